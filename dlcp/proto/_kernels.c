/*
 * dlcp.proto._kernels: the byte-moving loops of the data path, in C.
 *
 * Optional accelerator. dlcp/proto/kernels.py falls back to numpy when this module
 * was not built; both give the same bytes (tests/proto/test_kernels.py compares them).
 * Rows must not overlap (dst and src are different buffers in every caller).
 * Pure computation on caller-owned buffers: no I/O, no global state, and the GIL is
 * released while bytes move, so the endpoint's I/O thread keeps running.
 *
 * copy_rows(dst, dst_start, dst_stride, dst_rows,
 *           src, src_start, src_stride, src_rows, n, nbytes, stream[, add])
 *     for i in range(n):
 *         d = dst_start + (dst_rows[i] if dst_rows is not None else i) * dst_stride
 *         s = src_start + (src_rows[i] if src_rows is not None else i) * src_stride
 *         dst[d : d + nbytes] = src[s : s + nbytes]
 *     (with add, the rows are float32 values added to those of dst: += instead of =)
 *     rows are int64 arrays (any object with a C-contiguous 'q' buffer). Every
 *     address is checked before the first byte moves: a bad row raises IndexError
 *     naming it and nothing is written.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h> /* (SSE2: the sampled sums and the streaming stores) */
#endif

#include "_kernels_core.h" /* copy_row, and the Python-free cores of scatter_run and swap_records */

typedef struct {
    Py_buffer view;
    int held;
} Buf;

static void buf_release(Buf *b) {
    if (b->held) {
        PyBuffer_Release(&b->view);
        b->held = 0;
    }
}

/* A C-contiguous buffer of obj (writable if asked), held until buf_release. */
static int buf_get(PyObject *obj, int writable, Buf *b) {
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &b->view, flags) < 0)
        return -1;
    b->held = 1;
    return 0;
}

/* An int64 row index array, or None (identity). */
static int get_rows(PyObject *obj, const char *name, Py_ssize_t n, Buf *out) {
    out->held = 0;
    if (obj == Py_None)
        return 0;
    if (PyObject_GetBuffer(obj, &out->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    out->held = 1;
    const char *fmt = out->view.format ? out->view.format : "B";
    if (out->view.itemsize != 8 || !(strcmp(fmt, "q") == 0 || strcmp(fmt, "l") == 0 ||
                                      strcmp(fmt, "<q") == 0 || strcmp(fmt, "=q") == 0)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int64 array, got format '%s'", name, fmt);
        buf_release(out);
        return -1;
    }
    if (out->view.len / 8 < n) {
        PyErr_Format(PyExc_ValueError, "%s has %zd rows, %zd needed", name, out->view.len / 8,
                     n);
        buf_release(out);
        return -1;
    }
    return 0;
}

/* Check that [start + row * stride, + nbytes) lies in [0, len) for every row. */
static int check_rows(const char *name, const Buf *rows, Py_ssize_t n, Py_ssize_t start,
                      Py_ssize_t stride, Py_ssize_t nbytes, Py_ssize_t len) {
    const int64_t *r = rows->held ? (const int64_t *)rows->view.buf : NULL;
    /* bounded first, so that start + row * stride + nbytes below cannot overflow */
    if (n > 0 && (start < 0 || start > len || nbytes < 0 || nbytes > len)) {
        PyErr_Format(PyExc_IndexError,
                     "%s rows of %zd bytes from byte %zd are outside a buffer of %zd", name,
                     nbytes, start, len);
        return -1;
    }
    /* row * stride in 128 bits would be exact; stride and rows are bounded by len
       here, so rows above this cannot fit and are rejected before multiplying */
    const int64_t top_row = stride > 0 ? (int64_t)(len / stride) + 1 : INT64_MAX;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t row = r ? r[i] : (int64_t)i;
        if (row < 0 || row > top_row) {
            PyErr_Format(PyExc_IndexError, "%s row %lld (item %zd) is outside the buffer", name,
                         (long long)row, i);
            return -1;
        }
        int64_t at = (int64_t)start + row * (int64_t)stride;
        if (at < 0 || at + (int64_t)nbytes > (int64_t)len) {
            PyErr_Format(PyExc_IndexError,
                         "%s row %lld (item %zd): bytes [%lld, %lld) are outside a buffer of %zd",
                         name, (long long)row, i, (long long)at, (long long)(at + nbytes), len);
            return -1;
        }
    }
    return 0;
}

/* The two buffers of a row copy and their row index arrays, every row checked. */
typedef struct {
    Buf dst, src, drows, srows;
} RowBufs;

static void row_bufs_release(RowBufs *b) {
    buf_release(&b->srows);
    buf_release(&b->drows);
    buf_release(&b->src);
    buf_release(&b->dst);
}

/* Acquire dst (writable) and src, their row arrays (or None), and check that rows
 * [start + row * stride, + bytes) lie inside each buffer. -1 with an exception set
 * (and whatever was acquired still to release) on failure. */
static int row_bufs_get(RowBufs *b, Py_ssize_t n, PyObject *dst_obj, PyObject *dst_rows_obj,
                        Py_ssize_t dst_start, Py_ssize_t dst_stride, Py_ssize_t dst_bytes,
                        PyObject *src_obj, PyObject *src_rows_obj, Py_ssize_t src_start,
                        Py_ssize_t src_stride, Py_ssize_t src_bytes) {
    if (buf_get(dst_obj, 1, &b->dst) < 0)
        return -1;
    if (buf_get(src_obj, 0, &b->src) < 0)
        return -1;
    if (get_rows(dst_rows_obj, "dst_rows", n, &b->drows) < 0 ||
        get_rows(src_rows_obj, "src_rows", n, &b->srows) < 0)
        return -1;
    if (check_rows("dst", &b->drows, n, dst_start, dst_stride, dst_bytes, b->dst.view.len) < 0 ||
        check_rows("src", &b->srows, n, src_start, src_stride, src_bytes, b->src.view.len) < 0)
        return -1;
    return 0;
}

static PyObject *copy_rows(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *dst_obj, *dst_rows_obj, *src_obj, *src_rows_obj;
    Py_ssize_t dst_start, dst_stride, src_start, src_stride, n, nbytes;
    int stream, add = 0;
    if (!PyArg_ParseTuple(args, "OnnOOnnOnnp|p:copy_rows", &dst_obj, &dst_start, &dst_stride,
                          &dst_rows_obj, &src_obj, &src_start, &src_stride, &src_rows_obj, &n,
                          &nbytes, &stream, &add))
        return NULL;
    if (n < 0 || nbytes < 0 || dst_stride < 0 || src_stride < 0) {
        PyErr_SetString(PyExc_ValueError, "n, nbytes and strides must not be negative");
        return NULL;
    }
    if (add && nbytes % 4) {
        PyErr_Format(PyExc_ValueError, "add: rows of %zd bytes are not float32 values", nbytes);
        return NULL;
    }
    RowBufs b = {0};
    PyObject *result = NULL;
    if (row_bufs_get(&b, n, dst_obj, dst_rows_obj, dst_start, dst_stride, nbytes, src_obj,
                     src_rows_obj, src_start, src_stride, nbytes) < 0)
        goto done;
    {
        char *d = (char *)b.dst.view.buf;
        const char *s = (const char *)b.src.view.buf;
        const int64_t *dr = b.drows.held ? (const int64_t *)b.drows.view.buf : NULL;
        const int64_t *sr = b.srows.held ? (const int64_t *)b.srows.view.buf : NULL;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_ssize_t di = dr ? (Py_ssize_t)dr[i] : i;
            Py_ssize_t si = sr ? (Py_ssize_t)sr[i] : i;
            place_row(d + dst_start + di * dst_stride, s + src_start + si * src_stride,
                      (size_t)nbytes, stream, add);
        }
#if defined(__SSE2__)
        if (stream)
            _mm_sfence(); /* streamed stores are visible before the caller reads */
#endif
        Py_END_ALLOW_THREADS
    }
    result = Py_NewRef(Py_None);
done:
    row_bufs_release(&b);
    return result;
}

/*
 * block_abs_mean_f32(data, chunk_elems, n_chunks, starts, block, out)
 *     out[c] = mean of |data[c * chunk_elems + b + k]| over every b in starts and
 *     k < block, summed in double: the sampled magnitude of chunk c of a float32
 *     message (dlcp/proto/packetizer.py samples blocks of 16 neighbouring values at
 *     evenly spaced places). Every sampled index is checked against len(data).
 */
/*
 * gather_records(dst, dst_stride, head_bytes, dst_rows, src, src_stride, src_rows,
 *                n, nbytes, template, fields, stream)
 *     builds n records in one pass: record r = dst_rows[i] (i when None) gets a
 *     head_bytes header at dst + r * dst_stride and, after it, nbytes from
 *     src + s * src_stride (s = src_rows[i], or i). The header is `template` with,
 *     for each (offset, size, array) in `fields`, array[r] written big-endian in
 *     `size` bytes at `offset` (array: unsigned or signed integers of 1, 2, 4 or
 *     8 bytes, native order, at least max(r) + 1 of them). Header and payload
 *     leave together: with stream set, the record's first 64 bytes (header and
 *     the start of the payload) go out as one streamed line, so no line of the
 *     record is written in part. All rows and fields are checked first.
 */
#define MAX_FIELDS 16
#define MAX_HEAD 64

typedef struct {
    int offset, size, itemsize;
    const unsigned char *data;
} Field;

/* v with its bytes in reverse order (compilers make this one bswap). */
static inline uint32_t swap32(uint32_t v) {
    return (v >> 24) | ((v >> 8) & 0xff00u) | ((v << 8) & 0xff0000u) | (v << 24);
}

/* Records whose headers gather_records builds together, one field at a time. */
#define HEADER_BLOCK 64

/* Field f of records dr[i0 + j] (i0 + j without dr), j < m, big-endian into
 * lines[j]: a loop per field whose item and field sizes are fixed, where one
 * record at a time would choose them again for every field of every record. */
static void put_field(unsigned char (*lines)[MAX_HEAD], Py_ssize_t m, const Field *f,
                      const int64_t *dr, Py_ssize_t i0) {
    uint64_t v[HEADER_BLOCK];
    const unsigned char *data = f->data;
    switch (f->itemsize) {
#define LOAD_VALUES(T)                                                                    \
    for (Py_ssize_t j = 0; j < m; j++) {                                                  \
        T x;                                                                              \
        memcpy(&x, data + (dr ? (Py_ssize_t)dr[i0 + j] : i0 + j) * (Py_ssize_t)sizeof x, \
               sizeof x);                                                                 \
        v[j] = x;                                                                         \
    }
    case 1: LOAD_VALUES(uint8_t) break;
    case 2: LOAD_VALUES(uint16_t) break;
    case 4: LOAD_VALUES(uint32_t) break;
    default: LOAD_VALUES(uint64_t) break;
#undef LOAD_VALUES
    }
    const int at = f->offset;
    switch (f->size) {
    case 1:
        for (Py_ssize_t j = 0; j < m; j++)
            lines[j][at] = (unsigned char)v[j];
        break;
    case 2:
        for (Py_ssize_t j = 0; j < m; j++) {
            uint16_t w = (uint16_t)((v[j] >> 8 & 0xff) | (v[j] & 0xff) << 8);
            memcpy(lines[j] + at, &w, 2);
        }
        break;
    case 4:
        for (Py_ssize_t j = 0; j < m; j++) {
            uint32_t w = swap32((uint32_t)v[j]);
            memcpy(lines[j] + at, &w, 4);
        }
        break;
    default:
        for (Py_ssize_t j = 0; j < m; j++) {
            uint64_t w = ((uint64_t)swap32((uint32_t)v[j]) << 32) | swap32((uint32_t)(v[j] >> 32));
            memcpy(lines[j] + at, &w, 8);
        }
        break;
    }
}

/* A record at rec: the header in line[:head_bytes], then nbytes from pay. With
 * stream, where the record starts 16-byte aligned and spans a whole line, its first
 * 64 bytes (header and payload start, put together in line) leave as one streamed
 * line and the rest streams too, so that no line of it is written in part. */
static void put_record(unsigned char *rec, unsigned char *line, Py_ssize_t head_bytes,
                       const unsigned char *pay, Py_ssize_t nbytes, int stream) {
#if defined(__SSE2__)
    if (stream && ((uintptr_t)rec & 15) == 0 && head_bytes + nbytes >= 64) {
        Py_ssize_t first = 64 - head_bytes;
        memcpy(line + head_bytes, pay, (size_t)first);
        for (int q = 0; q < 4; q++)
            _mm_stream_si128((__m128i *)(rec + 16 * q),
                             _mm_loadu_si128((const __m128i *)(line + 16 * q)));
        copy_row((char *)rec + 64, (const char *)pay + first, (size_t)(nbytes - first), 1);
        return;
    }
#endif
    memcpy(rec, line, (size_t)head_bytes);
    if (nbytes > 0) /* (headers only: nothing to copy) */
        copy_row((char *)rec + head_bytes, (const char *)pay, (size_t)nbytes, stream);
}

static PyObject *gather_records(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *dst_obj, *dst_rows_obj, *src_obj, *src_rows_obj, *fields_obj;
    Py_ssize_t dst_stride, head_bytes, src_stride, n, nbytes, template_len;
    const char *template;
    int stream;
    if (!PyArg_ParseTuple(args, "OnnOOnOnny#Op:gather_records", &dst_obj, &dst_stride,
                          &head_bytes, &dst_rows_obj, &src_obj, &src_stride, &src_rows_obj, &n,
                          &nbytes, &template, &template_len, &fields_obj, &stream))
        return NULL;
    if (n < 0 || nbytes < 0 || head_bytes < 0 || head_bytes > MAX_HEAD ||
        template_len != head_bytes || dst_stride < head_bytes + nbytes || src_stride < 0) {
        PyErr_SetString(PyExc_ValueError,
                         "need n, nbytes >= 0, a template of head_bytes <= 64 bytes and "
                         "dst_stride >= head_bytes + nbytes");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(fields_obj, "fields must be a sequence of (offset, size, array)");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n_fields = PySequence_Fast_GET_SIZE(seq);
    RowBufs b = {0};
    Buf fbuf[MAX_FIELDS];
    Field fields[MAX_FIELDS];
    Py_ssize_t n_held = 0;
    PyObject *result = NULL;
    memset(fbuf, 0, sizeof fbuf);
    if (n_fields > MAX_FIELDS) {
        PyErr_Format(PyExc_ValueError, "at most %d fields", MAX_FIELDS);
        goto done;
    }
    if (row_bufs_get(&b, n, dst_obj, dst_rows_obj, 0, dst_stride, head_bytes + nbytes, src_obj,
                     src_rows_obj, 0, src_stride, nbytes) < 0)
        goto done;
    Py_ssize_t top = b.drows.held ? -1 : n - 1; /* highest record row: every field array
                                                    must reach it */
    for (Py_ssize_t i = 0; b.drows.held && i < n; i++) {
        Py_ssize_t r = (Py_ssize_t)((const int64_t *)b.drows.view.buf)[i];
        if (r > top)
            top = r;
    }
    for (Py_ssize_t k = 0; k < n_fields; k++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, k);
        int offset, size;
        PyObject *arr;
        if (!PyArg_ParseTuple(item, "iiO:field", &offset, &size, &arr))
            goto done;
        if (buf_get(arr, 0, &fbuf[k]) < 0)
            goto done;
        n_held = k + 1;
        Py_ssize_t item_size = fbuf[k].view.itemsize;
        if ((size != 1 && size != 2 && size != 4 && size != 8) || offset < 0 ||
            (Py_ssize_t)offset > head_bytes - size || /* (offset + size may overflow) */
            (item_size != 1 && item_size != 2 && item_size != 4 && item_size != 8)) {
            PyErr_Format(PyExc_ValueError, "field %zd: %d bytes at %d do not fit a %zd-byte header "
                         "(or its array has %zd-byte items)", k, size, offset, head_bytes, item_size);
            goto done;
        }
        if (fbuf[k].view.len / item_size <= top) {
            PyErr_Format(PyExc_IndexError, "field %zd holds %zd values, row %zd needs one",
                         k, fbuf[k].view.len / item_size, top);
            goto done;
        }
        fields[k] = (Field){offset, size, (int)item_size, (const unsigned char *)fbuf[k].view.buf};
    }
    {
        unsigned char *d = (unsigned char *)b.dst.view.buf;
        const unsigned char *s = (const unsigned char *)b.src.view.buf;
        const int64_t *dr = b.drows.held ? (const int64_t *)b.drows.view.buf : NULL;
        const int64_t *sr = b.srows.held ? (const int64_t *)b.srows.view.buf : NULL;
        Py_BEGIN_ALLOW_THREADS
        /* the headers of HEADER_BLOCK records are built in `lines`, field by field;
           the template goes in once, as every record then overwrites the same field
           bytes with its own values */
        unsigned char lines[HEADER_BLOCK][MAX_HEAD];
        for (int j = 0; j < HEADER_BLOCK; j++)
            memcpy(lines[j], template, (size_t)head_bytes);
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_ssize_t j = i % HEADER_BLOCK;
            if (j == 0)
                for (Py_ssize_t k = 0; k < n_fields; k++)
                    put_field(lines, n - i < HEADER_BLOCK ? n - i : HEADER_BLOCK, &fields[k], dr,
                              i);
            unsigned char *line = lines[j];
            Py_ssize_t r = dr ? (Py_ssize_t)dr[i] : i;
            Py_ssize_t si = sr ? (Py_ssize_t)sr[i] : i;
            put_record(d + r * dst_stride, line, head_bytes, s + si * src_stride, nbytes, stream);
        }
#if defined(__SSE2__)
        if (stream)
            _mm_sfence();
#endif
        Py_END_ALLOW_THREADS
    }
    result = Py_NewRef(Py_None);
done:
    for (Py_ssize_t k = 0; k < n_held; k++)
        buf_release(&fbuf[k]);
    row_bufs_release(&b);
    Py_DECREF(seq);
    return result;
}

/*
 * swap_records(dst, dst_stride, src, src_stride, n, record_bytes, fields[, mask])
 *     copies n records of record_bytes from src to dst (strided, like copy_rows
 *     without row indices) and reverses the byte order of the fields that
 *     `fields` names: bytes of (offset, size) pairs, size 2, 4 or 8. It turns
 *     big-endian wire headers into native structured records and back; the layout
 *     comes from the caller (dlcp/proto/wire.py's dtype), none is written here.
 *     With `mask` (record_bytes bytes), it also returns whether every record
 *     agrees with the first in the bits the mask sets (None without a mask).
 */
static PyObject *swap_records(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *dst_obj, *src_obj;
    Py_ssize_t dst_stride, src_stride, n, record_bytes;
    const unsigned char *fields;
    Py_ssize_t fields_len;
    const unsigned char *mask = NULL;
    Py_ssize_t mask_len = 0;
    if (!PyArg_ParseTuple(args, "OnOnnny#|z#:swap_records", &dst_obj, &dst_stride, &src_obj,
                          &src_stride, &n, &record_bytes, &fields, &fields_len, &mask,
                          &mask_len))
        return NULL;
    SwapArgs a = {NULL, 0, dst_stride, NULL, 0, src_stride, n, record_bytes, fields,
                  fields_len, mask, mask_len};
    ssize_t bad = 0;
    switch (swap_check_args(&a, &bad)) {
    case SWAP_BAD_MASK:
        PyErr_Format(PyExc_ValueError, "mask has %zd bytes, records %zd", mask_len, record_bytes);
        return NULL;
    case SWAP_BAD_GEOMETRY:
        PyErr_SetString(PyExc_ValueError, "n must be >= 0 and strides >= record_bytes");
        return NULL;
    case SWAP_ODD_FIELDS:
        PyErr_SetString(PyExc_ValueError, "fields must be (offset, size) byte pairs");
        return NULL;
    case SWAP_BAD_FIELD:
        PyErr_Format(PyExc_ValueError, "field at %d of %d bytes does not fit a %zd-byte record",
                     fields[bad], fields[bad + 1], record_bytes);
        return NULL;
    }
    Buf dst = {0}, src = {0};
    PyObject *result = NULL;
    int same = 1;
    if (buf_get(dst_obj, 1, &dst) < 0)
        goto done;
    if (buf_get(src_obj, 0, &src) < 0)
        goto done;
    a.dst = (unsigned char *)dst.view.buf;
    a.dst_len = dst.view.len;
    a.src = (const unsigned char *)src.view.buf;
    a.src_len = src.view.len;
    if (swap_check_buffers(&a) != SWAP_OK) {
        PyErr_Format(PyExc_IndexError, "%zd records do not fit dst (%zd bytes) or src (%zd bytes)",
                     n, dst.view.len, src.view.len);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    same = swap_records_loop(&a);
    Py_END_ALLOW_THREADS
    result = mask == NULL ? Py_NewRef(Py_None) : PyBool_FromLong(same);
done:
    buf_release(&src);
    buf_release(&dst);
    return result;
}

/* The sum of |value| over the sample blocks of one chunk, in double, value by
 * value in the order of `starts`: the sampled magnitude times the values sampled. */
static inline double abs_sum(const float *chunk, const int64_t *st, Py_ssize_t n_starts,
                             Py_ssize_t block) {
    double total = 0.0;
    for (Py_ssize_t j = 0; j < n_starts; j++) {
        const float *b = chunk + st[j];
        for (Py_ssize_t k = 0; k < block; k++)
            total += fabs((double)b[k]); /* branch-free: signs are random */
    }
    return total;
}

#if defined(__SSE2__)
/* Adds |value| of one value of four chunks (v, lane q: chunk q) to the sums of
 * those chunks: *lo holds chunks 0 and 1, *hi chunks 2 and 3. */
static inline void add_abs_values(__m128d *lo, __m128d *hi, __m128 v, __m128d magnitude) {
    *lo = _mm_add_pd(*lo, _mm_and_pd(_mm_cvtps_pd(v), magnitude));
    *hi = _mm_add_pd(*hi, _mm_and_pd(_mm_cvtps_pd(_mm_movehl_ps(v, v)), magnitude));
}

/* Adds |value| of values k..k+3 of the four chunks from b on (b: value k of the
 * first; chunk_elems apart) to their sums, value by value: loaded four of a chunk
 * at a time and transposed, so that one vector add takes the same value of two
 * chunks. */
static inline void add_abs_quad(__m128d *lo, __m128d *hi, const float *b,
                                Py_ssize_t chunk_elems, __m128d magnitude) {
    __m128 v0 = _mm_loadu_ps(b), v1 = _mm_loadu_ps(b + chunk_elems),
           v2 = _mm_loadu_ps(b + 2 * chunk_elems), v3 = _mm_loadu_ps(b + 3 * chunk_elems);
    _MM_TRANSPOSE4_PS(v0, v1, v2, v3); /* v0: value k of the four chunks, v1: k + 1, ... */
    add_abs_values(lo, hi, v0, magnitude);
    add_abs_values(lo, hi, v1, magnitude);
    add_abs_values(lo, hi, v2, magnitude);
    add_abs_values(lo, hi, v3, magnitude);
}

/* Chunks that abs_sums sums at once. */
#define SUMS_AT_ONCE 8

/* abs_sum of the SUMS_AT_ONCE chunks from `chunk` on (chunk_elems apart) at once:
 * each chunk's sum is its own lane of a double vector, which adds the chunk's
 * values in the same order as abs_sum does, so each sum has the same bits; the
 * four vectors are four independent chains of additions where abs_sum has one.
 * block is a multiple of 4. Measured (one 16-value block per 1,440-byte chunk,
 * CPU time on a busy 2-core VM): 6.5-7.5 ns a chunk against abs_sum's 7.9-9.3
 * with the chunks in L2; over a 64 MiB message the memory's latency dominates
 * both (1.4-1.8 ms each). */
static inline void abs_sums(const float *chunk, Py_ssize_t chunk_elems, const int64_t *st,
                            Py_ssize_t n_starts, Py_ssize_t block, double sums[SUMS_AT_ONCE]) {
    const __m128d magnitude = _mm_castsi128_pd(_mm_set1_epi64x(0x7fffffffffffffffLL));
    __m128d s01 = _mm_setzero_pd(), s23 = _mm_setzero_pd(), s45 = _mm_setzero_pd(),
            s67 = _mm_setzero_pd(); /* s01: the sums of chunks 0 and 1, ... */
    for (Py_ssize_t j = 0; j < n_starts; j++)
        for (Py_ssize_t k = 0; k < block; k += 4) {
            const float *b = chunk + st[j] + k;
            add_abs_quad(&s01, &s23, b, chunk_elems, magnitude);
            add_abs_quad(&s45, &s67, b + 4 * chunk_elems, chunk_elems, magnitude);
        }
    _mm_storeu_pd(sums, s01);
    _mm_storeu_pd(sums + 2, s23);
    _mm_storeu_pd(sums + 4, s45);
    _mm_storeu_pd(sums + 6, s67);
}
#endif

/* Asks for the sample blocks of chunk c + ahead, if there is one. Always inlined:
 * GCC takes a function that does nothing but prefetch for one without side effects
 * and drops the calls (measured: no prefetch left, and sampling 10x slower). */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline void prefetch_blocks(const float *d, Py_ssize_t c, Py_ssize_t ahead,
                                   Py_ssize_t n_chunks, Py_ssize_t chunk_elems, const int64_t *st,
                                   Py_ssize_t n_starts, Py_ssize_t block) {
#if defined(__GNUC__)
    if (c + ahead < n_chunks)
        for (Py_ssize_t j = 0; j < n_starts; j++) {
            /* both ends: a block that straddles two lines needs both */
            const float *b = d + (c + ahead) * chunk_elems + st[j];
            __builtin_prefetch(b);
            __builtin_prefetch(b + block - 1);
        }
#else
    (void)d, (void)c, (void)ahead, (void)n_chunks, (void)chunk_elems, (void)st, (void)n_starts,
        (void)block;
#endif
}

/* -1 with IndexError unless every sample block of `block` values at st[0..n_starts)
   lies within a chunk of chunk_elems values and n_chunks such chunks fit n_data
   values (at least one block). */
static int check_samples(const int64_t *st, Py_ssize_t n_starts, Py_ssize_t block,
                         Py_ssize_t chunk_elems, Py_ssize_t n_chunks, Py_ssize_t n_data) {
    for (Py_ssize_t j = 0; j < n_starts; j++)
        if (st[j] < 0 || st[j] > (int64_t)chunk_elems - (int64_t)block) {
            PyErr_Format(PyExc_IndexError, "sample block at %lld leaves a chunk of %zd",
                         (long long)st[j], chunk_elems);
            return -1;
        }
    if (n_starts == 0 || (n_chunks > 0 && n_chunks > n_data / chunk_elems)) {
        PyErr_Format(PyExc_IndexError, "%zd chunks of %zd values do not fit %zd values",
                     n_chunks, chunk_elems, n_data);
        return -1;
    }
    return 0;
}

/* The sampled mean |value| of each of the first n_chunks chunks of d into o, on
   arguments check_samples passed; no Python (block_abs_mean_f32 and plan_send). */
static void abs_means(const float *d, Py_ssize_t chunk_elems, Py_ssize_t n_chunks,
                      const int64_t *st, Py_ssize_t n_starts, Py_ssize_t block, float *o) {
    const double count = (double)(n_starts * block);
    const Py_ssize_t ahead = prefetch_ahead(chunk_elems * 4);
    Py_ssize_t c = 0;
#if defined(__SSE2__)
    if (block % 4 == 0)
        for (; c + SUMS_AT_ONCE <= n_chunks; c += SUMS_AT_ONCE) {
            for (Py_ssize_t q = 0; q < SUMS_AT_ONCE; q++)
                prefetch_blocks(d, c + q, ahead, n_chunks, chunk_elems, st, n_starts, block);
            double sums[SUMS_AT_ONCE];
            abs_sums(d + c * chunk_elems, chunk_elems, st, n_starts, block, sums);
            for (Py_ssize_t q = 0; q < SUMS_AT_ONCE; q++)
                o[c + q] = (float)(sums[q] / count);
        }
#endif
    for (; c < n_chunks; c++) {
        prefetch_blocks(d, c, ahead, n_chunks, chunk_elems, st, n_starts, block);
        o[c] = (float)(abs_sum(d + c * chunk_elems, st, n_starts, block) / count);
    }
}

static PyObject *block_abs_mean_f32(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *data_obj, *starts_obj, *out_obj;
    Py_ssize_t chunk_elems, n_chunks, block;
    if (!PyArg_ParseTuple(args, "OnnOnO:block_abs_mean_f32", &data_obj, &chunk_elems, &n_chunks,
                          &starts_obj, &block, &out_obj))
        return NULL;
    Buf data = {0}, starts = {0}, out = {0};
    PyObject *result = NULL;
    if (chunk_elems <= 0 || n_chunks < 0 || block <= 0) {
        PyErr_SetString(PyExc_ValueError, "chunk_elems and block must be positive");
        return NULL;
    }
    if (buf_get(data_obj, 0, &data) < 0)
        goto done;
    if (buf_get(out_obj, 1, &out) < 0)
        goto done;
    if (get_rows(starts_obj, "starts", 0, &starts) < 0)
        goto done;
    if ((uintptr_t)data.view.buf % 4 || (uintptr_t)out.view.buf % 4) {
        PyErr_SetString(PyExc_ValueError, "block_abs_mean_f32: data and out must be aligned "
                                          "float32 values");
        goto done;
    }
    {
        Py_ssize_t n_data = data.view.len / 4, n_starts = starts.view.len / 8;
        const int64_t *st = (const int64_t *)starts.view.buf;
        if (out.view.len / 4 < n_chunks) {
            PyErr_Format(PyExc_ValueError, "out holds %zd values, %zd needed", out.view.len / 4,
                         n_chunks);
            goto done;
        }
        if (check_samples(st, n_starts, block, chunk_elems, n_chunks, n_data) < 0)
            goto done;
        const float *d = (const float *)data.view.buf;
        float *o = (float *)out.view.buf;
        Py_BEGIN_ALLOW_THREADS
        abs_means(d, chunk_elems, n_chunks, st, n_starts, block, o);
        Py_END_ALLOW_THREADS
    }
    result = Py_NewRef(Py_None);
done:
    buf_release(&starts);
    buf_release(&out);
    buf_release(&data);
    return result;
}

/*
 * scatter_run(buf, n, stride, total, template, mask, layout, out, chunk_elems,
 *             msg_elems, itemsize, received, received_class, stream, trailer[, add])
 *     the receive side's fast path, one pass per record: n datagrams lie back to
 *     back in buf, stride bytes apart (the last one ends at `total`), each a
 *     header of len(template) bytes and a payload. Record i is taken when
 *       - it agrees with `template` (the first record's header, checked by the
 *         caller) in every bit `mask` sets: same message, same element type;
 *       - its per-packet fields fit the message geometry: seq < n_chunks,
 *         offset == seq * chunk_elems, payload_len == the chunk's elements *
 *         itemsize, datagram length == header + payload_len + trailer (the
 *         authentication trailer's bytes, 0 or 24: the caller verified the tags
 *         of the records it passes), and the LAST flag set exactly on the last
 *         chunk.
 *     A taken record whose chunk has not arrived (received[seq] == 0) is copied to
 *     out + offset * itemsize (with add, its float32 values are added to those
 *     there; itemsize must be 4) and marked: received[seq] = 1, received_class[seq] =
 *     tclass >> 4. A chunk that arrived already is never written again. The first record that is not taken ends the run: the caller
 *     gives it and the rest to the general path (which names what is wrong).
 *     Field positions come from `layout`, bytes (flags, seq, offset, payload_len,
 *     tclass) offsets in the header, and three bit masks (last, retransmit, drop)
 *     follow; fields are big-endian of 1, 4, 4, 2 and 1 bytes.
 *     Returns (taken, fresh, fresh_elems, fresh_droppable, fresh_retransmitted,
 *     payload_bytes): records taken, those that were new, their elements, how many
 *     of them were drop-eligible or retransmissions, and the payload bytes of all
 *     taken records (duplicates too: they crossed the network).
 */
static PyObject *scatter_run(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *buf_obj, *out_obj, *recv_obj, *cls_obj;
    Py_ssize_t n, stride, total, chunk_elems, msg_elems, itemsize;
    const unsigned char *tmpl, *mask, *layout;
    Py_ssize_t tmpl_len, mask_len, layout_len;
    int stream, add = 0;
    Py_ssize_t trailer = 0;
    if (!PyArg_ParseTuple(args, "Onnny#y#y#OnnnOOp|np:scatter_run", &buf_obj, &n, &stride, &total,
                          &tmpl, &tmpl_len, &mask, &mask_len, &layout, &layout_len, &out_obj,
                          &chunk_elems, &msg_elems, &itemsize, &recv_obj, &cls_obj, &stream,
                          &trailer, &add))
        return NULL;
    if (trailer < 0 || trailer > 64) {
        PyErr_Format(PyExc_ValueError, "trailer of %zd bytes: 0..64", trailer);
        return NULL;
    }
    ScatterArgs a = {NULL, 0, n, stride, total, tmpl, mask, layout, tmpl_len, mask_len,
                     layout_len, NULL, 0, chunk_elems, msg_elems, itemsize, NULL, NULL, 0, 0,
                     stream, trailer, add};
    switch (scatter_check_args(&a)) {
    case SCATTER_BAD_HEADER:
        PyErr_Format(PyExc_ValueError,
                     "template and mask must have the same length, a multiple of 8 up to %d "
                     "(got %zd and %zd)", SCATTER_MAX_HEADER, tmpl_len, mask_len);
        return NULL;
    case SCATTER_BAD_LAYOUT:
        PyErr_SetString(PyExc_ValueError,
                        "layout must be 8 bytes: flags, seq, offset, payload_len, tclass offsets "
                        "inside the header, then the last, retransmit and drop bits");
        return NULL;
    case SCATTER_BAD_GEOMETRY:
        PyErr_SetString(PyExc_ValueError,
                        "need n >= 0, stride >= header, positive geometry, and the last record "
                        "ending inside its stride");
        return NULL;
    case SCATTER_BAD_ADD:
        PyErr_Format(PyExc_ValueError,
                     "add needs float32 elements (itemsize 4), got itemsize %zd", itemsize);
        return NULL;
    }
    Buf buf = {0}, out = {0}, recv = {0}, cls = {0};
    PyObject *result = NULL;
    if (buf_get(buf_obj, 0, &buf) < 0)
        goto done;
    if (buf_get(out_obj, 1, &out) < 0)
        goto done;
    if (buf_get(recv_obj, 1, &recv) < 0)
        goto done;
    if (buf_get(cls_obj, 1, &cls) < 0)
        goto done;
    a.buf = (const unsigned char *)buf.view.buf;
    a.buf_len = buf.view.len;
    a.out = (unsigned char *)out.view.buf;
    a.out_len = out.view.len;
    a.received = (unsigned char *)recv.view.buf;
    a.received_len = recv.view.len;
    a.received_class = (unsigned char *)cls.view.buf;
    a.received_class_len = cls.view.len;
    if (scatter_check_buffers(&a) != SCATTER_OK || recv.view.itemsize != 1 ||
        cls.view.itemsize != 1) {
        PyErr_Format(PyExc_ValueError,
                     "buffers too small: buf %zd < %zd bytes, out %zd < %zd elements of %zd "
                     "bytes, or the chunk maps (%zd, %zd) hold fewer than %zd one-byte items",
                     buf.view.len, total, out.view.len, msg_elems, itemsize, recv.view.len,
                     cls.view.len, scatter_chunks(&a));
        goto done;
    }
    ScatterResult r;
    Py_BEGIN_ALLOW_THREADS
    scatter_records(&a, &r);
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("nnLnnL", r.taken, r.fresh, r.fresh_elems, r.fresh_drop, r.fresh_retx,
                           r.payload_bytes);
done:
    buf_release(&cls);
    buf_release(&recv);
    buf_release(&out);
    buf_release(&buf);
    return result;
}

/*
 * plan_round(records, row_bytes, template, layout, prio, drop, mag, layer, chunk_elems,
 *            msg_elems, itemsize, flags, last_flag, source, order, row_of_seq,
 *            sent_prio, sent_drop, stream)
 *     the first round of a message in one pass: its send order, and a record per
 *     chunk in that order. The order is a stable sort of the chunks by the key
 *     (7 - prio) * 2 + drop (most urgent class first, protected before
 *     drop-eligible, by seq within a class), done by counting: order[r] is the
 *     chunk of record r, row_of_seq[s] the record of chunk s, sent_prio[r] and
 *     sent_drop[r] the class of record r. Record row_of_seq[s] (row_bytes apart
 *     in `records`) gets `template` (the header of every packet of the message)
 *     with, big-endian at the offsets `layout` names (six bytes: flags, layer,
 *     seq, offset, payload_len, tclass), flags (last_flag added on the last
 *     chunk), layer[s], s, s * chunk_elems, the chunk's bytes and
 *     prio << 5 | drop << 4 | mag. With `source` (the message's bytes; None:
 *     headers only), the chunk's bytes follow its header, and the rest of the
 *     short last chunk's row is zeroed. Every array's length and every class is
 *     checked before anything is written. Returns how many records each of the 16
 *     keys has.
 */
#define PLAN_KEYS 16

/*
 * plan_send(data, chunk_elems, starts, block, tail_magnitude, layer, n_layers,
 *           layer_prio, layer_eligible, fraction, threshold, may_drop, bias, top,
 *           records, row_bytes, template, layout, flags, last_flag, lend, stream,
 *           magnitude, classes, order)
 *     a float32 message planned and its first round laid out in one call:
 *     block_abs_mean_f32 of its whole chunks into magnitude (tail_magnitude for
 *     a short last chunk, which the caller works out as the general path does),
 *     classify_chunks' pass over them into the first three n-byte parts of
 *     classes (prio, drop, mag), then plan_round with the message's own bytes as
 *     the source (lend: headers only) into records, the last two parts of
 *     classes (sent_prio, sent_drop) and the two n-item parts of order (the send
 *     order, row_of_seq). layer_prio's classes must be at most 7 and top at most
 *     15. Returns the first chunk whose layer is not below n_layers (nothing is
 *     then written to records), or the 16 counts plan_round returns.
 */

/*
 * magnitude_class_f32(magnitudes, bias, top, out)
 *     out[i] = clamp(floor(log2(|m|)) + bias, 0, top) for the float32 m =
 *     magnitudes[i], read off its exponent bits: 0 for zero and subnormals below
 *     2**-126 when bias is small enough that they clamp to 0 (bias <= 126, checked),
 *     top for infinities and NaN (dlcp/proto/classify.py's magnitude_class).
 */
static PyObject *magnitude_class_f32(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *mag_obj, *out_obj;
    int bias, top;
    if (!PyArg_ParseTuple(args, "OiiO:magnitude_class_f32", &mag_obj, &bias, &top, &out_obj))
        return NULL;
    if (bias < 0 || bias > 126 || top < 0 || top > 255) {
        PyErr_SetString(PyExc_ValueError, "magnitude_class_f32: need 0 <= bias <= 126 and "
                                          "0 <= top <= 255");
        return NULL;
    }
    Buf mag = {0}, out = {0};
    PyObject *result = NULL;
    if (buf_get(mag_obj, 0, &mag) < 0 || buf_get(out_obj, 1, &out) < 0)
        goto done;
    if (mag.view.itemsize != 4 || (uintptr_t)mag.view.buf % 4 ||
        out.view.len * 4 != mag.view.len) {
        PyErr_Format(PyExc_ValueError, "magnitude_class_f32: %zd bytes of aligned float32 "
                     "need %zd one-byte classes, got %zd", mag.view.len, mag.view.len / 4,
                     out.view.len);
        goto done;
    }
    {
        const uint32_t *m = mag.view.buf;
        uint8_t *o = out.view.buf;
        Py_ssize_t n = out.view.len;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            int e = (int)(m[i] >> 23 & 0xff); /* (the sign bit is shifted out) */
            int c = e == 0xff ? top : e == 0 ? 0 : e - 127 + bias;
            o[i] = (uint8_t)(c < 0 ? 0 : c > top ? top : c);
        }
        Py_END_ALLOW_THREADS
    }
    result = Py_NewRef(Py_None);
done:
    buf_release(&out);
    buf_release(&mag);
    return result;
}

/*
 * classify_chunks(layer, n_layers, magnitudes, layer_prio, layer_eligible, fraction,
 *                 threshold, may_drop, bias, top, prio, drop, mag)
 *     the rule of the built-in classifiers (dlcp/proto/classify.py) over a
 *     message's chunks in one pass, without numpy's temporaries:
 *     prio[s] = layer_prio[layer[s]]; mag[s] the magnitude class of magnitudes[s]
 *     (as magnitude_class_f32); drop[s] only when may_drop, among the chunks whose
 *     layer_eligible[layer[s]] is set (None: every chunk): with fraction >= 0, the
 *     floor(fraction * eligible chunks) of smallest |magnitude| that are not NaN,
 *     ties going to the lower chunk; with fraction < 0, those with |magnitude| below
 *     the float32 threshold. Returns -1, or the first chunk whose layer is not
 *     below n_layers (then nothing in the outputs is defined).
 *
 *     The k-th smallest |magnitude| is found by its bits: for floats >= 0 (+inf
 *     included, NaN left out) the order of the bit patterns as integers is the
 *     order of the values, so three passes of a radix select find it exactly, in
 *     O(n) whatever the values.
 */
static inline uint32_t abs_bits(float v) {
    uint32_t b;
    memcpy(&b, &v, 4);
    return b & 0x7fffffffu;
}

/* |v|'s bits for a float that is not NaN are at most these (+inf's) */
#define INF_BITS 0x7f800000u

/* The digits of a key's radix select, most significant first: 11, 11 and 9 bits.
   The first (the exponent and the top of the mantissa) spreads magnitudes over
   enough buckets that the counts' increments seldom wait on each other, and leaves
   few keys for the others. */
static const int RADIX_SHIFT[3] = {20, 9, 0}, RADIX_WIDTH[3] = {11, 11, 9};

/* The k-th smallest (0-based) of keys[0..n), k < n, whose digits before digit
   `from` are all `prefix`'s; keys is reordered. *equal_before: how many keys equal
   to it rank before it. */
static uint32_t radix_select(uint32_t *keys, Py_ssize_t n, Py_ssize_t k, int from,
                             uint32_t prefix, Py_ssize_t *equal_before) {
    for (int pass = from; pass < 3; pass++) {
        const int shift = RADIX_SHIFT[pass];
        const uint32_t digit_mask = (1u << RADIX_WIDTH[pass]) - 1;
        uint32_t hist[2048] = {0};
        for (Py_ssize_t i = 0; i < n; i++)
            hist[keys[i] >> shift & digit_mask]++;
        uint32_t digit = 0;
        while (k >= (Py_ssize_t)hist[digit])
            k -= hist[digit++];
        prefix |= digit << shift;
        /* keep the keys in that bucket (written always, kept by the count): the
           next digit ranks only them */
        Py_ssize_t kept = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            const uint32_t key = keys[i];
            keys[kept] = key;
            kept += (key >> shift & digit_mask) == digit;
        }
        n = kept;
    }
    *equal_before = k;
    return prefix;
}

/* The C pass's arguments, checked (classify_chunks). Each loop below reads them
   into locals first: its stores go through uint8_t pointers, which may alias
   anything, so fields read through the struct would be loaded again after each. */
typedef struct {
    const uint16_t *layer;
    const float *mag;
    const uint8_t *layer_prio, *layer_eligible; /* (eligible: NULL for every layer) */
    Py_ssize_t n, n_layers;
    double fraction, threshold;
    int may_drop, bias, top;
    uint8_t *prio, *drop, *cls;
} ChunkPass;

/* Whether chunk s may be drop-eligible by its layer (elig NULL: every layer). */
#define ELIGIBLE(elig, layer, s) ((elig) == NULL ? 1 : (elig)[(layer)[s]])

/* drop[] by the fraction rule; -1 if its scratch could not be had. The first
   digit's counts are taken in the pass that counts the candidates, and only the
   keys of the bucket that holds the k-th are copied out; every loop is
   branch-free per chunk (a key is written always and kept by a count). */
static int drop_by_fraction(const ChunkPass *a) {
    const Py_ssize_t n = a->n;
    const uint16_t *const layer = a->layer;
    const float *const mag = a->mag;
    const uint8_t *const elig = a->layer_eligible;
    uint8_t *const drop = a->drop;
    const int shift = RADIX_SHIFT[0];
    uint32_t hist[2048] = {0};
    Py_ssize_t eligible = 0, n_cand = 0;
    for (Py_ssize_t s = 0; s < n; s++) {
        const uint8_t ok = ELIGIBLE(elig, layer, s);
        const uint32_t b = abs_bits(mag[s]);
        const uint8_t cand = ok & (b <= INF_BITS); /* (NaN is never a candidate) */
        eligible += ok;
        n_cand += cand;
        hist[b >> shift] += cand;
    }
    /* (floor, in double, as numpy's floor(q * count) in the reference) */
    const Py_ssize_t k = (Py_ssize_t)floor(a->fraction * (double)eligible);
    if (k <= 0) {
        memset(drop, 0, (size_t)n);
        return 0;
    }
    /* all candidates (kth above every key), or those below the k-th smallest and
       the first `need` equal to it */
    uint32_t kth = INF_BITS + 1;
    Py_ssize_t need = 0;
    if (k < n_cand) {
        Py_ssize_t rank = k - 1;
        uint32_t digit = 0;
        while (rank >= (Py_ssize_t)hist[digit])
            rank -= hist[digit++];
        uint32_t *keys = PyMem_RawMalloc(((size_t)hist[digit] + 1) * 4);
        if (keys == NULL)
            return -1;
        Py_ssize_t m = 0;
        for (Py_ssize_t s = 0; s < n; s++) {
            const uint32_t b = abs_bits(mag[s]);
            keys[m] = b;
            m += ELIGIBLE(elig, layer, s) & (b <= INF_BITS) & (b >> shift == digit);
        }
        kth = radix_select(keys, m, rank, 1, digit << shift, &need);
        need += 1;
        PyMem_RawFree(keys);
    }
    /* below the k-th; then, in chunk order, the first `need` equal to it */
    for (Py_ssize_t s = 0; s < n; s++) {
        const uint32_t b = abs_bits(mag[s]);
        drop[s] = ELIGIBLE(elig, layer, s) & (b < kth); /* (NaN's bits are above) */
    }
    for (Py_ssize_t s = 0; s < n && need > 0 && kth <= INF_BITS; s++)
        if (abs_bits(mag[s]) == kth && ELIGIBLE(elig, layer, s)) {
            drop[s] = 1;
            need--;
        }
    return 0;
}

/* The pass itself (no Python): -2 if scratch memory failed, else -1, or the first
   chunk whose layer is not below n_layers (the outputs are then undefined). */
static Py_ssize_t chunk_pass(const ChunkPass *a) {
    const Py_ssize_t n = a->n, n_layers = a->n_layers;
    const uint16_t *const layer = a->layer;
    const float *const mag = a->mag;
    const uint8_t *const layer_prio = a->layer_prio, *const elig = a->layer_eligible;
    uint8_t *const prio = a->prio, *const cls = a->cls, *const drop = a->drop;
    const int bias = a->bias, top = a->top;
    /* one branch-free loop: a layer out of range reads layer 0's class and is
       looked for once the loop is done */
    unsigned out_of_range = 0;
    for (Py_ssize_t s = 0; s < n; s++) {
        const unsigned l = layer[s];
        const unsigned in_range = l < (size_t)n_layers;
        out_of_range |= !in_range;
        prio[s] = layer_prio[in_range ? l : 0];
        const int e = (int)(abs_bits(mag[s]) >> 23);
        int c = e - 127 + bias;
        c = c < 0 ? 0 : c;
        c = c > top ? top : c;
        c = e == 0 ? 0 : c;
        cls[s] = (uint8_t)(e == 0xff ? top : c);
    }
    if (out_of_range)
        for (Py_ssize_t s = 0; s < n; s++)
            if (layer[s] >= n_layers)
                return s;
    if (!a->may_drop) {
        memset(drop, 0, (size_t)n);
        return -1;
    }
    if (a->fraction < 0) {
        const float t = (float)a->threshold; /* (a float32 value: checked) */
        for (Py_ssize_t s = 0; s < n; s++) /* (NaN < t is false) */
            drop[s] = ELIGIBLE(elig, layer, s) & (fabsf(mag[s]) < t);
        return -1;
    }
    return drop_by_fraction(a) < 0 ? -2 : -1;
}

/* Whether v is a float32 value (infinities included, NaN not). */
static int is_float32(double v) {
    if (isinf(v))
        return 1;
    return fabs(v) <= 0x1.fffffep+127 /* the largest float */ && (double)(float)v == v;
}

static PyObject *classify_chunks(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *layer_obj, *mag_obj, *lprio_obj, *lelig_obj, *prio_obj, *drop_obj, *cls_obj;
    Py_ssize_t n_layers;
    double fraction, threshold;
    int may_drop, bias, top;
    if (!PyArg_ParseTuple(args, "OnOOOddpiiOOO:classify_chunks", &layer_obj, &n_layers,
                          &mag_obj, &lprio_obj, &lelig_obj, &fraction, &threshold, &may_drop,
                          &bias, &top, &prio_obj, &drop_obj, &cls_obj))
        return NULL;
    if (bias < 0 || bias > 126 || top < 0 || top > 255 || n_layers < 1 || n_layers > 0x10000 ||
        !(fraction <= 1.0) || (fraction < 0 && !is_float32(threshold))) {
        PyErr_SetString(PyExc_ValueError, "classify_chunks: need 0 <= bias <= 126, "
                                          "0 <= top <= 255, 1..65536 layers, a fraction of "
                                          "at most 1 and a float32 threshold");
        return NULL;
    }
    Buf layer = {0}, mag = {0}, lprio = {0}, lelig = {0}, prio = {0}, drop = {0}, cls = {0};
    PyObject *result = NULL;
    if (buf_get(layer_obj, 0, &layer) < 0 || buf_get(mag_obj, 0, &mag) < 0 ||
        buf_get(lprio_obj, 0, &lprio) < 0 ||
        (lelig_obj != Py_None && buf_get(lelig_obj, 0, &lelig) < 0) ||
        buf_get(prio_obj, 1, &prio) < 0 || buf_get(drop_obj, 1, &drop) < 0 ||
        buf_get(cls_obj, 1, &cls) < 0)
        goto done;
    const Py_ssize_t n = prio.view.len;
    if ((uintptr_t)layer.view.buf % 2 || (uintptr_t)mag.view.buf % 4 ||
        layer.view.len != 2 * n || mag.view.len != 4 * n || drop.view.len != n ||
        cls.view.len != n || lprio.view.len != n_layers ||
        (lelig.held && lelig.view.len != n_layers)) {
        PyErr_Format(PyExc_ValueError, "classify_chunks: %zd chunks need aligned uint16 "
                     "layers, float32 magnitudes, one-byte outputs of %zd and per-layer "
                     "tables of %zd", n, n, n_layers);
        goto done;
    }
    {
        const ChunkPass a = {layer.view.buf, mag.view.buf, lprio.view.buf,
                             lelig.held ? lelig.view.buf : NULL, n, n_layers, fraction,
                             threshold, may_drop, bias, top, prio.view.buf, drop.view.buf,
                             cls.view.buf};
        Py_ssize_t bad;
        Py_BEGIN_ALLOW_THREADS
        bad = chunk_pass(&a);
        Py_END_ALLOW_THREADS
        if (bad == -2) {
            PyErr_NoMemory();
            goto done;
        }
        result = PyLong_FromSsize_t(bad);
    }
done:
    buf_release(&cls);
    buf_release(&drop);
    buf_release(&prio);
    buf_release(&lelig);
    buf_release(&lprio);
    buf_release(&mag);
    buf_release(&layer);
    return result;
}

/* What plan_round puts in each header, and where. Passed by value, so that the
   compiler knows the header stores (through unsigned char *) cannot change it and
   keeps its fields in registers instead of loading them again after every store. */
typedef struct {
    int at_flags, at_layer, at_seq, at_offset, at_len, at_tclass;
    const uint16_t *layer;
    const uint8_t *prio, *drop, *mag;
    Py_ssize_t n, chunk_elems, chunk_bytes, msg_elems, itemsize;
    int flags, last_flag;
} PlanHeader;

/* Chunk s's fields into the header at line; returns its payload bytes. */
__attribute__((always_inline)) static inline Py_ssize_t plan_header(const PlanHeader h,
                                                                   unsigned char *line,
                                                                   Py_ssize_t s) {
    const int last = s == h.n - 1;
    const Py_ssize_t bytes = last ? (h.msg_elems - s * h.chunk_elems) * h.itemsize
                                  : h.chunk_bytes;
    const uint16_t layer = (uint16_t)(h.layer[s] >> 8 | h.layer[s] << 8);
    const uint32_t seq = swap32((uint32_t)s), offset = swap32((uint32_t)(s * h.chunk_elems));
    const uint16_t len = (uint16_t)((bytes >> 8 & 0xff) | (bytes & 0xff) << 8);
    const unsigned char tclass = (unsigned char)(h.prio[s] << 5 | h.drop[s] << 4 | h.mag[s]);
    line[h.at_flags] = (unsigned char)(h.flags | (last ? h.last_flag : 0));
    memcpy(line + h.at_layer, &layer, 2);
    memcpy(line + h.at_seq, &seq, 4);
    memcpy(line + h.at_offset, &offset, 4);
    memcpy(line + h.at_len, &len, 2);
    line[h.at_tclass] = tclass;
    return bytes;
}

/* A first round's arrays and buffers, checked (plan_round, plan_send). */
typedef struct {
    const uint8_t *prio, *drop;
    int64_t *order, *row_of_seq;
    uint8_t *sent_prio, *sent_drop;
    unsigned char *records;
    Py_ssize_t row_bytes;
    const unsigned char *tmpl;
    Py_ssize_t tmpl_len;
    const unsigned char *source; /* the message's bytes; NULL: headers only */
    int stream;
} PlanRecords;

/* plan_round's pass on checked arguments (no Python): the send order, the class
   of each record, each record, and how many records each key has (counts, zeroed
   by the caller). */
static void plan_records(const PlanRecords *a, const PlanHeader h, Py_ssize_t counts[PLAN_KEYS]) {
    const uint8_t *pr = a->prio, *dr = a->drop;
    const Py_ssize_t n = h.n, row_bytes = a->row_bytes, tmpl_len = a->tmpl_len;
    const Py_ssize_t chunk_bytes = h.chunk_bytes;
    const unsigned char *tmpl = a->tmpl, *sb = a->source;
    int64_t *ord = a->order, *ros = a->row_of_seq;
    uint8_t *sp = a->sent_prio, *sd = a->sent_drop;
    unsigned char *d = a->records;
    const int stream = a->stream;
    /* run by run of one priority (a layer's chunks are one run): the two keys
       of a run, protected and drop-eligible, are counted and placed from
       locals, not through counts[] and next[] in memory, whose increments
       would each wait for the one before */
    for (Py_ssize_t s = 0; s < n;) {
        const uint8_t p = pr[s];
        Py_ssize_t e = s, drops = 0;
        for (; e < n && pr[e] == p; e++)
            drops += dr[e];
        counts[(7 - p) * 2] += e - s - drops;
        counts[(7 - p) * 2 + 1] += drops;
        s = e;
    }
    Py_ssize_t next[PLAN_KEYS];
    for (Py_ssize_t k = 0, at = 0; k < PLAN_KEYS; at += counts[k], k++)
        next[k] = at;
    for (Py_ssize_t s = 0; s < n;) {
        const uint8_t p = pr[s];
        const int k = (7 - p) * 2;
        Py_ssize_t kept = next[k], eligible = next[k + 1];
        for (; s < n && pr[s] == p; s++) {
            const uint8_t dd = dr[s];
            const Py_ssize_t r = dd ? eligible : kept;
            ord[r] = s;
            ros[s] = r;
            sp[r] = p;
            sd[r] = dd;
            eligible += dd;
            kept += 1 - dd;
        }
        next[k] = kept;
        next[k + 1] = eligible;
    }
    if (sb == NULL) {
        /* headers only: written in record order, one after the other, the
           template first and the fields over it (fields put in `line` and then
           copied out whole would stall the copy's loads on the fields' stores) */
        for (Py_ssize_t r = 0; r < n; r++) {
            unsigned char *at = d + r * row_bytes;
            if (tmpl_len == 32) /* (DLCP's header: a copy the compiler inlines) */
                memcpy(at, tmpl, 32);
            else
                memcpy(at, tmpl, (size_t)tmpl_len);
            plan_header(h, at, ord[r]);
        }
    } else {
        /* with payload: in chunk order, so that the message is read front to
           back; each header is put together in `line` with its payload's start
           (put_record) */
        unsigned char line[MAX_HEAD];
        memcpy(line, tmpl, (size_t)tmpl_len);
        for (Py_ssize_t s = 0; s < n; s++) {
            Py_ssize_t bytes = plan_header(h, line, s);
            unsigned char *at = d + ros[s] * row_bytes;
            put_record(at, line, tmpl_len, sb + s * chunk_bytes, bytes, stream && s < n - 1);
            if (bytes < chunk_bytes)
                memset(at + tmpl_len + bytes, 0, (size_t)(row_bytes - tmpl_len - bytes));
        }
    }
#if defined(__SSE2__)
    if (stream && sb != NULL)
        _mm_sfence();
#endif
}

/* The 16 counts as a tuple of ints (NULL with the error set). */
static PyObject *counts_tuple(const Py_ssize_t counts[PLAN_KEYS]) {
    PyObject *result = PyTuple_New(PLAN_KEYS);
    for (int k = 0; result != NULL && k < PLAN_KEYS; k++) {
        PyObject *count = PyLong_FromSsize_t(counts[k]);
        if (count == NULL)
            Py_CLEAR(result);
        else
            PyTuple_SET_ITEM(result, k, count);
    }
    return result;
}

/* -1 with ValueError (named for `fn`) unless a round's header template, layout
   and sizes fit each other (plan_round, plan_send). */
static int check_plan(const char *fn, Py_ssize_t tmpl_len, Py_ssize_t row_bytes,
                      const unsigned char *layout, Py_ssize_t layout_len,
                      Py_ssize_t chunk_elems, Py_ssize_t msg_elems, Py_ssize_t itemsize,
                      int with_payload) {
    /* flags, layer, seq, offset, payload_len, tclass: their sizes */
    static const int sizes[6] = {1, 2, 4, 4, 2, 1};
    if (tmpl_len > MAX_HEAD || tmpl_len > row_bytes || layout_len != 6 || chunk_elems <= 0 ||
        msg_elems <= 0 || (itemsize != 1 && itemsize != 2 && itemsize != 4 && itemsize != 8) ||
        chunk_elems > 0xFFFF / itemsize /* (divided: a product could wrap) */ ||
        msg_elems > 0xFFFFFFFFLL) {
        PyErr_Format(PyExc_ValueError,
                     "%s: need a template of at most 64 bytes and row_bytes, a 6-byte layout, "
                     "positive sizes, chunks of at most 65535 bytes and messages of fewer than "
                     "2**32 elements", fn);
        return -1;
    }
    for (int k = 0; k < 6; k++)
        if (layout[k] + sizes[k] > tmpl_len) {
            PyErr_Format(PyExc_ValueError, "%s: layout field %d (%d bytes at %d) is outside a "
                         "%zd-byte header", fn, k, sizes[k], layout[k], tmpl_len);
            return -1;
        }
    const Py_ssize_t chunk_bytes = chunk_elems * itemsize;
    if (with_payload && row_bytes < tmpl_len + chunk_bytes) {
        PyErr_Format(PyExc_ValueError, "%s: rows of %zd bytes cannot hold a %zd-byte header "
                     "and a %zd-byte chunk", fn, row_bytes, tmpl_len, chunk_bytes);
        return -1;
    }
    return 0;
}

static PyObject *plan_round(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *rec_obj, *prio_obj, *drop_obj, *mag_obj, *layer_obj, *src_obj, *order_obj,
        *row_obj, *sprio_obj, *sdrop_obj;
    Py_ssize_t row_bytes, chunk_elems, msg_elems, itemsize, tmpl_len, layout_len;
    const unsigned char *tmpl, *layout;
    int flags, last_flag, stream;
    if (!PyArg_ParseTuple(args, "Ony#y#OOOOnnniiOOOOOp:plan_round", &rec_obj, &row_bytes, &tmpl,
                          &tmpl_len, &layout, &layout_len, &prio_obj, &drop_obj, &mag_obj,
                          &layer_obj, &chunk_elems, &msg_elems, &itemsize, &flags, &last_flag,
                          &src_obj, &order_obj, &row_obj, &sprio_obj, &sdrop_obj, &stream))
        return NULL;
    const int with_payload = src_obj != Py_None;
    if (check_plan("plan_round", tmpl_len, row_bytes, layout, layout_len, chunk_elems, msg_elems,
                   itemsize, with_payload) < 0)
        return NULL;
    const Py_ssize_t n = (msg_elems + chunk_elems - 1) / chunk_elems;
    const Py_ssize_t chunk_bytes = chunk_elems * itemsize;
    Buf rec = {0}, prio = {0}, drop = {0}, mag = {0}, layer = {0}, src = {0}, order = {0},
        row = {0}, sprio = {0}, sdrop = {0};
    PyObject *result = NULL;
    if (buf_get(rec_obj, 1, &rec) < 0 || buf_get(prio_obj, 0, &prio) < 0 ||
        buf_get(drop_obj, 0, &drop) < 0 || buf_get(mag_obj, 0, &mag) < 0 ||
        buf_get(layer_obj, 0, &layer) < 0 || buf_get(order_obj, 1, &order) < 0 ||
        buf_get(row_obj, 1, &row) < 0 || buf_get(sprio_obj, 1, &sprio) < 0 ||
        buf_get(sdrop_obj, 1, &sdrop) < 0 || (with_payload && buf_get(src_obj, 0, &src) < 0))
        goto done;
    if ((uintptr_t)layer.view.buf % 2 || (uintptr_t)order.view.buf % 8 ||
        (uintptr_t)row.view.buf % 8) {
        PyErr_SetString(PyExc_ValueError, "plan_round: layer, order and row_of_seq must be "
                                          "aligned to their items");
        goto done;
    }
    if (prio.view.len != n || drop.view.len != n || mag.view.len != n ||
        layer.view.len != 2 * n || layer.view.itemsize != 2 || order.view.itemsize != 8 ||
        row.view.itemsize != 8 || order.view.len != 8 * n || row.view.len != 8 * n ||
        sprio.view.len != n || sdrop.view.len != n || row_bytes > rec.view.len / n ||
        (with_payload && src.view.len != msg_elems * itemsize)) {
        PyErr_Format(PyExc_ValueError,
                     "plan_round: a message of %zd chunks needs %zd one-byte prio, drop, mag, "
                     "sent_prio and sent_drop items, %zd uint16 layers, %zd int64 order and "
                     "row_of_seq items, %zd rows of %zd record bytes and a source of %zd bytes",
                     n, n, n, n, n, row_bytes, msg_elems * itemsize);
        goto done;
    }
    const uint8_t *pr = prio.view.buf, *dr = drop.view.buf, *mg = mag.view.buf;
    for (Py_ssize_t s = 0; s < n; s++)
        if (pr[s] > 7 || mg[s] > 15 || dr[s] > 1) {
            PyErr_Format(PyExc_ValueError, "plan_round: chunk %zd has prio %d, drop %d, mag %d "
                         "(at most 7, 1 and 15)", s, pr[s], dr[s], mg[s]);
            goto done;
        }
    Py_ssize_t counts[PLAN_KEYS] = {0};
    {
        const PlanRecords a = {pr, dr, order.view.buf, row.view.buf, sprio.view.buf,
                               sdrop.view.buf, rec.view.buf, row_bytes, tmpl, tmpl_len,
                               with_payload ? src.view.buf : NULL, stream};
        const PlanHeader h = {layout[0], layout[1], layout[2], layout[3], layout[4], layout[5],
                              layer.view.buf, pr, dr, mg, n, chunk_elems, chunk_bytes,
                              msg_elems, itemsize, flags, last_flag};
        Py_BEGIN_ALLOW_THREADS
        plan_records(&a, h, counts);
        Py_END_ALLOW_THREADS
    }
    result = counts_tuple(counts);
done:
    buf_release(&sdrop);
    buf_release(&sprio);
    buf_release(&row);
    buf_release(&order);
    buf_release(&src);
    buf_release(&layer);
    buf_release(&mag);
    buf_release(&drop);
    buf_release(&prio);
    buf_release(&rec);
    return result;
}

static PyObject *plan_send(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *data_obj, *starts_obj, *layer_obj, *lprio_obj, *lelig_obj, *rec_obj, *mag_obj,
        *cls_obj, *ord_obj;
    Py_ssize_t chunk_elems, block, n_layers, row_bytes, tmpl_len, layout_len;
    double tail_magnitude, fraction, threshold;
    int may_drop, bias, top, flags, last_flag, lend, stream;
    const unsigned char *tmpl, *layout;
    if (!PyArg_ParseTuple(args, "OnOndOnOOddpiiOny#y#iippOOO:plan_send", &data_obj,
                          &chunk_elems, &starts_obj, &block, &tail_magnitude, &layer_obj,
                          &n_layers, &lprio_obj, &lelig_obj, &fraction, &threshold, &may_drop,
                          &bias, &top, &rec_obj, &row_bytes, &tmpl, &tmpl_len, &layout,
                          &layout_len, &flags, &last_flag, &lend, &stream, &mag_obj, &cls_obj,
                          &ord_obj))
        return NULL;
    if (bias < 0 || bias > 126 || top < 0 || top > 15 || n_layers < 1 || n_layers > 0x10000 ||
        block <= 0 || !(fraction <= 1.0) || (fraction < 0 && !is_float32(threshold))) {
        PyErr_SetString(PyExc_ValueError, "plan_send: need 0 <= bias <= 126, 0 <= top <= 15, "
                                          "1..65536 layers, a positive block, a fraction of "
                                          "at most 1 and a float32 threshold");
        return NULL;
    }
    Buf data = {0}, starts = {0}, layer = {0}, lprio = {0}, lelig = {0}, rec = {0}, mag = {0},
        cls = {0}, ord = {0};
    PyObject *result = NULL;
    if (buf_get(data_obj, 0, &data) < 0 || get_rows(starts_obj, "starts", 0, &starts) < 0 ||
        buf_get(layer_obj, 0, &layer) < 0 || buf_get(lprio_obj, 0, &lprio) < 0 ||
        (lelig_obj != Py_None && buf_get(lelig_obj, 0, &lelig) < 0) ||
        buf_get(rec_obj, 1, &rec) < 0 || buf_get(mag_obj, 1, &mag) < 0 ||
        buf_get(cls_obj, 1, &cls) < 0 || buf_get(ord_obj, 1, &ord) < 0)
        goto done;
    if (data.view.len % 4 || (uintptr_t)data.view.buf % 4) {
        PyErr_SetString(PyExc_ValueError, "plan_send: data must be aligned float32 values");
        goto done;
    }
    const Py_ssize_t msg_elems = data.view.len / 4;
    if (check_plan("plan_send", tmpl_len, row_bytes, layout, layout_len, chunk_elems,
                   msg_elems, 4, !lend) < 0)
        goto done;
    const Py_ssize_t n = (msg_elems + chunk_elems - 1) / chunk_elems;
    const Py_ssize_t n_full = msg_elems / chunk_elems;
    const Py_ssize_t n_starts = starts.view.len / 8;
    const int64_t *st = starts.view.buf;
    if (check_samples(st, n_starts, block, chunk_elems, n_full, msg_elems) < 0)
        goto done;
    if ((uintptr_t)layer.view.buf % 2 || (uintptr_t)mag.view.buf % 4 ||
        (uintptr_t)ord.view.buf % 8 || layer.view.len != 2 * n || mag.view.len != 4 * n ||
        cls.view.len != 5 * n || ord.view.len != 16 * n || row_bytes > rec.view.len / n ||
        lprio.view.len != n_layers || (lelig.held && lelig.view.len != n_layers)) {
        PyErr_Format(PyExc_ValueError, "plan_send: a message of %zd chunks needs aligned "
                     "uint16 layers, float32 magnitudes, 5 * %zd class bytes, 2 * %zd int64 "
                     "order items, %zd rows of %zd record bytes and per-layer tables of %zd",
                     n, n, n, n, row_bytes, n_layers);
        goto done;
    }
    /* plan_round checks every chunk's class; here the classes come from chunk_pass,
       so its inputs are checked instead: prio from layer_prio (at most 7), mag at
       most top (at most 15), drop 0 or 1 by construction (plan_records counts with
       it and would place records out of bounds otherwise) */
    const uint8_t *lp = lprio.view.buf;
    for (Py_ssize_t l = 0; l < n_layers; l++)
        if (lp[l] > 7) {
            PyErr_Format(PyExc_ValueError, "plan_send: layer %zd has prio %d (at most 7)", l,
                         lp[l]);
            goto done;
        }
    {
        uint8_t *c = cls.view.buf;
        int64_t *o = ord.view.buf;
        const ChunkPass pass = {layer.view.buf, mag.view.buf, lp,
                                lelig.held ? lelig.view.buf : NULL, n, n_layers, fraction,
                                threshold, may_drop, bias, top, c, c + n, c + 2 * n};
        const PlanRecords a = {c, c + n, o, o + n, c + 3 * n, c + 4 * n, rec.view.buf,
                               row_bytes, tmpl, tmpl_len, lend ? NULL : data.view.buf, stream};
        const PlanHeader h = {layout[0], layout[1], layout[2], layout[3], layout[4], layout[5],
                              layer.view.buf, c, c + n, c + 2 * n, n, chunk_elems,
                              chunk_elems * 4, msg_elems, 4, flags, last_flag};
        Py_ssize_t counts[PLAN_KEYS] = {0}, bad;
        float *m = mag.view.buf;
        Py_BEGIN_ALLOW_THREADS
        abs_means(data.view.buf, chunk_elems, n_full, st, n_starts, block, m);
        if (n_full < n)
            m[n - 1] = (float)tail_magnitude;
        bad = chunk_pass(&pass);
        if (bad == -1)
            plan_records(&a, h, counts);
        Py_END_ALLOW_THREADS
        if (bad == -2)
            PyErr_NoMemory();
        else
            result = bad >= 0 ? PyLong_FromSsize_t(bad) : counts_tuple(counts);
    }
done:
    buf_release(&ord);
    buf_release(&cls);
    buf_release(&mag);
    buf_release(&rec);
    buf_release(&lelig);
    buf_release(&lprio);
    buf_release(&layer);
    buf_release(&starts);
    buf_release(&data);
    return result;
}

static PyMethodDef methods[] = {
    {"scatter_run", scatter_run, METH_VARARGS,
     "scatter_run(buf, n, stride, total, template, mask, layout, out, chunk_elems, msg_elems, "
     "itemsize, received, received_class, stream, trailer=0, add=0): check and scatter (or "
     "add) a run of one message's datagrams in one pass (see the module source)."},
    {"gather_records", gather_records, METH_VARARGS,
     "gather_records(dst, dst_stride, head_bytes, dst_rows, src, src_stride, src_rows, n, "
     "nbytes, template, fields, stream): build records, header and payload in one pass "
     "(see the module source)."},
    {"swap_records", swap_records, METH_VARARGS,
     "swap_records(dst, dst_stride, src, src_stride, n, record_bytes, fields[, mask]): copy strided "
     "records, reversing the byte order of the (offset, size) fields (see the module source)."},
    {"block_abs_mean_f32", block_abs_mean_f32, METH_VARARGS,
     "block_abs_mean_f32(data, chunk_elems, n_chunks, starts, block, out): sampled mean "
     "|value| per chunk of a float32 message (see the module source)."},
    {"plan_round", plan_round, METH_VARARGS,
     "plan_round(records, row_bytes, template, layout, prio, drop, mag, layer, chunk_elems, "
     "msg_elems, itemsize, flags, last_flag, source, order, row_of_seq, sent_prio, sent_drop, "
     "stream): a message's send order and first-round records in one pass (see the module "
     "source)."},
    {"plan_send", plan_send, METH_VARARGS,
     "plan_send(data, chunk_elems, starts, block, tail_magnitude, layer, n_layers, layer_prio, "
     "layer_eligible, fraction, threshold, may_drop, bias, top, records, row_bytes, template, "
     "layout, flags, last_flag, lend, stream, magnitude, classes, order): a float32 message "
     "sampled, classified and its first round laid out in one call (see the module source)."},
    {"classify_chunks", classify_chunks, METH_VARARGS,
     "classify_chunks(layer, n_layers, magnitudes, layer_prio, layer_eligible, fraction, "
     "threshold, may_drop, bias, top, prio, drop, mag): the built-in classifiers' rule over a "
     "message's chunks in one pass (see the module source)."},
    {"magnitude_class_f32", magnitude_class_f32, METH_VARARGS,
     "magnitude_class_f32(magnitudes, bias, top, out): clamped floor(log2|m|) + bias of "
     "float32 magnitudes (see the module source)."},
    {"copy_rows", copy_rows, METH_VARARGS,
     "copy_rows(dst, dst_start, dst_stride, dst_rows, src, src_start, src_stride, src_rows, "
     "n, nbytes, stream[, add]): move (or add, float32) n rows of nbytes between strided "
     "buffers (see the module source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "dlcp.proto._kernels",
    "Byte-moving loops of the DLCP data path (optional C accelerator).", -1, methods,
};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
