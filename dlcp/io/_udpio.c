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
 *   while the socket buffer is full (the data sockets are blocking); a message
 *   the host's own queue dropped (ENOBUFS) is lost, as in the network, and not
 *   counted in `sent` (_sendmmsg.h); raises OSError on other errors. A batch of
 *   at most SEND_WITH_GIL_BYTES keeps the GIL while it goes.
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
 *
 * send_now(fd, data) -> sent
 * recv_now(fd, buf) -> received or None
 *   One send(MSG_DONTWAIT | MSG_NOSIGNAL) or recv(MSG_DONTWAIT) on a stream
 *   socket (the control connections), holding the GIL: sent 0 and None where it
 *   would block (or a signal came); OSError on other errors, recv 0 at the end.
 *   Python's socket methods let the GIL go around the call, and on a busy core a
 *   thread that does so for a few microseconds waits for it again behind
 *   whichever thread took it: a context switch or two for each control frame.
 *
 * MessageTable(job, data_vt, per_packet_flags, head_layout, mask, layout,
 *              auth_flag=0)
 *   The native receive path (_take_runs.h): the messages under way that the
 *   receive loop scatters itself, without calling back into Python per run.
 *   register(src, step, msg, out, received, received_class, chunk_elems,
 *            msg_elems, itemsize, dtype_byte, stream, add, received_elems,
 *            received_protected, complete_elems, complete_protected,
 *            tag_key=None, nonce_floor=0)
 *     adds (or replaces) a message: its reassembler's output bytes and chunk
 *     maps (held, as Py_buffers, until it is removed), geometry (with add, its
 *     float32 payloads are added to what out holds), and the counts
 *     that say when its completion check is due. With tag_key (the AES key of
 *     the pair src -> this rank, spec §3; only where the module was built with
 *     libcrypto: VERIFIES_TAGS) its datagrams carry the AUTH flag (auth_flag)
 *     and a trailer, and only those whose AES-GMAC tag verifies under the key
 *     are taken (dlcp/proto/gmac.h, the bytes of dlcp/proto/auth.py), their
 *     trailers left out of the payload, and none whose nonce is below
 *     nonce_floor (a replay: dlcp/proto/replay.py). The table keeps one key per source rank,
 *     expanded once: a register that gives another key for src replaces it for
 *     every message of src (it waits for a running receive step, as unregister
 *     does), so no step checks a tag under a key the session no longer gives.
 *     sync(src, step, msg,
 *     received_elems, received_protected, complete_elems, complete_protected)
 *     updates those counts; unregister(src, step, msg) removes it. Each returns
 *     once no receive step is running: a removed message's buffers are never
 *     written after it returns.
 *   receive(fd, buf, budget, max_reads, read_size, step, screen, linger_ns=0,
 *     watch_fd=-1, nap_ns=0, trickle_ns=0) -> (nbytes, reads, empty, errno, kept,
 *     drained, lingered_ns):
 *     recv_runs into buf in steps, then the pre-filter (screen: None, or (job,
 *     require_auth, tag_len, counts) as filter_runs takes them), taking each
 *     step's runs before the next, and stages the last step's (kept: the bytes
 *     of all steps' runs) for next(); with linger_ns it waits for more data
 *     after the socket ran dry, with nap_ns it naps while data trickles in
 *     (_linger.h, table_receive). stage(buf, runs)
 *     stages given runs instead.
 *   next(buf) -> (handover, taken): takes the staged runs into the registered
 *     messages, without the GIL, until one needs Python: handover is None when
 *     all were handled, else (start, end, segment_size, kind) with kind 1
 *     (TAKE_WHOLE), 2 (TAKE_REST) or 3 (TAKE_CHECK) as _take_runs.h says. taken:
 *     None, or what the registered messages took since the last call, a tuple
 *     (src, step, msg, datagrams, nbytes, fresh, fresh_elems, fresh_droppable,
 *     fresh_retransmitted, payload_bytes, bound, nonce_next) each, to apply
 *     before the handover (nonce_next: one above the highest nonce it took since
 *     it was registered, 0 if none).
 *   take_rates(pacer_api, job, first, shared_flag, auth_flag=0), rate_pacer(src,
 *   pacer), take_stops(first, hold_ns), stops(), waiting(delta), take_finishes(first,
 *   crossed_ns, keys), ended(src, step, msg, completed_at), watch_control(fd, src,
 *   tag_key=None), unwatch_control(fd), wait(epfd, timeout_ns, max_events),
 *   control_counts(): the RATE reports of watched control connections, handed to
 *     the native engine's pacers (pacer_api: dlcp.io._engine.PACER_API,
 *     _pacer_api.h), their STOPs, which stop the engine's round and are kept for
 *     Python's next turn (stops()), and the FINISHes of messages that completed
 *     here, dropped, wherever the I/O thread waits: in receive's linger and naps,
 *     and in wait, its selector's epoll_wait (_control_watch.h; the frames taken:
 *     _control_frames.h). With auth_flag (a job that authenticates; only where
 *     the module was built with libcrypto) only frames with that flag and a tag
 *     that verifies under the table's key of their source are taken: the key a
 *     tagged message of src was registered with, or watch_control's tag_key (the
 *     same key, spec §3: the pair src -> this rank).
 *
 * control_frames(data, job, first, shared_flag, src, stop_first=0, finish_first=0,
 *   auth_flag=0, tag_key=None) -> (consumed, frames): the walk those waits run over
 *   a connection's queued bytes, for tests.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <sys/socket.h>

#include "_prefilter.h"
#include "_recv_runs.h"  /* the receive loop, without Python */
#include "_take_runs.h" /* the native receive path, without Python */
#include "_linger.h"    /* waiting for the next burst in C (MessageTable.receive) */
#include "_control_watch.h" /* RATE and STOP frames the waits take themselves */
#include "_sendmmsg.h"
#ifdef DLCP_LIBCRYPTO
#include "../proto/gmac.h" /* AES-GMAC with libcrypto, as the send engine seals */
#endif

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
    /* (a batch this small keeps the GIL while it goes: _sendmmsg.h) */
    PyThreadState *saved = data.len <= SEND_WITH_GIL_BYTES ? NULL : PyEval_SaveThread();
    int err = send_datagrams(fd, &addr, (const char *)data.buf, data.len, seg, per_message, tos,
                             &sent, &calls);
    if (saved != NULL)
        PyEval_RestoreThread(saved);
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

/* ------------------------------------------------------------------ MessageTable */

/* The Py_buffers a registered message's slot holds: its output bytes and chunk
 * maps, released when it is removed or replaced. */
typedef struct {
    Py_buffer out, received, received_class;
} HeldBuffers;

#ifdef DLCP_LIBCRYPTO
/* The key the datagrams of one source rank are verified with, expanded once
 * (registered messages of src point at its gmac; replaced in place under the
 * table's lock when the session gives another key). */
typedef struct {
    unsigned src;
    size_t len;
    uint8_t key[32];
    Gmac gmac;
} SourceKey;

/* TakeVerify over a SourceKey's gmac (called with the table's lock held). */
static int verify_tag(void *verifier, const unsigned char *record, size_t len) {
    return gmac_verify_data((Gmac *)verifier, record, len);
}

static void source_key_free(SourceKey *k) {
    gmac_free(&k->gmac);
    OPENSSL_cleanse(k->key, sizeof k->key);
    PyMem_RawFree(k);
}
#endif

typedef struct {
    PyObject_HEAD
    TakeTable t;
    HeldBuffers *held; /* t.n_slots of them, for the live slots */
    ssize_t n_held;
#ifdef DLCP_LIBCRYPTO
    /* one per source rank a tagged message or control key was given for (the array
     * grows under the table's lock: the waits' control walk reads it) */
    SourceKey **keys;
    ssize_t n_keys;
#endif
    RecvScratch *scratch;
    /* the handover a receive call's step met (TAKE_DONE: none), which next()
     * returns first, and its bytes */
    int pending;
    Run pending_run;
    ControlWatch control; /* the connections whose RATE reports the linger takes */
    pthread_mutex_t lock; /* held by a receive step, and by every change of the table */
    int ready;            /* __init__ done */
} MessageTableObject;

/* Takes the table's lock; waits for it without the GIL (a receive step holds it
 * without the GIL). */
static void table_lock(MessageTableObject *self) {
    if (pthread_mutex_trylock(&self->lock) == 0)
        return;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->lock);
    Py_END_ALLOW_THREADS
}

static void table_unlock(MessageTableObject *self) { pthread_mutex_unlock(&self->lock); }

#ifdef DLCP_LIBCRYPTO
/* TagCheck of the waits' control walk (a job that authenticates): the datagram's
 * tag verifies under the table's key of src. Called with the table's lock held. */
static int control_tag_verifies(void *ctx, unsigned src, const uint8_t *d, size_t len) {
    MessageTableObject *self = ctx;
    for (ssize_t i = 0; i < self->n_keys; i++)
        if (self->keys[i]->src == src)
            return gmac_verify_control(&self->keys[i]->gmac, d, len) == 1;
    return 0;
}
#endif

static void held_release(HeldBuffers *h) {
    PyBuffer_Release(&h->out);
    PyBuffer_Release(&h->received);
    PyBuffer_Release(&h->received_class);
}

static int table_ready(MessageTableObject *self) {
    if (!self->ready) {
        PyErr_SetString(PyExc_RuntimeError, "MessageTable was not initialised");
        return 0;
    }
    return 1;
}

static PyObject *table_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    (void)args;
    (void)kwds;
    MessageTableObject *self = (MessageTableObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    memset(&self->t, 0, sizeof self->t);
    self->held = NULL;
    self->n_held = 0;
    self->scratch = NULL;
#ifdef DLCP_LIBCRYPTO
    self->keys = NULL;
    self->n_keys = 0;
#endif
    memset(&self->control, 0, sizeof self->control);
    self->control.due_ns = INT64_MAX;
    self->ready = 0;
    pthread_mutex_init(&self->lock, NULL);
    return (PyObject *)self;
}

static int table_init(MessageTableObject *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"job", "data_vt", "per_packet_flags", "head_layout", "mask", "layout",
                            "auth_flag", NULL};
    unsigned job, data_vt, per_packet, auth_flag = 0;
    const unsigned char *head, *mask, *layout;
    Py_ssize_t head_len, mask_len, layout_len;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "IIIy#y#y#|I:MessageTable", names, &job,
                                     &data_vt, &per_packet, &head, &head_len, &mask, &mask_len,
                                     &layout, &layout_len, &auth_flag))
        return -1;
    if (self->ready) {
        PyErr_SetString(PyExc_RuntimeError, "MessageTable is initialised once");
        return -1;
    }
    if (job > 0xFFFF || data_vt > 0xFF || per_packet > 0xFF) {
        PyErr_Format(PyExc_ValueError, "job %u, data_vt %u or per_packet_flags %u out of range",
                     job, data_vt, per_packet);
        return -1;
    }
    if (auth_flag > 0xFF || (auth_flag & (auth_flag - 1)) || (auth_flag & per_packet)) {
        PyErr_Format(PyExc_ValueError,
                     "auth_flag %u is not one flag bit outside per_packet_flags %u", auth_flag,
                     per_packet);
        return -1;
    }
    if (mask_len <= 0 || mask_len > SCATTER_MAX_HEADER || mask_len % 8) {
        PyErr_Format(PyExc_ValueError, "mask of %zd bytes: a multiple of 8 up to %d", mask_len,
                     SCATTER_MAX_HEADER);
        return -1;
    }
    if (head_len != HEAD_LAYOUT_LEN || layout_len != 8) {
        PyErr_Format(PyExc_ValueError, "head_layout (%zd bytes) must be %d bytes, layout (%zd) 8",
                     head_len, HEAD_LAYOUT_LEN, layout_len);
        return -1;
    }
    /* (field sizes: ver_type 1, flags 1, job 2, step 4, msg 2, msg_elems 4, src 2, dtype 1,
     * bound 1) */
    static const int size[HEAD_LAYOUT_LEN] = {1, 1, 2, 4, 2, 4, 2, 1, 1};
    for (int i = 0; i < HEAD_LAYOUT_LEN; i++)
        if (head[i] + size[i] > mask_len) {
            PyErr_Format(PyExc_ValueError, "head_layout field %d at byte %d leaves the %zd-byte header",
                         i, head[i], mask_len);
            return -1;
        }
    ScatterArgs probe = {NULL, 0, 0, mask_len, 0, mask, mask, layout, mask_len, mask_len, 8,
                         NULL, 0, 1, 1, 1, NULL, NULL, 0, 0, 0, 0};
    if (scatter_check_args(&probe) != SCATTER_OK) {
        PyErr_SetString(PyExc_ValueError,
                        "layout must name flags, seq, offset, payload_len and tclass inside the "
                        "header, then the last, retransmit and drop bits (as scatter_run's)");
        return -1;
    }
    self->t.job = job;
    self->t.data_vt = data_vt;
    self->t.per_packet_flags = per_packet;
    self->t.head = (HeadLayout){head[0], head[1], head[2], head[3], head[4],
                                head[5], head[6], head[7], head[8]};
    memcpy(self->t.mask, mask, (size_t)mask_len);
    memcpy(self->t.layout, layout, 8);
    self->t.header_len = mask_len;
    self->t.auth_flag = auth_flag;
#ifdef DLCP_LIBCRYPTO
    self->t.trailer_len = GMAC_TRAILER_LEN;
    self->t.verify = verify_tag;
#endif
    self->t.runs = PyMem_RawMalloc(sizeof(Run) * MAX_RUNS);
    self->scratch = PyMem_RawMalloc(sizeof(RecvScratch));
    if (self->t.runs == NULL || self->scratch == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->ready = 1;
    return 0;
}

static void table_dealloc(MessageTableObject *self) {
    for (ssize_t i = 0; i < self->t.n_slots; i++)
        if (self->t.slots[i].live)
            held_release(&self->held[i]);
    free(self->t.slots);
    free(self->t.index);
    free(self->t.touched);
    PyMem_RawFree(self->t.runs);
    PyMem_RawFree(self->scratch);
    PyMem_Free(self->held);
#ifdef DLCP_LIBCRYPTO
    for (ssize_t i = 0; i < self->n_keys; i++)
        source_key_free(self->keys[i]);
    PyMem_RawFree(self->keys);
#endif
    control_watch_free(&self->control);
    pthread_mutex_destroy(&self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A message key from Python's (src, step, msg): -1 with ValueError if out of range. */
static int key_of(unsigned long long src, unsigned long long step, unsigned long long msg,
                  uint64_t *key) {
    if (src > 0xFFFF || step > 0xFFFFFFFFULL || msg > 0xFFFF) {
        PyErr_Format(PyExc_ValueError, "message (src %llu, step %llu, msg %llu) out of range",
                     src, step, msg);
        return -1;
    }
    *key = take_key((unsigned)src, (unsigned)step, (unsigned)msg);
    return 0;
}

/* What message datagrams of src are verified with under tag_key (an AES key,
 * bytes-like): the table's key of src, made, or given this key if it had
 * another. NULL with an exception set if the key is bad, the table takes no
 * tagged messages, or this build verifies no tags. */
static void *table_verifier(MessageTableObject *self, unsigned src, PyObject *tag_key) {
#ifdef DLCP_LIBCRYPTO
    if (self->t.auth_flag == 0) {
        PyErr_SetString(PyExc_ValueError,
                        "a tag_key was given but the MessageTable has no auth_flag: it takes no "
                        "tagged messages");
        return NULL;
    }
    Py_buffer given;
    if (PyObject_GetBuffer(tag_key, &given, PyBUF_SIMPLE) < 0)
        return NULL;
    SourceKey *k = NULL;
    for (ssize_t i = 0; i < self->n_keys && k == NULL; i++)
        if (self->keys[i]->src == src)
            k = self->keys[i];
    if (k != NULL && k->len == (size_t)given.len &&
        CRYPTO_memcmp(k->key, given.buf, k->len) == 0) {
        PyBuffer_Release(&given);
        return &k->gmac;
    }
    Gmac fresh = {NULL, NULL};
    if (given.len > (Py_ssize_t)sizeof k->key ||
        gmac_init(&fresh, (const uint8_t *)given.buf, (size_t)given.len) < 0) {
        PyErr_Format(PyExc_ValueError,
                     "tag_key of src %u must be 16, 24 or 32 bytes (an AES key), got %zd", src,
                     given.len);
        PyBuffer_Release(&given);
        return NULL;
    }
    if (k == NULL) { /* (no message points at a new one yet; the array, under the lock) */
        k = PyMem_RawCalloc(1, sizeof *k);
        SourceKey **keys = NULL, *other = NULL;
        if (k != NULL) {
            k->src = src;
            k->gmac = fresh;
            k->len = (size_t)given.len;
            memcpy(k->key, given.buf, k->len);
            table_lock(self); /* (which may let another thread in first: look again) */
            for (ssize_t i = 0; i < self->n_keys && other == NULL; i++)
                if (self->keys[i]->src == src)
                    other = self->keys[i];
            keys = other != NULL ? self->keys
                                 : PyMem_RawRealloc(self->keys,
                                                    sizeof *keys * (size_t)(self->n_keys + 1));
            if (keys != NULL && other == NULL) {
                self->keys = keys;
                self->keys[self->n_keys++] = k;
            }
            table_unlock(self);
        }
        if (other != NULL) { /* (another thread made src's key meanwhile: give it this one) */
            source_key_free(k);
            PyBuffer_Release(&given);
            return table_verifier(self, src, tag_key);
        }
        if (keys == NULL) {
            if (k != NULL)
                source_key_free(k);
            else
                gmac_free(&fresh);
            PyBuffer_Release(&given);
            PyErr_NoMemory();
            return NULL;
        }
    } else { /* another key for src: no receive step may check a tag meanwhile */
        table_lock(self);
        Gmac old = k->gmac;
        k->gmac = fresh;
        OPENSSL_cleanse(k->key, sizeof k->key);
        k->len = (size_t)given.len;
        memcpy(k->key, given.buf, k->len);
        table_unlock(self);
        gmac_free(&old);
    }
    PyBuffer_Release(&given);
    return &k->gmac;
#else
    (void)self;
    (void)src;
    (void)tag_key;
    PyErr_SetString(PyExc_ValueError,
                    "a tag_key was given but dlcp.io._udpio was built without OpenSSL's "
                    "libcrypto: it verifies no tags (VERIFIES_TAGS is False)");
    return NULL;
#endif
}

static PyObject *table_register(MessageTableObject *self, PyObject *args) {
    unsigned long long src, step, msg;
    PyObject *out_obj, *recv_obj, *cls_obj;
    Py_ssize_t chunk_elems, msg_elems, itemsize;
    unsigned dtype_byte;
    int stream, add;
    long long received_elems, received_protected, complete_elems, complete_protected;
    PyObject *tag_key = Py_None;
    unsigned long long nonce_floor = 0;
    if (!table_ready(self) ||
        !PyArg_ParseTuple(args, "KKKOOOnnnIppLLLL|OK:register", &src, &step, &msg, &out_obj,
                          &recv_obj, &cls_obj, &chunk_elems, &msg_elems, &itemsize, &dtype_byte,
                          &stream, &add, &received_elems, &received_protected, &complete_elems,
                          &complete_protected, &tag_key, &nonce_floor))
        return NULL;
    uint64_t key;
    if (key_of(src, step, msg, &key) < 0)
        return NULL;
    if (chunk_elems <= 0 || msg_elems <= 0 || itemsize <= 0 || itemsize > 8 || dtype_byte > 0xFF) {
        PyErr_Format(PyExc_ValueError,
                     "message (src %llu, step %llu, msg %llu): chunk_elems %zd, msg_elems %zd, "
                     "itemsize %zd or dtype byte %u out of range",
                     src, step, msg, chunk_elems, msg_elems, itemsize, dtype_byte);
        return NULL;
    }
    if (add && itemsize != 4) {
        PyErr_Format(PyExc_ValueError,
                     "message (src %llu, step %llu, msg %llu): add needs float32 elements "
                     "(itemsize 4), got itemsize %zd",
                     src, step, msg, itemsize);
        return NULL;
    }
    void *verifier = NULL;
    if (tag_key != Py_None && (verifier = table_verifier(self, (unsigned)src, tag_key)) == NULL)
        return NULL;
    HeldBuffers h;
    memset(&h, 0, sizeof h);
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE;
    if (PyObject_GetBuffer(out_obj, &h.out, flags) < 0)
        return NULL;
    if (PyObject_GetBuffer(recv_obj, &h.received, flags | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&h.out);
        return NULL;
    }
    if (PyObject_GetBuffer(cls_obj, &h.received_class, flags | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&h.out);
        PyBuffer_Release(&h.received);
        return NULL;
    }
    ssize_t n_chunks = (msg_elems - 1) / chunk_elems + 1;
    if (msg_elems > h.out.len / itemsize || h.received.itemsize != 1 ||
        h.received_class.itemsize != 1 || h.received.len < n_chunks ||
        h.received_class.len < n_chunks) {
        PyErr_Format(PyExc_ValueError,
                     "message (src %llu, step %llu, msg %llu): out holds %zd bytes for %zd "
                     "elements of %zd, or received (%zd) / received_class (%zd) are not one "
                     "byte for each of its %zd chunks",
                     src, step, msg, h.out.len, msg_elems, itemsize, h.received.len,
                     h.received_class.len, n_chunks);
        held_release(&h);
        return NULL;
    }
    TakenMessage m;
    memset(&m, 0, sizeof m);
    m.key = key;
    m.out = h.out.buf;
    m.out_len = h.out.len;
    m.received = h.received.buf;
    m.received_len = h.received.len;
    m.received_class = h.received_class.buf;
    m.received_class_len = h.received_class.len;
    m.chunk_elems = chunk_elems;
    m.msg_elems = msg_elems;
    m.itemsize = itemsize;
    m.dtype_byte = dtype_byte;
    m.stream = stream;
    m.add = add;
    m.verifier = verifier;
    m.nonce_floor = nonce_floor;
    m.received_elems = received_elems;
    m.received_protected = received_protected;
    m.complete_elems = complete_elems;
    m.complete_protected = complete_protected;
    m.bound = -1;
    table_lock(self);
    ssize_t slot = -1;
    HeldBuffers replaced;
    int replacing = 0;
    if (take_reserve(&self->t) == 0) {
        if (self->n_held < self->t.n_slots) {
            HeldBuffers *held = PyMem_Realloc(self->held, sizeof *held * (size_t)self->t.n_slots);
            if (held != NULL) {
                self->held = held;
                self->n_held = self->t.n_slots;
            }
        }
        if (self->n_held >= self->t.n_slots) {
            ssize_t before = take_find(&self->t, key);
            slot = take_register(&self->t, &m);
            if (slot >= 0) {
                if (before >= 0) { /* the buffers it replaces */
                    replaced = self->held[slot];
                    replacing = 1;
                }
                self->held[slot] = h;
            }
        }
    }
    table_unlock(self);
    if (slot < 0) {
        held_release(&h);
        return PyErr_NoMemory();
    }
    if (replacing) /* (after the lock: releasing may run Python code) */
        held_release(&replaced);
    Py_RETURN_NONE;
}

static PyObject *table_sync(MessageTableObject *self, PyObject *args) {
    unsigned long long src, step, msg;
    long long received_elems, received_protected, complete_elems, complete_protected;
    if (!table_ready(self) ||
        !PyArg_ParseTuple(args, "KKKLLLL:sync", &src, &step, &msg, &received_elems,
                          &received_protected, &complete_elems, &complete_protected))
        return NULL;
    uint64_t key;
    if (key_of(src, step, msg, &key) < 0)
        return NULL;
    table_lock(self);
    ssize_t slot = take_find(&self->t, key);
    if (slot >= 0) {
        TakenMessage *m = &self->t.slots[slot];
        m->received_elems = received_elems;
        m->received_protected = received_protected;
        m->complete_elems = complete_elems;
        m->complete_protected = complete_protected;
    }
    table_unlock(self);
    return PyBool_FromLong(slot >= 0);
}

static PyObject *table_unregister(MessageTableObject *self, PyObject *args) {
    unsigned long long src, step, msg;
    if (!table_ready(self) || !PyArg_ParseTuple(args, "KKK:unregister", &src, &step, &msg))
        return NULL;
    uint64_t key;
    if (key_of(src, step, msg, &key) < 0)
        return NULL;
    table_lock(self);
    ssize_t slot = take_unregister(&self->t, key);
    HeldBuffers h;
    if (slot >= 0)
        h = self->held[slot];
    table_unlock(self);
    if (slot < 0)
        Py_RETURN_FALSE;
    held_release(&h); /* (after the lock: releasing may run Python code) */
    Py_RETURN_TRUE;
}

/* Reads, pre-filters and stages a step's runs: at most `room` bytes and
 * `max_reads` reads into the start of buf (recv_runs_loop). Adds the bytes of
 * the runs it kept to *kept; returns the step's reads' outcome. */
static RecvRuns receive_step(MessageTableObject *self, int fd, Py_buffer *view, ssize_t room,
                             ssize_t max_reads, ssize_t read_size, const PfRules *rules,
                             int64_t *counts, ssize_t *kept) {
    RecvRuns got;
    TakeTable *t = &self->t;
    recv_runs_loop(fd, (char *)view->buf, view->len, room, max_reads, read_size, t->runs,
                   self->scratch, &got);
    ssize_t n = 0;
    for (ssize_t i = 0; i < got.n_runs; i++) {
        Run r = t->runs[i];
        if (counts != NULL)
            r.end = r.start + (ssize_t)pf_filter_run((unsigned char *)view->buf + r.start,
                                                     (size_t)(r.end - r.start), (size_t)r.seg,
                                                     rules, counts);
        if (r.end > r.start) {
            t->runs[n++] = r;
            *kept += r.end - r.start;
        }
    }
    take_stage(t, t->runs, n, view->len); /* (the loop's runs lie in buf) */
    return got;
}

/* receive(fd, buf, budget, max_reads, read_size, step, screen, linger_ns=0,
 * watch_fd=-1, nap_ns=0, trickle_ns=0): drains the
 * socket in steps of at most `step` bytes, each read into the start of buf, so
 * that what the kernel copied is still in the cache when it is scattered. A step
 * after which more may be queued has its runs taken at once, and the next step
 * reads over them; the loop ends when the socket ran dry, the budget (kept
 * bytes) or max_reads (all reads) is spent, a read failed, or a run needs Python:
 * that handover is kept for next(), which returns it first, and the last step's
 * runs stay staged for next().
 *
 * With linger_ns > 0, a socket that ran dry ends the loop only after its runs
 * were taken (a handover still ends it) and no more data came within linger_ns
 * of the call's start, or a file of the epoll set watch_fd other than fd turned
 * readable first, or less than LINGER_MIN_BURST bytes came after the last wait
 * (a trickle, _linger.h). With nap_ns > 0 a trickle does not end it while the
 * call's data comes slower than LINGER_NAP_MAX_RATE: the loop sleeps nap_ns at a
 * time and takes what came, until trickle_ns of the call's start (at least
 * linger_ns) or until another file is ready. Returns (nbytes,
 * reads, empty, errno, kept, drained, lingered_ns), over all steps; lingered_ns
 * is the time it waited or slept. */
static PyObject *table_receive(MessageTableObject *self, PyObject *args) {
    int fd;
    PyObject *buf_obj, *screen;
    Py_ssize_t budget, max_reads, read_size, step;
    long long linger_ns = 0, nap_ns = 0, trickle_ns = 0;
    int watch_fd = -1;
    if (!table_ready(self) ||
        !PyArg_ParseTuple(args, "iOnnnnO|LiLL:receive", &fd, &buf_obj, &budget, &max_reads,
                          &read_size, &step, &screen, &linger_ns, &watch_fd, &nap_ns,
                          &trickle_ns))
        return NULL;
    if (read_size <= 0 || step <= 0 || budget < 0 || max_reads < 0 || linger_ns < 0 ||
        nap_ns < 0 || trickle_ns < 0) {
        PyErr_SetString(PyExc_ValueError, "read_size and step must be positive, budget, "
                                          "max_reads, linger_ns, nap_ns and trickle_ns >= 0");
        return NULL;
    }
    PfRules rules = {0, 0, 0};
    PyObject *counts_obj = NULL;
    if (screen != Py_None) {
        unsigned job;
        int require_auth;
        Py_ssize_t tag_len;
        if (!PyArg_ParseTuple(screen, "IpnO:receive screen", &job, &require_auth, &tag_len,
                              &counts_obj))
            return NULL;
        if (tag_len < 0) {
            PyErr_SetString(PyExc_ValueError, "tag_len must be >= 0");
            return NULL;
        }
        rules = (PfRules){job, require_auth, (size_t)tag_len};
    }
    Py_buffer view, counts;
    if (PyObject_GetBuffer(buf_obj, &view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        return NULL;
    if (read_size > view.len) { /* (no step could read: the loop would never end) */
        PyErr_Format(PyExc_ValueError, "read_size (%zd) is larger than buf (%zd bytes)",
                     read_size, view.len);
        PyBuffer_Release(&view);
        return NULL;
    }
    memset(&counts, 0, sizeof counts);
    if (counts_obj != NULL) {
        if (PyObject_GetBuffer(counts_obj, &counts, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
            PyBuffer_Release(&view);
            return NULL;
        }
        if (counts.len < (Py_ssize_t)(sizeof(int64_t) * PF_REASONS)) {
            PyErr_Format(PyExc_ValueError, "counts holds %zd bytes, needs %d int64", counts.len,
                         PF_REASONS);
            PyBuffer_Release(&counts);
            PyBuffer_Release(&view);
            return NULL;
        }
    }
    ssize_t total = 0, reads = 0, empty = 0, kept = 0;
    int err = 0, drained = 0;
    int64_t lingered = 0;
    table_lock(self);
    TakeTable *t = &self->t;
    self->pending = TAKE_DONE;
    LingerAbsorb absorb = {control_watch_absorb, &self->control, &self->control.due_ns};
    Py_BEGIN_ALLOW_THREADS
    int64_t start_ns = linger_clock_ns();
    int64_t linger_end = linger_ns > 0 ? start_ns + linger_ns : 0;
    /* (a trickle's naps go on to trickle_end: never before the linger's end) */
    int64_t trickle_end = linger_end != 0 && trickle_ns > linger_ns ? start_ns + trickle_ns
                                                                    : linger_end;
    ssize_t since_wait = -1; /* bytes read since the linger last waited (-1: it has not) */
    for (;;) {
        ssize_t room = budget - kept < step ? budget - kept : step;
        ssize_t read_room = max_reads - reads;
        RecvRuns got = receive_step(self, fd, &view, room, read_room, read_size, &rules,
                                    counts_obj != NULL ? (int64_t *)counts.buf : NULL, &kept);
        total += got.total;
        reads += got.reads;
        empty += got.empty;
        err = got.err;
        if (err)
            break;
        if (since_wait >= 0)
            since_wait += got.total;
        int dry = !got.more && got.reads < read_room && got.total < room;
        int trickle = since_wait >= 0 && since_wait < LINGER_MIN_BURST;
        int lingers = linger_end != 0 &&
                      (!trickle || (nap_ns > 0 && linger_slow(total, start_ns)));
        if (dry && (!lingers || kept >= budget || reads >= max_reads)) {
            drained = 1;
            break;
        }
        if (kept >= budget || reads >= max_reads)
            break;
        int kind = take_next(t, (unsigned char *)view.buf, view.len, &self->pending_run);
        if (kind != TAKE_DONE) {
            self->pending = kind;
            drained = dry;
            break;
        }
        if (dry) {
            if (!(trickle ? linger_nap(fd, watch_fd, &absorb, trickle_end, nap_ns, &lingered)
                          : linger_for_data(fd, watch_fd, &absorb, linger_end, &lingered))) {
                drained = 1; /* (its runs are taken: next() has only the counts to report) */
                break;
            }
            since_wait = 0;
        }
    }
    Py_END_ALLOW_THREADS
    table_unlock(self);
    if (counts_obj != NULL)
        PyBuffer_Release(&counts);
    PyBuffer_Release(&view);
    return Py_BuildValue("(nnniniL)", total, reads, empty, err, kept, drained,
                         (long long)lingered);
}

static PyObject *table_stage(MessageTableObject *self, PyObject *args) {
    PyObject *buf_obj, *runs_in;
    if (!table_ready(self) ||
        !PyArg_ParseTuple(args, "OO!:stage", &buf_obj, &PyList_Type, &runs_in))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(runs_in);
    if (n > MAX_RUNS) {
        PyErr_Format(PyExc_ValueError, "%zd runs: at most %d", n, MAX_RUNS);
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(buf_obj, &view, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    Run *runs = PyMem_Malloc(sizeof(Run) * (size_t)(n ? n : 1));
    PyObject *result = NULL;
    if (runs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t start, end, seg;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(runs_in, i), "nnn:stage run", &start, &end, &seg))
            goto done;
        runs[i] = (Run){start, end, seg};
    }
    table_lock(self);
    int bad = take_stage(&self->t, runs, n, view.len);
    if (!bad)
        self->pending = TAKE_DONE; /* (what a receive call left is replaced) */
    table_unlock(self);
    if (bad) {
        PyErr_Format(PyExc_ValueError,
                     "a run does not lie in the %zd-byte buffer (or has no positive segment size)",
                     view.len);
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    PyMem_Free(runs);
    PyBuffer_Release(&view);
    return result;
}

static int report_taken(void *context, const TakenMessage *m) {
    PyObject *t = Py_BuildValue("(KKKLLLLLLLiK)", (unsigned long long)(m->key >> 48),
                                (unsigned long long)((m->key >> 16) & 0xFFFFFFFFULL),
                                (unsigned long long)(m->key & 0xFFFF), m->datagrams, m->nbytes,
                                m->fresh, m->fresh_elems, m->fresh_drop, m->fresh_retx,
                                m->payload_bytes, m->bound, (unsigned long long)m->nonce_next);
    if (t == NULL)
        return -1;
    int err = PyList_Append((PyObject *)context, t);
    Py_DECREF(t);
    return err;
}

static PyObject *table_next(MessageTableObject *self, PyObject *args) {
    PyObject *buf_obj;
    int report = 1;
    if (!table_ready(self) || !PyArg_ParseTuple(args, "O|p:next", &buf_obj, &report))
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(buf_obj, &view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        return NULL;
    Run handover = {0, 0, 0};
    int kind;
    table_lock(self);
    if (self->pending != TAKE_DONE) { /* (a receive call's step met it) */
        kind = self->pending;
        handover = self->pending_run;
        self->pending = TAKE_DONE;
    } else {
        Py_BEGIN_ALLOW_THREADS
        kind = take_next(&self->t, (unsigned char *)view.buf, view.len, &handover);
        Py_END_ALLOW_THREADS
    }
    PyObject *taken = Py_NewRef(Py_None);
    /* (a handover is always reported with what came before it: Python applies
     * those counts before it takes the run handed over) */
    if (self->t.n_touched && (report || kind != TAKE_DONE)) {
        Py_SETREF(taken, PyList_New(0));
        if (taken != NULL && take_report(&self->t, report_taken, taken) < 0)
            Py_CLEAR(taken);
    }
    table_unlock(self);
    PyBuffer_Release(&view);
    if (taken == NULL)
        return NULL;
    if (kind == TAKE_DONE)
        return Py_BuildValue("(ON)", Py_None, taken);
    return Py_BuildValue("((nnni)N)", handover.start, handover.end, handover.seg, kind, taken);
}

static Py_ssize_t table_len(MessageTableObject *self) { return self->t.n_live; }

static PyObject *table_take_rates(MessageTableObject *self, PyObject *args) {
    PyObject *capsule;
    unsigned job, first, shared_flag, auth_flag = 0;
    if (!table_ready(self) || !PyArg_ParseTuple(args, "OIII|I:take_rates", &capsule, &job, &first,
                                                &shared_flag, &auth_flag))
        return NULL;
    if (job > 0xFFFF || first > 0xFF || shared_flag > 0xFF) {
        PyErr_Format(PyExc_ValueError, "job %u, first byte %u or shared_flag %u out of range", job,
                     first, shared_flag);
        return NULL;
    }
    if (auth_flag > 0xFF || (auth_flag & (auth_flag - 1)) || (auth_flag & shared_flag)) {
        PyErr_Format(PyExc_ValueError, "auth_flag %u is not one flag bit apart from shared_flag %u",
                     auth_flag, shared_flag);
        return NULL;
    }
    TagCheck tags = {NULL, NULL};
    if (auth_flag) {
#ifdef DLCP_LIBCRYPTO
        tags = (TagCheck){control_tag_verifies, self};
#else
        PyErr_SetString(PyExc_ValueError,
                        "take_rates: an auth_flag was given but dlcp.io._udpio was built without "
                        "OpenSSL's libcrypto: it verifies no tags (VERIFIES_TAGS is False)");
        return NULL;
#endif
    }
    if (!PyCapsule_IsValid(capsule, DLCP_PACER_API_NAME)) {
        PyErr_Format(PyExc_TypeError, "take_rates: pacer_api must be %s, not %.100s",
                     DLCP_PACER_API_NAME, Py_TYPE(capsule)->tp_name);
        return NULL;
    }
    const DlcpPacerApi *api = PyCapsule_GetPointer(capsule, DLCP_PACER_API_NAME);
    if (api->version != DLCP_PACER_API_VERSION) {
        PyErr_Format(PyExc_ValueError, "the engine's pacer API is version %d, this loop reads %d",
                     api->version, DLCP_PACER_API_VERSION);
        return NULL;
    }
    table_lock(self);
    Py_INCREF(capsule);
    Py_XSETREF(self->control.api_owner, capsule);
    self->control.api = api;
    self->control.rules = (ControlRules){(uint8_t)first,
                                         (uint8_t)shared_flag,
                                         (uint16_t)job,
                                         self->control.rules.stop_first,
                                         self->control.rules.finish_first,
                                         (uint8_t)auth_flag};
    self->control.tags = tags;
    table_unlock(self);
    Py_RETURN_NONE;
}

static PyObject *table_rate_pacer(MessageTableObject *self, PyObject *args) {
    unsigned src;
    PyObject *pacer;
    if (!table_ready(self) || !PyArg_ParseTuple(args, "IO:rate_pacer", &src, &pacer))
        return NULL;
    if (self->control.api == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "rate_pacer: call take_rates first");
        return NULL;
    }
    if (src > 0xFFFF) {
        PyErr_Format(PyExc_ValueError, "rank %u out of range", src);
        return NULL;
    }
    if (pacer != Py_None && !PyObject_TypeCheck(pacer, self->control.api->pacer_type)) {
        PyErr_Format(PyExc_TypeError, "rate_pacer: a native engine's Pacer, not %.100s",
                     Py_TYPE(pacer)->tp_name);
        return NULL;
    }
    table_lock(self);
    int err = control_watch_pacer(&self->control, src, pacer == Py_None ? NULL : pacer);
    table_unlock(self);
    if (err < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *table_watch_control(MessageTableObject *self, PyObject *args) {
    int fd;
    unsigned src;
    PyObject *tag_key = Py_None;
    if (!table_ready(self) ||
        !PyArg_ParseTuple(args, "iI|O:watch_control", &fd, &src, &tag_key))
        return NULL;
    if (fd < 0 || src > 0xFFFF) {
        PyErr_Format(PyExc_ValueError, "watch_control: descriptor %d or rank %u out of range", fd,
                     src);
        return NULL;
    }
    /* (the key src's tags verify under, shared with its data: table_verifier) */
    if (tag_key != Py_None && table_verifier(self, src, tag_key) == NULL)
        return NULL;
    table_lock(self);
    int err = control_watch_add(&self->control, fd, src);
    table_unlock(self);
    if (err < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *table_unwatch_control(MessageTableObject *self, PyObject *args) {
    int fd;
    if (!table_ready(self) || !PyArg_ParseTuple(args, "i:unwatch_control", &fd))
        return NULL;
    table_lock(self);
    int was = control_watch_remove(&self->control, fd);
    table_unlock(self);
    return PyBool_FromLong(was);
}

/* wait(epfd, timeout_ns, max_events) -> [fd, ...]: epoll.poll of the I/O thread's
 * selector (timeout_ns < 0: no limit; rounded up to whole milliseconds, as Python's
 * is), except that a watched control connection whose readiness was all RATE frames
 * is handled here (control_watch_absorb) and the wait goes on. The table's lock is
 * taken only around that, so that callers register messages meanwhile. */
static PyObject *table_wait(MessageTableObject *self, PyObject *args) {
    int epfd, max_events;
    long long timeout_ns;
    if (!table_ready(self) || !PyArg_ParseTuple(args, "iLi:wait", &epfd, &timeout_ns, &max_events))
        return NULL;
    struct epoll_event events[64];
    if (max_events < 1)
        max_events = 1;
    if (max_events > 64)
        max_events = 64;
    int n = 0, err = 0;
    Py_BEGIN_ALLOW_THREADS
    int64_t now = linger_clock_ns();
    int64_t end = timeout_ns < 0 ? -1 : timeout_ns > INT64_MAX - now ? INT64_MAX : now + timeout_ns;
    for (;;) {
        int ms = -1;
        /* (a STOP kept: Python's turn by then) */
        int64_t due = __atomic_load_n(&self->control.due_ns, __ATOMIC_RELAXED);
        int64_t until = end < 0 || due < end ? due : end;
        if (until != INT64_MAX) {
            int64_t left = until - linger_clock_ns();
            int64_t msl = left <= 0 ? 0 : (left + 999999) / 1000000;
            ms = msl > INT_MAX ? INT_MAX : (int)msl;
        }
        n = epoll_wait(epfd, events, max_events, ms);
        if (n < 0) {
            err = errno == EINTR ? 0 : errno;
            n = 0;
            break;
        }
        if (n == 0)
            break;
        int kept = 0;
        pthread_mutex_lock(&self->lock);
        for (int i = 0; i < n; i++)
            if (!control_watch_absorb(&self->control, events[i].data.fd))
                events[kept++] = events[i];
        pthread_mutex_unlock(&self->lock);
        n = kept;
        if (n > 0 || ms == 0)
            break;
    }
    Py_END_ALLOW_THREADS
    if (err) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    PyObject *ready = PyList_New(n);
    for (int i = 0; ready != NULL && i < n; i++) {
        PyObject *fd = PyLong_FromLong(events[i].data.fd);
        if (fd == NULL)
            Py_CLEAR(ready);
        else
            PyList_SET_ITEM(ready, i, fd);
    }
    return ready;
}

static PyObject *table_control_counts(MessageTableObject *self, PyObject *unused) {
    (void)unused;
    if (!table_ready(self))
        return NULL;
    table_lock(self);
    const ControlWatch *w = &self->control;
    long long taken = w->rates_taken, cut = w->cut_reads, stops = w->stops_taken,
              stopped = w->rounds_stopped, finishes = w->finishes_taken;
    table_unlock(self);
    return Py_BuildValue("(LLLLL)", taken, cut, stops, stopped, finishes);
}

/* the longest hold or crossing window a table takes (an hour, in nanoseconds) */
#define MAX_WAIT_NS (3600LL * 1000000000LL)

/* take_stops(first, hold_ns): from now on the waits take STOP frames too (first: a
 * STOP's first byte; 0: no more), each kept for Python's turn at most hold_ns. */
static PyObject *table_take_stops(MessageTableObject *self, PyObject *args) {
    unsigned first;
    long long hold_ns;
    if (!table_ready(self) || !PyArg_ParseTuple(args, "IL:take_stops", &first, &hold_ns))
        return NULL;
    if (first > 0xFF || hold_ns < 0 || hold_ns > MAX_WAIT_NS) {
        PyErr_Format(PyExc_ValueError, "take_stops: first byte %u or hold_ns %lld out of range",
                     first, hold_ns);
        return NULL;
    }
    if (self->control.api == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "take_stops: call take_rates first");
        return NULL;
    }
    table_lock(self);
    self->control.rules.stop_first = (uint8_t)first;
    self->control.hold_ns = hold_ns;
    table_unlock(self);
    Py_RETURN_NONE;
}

/* absorb(fd) -> bool: the frames at the head of watched connection fd taken as a wait
 * takes them (control_watch_absorb); whether that was all it had. */
static PyObject *table_absorb(MessageTableObject *self, PyObject *args) {
    int fd;
    if (!table_ready(self) || !PyArg_ParseTuple(args, "i:absorb", &fd))
        return NULL;
    table_lock(self);
    int all = control_watch_absorb(&self->control, fd);
    table_unlock(self);
    return PyBool_FromLong(all);
}

/* take_finishes(first, crossed_ns, keys): from now on the waits drop the FINISH frames
 * of messages that completed here less than crossed_ns ago (first: a FINISH's first
 * byte; 0: no more), remembering the last `keys` messages that ended (ended()). */
static PyObject *table_take_finishes(MessageTableObject *self, PyObject *args) {
    unsigned first;
    long long crossed_ns;
    Py_ssize_t keys;
    if (!table_ready(self) ||
        !PyArg_ParseTuple(args, "ILn:take_finishes", &first, &crossed_ns, &keys))
        return NULL;
    if (first > 0xFF || crossed_ns < 0 || crossed_ns > MAX_WAIT_NS || keys < 1 ||
        keys > CONTROL_ENDED_KEYS) {
        PyErr_Format(PyExc_ValueError,
                     "take_finishes: first byte %u, crossed_ns %lld or keys %zd out of range "
                     "(keys: 1 to %d)",
                     first, crossed_ns, keys, CONTROL_ENDED_KEYS);
        return NULL;
    }
    if (self->control.api == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "take_finishes: call take_rates first");
        return NULL;
    }
    table_lock(self);
    ControlWatch *w = &self->control;
    w->rules.finish_first = (uint8_t)first;
    w->crossed_ns = first ? crossed_ns : 0;
    w->ended_cap = (size_t)keys;
    w->n_ended = w->ended_next = 0;
    table_unlock(self);
    Py_RETURN_NONE;
}

/* ended(src, step, msg, completed_at): message (src, step, msg) ended here, completed
 * at completed_at on the monotonic clock (None: it ended another way). */
static PyObject *table_ended(MessageTableObject *self, PyObject *args) {
    unsigned src;
    unsigned long step, msg;
    PyObject *at_obj;
    if (!table_ready(self) || !PyArg_ParseTuple(args, "IkkO:ended", &src, &step, &msg, &at_obj))
        return NULL;
    double at = 0;
    if (at_obj != Py_None && ((at = PyFloat_AsDouble(at_obj)) == -1.0 && PyErr_Occurred()))
        return NULL;
    if (src > 0xFFFF || step > 0xFFFFFFFFUL || msg > 0xFFFF || !(fabs(at) < 1e9)) {
        PyErr_Format(PyExc_ValueError, "ended: rank %u, step %lu, msg %lu or time out of range",
                     src, step, msg);
        return NULL;
    }
    table_lock(self);
    control_watch_ended(&self->control, src, (uint32_t)step, (uint32_t)msg,
                        (int64_t)(at * 1e9), at_obj != Py_None);
    table_unlock(self);
    Py_RETURN_NONE;
}

/* waiting(delta) -> kept: callers waiting for a send's future, counted up or down by
 * delta (while any waits, the waits take no STOP); how many STOPs are kept, looked at
 * after the count changed (_control_watch.h). */
static PyObject *table_waiting(MessageTableObject *self, PyObject *args) {
    int delta;
    if (!table_ready(self) || !PyArg_ParseTuple(args, "i:waiting", &delta))
        return NULL;
    __atomic_add_fetch(&self->control.waiters, delta, __ATOMIC_SEQ_CST);
    table_lock(self);
    size_t n = self->control.n_stash;
    table_unlock(self);
    return PyLong_FromSize_t(n);
}

/* stops() -> [(src, datagram, t), ...]: the STOPs the waits kept since the last
 * call, in the order they were taken (the stash is empty after it). */
static PyObject *table_stops(MessageTableObject *self, PyObject *unused) {
    (void)unused;
    if (!table_ready(self))
        return NULL;
    ControlWatch *w = &self->control;
    StashedStop kept[CONTROL_STASH_STOPS];
    table_lock(self);
    size_t n = w->n_stash;
    if (n > 0)
        memcpy(kept, w->stash, n * sizeof *kept);
    table_unlock(self);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list != NULL && i < n; i++) {
        PyObject *item = Py_BuildValue("(Iy#d)", kept[i].src, (const char *)kept[i].datagram,
                                       (Py_ssize_t)kept[i].len,
                                       (double)kept[i].t_ns * 1e-9);
        if (item == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    if (list == NULL || n == 0) /* (kept for the next call: their rounds are stopped) */
        return list;
    table_lock(self); /* (a wait may have kept more meanwhile: they stay, in order) */
    memmove(w->stash, w->stash + n, (w->n_stash - n) * sizeof *w->stash);
    w->n_stash -= n;
    int64_t due = w->n_stash ? w->stash[0].t_ns + w->hold_ns : INT64_MAX;
    __atomic_store_n(&w->due_ns, due, __ATOMIC_RELAXED);
    table_unlock(self);
    return list;
}

static PyMethodDef table_methods[] = {
    {"register", (PyCFunction)table_register, METH_VARARGS,
     "register(src, step, msg, out, received, received_class, chunk_elems, msg_elems, "
     "itemsize, dtype_byte, stream, add, received_elems, received_protected, complete_elems, "
     "complete_protected, tag_key=None, nonce_floor=0): take this message's runs from now on, "
     "those whose tags verify under tag_key and nonces are at least nonce_floor if given (see "
     "the module source)."},
    {"sync", (PyCFunction)table_sync, METH_VARARGS,
     "sync(src, step, msg, received_elems, received_protected, complete_elems, "
     "complete_protected) -> registered: the counts that say when its completion check is due."},
    {"unregister", (PyCFunction)table_unregister, METH_VARARGS,
     "unregister(src, step, msg) -> was registered: no more writes to its buffers."},
    {"receive", (PyCFunction)table_receive, METH_VARARGS,
     "receive(fd, buf, budget, max_reads, read_size, step, screen, linger_ns=0, watch_fd=-1, "
     "nap_ns=0, trickle_ns=0) "
     "-> (nbytes, reads, empty, errno, kept, drained, lingered_ns): read, pre-filter and take "
     "runs in steps, staging the last step's for next(); with linger_ns, wait that long for "
     "more data while no other file of the epoll set watch_fd is ready; with nap_ns, go on "
     "taking a trickle in naps of nap_ns until trickle_ns."},
    {"stage", (PyCFunction)table_stage, METH_VARARGS,
     "stage(buf, runs): stage (start, end, segment_size) runs of buf for next()."},
    {"next", (PyCFunction)table_next, METH_VARARGS,
     "next(buf, report=True) -> (handover, taken): take staged runs until one needs Python; "
     "taken: what each message took since the last report (None: nothing, or report false "
     "and no handover: the counts stay for a later call, as within a receive call)."},
    {"take_rates", (PyCFunction)table_take_rates, METH_VARARGS,
     "take_rates(pacer_api, job, first, shared_flag): while receive() lingers or wait() "
     "waits, the RATE frames at the head of a watched control connection go to their "
     "source's pacer "
     "(pacer_api: dlcp.io._engine.PACER_API; first: a RATE's first byte; see "
     "dlcp/io/_control_frames.h)."},
    {"rate_pacer", (PyCFunction)table_rate_pacer, METH_VARARGS,
     "rate_pacer(src, pacer): the native Pacer that src's RATE reports go to (None: Python)."},
    {"watch_control", (PyCFunction)table_watch_control, METH_VARARGS,
     "watch_control(fd, src): the loop may take src's RATE frames from inbound control "
     "connection fd (whose stream Python holds no partial frame of)."},
    {"unwatch_control", (PyCFunction)table_unwatch_control, METH_VARARGS,
     "unwatch_control(fd) -> was watched: it is not any more (before fd is closed)."},
    {"wait", (PyCFunction)table_wait, METH_VARARGS,
     "wait(epfd, timeout_ns, max_events) -> [fd, ...]: epoll_wait on epfd, the RATE frames "
     "of watched control connections taken as the linger takes them (the wait goes on "
     "while that was all that came)."},
    {"control_counts", (PyCFunction)table_control_counts, METH_NOARGS,
     "control_counts() -> (rates_taken, cut_reads, stops_taken, rounds_stopped, "
     "finishes_taken): RATE reports the loop handed to pacers, reads that took part of a "
     "frame (none expected), STOPs it kept for Python, the engine's rounds they stopped, and "
     "FINISHes it dropped (their message had completed)."},
    {"absorb", (PyCFunction)table_absorb, METH_VARARGS,
     "absorb(fd) -> bool: take the frames at the head of watched connection fd as a wait "
     "takes them; whether that was all it had."},
    {"take_finishes", (PyCFunction)table_take_finishes, METH_VARARGS,
     "take_finishes(first, crossed_ns, keys): the waits drop the FINISH frames of messages "
     "that completed here less than crossed_ns ago, of the last `keys` that ended (ended())."},
    {"ended", (PyCFunction)table_ended, METH_VARARGS,
     "ended(src, step, msg, completed_at): a message ended here (completed_at: when it "
     "completed, on the monotonic clock; None: it did not)."},
    {"take_stops", (PyCFunction)table_take_stops, METH_VARARGS,
     "take_stops(first, hold_ns): the waits take the STOP frames of watched connections too, "
     "stop the engine's round each ends and keep them for stops(); a wait ends at most "
     "hold_ns after the first STOP kept (first: a STOP's first byte; 0: no more)."},
    {"waiting", (PyCFunction)table_waiting, METH_VARARGS,
     "waiting(delta) -> kept: count callers waiting for a send up or down (while any waits, "
     "STOPs are left to Python); how many STOPs are kept for stops()."},
    {"stops", (PyCFunction)table_stops, METH_NOARGS,
     "stops() -> [(src, datagram, t), ...]: the STOPs kept since the last call, oldest first."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods table_sequence = {.sq_length = (lenfunc)table_len};

static PyTypeObject MessageTableType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dlcp.io._udpio.MessageTable",
    .tp_basicsize = sizeof(MessageTableObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The messages under way whose runs the receive loop scatters itself (see the "
              "module source).",
    .tp_new = table_new,
    .tp_init = (initproc)table_init,
    .tp_dealloc = (destructor)table_dealloc,
    .tp_methods = table_methods,
    .tp_as_sequence = &table_sequence,
};

/* send_now's and recv_now's answer: the bytes moved; where the call would have
   waited (or a signal came) 0, or None for recv_now (`none`); else OSError */
static PyObject *now_answer(ssize_t moved, int err, int none) {
    if (moved >= 0)
        return PyLong_FromSsize_t(moved);
    if (err != EAGAIN && err != EWOULDBLOCK && err != EINTR) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (none)
        Py_RETURN_NONE;
    return PyLong_FromLong(0);
}

static PyObject *send_now(PyObject *self, PyObject *args) {
    (void)self;
    int fd;
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "iy*:send_now", &fd, &data))
        return NULL;
    ssize_t sent = send(fd, data.buf, (size_t)data.len, MSG_DONTWAIT | MSG_NOSIGNAL);
    int err = errno;
    PyBuffer_Release(&data);
    return now_answer(sent, err, 0);
}

static PyObject *recv_now(PyObject *self, PyObject *args) {
    (void)self;
    int fd;
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "iw*:recv_now", &fd, &buf))
        return NULL;
    ssize_t got = recv(fd, buf.buf, (size_t)buf.len, MSG_DONTWAIT);
    int err = errno;
    PyBuffer_Release(&buf);
    return now_answer(got, err, 1);
}

static int every_finish(void *ctx, uint32_t step, uint32_t msg) {
    (void)ctx, (void)step, (void)msg;
    return 1;
}

#ifdef DLCP_LIBCRYPTO
/* TagCheck under one key, whatever the source (control_frames_py's). */
static int one_key_verifies(void *ctx, unsigned src, const uint8_t *d, size_t len) {
    (void)src;
    return gmac_verify_control((Gmac *)ctx, d, len) == 1;
}
#endif

/* control_frames(data, job, first, shared_flag, src, stop_first=0, finish_first=0,
 * auth_flag=0, tag_key=None) -> (consumed, frames): the frames at the head of a
 * control stream that the waits would take (_control_frames.h; a valid FINISH as if
 * its message had completed; with auth_flag, tagged frames whose tags verify under
 * tag_key, an AES key), at most CONTROL_WATCH_FRAMES of them, each ("rate",
 * bytes_per_s, window, shared), ("stop", step, msg) or ("finish", step, msg); for
 * tests. */
static PyObject *control_frames_py(PyObject *mod, PyObject *args) {
    (void)mod;
    Py_buffer data, key = {0};
    unsigned job, first, shared_flag, src, stop_first = 0, finish_first = 0, auth_flag = 0;
    if (!PyArg_ParseTuple(args, "y*IIII|IIIz*:control_frames", &data, &job, &first,
                          &shared_flag, &src, &stop_first, &finish_first, &auth_flag, &key))
        return NULL;
    if (auth_flag > 0xFF || (key.buf != NULL && key.len != 16 && key.len != 24 && key.len != 32)) {
        PyErr_Format(PyExc_ValueError,
                     "control_frames: auth_flag %u out of range or a tag_key of %zd bytes "
                     "(an AES key: 16, 24 or 32)",
                     auth_flag, key.buf != NULL ? key.len : (Py_ssize_t)0);
        PyBuffer_Release(&data);
        if (key.buf != NULL)
            PyBuffer_Release(&key);
        return NULL;
    }
    ControlRules rules = {(uint8_t)first,     (uint8_t)shared_flag,   (uint16_t)job,
                          (uint8_t)stop_first, (uint8_t)finish_first, (uint8_t)auth_flag};
    FinishFilter finishes = {every_finish, NULL};
    ControlFrame frames[CONTROL_WATCH_FRAMES];
    size_t count = 0, consumed = 0;
    TagCheck tags = {NULL, NULL}; /* (no key: no tag verifies) */
#ifdef DLCP_LIBCRYPTO
    Gmac gmac = {NULL, NULL};
    if (key.buf != NULL && gmac_init(&gmac, key.buf, (size_t)key.len) == 0)
        tags = (TagCheck){one_key_verifies, &gmac};
#endif
    if (job <= 0xFFFF && first <= 0xFF && shared_flag <= 0xFF && src <= 0xFFFF &&
        stop_first <= 0xFF && finish_first <= 0xFF)
        consumed = control_frames(data.buf, (size_t)data.len, &rules, &tags, src, frames,
                                  CONTROL_WATCH_FRAMES, CONTROL_WATCH_FRAMES, &finishes, &count);
#ifdef DLCP_LIBCRYPTO
    gmac_free(&gmac);
#endif
    PyBuffer_Release(&data);
    if (key.buf != NULL)
        PyBuffer_Release(&key);
    PyObject *list = PyList_New((Py_ssize_t)count);
    for (size_t i = 0; list != NULL && i < count; i++) {
        const ControlFrame *f = &frames[i];
        PyObject *item = f->kind == FRAME_RATE
                             ? Py_BuildValue("(sddO)", "rate", f->rate.bytes_per_s,
                                             f->rate.window, f->rate.shared ? Py_True : Py_False)
                             : Py_BuildValue("(sII)", f->kind == FRAME_STOP ? "stop" : "finish",
                                             f->step, f->msg);
        if (item == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    if (list == NULL)
        return NULL;
    return Py_BuildValue("(nN)", (Py_ssize_t)consumed, list);
}

static PyMethodDef methods[] = {
    {"control_frames", control_frames_py, METH_VARARGS,
     "control_frames(data, job, first, shared_flag, src, stop_first=0, finish_first=0, "
     "auth_flag=0, tag_key=None) -> (consumed, frames): the RATE, STOP and FINISH frames at "
     "the head of a control stream that the receive loop's waits take themselves "
     "(dlcp/io/_control_frames.h; a FINISH as if its message had completed; with auth_flag, "
     "tagged frames whose tags verify under tag_key), as (\"rate\", bytes_per_s, window, "
     "shared), (\"stop\", step, msg) or (\"finish\", step, msg); for tests."},
    {"send_now", send_now, METH_VARARGS,
     "send_now(fd, data) -> sent: one non-blocking send on a stream socket, holding the "
     "GIL; 0 where it would block (see the module source)."},
    {"recv_now", recv_now, METH_VARARGS,
     "recv_now(fd, buf) -> received or None: one non-blocking recv into buf, holding the "
     "GIL; None where it would block, 0 at the end (see the module source)."},
    {"send_gathered", send_gathered_py, METH_VARARGS,
     "send_gathered(fd, heads, head, payload, chunk, per_message, host, port, tos) -> sent: "
     "datagrams gathered from a header each and consecutive chunks of payload (see the "
     "module source)."},
    {"send_batch", send_batch, METH_VARARGS,
     "send_batch(fd, data, segment_size, per_message, host, port, tos) -> sent: the datagrams "
     "of a batch, per_message per (GSO) message, many messages per sendmmsg call; those the "
     "host's queue dropped (ENOBUFS) are not counted (see the module source)."},
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

PyMODINIT_FUNC PyInit__udpio(void) {
    if (PyType_Ready(&MessageTableType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
#ifdef DLCP_LIBCRYPTO
    int verifies_tags = 1;
#else
    int verifies_tags = 0;
#endif
    if (PyModule_AddObjectRef(m, "MessageTable", (PyObject *)&MessageTableType) < 0 ||
        PyModule_AddObjectRef(m, "VERIFIES_TAGS", verifies_tags ? Py_True : Py_False) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
