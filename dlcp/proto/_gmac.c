/*
 * dlcp.proto._gmac: AES-GMAC over runs of data records in one call (docs/spec.md §3),
 * with OpenSSL's libcrypto and without the GIL. dlcp/proto/auth.py is the reference
 * and the Python face; this module is built only where libcrypto's headers are.
 *
 *   take_nonces(cell, n) -> first           reserve n nonces of a counter cell
 *   seal_data(records, lengths, start, stop, key, first)
 *                                           nonce and tag of records [start, stop)
 *   verify_data(records, lengths, rows, key, ok) -> failed
 *                                           ok[i] = tag of record rows[i] is right
 *   Verifier(key).verified_prefix(buf, segment_size, floor=0) -> (n, nonce_next)
 *                                           leading datagrams of one receive whose
 *                                           nonces are at least floor and tags are
 *                                           right, under a key expanded once, and one
 *                                           above their highest nonce (0: none)
 *   LIBCRYPTO_VERSION                       the version string of the libcrypto loaded
 *                                           (the one the engines seal and verify with)
 *   backend() -> "modes", "evp" or "sized"  how this module's keys compute tags now
 *   use_backend(name) -> previous           how its later keys do: "auto" (as the
 *                                           engines do, gmac.h), "modes", "evp" or
 *                                           "sized" (the same tags: tests, benchmarks)
 *   seal_gathered(header, payload, trailer, key, nonce)
 *                                           the engine's sealing of a datagram sent
 *                                           from three places (tests)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <openssl/crypto.h>

#include "gmac.h"

/* A writable (or readable) C-contiguous 2-D uint8 buffer of records: *stride its rows' bytes. */
static int get_records(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t *n,
                       Py_ssize_t *stride) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0)
        return -1;
    if (view->ndim != 2 || view->itemsize != 1) {
        PyErr_SetString(PyExc_ValueError, "records must be a 2-D uint8 array (n, stride)");
        PyBuffer_Release(view);
        return -1;
    }
    *n = view->shape[0];
    *stride = view->shape[1];
    return 0;
}

/* A contiguous int64 array of at least `need` items. */
static int get_int64(PyObject *obj, Py_buffer *view, Py_ssize_t need, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    const char *f = view->format ? view->format + strlen(view->format) - 1 : "";
    if (view->itemsize != 8 || strchr("qlQL", *f) == NULL || view->len / 8 < need) {
        PyErr_Format(PyExc_ValueError, "%s must be an int64 array of at least %zd items", name,
                     need);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* Whether a record length fits a tagged data record in a row of `stride` bytes. */
static int length_ok(int64_t len, Py_ssize_t stride) {
    return len >= GMAC_DATA_HEADER_LEN + GMAC_TRAILER_LEN && len <= stride;
}

/* How this module's keys compute tags (use_backend), and the names it takes. */
static int module_backend = GMAC_AUTO;
static const char *const backend_names[] = {"auto", "modes", "evp", "sized"};

static int key_of(Py_buffer *key, Gmac *g) {
    if (gmac_init_backend(g, (const uint8_t *)key->buf, (size_t)key->len, module_backend) < 0) {
        PyErr_Format(PyExc_ValueError,
                     "authentication key must be 16, 24 or 32 bytes (an AES key), got %zd",
                     key->len);
        return -1;
    }
    return 0;
}

static PyObject *backend(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(args)) {
    int b = module_backend == GMAC_AUTO ? gmac_auto_backend() : module_backend;
    return PyUnicode_FromString(backend_names[b]);
}

static PyObject *use_backend(PyObject *Py_UNUSED(self), PyObject *args) {
    const char *name;
    if (!PyArg_ParseTuple(args, "s:use_backend", &name))
        return NULL;
    for (int b = GMAC_AUTO; b <= GMAC_SIZED; b++)
        if (strcmp(name, backend_names[b]) == 0) {
            const char *previous = backend_names[module_backend];
            module_backend = b;
            return PyUnicode_FromString(previous);
        }
    PyErr_Format(PyExc_ValueError, "unknown AES-GMAC backend %R: 'auto', 'modes', 'evp' or 'sized'",
                 PyTuple_GET_ITEM(args, 0));
    return NULL;
}

static PyObject *seal_gathered(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer header, payload, trailer, key;
    unsigned long long nonce;
    if (!PyArg_ParseTuple(args, "y*y*w*y*K:seal_gathered", &header, &payload, &trailer, &key,
                          &nonce))
        return NULL;
    PyObject *result = NULL;
    Gmac g = {NULL};
    if (header.len != GMAC_DATA_HEADER_LEN || trailer.len != GMAC_TRAILER_LEN)
        PyErr_Format(PyExc_ValueError, "a data header is %d bytes and a trailer %d, got %zd and %zd",
                     (int)GMAC_DATA_HEADER_LEN, (int)GMAC_TRAILER_LEN, header.len, trailer.len);
    else if (key_of(&key, &g) == 0) {
        if (gmac_seal_gathered(&g, header.buf, payload.buf, (size_t)payload.len, trailer.buf,
                               (uint64_t)nonce) < 0)
            PyErr_SetString(PyExc_RuntimeError, "libcrypto failed to compute an AES-GMAC tag");
        else
            result = Py_NewRef(Py_None);
        gmac_free(&g);
    }
    PyBuffer_Release(&header);
    PyBuffer_Release(&payload);
    PyBuffer_Release(&trailer);
    PyBuffer_Release(&key);
    return result;
}

static PyObject *take_nonces(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer cell;
    unsigned long long n;
    if (!PyArg_ParseTuple(args, "w*K:take_nonces", &cell, &n))
        return NULL;
    uint64_t first = 0;
    int bad = cell.len != 8 || ((uintptr_t)cell.buf & 7) != 0;
    int exhausted = !bad && gmac_take_nonces((uint64_t *)cell.buf, n, &first) < 0;
    PyBuffer_Release(&cell);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "a nonce cell is one aligned uint64");
        return NULL;
    }
    if (exhausted) {
        PyErr_SetString(PyExc_OverflowError,
                        "nonce counter exhausted: derive a new key (a new run)");
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(first);
}

static PyObject *seal_data(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *records_obj, *lengths_obj;
    Py_ssize_t start, stop;
    Py_buffer key;
    unsigned long long first;
    if (!PyArg_ParseTuple(args, "OOnny*K:seal_data", &records_obj, &lengths_obj, &start, &stop,
                          &key, &first))
        return NULL;
    Py_buffer records, lengths;
    Py_ssize_t n, stride;
    Gmac g = {NULL};
    PyObject *result = NULL;
    if (get_records(records_obj, &records, 1, &n, &stride) < 0)
        goto out_key;
    if (start < 0 || stop > n || start > stop) {
        PyErr_Format(PyExc_IndexError, "records [%zd, %zd) of %zd", start, stop, n);
        goto out_records;
    }
    if (get_int64(lengths_obj, &lengths, stop, "lengths") < 0)
        goto out_records;
    const int64_t *len = (const int64_t *)lengths.buf;
    for (Py_ssize_t i = start; i < stop; i++)
        if (!length_ok(len[i], stride)) {
            PyErr_Format(PyExc_ValueError, "record %zd: length %lld cannot hold a tagged datagram",
                         i, (long long)len[i]);
            goto out_lengths;
        }
    if (key_of(&key, &g) < 0)
        goto out_lengths;
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    uint8_t *base = (uint8_t *)records.buf;
    for (Py_ssize_t i = start; i < stop && !failed; i++)
        failed = gmac_seal_data(&g, base + i * stride, (size_t)len[i],
                                (uint64_t)first + (uint64_t)(i - start)) < 0;
    Py_END_ALLOW_THREADS
    gmac_free(&g);
    if (failed)
        PyErr_SetString(PyExc_RuntimeError, "libcrypto failed to compute an AES-GMAC tag");
    else
        result = Py_NewRef(Py_None);
out_lengths:
    PyBuffer_Release(&lengths);
out_records:
    PyBuffer_Release(&records);
out_key:
    PyBuffer_Release(&key);
    return result;
}

static PyObject *verify_data(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *records_obj, *lengths_obj, *rows_obj;
    Py_buffer key, ok;
    if (!PyArg_ParseTuple(args, "OOOy*w*:verify_data", &records_obj, &lengths_obj, &rows_obj,
                          &key, &ok))
        return NULL;
    Py_buffer records, lengths, rows;
    Py_ssize_t n, stride;
    Gmac g = {NULL};
    PyObject *result = NULL;
    if (get_records(records_obj, &records, 0, &n, &stride) < 0)
        goto out_args;
    if (get_int64(lengths_obj, &lengths, n, "lengths") < 0)
        goto out_records;
    if (get_int64(rows_obj, &rows, 0, "rows") < 0)
        goto out_lengths;
    Py_ssize_t n_rows = rows.len / 8;
    const int64_t *row = (const int64_t *)rows.buf, *len = (const int64_t *)lengths.buf;
    if (ok.len < n_rows) {
        PyErr_Format(PyExc_ValueError, "ok has %zd bytes for %zd rows", ok.len, n_rows);
        goto out_rows;
    }
    for (Py_ssize_t k = 0; k < n_rows; k++)
        if (row[k] < 0 || row[k] >= n || !length_ok(len[row[k]], stride)) {
            PyErr_Format(PyExc_ValueError, "row %lld is not a tagged record of the %zd",
                         (long long)row[k], n);
            goto out_rows;
        }
    if (key_of(&key, &g) < 0)
        goto out_rows;
    Py_ssize_t bad = 0;
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    const uint8_t *base = (const uint8_t *)records.buf;
    uint8_t *out = (uint8_t *)ok.buf;
    for (Py_ssize_t k = 0; k < n_rows && !failed; k++) {
        int right = gmac_verify_data(&g, base + row[k] * stride, (size_t)len[row[k]]);
        failed = right < 0;
        out[k] = right == 1;
        bad += right != 1;
    }
    Py_END_ALLOW_THREADS
    gmac_free(&g);
    if (failed)
        PyErr_SetString(PyExc_RuntimeError, "libcrypto failed to compute an AES-GMAC tag");
    else
        result = PyLong_FromSsize_t(bad);
out_rows:
    PyBuffer_Release(&rows);
out_lengths:
    PyBuffer_Release(&lengths);
out_records:
    PyBuffer_Release(&records);
out_args:
    PyBuffer_Release(&key);
    PyBuffer_Release(&ok);
    return result;
}

/* ------------------------------------------------------------------ Verifier */

/* A key expanded once, for the receive path's many short calls (one per receive).
 * Threads take turns with it (its lock, taken without the GIL). */
typedef struct {
    PyObject_HEAD
    Gmac gmac;
    PyThread_type_lock lock;
} Verifier;

static int Verifier_init(Verifier *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"key", NULL};
    Py_buffer key;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*:Verifier", names, &key))
        return -1;
    if (self->lock == NULL && (self->lock = PyThread_allocate_lock()) == NULL) {
        PyBuffer_Release(&key);
        PyErr_NoMemory();
        return -1;
    }
    /* The new key is expanded aside and swapped in under the lock, so that a thread
     * in verified_prefix finishes with the key it started with. */
    Gmac fresh = {0};
    int bad = key_of(&key, &fresh);
    PyBuffer_Release(&key);
    if (bad < 0)
        return -1;
    Gmac old;
    Py_BEGIN_ALLOW_THREADS
    PyThread_acquire_lock(self->lock, WAIT_LOCK);
    old = self->gmac;
    self->gmac = fresh;
    PyThread_release_lock(self->lock);
    Py_END_ALLOW_THREADS
    gmac_free(&old);
    return 0;
}

static void Verifier_dealloc(Verifier *self) {
    gmac_free(&self->gmac);
    if (self->lock != NULL)
        PyThread_free_lock(self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* How many leading datagrams of `buf` (segment_size apart, the last possibly
 * shorter, as one receive hands them over) carry a nonce of at least `floor` and
 * the right tag, and in *next one above the highest of their nonces (0: none); a
 * short last one counts only if it can hold a data header and a trailer. -1:
 * libcrypto failed. */
static Py_ssize_t prefix_of(Gmac *g, const uint8_t *buf, Py_ssize_t len, Py_ssize_t segment_size,
                            uint64_t floor, uint64_t *next) {
    const Py_ssize_t least = GMAC_DATA_HEADER_LEN + GMAC_TRAILER_LEN;
    *next = 0;
    if (segment_size < least)
        return 0;
    Py_ssize_t n = 0;
    for (Py_ssize_t at = 0; at < len; at += segment_size, n++) {
        Py_ssize_t size = len - at < segment_size ? len - at : segment_size;
        if (size < least)
            break;
        const uint8_t *p = buf + at + size - GMAC_TRAILER_LEN;
        uint64_t nonce = 0;
        for (int k = 0; k < 8; k++)
            nonce = nonce << 8 | p[k];
        if (nonce < floor)
            break;
        int right = gmac_verify_data(g, buf + at, (size_t)size);
        if (right < 0)
            return -1;
        if (!right)
            break;
        if (nonce >= *next)
            *next = nonce < UINT64_MAX ? nonce + 1 : UINT64_MAX;
    }
    return n;
}

static PyObject *Verifier_verified_prefix(Verifier *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t segment_size;
    unsigned long long floor = 0;
    if (!PyArg_ParseTuple(args, "y*n|K:verified_prefix", &buf, &segment_size, &floor))
        return NULL;
    Py_ssize_t n = -2; /* -2: no key */
    uint64_t next = 0;
    if (self->lock != NULL) {
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(self->lock, WAIT_LOCK);
        if (gmac_ready(&self->gmac))
            n = prefix_of(&self->gmac, (const uint8_t *)buf.buf, buf.len, segment_size,
                          (uint64_t)floor, &next);
        PyThread_release_lock(self->lock);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&buf);
    if (n == -2) {
        PyErr_SetString(PyExc_ValueError, "verified_prefix: the Verifier has no key");
        return NULL;
    }
    if (n < 0) {
        PyErr_SetString(PyExc_RuntimeError, "libcrypto failed to compute an AES-GMAC tag");
        return NULL;
    }
    return Py_BuildValue("(nK)", n, (unsigned long long)next);
}

static PyMethodDef Verifier_methods[] = {
    {"verified_prefix", (PyCFunction)Verifier_verified_prefix, METH_VARARGS,
     "verified_prefix(buf, segment_size, floor=0) -> (n, nonce_next): how many leading "
     "datagrams of buf (segment_size apart, the last possibly shorter) carry a nonce of at "
     "least floor and the right tag, and one above the highest of their nonces (0: none)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject VerifierType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dlcp.proto._gmac.Verifier",
    .tp_basicsize = sizeof(Verifier),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Verifier(key): AES-GMAC verification of received runs under one key, expanded "
              "once",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Verifier_init,
    .tp_dealloc = (destructor)Verifier_dealloc,
    .tp_methods = Verifier_methods,
};

static PyMethodDef methods[] = {
    {"backend", backend, METH_NOARGS,
     "backend() -> 'modes', 'evp' or 'sized': how this module's keys compute tags now"},
    {"use_backend", use_backend, METH_VARARGS,
     "use_backend(name) -> previous: how this module's later keys compute tags ('auto': as "
     "the engines, by the libcrypto and the CPU; 'modes', 'evp' or 'sized': EVP from "
     "4,112-byte datagrams; the same tags every way)"},
    {"seal_gathered", seal_gathered, METH_VARARGS,
     "seal_gathered(header, payload, trailer, key, nonce): writes the trailer's nonce and tag "
     "of a data datagram sent from three places, as the native engine seals a lent one"},
    {"take_nonces", take_nonces, METH_VARARGS,
     "take_nonces(cell, n) -> first: reserve n nonces of a uint64 counter cell, atomically"},
    {"seal_data", seal_data, METH_VARARGS,
     "seal_data(records, lengths, start, stop, key, first): nonce and AES-GMAC tag of records "
     "[start, stop), nonces first, first + 1, ..."},
    {"verify_data", verify_data, METH_VARARGS,
     "verify_data(records, lengths, rows, key, ok) -> failed: ok[k] = whether record rows[k] "
     "carries the right tag"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_gmac", "AES-GMAC over runs of DLCP data records (libcrypto)", -1,
    methods,
};

PyMODINIT_FUNC PyInit__gmac(void) {
    if (PyType_Ready(&VerifierType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Verifier", (PyObject *)&VerifierType) < 0 ||
        PyModule_AddStringConstant(m, "LIBCRYPTO_VERSION", OpenSSL_version(OPENSSL_VERSION)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
