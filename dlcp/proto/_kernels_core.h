/*
 * The receive-side checks of dlcp.proto._kernels without Python: the argument
 * checks and loops of scatter_run and swap_records on plain pointers and lengths.
 * _kernels.c wraps them for Python; tests/fuzz/ calls them directly under
 * libFuzzer with AddressSanitizer and UBSan. No I/O, no global state, no
 * allocation: every byte read or written lies in the buffers the caller passes,
 * whose lengths the checks compare with the geometry first.
 */
#ifndef DLCP_KERNELS_CORE_H
#define DLCP_KERNELS_CORE_H

#include <stdint.h>
#include <string.h>
#include <sys/types.h>
#if defined(__SSE2__)
#include <emmintrin.h>

/* Streams the first `bytes` (a multiple of 4) of a row 4 bytes at a time; the
 * destination is 4-byte aligned. (See copy_row.) */
static inline void stream_ragged(char **d, const char **s, size_t *n, size_t bytes) {
    for (; bytes >= 4; bytes -= 4, *d += 4, *s += 4, *n -= 4) {
        int v;
        memcpy(&v, *s, 4);
        _mm_stream_si32((int *)*d, v);
    }
}
#endif

/* With stream set, rows are written with streaming (non-temporal) stores where the
 * CPU has them, as glibc's memcpy does for one large copy: for buffers much larger
 * than the cache the rows are not read again soon, and streaming skips reading
 * every destination line first, which otherwise doubles the memory traffic of a
 * row-by-row copy. The caller decides, as it knows the size of the whole buffer.
 *
 * A row that does not start or end on 16 bytes (authenticated datagrams carry
 * 1,416-byte chunks at MTU 1500: every other one starts 8 bytes off) has its
 * ragged ends streamed 4 bytes at a time where the destination is 4-byte aligned:
 * an ordinary store there would read the line from memory first, and the line
 * is also written by the neighbouring row's streamed stores. Measured (64 MiB in
 * rows from a cached source, CPU time, best of 4 runs interleaved on a busy
 * 2-core VM): 1,416-byte rows 17.0 ms with ordinary stores at the ends, 5.1 with
 * the ends streamed; 1,408-byte rows, which have no ragged ends, 5.3.
 *
 * The 64-byte loop starts on a destination line: 16-byte stores first up to it, so
 * that each turn of the loop fills one line. A large numpy array starts 16 bytes
 * into a line (glibc puts a header before an mmap'ed block), and every other
 * 1,440-byte row starts half-way into one: turns that each wrote into two lines
 * took longer on an Intel Xeon (Ice Lake) VM: 64 MiB of 1,440-byte rows from a hot
 * source, best of 7 in two runs, 5.2-7.7 ms by the destination's offset in its
 * line, 4.2-5.2 with the loop on lines; 1,416-byte rows 7.3-7.5 against 6.2-6.3
 * (docs/results/2026-12-04/row_alignment/). */
static inline void copy_row(char *d, const char *s, size_t n, int stream) {
#if defined(__SSE2__)
    if (stream && n >= 64) {
        /* head: up to the first 16-byte aligned destination address */
        size_t head = (size_t)(-(uintptr_t)d & 15);
        if (((uintptr_t)d & 3) == 0) {
            stream_ragged(&d, &s, &n, head);
        } else {
            memcpy(d, s, head);
            d += head;
            s += head;
            n -= head;
        }
        for (; n >= 16 && ((uintptr_t)d & 63) != 0; n -= 16, d += 16, s += 16)
            _mm_stream_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s));
        for (; n >= 64; n -= 64, d += 64, s += 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)s);
            __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
            __m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
            _mm_stream_si128((__m128i *)d, a);
            _mm_stream_si128((__m128i *)(d + 16), b);
            _mm_stream_si128((__m128i *)(d + 32), c);
            _mm_stream_si128((__m128i *)(d + 48), e);
        }
        for (; n >= 16; n -= 16, d += 16, s += 16)
            _mm_stream_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s));
        stream_ragged(&d, &s, &n, n & ~(size_t)3);
        memcpy(d, s, n);
        return;
    }
#else
    (void)stream;
#endif
    memcpy(d, s, n);
}

/* Adds the n / 4 float32 values at s to those at d (n a multiple of 4; neither
 * needs alignment), each sum rounded once, as numpy's float32 add rounds it: the
 * receive side of a message received into what the buffer holds (a reduction's
 * step). The destination is read, so nothing is streamed. */
static inline void add_row_f32(char *d, const char *s, size_t n) {
#if defined(__SSE2__)
    for (; n >= 64; n -= 64, d += 64, s += 64)
        for (int k = 0; k < 64; k += 16)
            _mm_storeu_ps((float *)(d + k), _mm_add_ps(_mm_loadu_ps((const float *)(d + k)),
                                                       _mm_loadu_ps((const float *)(s + k))));
    for (; n >= 16; n -= 16, d += 16, s += 16)
        _mm_storeu_ps((float *)d,
                      _mm_add_ps(_mm_loadu_ps((const float *)d), _mm_loadu_ps((const float *)s)));
#endif
    for (; n >= 4; n -= 4, d += 4, s += 4) {
        float x, y;
        memcpy(&x, d, 4);
        memcpy(&y, s, 4);
        x += y;
        memcpy(d, &x, 4);
    }
}

/* A received row into its place: added to the float32 values there (add), else
 * copied (streamed as copy_row says). */
static inline void place_row(char *d, const char *s, size_t n, int stream, int add) {
    if (add)
        add_row_f32(d, s, n);
    else
        copy_row(d, s, n, stream);
}

/* ------------------------------------------------------------------ scatter_run */

#define SCATTER_MAX_HEADER 64

/* One call of scatter_run (see _kernels.c for what it does). */
typedef struct {
    const unsigned char *buf; /* n records, stride apart, the last ending at total */
    ssize_t buf_len, n, stride, total;
    const unsigned char *tmpl, *mask, *layout;
    ssize_t tmpl_len, mask_len, layout_len;
    unsigned char *out; /* msg_elems * itemsize bytes at least */
    ssize_t out_len, chunk_elems, msg_elems, itemsize;
    unsigned char *received, *received_class; /* one byte per chunk */
    ssize_t received_len, received_class_len;
    int stream;
    ssize_t trailer; /* bytes after each payload (the authentication trailer), 0..64 */
    int add; /* payloads are float32 values added to those in out, not copied */
} ScatterArgs;

typedef struct {
    ssize_t taken, fresh, fresh_drop, fresh_retx;
    long long fresh_elems, payload_bytes;
} ScatterResult;

enum {
    SCATTER_OK = 0,
    SCATTER_BAD_HEADER,   /* template and mask: same length, a multiple of 8 up to 64 */
    SCATTER_BAD_LAYOUT,   /* layout: 8 bytes, fields inside the header */
    SCATTER_BAD_GEOMETRY, /* n, stride, total, chunk_elems, msg_elems, itemsize */
    SCATTER_SMALL_BUFFER, /* buf, out or the chunk maps shorter than the geometry needs */
    SCATTER_BAD_ADD,      /* add with elements of other than 4 bytes (float32) */
};

/* The chunks of a message of msg_elems in chunks of chunk_elems (both positive). */
static inline ssize_t scatter_chunks(const ScatterArgs *a) {
    return (a->msg_elems - 1) / a->chunk_elems + 1; /* (msg_elems + chunk - 1 may overflow) */
}

/* Whether n records `stride` apart (n >= 0, stride > 0) end at `total`, inside the
 * last one's stride: total in ((n - 1) * stride, n * stride], found by division,
 * as the products of the caller's numbers may overflow. */
static inline int scatter_total_fits(ssize_t n, ssize_t stride, ssize_t total) {
    if (n == 0)
        return total <= 0;
    return total > 0 && (total - 1) / stride == n - 1;
}

/* The checks that need no buffer: SCATTER_OK or the first that fails. */
static inline int scatter_check_args(const ScatterArgs *a) {
    ssize_t hl = a->tmpl_len;
    if (hl <= 0 || hl > SCATTER_MAX_HEADER || hl % 8 || a->mask_len != hl || a->trailer < 0 ||
        a->trailer > 64)
        return SCATTER_BAD_HEADER;
    const unsigned char *l = a->layout;
    if (a->layout_len != 8 || l[0] >= hl || l[1] + 4 > hl || l[2] + 4 > hl || l[3] + 2 > hl ||
        l[4] >= hl)
        return SCATTER_BAD_LAYOUT;
    if (a->n < 0 || a->stride < hl || a->chunk_elems <= 0 || a->msg_elems <= 0 ||
        a->itemsize <= 0 || !scatter_total_fits(a->n, a->stride, a->total))
        return SCATTER_BAD_GEOMETRY;
    if (a->add && a->itemsize != 4)
        return SCATTER_BAD_ADD;
    return SCATTER_OK;
}

/* The checks of the buffers against the geometry (after scatter_check_args). */
static inline int scatter_check_buffers(const ScatterArgs *a) {
    ssize_t n_chunks = scatter_chunks(a);
    if (a->buf_len < a->total || a->msg_elems > a->out_len / a->itemsize ||
        a->received_len < n_chunks || a->received_class_len < n_chunks)
        return SCATTER_SMALL_BUFFER;
    return SCATTER_OK;
}

static inline uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline uint32_t be16(const unsigned char *p) { return ((uint32_t)p[0] << 8) | p[1]; }

/* The loop of scatter_run, on arguments both checks passed. */
static inline void scatter_records(const ScatterArgs *a, ScatterResult *res) {
    const unsigned char *s = a->buf, *layout = a->layout;
    unsigned char *o = a->out, *rcv = a->received, *rcls = a->received_class;
    const ssize_t n = a->n, stride = a->stride, total = a->total, hl = a->tmpl_len;
    const ssize_t chunk_elems = a->chunk_elems, msg_elems = a->msg_elems,
                  itemsize = a->itemsize, n_chunks = scatter_chunks(a);
    const int f_flags = layout[0], f_seq = layout[1], f_off = layout[2], f_len = layout[3],
              f_cls = layout[4];
    const unsigned last_bit = layout[5], retx_bit = layout[6], drop_bit = layout[7];
    uint64_t want[SCATTER_MAX_HEADER / 8], bits[SCATTER_MAX_HEADER / 8];
    const int words = (int)(hl / 8);
    for (int w = 0; w < words; w++) {
        uint64_t t, m;
        memcpy(&t, a->tmpl + 8 * w, 8);
        memcpy(&m, a->mask + 8 * w, 8);
        want[w] = t & m;
        bits[w] = m;
    }
    ssize_t i = 0, fresh = 0, fresh_drop = 0, fresh_retx = 0;
    long long fresh_elems = 0, payload_bytes = 0;
    for (; i < n; i++) {
        const unsigned char *r = s + i * stride;
        ssize_t len = i + 1 < n ? stride : total - i * stride;
        if (len < hl)
            break;
        int same = 1;
        for (int w = 0; w < words; w++) {
            uint64_t v;
            memcpy(&v, r + 8 * w, 8);
            same &= (v & bits[w]) == want[w];
        }
        if (!same)
            break;
        uint32_t seq = be32(r + f_seq);
        if ((ssize_t)seq >= n_chunks)
            break;
        long long start = (long long)seq * chunk_elems;
        long long elems = msg_elems - start < chunk_elems ? msg_elems - start : chunk_elems;
        uint32_t payload = be16(r + f_len);
        unsigned flags = r[f_flags];
        if ((long long)be32(r + f_off) != start || (long long)payload != elems * itemsize ||
            len != hl + (ssize_t)payload + a->trailer ||
            ((flags & last_bit) != 0) != ((ssize_t)seq == n_chunks - 1))
            break;
        payload_bytes += payload;
        if (rcv[seq])
            continue; /* a duplicate: counted by the caller, never rewritten */
        place_row((char *)o + start * itemsize, (const char *)r + hl, payload, a->stream, a->add);
        rcv[seq] = 1;
        rcls[seq] = (unsigned char)(r[f_cls] >> 4);
        fresh++;
        fresh_elems += elems;
        fresh_drop += (r[f_cls] & drop_bit) != 0;
        fresh_retx += (flags & retx_bit) != 0;
    }
#if defined(__SSE2__)
    if (a->stream)
        _mm_sfence(); /* streamed stores are visible before the caller reads */
#endif
    *res = (ScatterResult){i, fresh, fresh_drop, fresh_retx, fresh_elems, payload_bytes};
}

/* ------------------------------------------------------------------ swap_records */

/* One call of swap_records (see _kernels.c for what it does). */
typedef struct {
    unsigned char *dst;
    ssize_t dst_len, dst_stride;
    const unsigned char *src;
    ssize_t src_len, src_stride, n, record_bytes;
    const unsigned char *fields; /* (offset, size) byte pairs */
    ssize_t fields_len;
    const unsigned char *mask; /* record_bytes bytes, or NULL */
    ssize_t mask_len;
} SwapArgs;

enum {
    SWAP_OK = 0,
    SWAP_BAD_MASK,     /* a mask of other than record_bytes bytes */
    SWAP_BAD_GEOMETRY, /* n < 0, or a stride shorter than a record */
    SWAP_ODD_FIELDS,   /* fields not in (offset, size) pairs */
    SWAP_BAD_FIELD,    /* a field of 2, 4 or 8 bytes that does not fit the record */
    SWAP_SMALL_BUFFER, /* the records do not fit dst or src */
};

/* The checks that need no buffer: SWAP_OK or the first that fails; *bad_field is
 * the pair index of a SWAP_BAD_FIELD. */
static inline int swap_check_args(const SwapArgs *a, ssize_t *bad_field) {
    if (a->mask != NULL && a->mask_len != a->record_bytes)
        return SWAP_BAD_MASK;
    if (a->n < 0 || a->record_bytes < 0 || a->dst_stride < a->record_bytes ||
        a->src_stride < a->record_bytes)
        return SWAP_BAD_GEOMETRY;
    if (a->fields_len % 2)
        return SWAP_ODD_FIELDS;
    for (ssize_t f = 0; f < a->fields_len; f += 2) {
        int size = a->fields[f + 1];
        if ((size != 2 && size != 4 && size != 8) || a->fields[f] + size > a->record_bytes) {
            *bad_field = f;
            return SWAP_BAD_FIELD;
        }
    }
    return SWAP_OK;
}

/* Whether n records of `bytes`, `stride` apart, fit `len` bytes: (n - 1) * stride
 * + bytes <= len, found by division, as the product may overflow. */
static inline int swap_records_fit(ssize_t n, ssize_t stride, ssize_t bytes, ssize_t len) {
    if (n == 0)
        return 1;
    if (bytes > len)
        return 0;
    return stride == 0 || n - 1 <= (len - bytes) / stride;
}

/* The checks of the buffers against the geometry (after swap_check_args). */
static inline int swap_check_buffers(const SwapArgs *a) {
    if (!swap_records_fit(a->n, a->dst_stride, a->record_bytes, a->dst_len) ||
        !swap_records_fit(a->n, a->src_stride, a->record_bytes, a->src_len))
        return SWAP_SMALL_BUFFER;
    return SWAP_OK;
}

/* Records or chunks a datagram apart are too sparse for the hardware prefetcher
 * within a page; the loops ask for the line this many bytes ahead (measured:
 * sampling a 64 MiB message took 2.0 ms prefetching 23 KB ahead, 1.1 ms at 184 KB,
 * 1.6 ms at 740 KB). */
#define PREFETCH_BYTES (192 * 1024)

static inline ssize_t prefetch_ahead(ssize_t stride) {
    return stride > 0 && stride < PREFETCH_BYTES ? PREFETCH_BYTES / stride : 1;
}

/* The loop of swap_records, on arguments both checks passed: whether every
 * record agrees with the first in the bits of the mask (1 without a mask). */
static inline int swap_records_loop(const SwapArgs *a) {
    unsigned char *d = a->dst;
    const unsigned char *s = a->src, *mask = a->mask, *fields = a->fields;
    const ssize_t n = a->n, record_bytes = a->record_bytes, fields_len = a->fields_len;
    ssize_t ahead = prefetch_ahead(a->src_stride);
    int same = 1;
    for (ssize_t i = 0; i < n; i++) {
        unsigned char *dr = d + i * a->dst_stride;
        const unsigned char *sr = s + i * a->src_stride;
#if defined(__GNUC__)
        /* headers a datagram apart: too sparse for the hardware prefetcher */
        if (i + ahead < n)
            __builtin_prefetch(sr + ahead * a->src_stride);
#endif
        memcpy(dr, sr, (size_t)record_bytes);
        if (mask != NULL && same)
            for (ssize_t k = 0; k < record_bytes; k++)
                if ((sr[k] ^ s[k]) & mask[k]) {
                    same = 0;
                    break;
                }
        for (ssize_t f = 0; f < fields_len; f += 2) {
            int at = fields[f], size = fields[f + 1];
            for (int k = 0; k < size; k++)
                dr[at + k] = sr[at + size - 1 - k];
        }
    }
    return same;
}

#endif
