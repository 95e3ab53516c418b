/*
 * dlcp.io._udpio: the UDP receive loop of dlcp/io/udp.py, in C.
 *
 * Optional accelerator: DataSockets.receive falls back to the same loop in Python
 * when this module was not built, and tests/io/test_udp_receive.py checks that
 * both hand over the same runs. A Python loop costs several microseconds per read;
 * when datagrams arrive one per read (GRO not aggregating, e.g. offloads off on
 * the path) that, not the kernel, bounds the receive rate. Here the loop runs
 * without the GIL, so the endpoint's other threads keep going meanwhile.
 *
 * send_batch(fd, data, segment_size, per_message, host, port, tos) -> sent
 *   Sends data as datagrams of segment_size bytes (the last may be shorter) to
 *   (host, port), each with IP_TOS tos, up to SEND_BATCH messages per sendmmsg
 *   call. A message holds up to per_message datagrams: more than one goes as one
 *   UDP GSO message (UDP_SEGMENT ancillary data), one as a plain datagram. With
 *   GSO a sender's decision of 352 datagrams is one system call instead of eight;
 *   without it (per_message 1: paths where GSO would be segmented in software),
 *   one system call per SEND_BATCH datagrams instead of one per datagram. Blocks
 *   while the socket buffer is full (the data sockets are blocking); raises
 *   OSError on other errors.
 *
 * recv_runs(fd, buf, budget, max_reads, read_size)
 *     -> (runs, nbytes, reads, empty, more, errno)
 *   Reads datagrams (non-blocking, with the UDP_GRO segment size from ancillary
 *   data) back to back into buf from offset 0, until the
 *   socket is drained, `budget` bytes or `max_reads` reads are done, or fewer
 *   than `read_size` bytes of buf are left. runs: (start, end, segment_size) of
 *   each run of same-size datagrams, in buf; a run ends where the size changes
 *   or after a short datagram. more: stopped because buf was full (call again
 *   once the runs are consumed). errno: a receive error other than EAGAIN/EINTR
 *   (0 if none), reported after the runs read before it.
 *   A read that returns one plain datagram (not GRO-coalesced, at most
 *   MMSG_SMALL bytes) switches to recvmmsg: up to MMSG_BATCH datagrams per
 *   system call, each into a read_size slot, moved down to the end of the data
 *   (a small copy; a system call per datagram costs more). A coalesced read
 *   switches back to one recvmsg per read, which needs no move.
 *
 * filter_runs(buf, runs, job, require_auth, tag_len, counts) -> runs
 *   The receive pre-filter (_prefilter.h) over the runs recv_runs returned: each
 *   run's datagrams that break a header rule of spec §6.1 (all but the tag's) are
 *   dropped, counts[reason] (an int64 array of 16) counting them; the rest move
 *   down within their run. Returns the runs that kept a datagram, as
 *   (start, end, segment_size) in buf.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <arpa/inet.h>
#include <sys/socket.h>

#include "_prefilter.h"
#include "_recv_runs.h" /* the receive loop, without Python */
#include "_sendmmsg.h"

static PyObject *recv_runs(PyObject *self, PyObject *args) {
    (void)self;
    int fd;
    PyObject *buf_obj;
    Py_ssize_t budget, max_reads, read_size;
    if (!PyArg_ParseTuple(args, "iOnnn:recv_runs", &fd, &buf_obj, &budget, &max_reads,
                          &read_size))
        return NULL;
    if (read_size <= 0 || budget < 0 || max_reads < 0) {
        PyErr_SetString(PyExc_ValueError, "read_size must be positive, budget and max_reads >= 0");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(buf_obj, &view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        return NULL;
    Run *runs = PyMem_Malloc(sizeof(Run) * MAX_RUNS);
    RecvScratch *scratch = PyMem_Malloc(sizeof(RecvScratch));
    if (runs == NULL || scratch == NULL) {
        PyMem_Free(runs);
        PyMem_Free(scratch);
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    RecvRuns got;
    Py_BEGIN_ALLOW_THREADS
    recv_runs_loop(fd, (char *)view.buf, view.len, budget, max_reads, read_size, runs, scratch,
                   &got);
    Py_END_ALLOW_THREADS

    PyMem_Free(scratch);
    Py_ssize_t n_runs = got.n_runs;
    PyBuffer_Release(&view);
    PyObject *list = PyList_New(n_runs);
    if (list == NULL) {
        PyMem_Free(runs);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n_runs; i++) {
        PyObject *t = Py_BuildValue("(nnn)", runs[i].start, runs[i].end, runs[i].seg);
        if (t == NULL) {
            Py_DECREF(list);
            PyMem_Free(runs);
            return NULL;
        }
        PyList_SET_ITEM(list, i, t);
    }
    PyMem_Free(runs);
    return Py_BuildValue("(Nnnnii)", list, got.total, got.reads, got.empty, got.more, got.err);
}

static PyObject *filter_runs(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *buf_obj, *runs_in, *counts_obj;
    unsigned job;
    int require_auth;
    Py_ssize_t tag_len;
    if (!PyArg_ParseTuple(args, "OO!IpnO:filter_runs", &buf_obj, &PyList_Type, &runs_in, &job,
                          &require_auth, &tag_len, &counts_obj))
        return NULL;
    if (tag_len < 0) {
        PyErr_SetString(PyExc_ValueError, "tag_len must be >= 0");
        return NULL;
    }
    Py_buffer view, counts;
    if (PyObject_GetBuffer(buf_obj, &view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(counts_obj, &counts, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    PyObject *out = NULL;
    if (counts.len < (Py_ssize_t)(sizeof(int64_t) * PF_REASONS)) {
        PyErr_Format(PyExc_ValueError, "counts holds %zd bytes, needs %d int64", counts.len,
                     PF_REASONS);
        goto done;
    }
    PfRules rules = {job, require_auth, (size_t)tag_len};
    int64_t *count = (int64_t *)counts.buf;
    out = PyList_New(0);
    for (Py_ssize_t i = 0; out != NULL && i < PyList_GET_SIZE(runs_in); i++) {
        PyObject *run = PyList_GET_ITEM(runs_in, i);
        Py_ssize_t start, end, seg;
        if (!PyArg_ParseTuple(run, "nnn:filter_runs run", &start, &end, &seg)) {
            Py_CLEAR(out);
            break;
        }
        if (start < 0 || end < start || end > view.len || seg <= 0) {
            PyErr_Format(PyExc_ValueError, "run (%zd, %zd, %zd) does not lie in a %zd-byte buffer",
                         start, end, seg, view.len);
            Py_CLEAR(out);
            break;
        }
        size_t kept = pf_filter_run((unsigned char *)view.buf + start, (size_t)(end - start),
                                    (size_t)seg, &rules, count);
        if (kept == 0)
            continue;
        PyObject *t = (Py_ssize_t)kept == end - start
                          ? (Py_INCREF(run), run)
                          : Py_BuildValue("(nnn)", start, start + (Py_ssize_t)kept, seg);
        if (t == NULL || PyList_Append(out, t) < 0)
            Py_CLEAR(out);
        Py_XDECREF(t);
    }
done:
    PyBuffer_Release(&counts);
    PyBuffer_Release(&view);
    return out;
}

/* An IPv4 destination from Python's (host, port); -1 with ValueError if bad. */
static int destination(struct sockaddr_in *addr, const char *host, int port) {
    memset(addr, 0, sizeof *addr);
    addr->sin_family = AF_INET;
    addr->sin_port = htons((unsigned short)port);
    if (port <= 0 || port > 65535 || inet_pton(AF_INET, host, &addr->sin_addr) != 1) {
        PyErr_Format(PyExc_ValueError, "bad destination %s:%d", host, port);
        return -1;
    }
    return 0;
}

static PyObject *send_batch(PyObject *self, PyObject *args) {
    (void)self;
    int fd, port, tos;
    Py_buffer data;
    Py_ssize_t seg, per_message;
    const char *host;
    if (!PyArg_ParseTuple(args, "iy*nnsii:send_batch", &fd, &data, &seg, &per_message, &host,
                          &port, &tos))
        return NULL;
    struct sockaddr_in addr;
    if (destination(&addr, host, port) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    /* (divided, not multiplied: a huge per_message must not overflow the check) */
    if (seg <= 0 || seg > 65535 || per_message <= 0 || per_message > 65535 / seg) {
        PyBuffer_Release(&data);
        PyErr_Format(PyExc_ValueError,
                     "segment size %zd x %zd per message does not fit one UDP GSO message",
                     seg, per_message);
        return NULL;
    }
    ssize_t sent = 0;
    unsigned long long calls = 0;
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = send_datagrams(fd, &addr, (const char *)data.buf, data.len, seg, per_message, tos, &sent,
                         &calls);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (err) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromSsize_t(sent);
}

/* send_gathered(fd, heads, head, payload, chunk, per_message, host, port, tos) -> sent:
 * datagram i is header i (the `head` bytes at heads + i * head) followed by chunk i
 * of payload (`chunk` bytes from i * chunk; the last chunk may be shorter), one
 * datagram per header; nothing is copied into a send buffer (see send_gathered in
 * _sendmmsg.h). */
static PyObject *send_gathered_py(PyObject *self, PyObject *args) {
    (void)self;
    int fd, port, tos;
    Py_buffer heads, payload;
    Py_ssize_t head, chunk, per_message;
    const char *host;
    if (!PyArg_ParseTuple(args, "iy*ny*nnsii:send_gathered", &fd, &heads, &head, &payload, &chunk,
                          &per_message, &host, &port, &tos))
        return NULL;
    PyObject *result = NULL;
    int64_t *seqs = NULL;
    struct sockaddr_in addr;
    if (destination(&addr, host, port) < 0)
        goto done;
    Py_ssize_t count = head > 0 ? heads.len / head : 0;
    Py_ssize_t tail = payload.len - (count - 1) * chunk; /* the last datagram's payload */
    if (head <= 0 || head > 64 || chunk <= 0 || head + chunk > 65535 || count < 1 ||
        heads.len != count * head || tail <= 0 || tail > chunk || per_message <= 0 ||
        per_message > 65535 / (head + chunk)) {
        PyErr_Format(PyExc_ValueError,
                     "send_gathered: %zd bytes of %zd-byte headers and a %zd-byte payload "
                     "do not make datagrams of %zd-byte chunks",
                     heads.len, head, payload.len, chunk);
        goto done;
    }
    seqs = PyMem_Malloc(sizeof(int64_t) * (size_t)count);
    if (seqs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++)
        seqs[i] = i;
    ssize_t sent = 0;
    unsigned long long calls = 0;
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = send_gathered(fd, &addr, (const char *)heads.buf, head, 0, (const char *)payload.buf,
                        seqs, chunk, count, tail < chunk ? count - 1 : -1, tail, per_message, tos, &sent,
                        &calls);
    Py_END_ALLOW_THREADS
    if (err) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    result = PyLong_FromSsize_t(sent);
done:
    PyMem_Free(seqs);
    PyBuffer_Release(&heads);
    PyBuffer_Release(&payload);
    return result;
}

static PyMethodDef methods[] = {
    {"send_gathered", send_gathered_py, METH_VARARGS,
     "send_gathered(fd, heads, head, payload, chunk, per_message, host, port, tos) -> sent: "
     "datagrams gathered from a header each and consecutive chunks of payload (see the "
     "module source)."},
    {"send_batch", send_batch, METH_VARARGS,
     "send_batch(fd, data, segment_size, per_message, host, port, tos) -> sent: the datagrams "
     "of a batch, per_message per (GSO) message, many messages per sendmmsg call (see the "
     "module source)."},
    {"recv_runs", recv_runs, METH_VARARGS,
     "recv_runs(fd, buf, budget, max_reads, read_size) -> (runs, nbytes, reads, empty, more, "
     "errno): drain a UDP socket into buf as runs of same-size datagrams (see the source)."},
    {"filter_runs", filter_runs, METH_VARARGS,
     "filter_runs(buf, runs, job, require_auth, tag_len, counts) -> runs: drop the datagrams "
     "of each run that break a header rule of spec 6.1, counting them by reason (see the "
     "source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "dlcp.io._udpio",
    "The UDP receive loop of the DLCP endpoint (optional C accelerator).", -1, methods,
};

PyMODINIT_FUNC PyInit__udpio(void) { return PyModule_Create(&module); }
