/*
 * The geometry of a round of the native send engine (dlcp.io._engine) without
 * Python: post()'s checks of what Python hands over (record count, stride,
 * datagrams per GSO message, the short last record, the breaks between batches)
 * and where each batch ends and how many bytes it holds (rule 2 of _engine.c).
 * _engine.c calls these; tests/fuzz/ calls them under libFuzzer.
 */
#ifndef DLCP_ROUND_GEOMETRY_H
#define DLCP_ROUND_GEOMETRY_H

#include <stdint.h>
#include <sys/types.h>

/* The most datagrams one UDP GSO message may carry (the kernel's UDP_MAX_SEGMENTS). */
#define ROUND_MAX_PER_MESSAGE 64

/* Whether count records of stride bytes, per_message per GSO message, with the
 * short record short_index (-1: none) of short_len bytes, are a round post()
 * takes. */
static inline int round_geometry_ok(ssize_t count, ssize_t stride, ssize_t per_message,
                                    ssize_t short_index, ssize_t short_len) {
    return !(count < 1 || stride < 1 || stride > 65535 || per_message < 1 ||
             per_message > ROUND_MAX_PER_MESSAGE || per_message > 65535 / stride ||
             short_index < -1 || short_index >= count ||
             (short_index >= 0 && (short_len < 1 || short_len > stride)));
}

/* Whether a buffer of len bytes holds exactly n items of itemsize (> 0) bytes: the
 * product is not formed, as a huge n would overflow it. */
static inline int round_buffer_fits(ssize_t len, ssize_t itemsize, ssize_t n) {
    return len % itemsize == 0 && len / itemsize == n;
}

/* The breaks of a round: strictly increasing within (0, count], ending at count,
 * with one just after the short record. -1 if they are; else the index of the
 * first break out of order or range, or n (== the number of breaks) when the
 * last one is not the count or none follows the short record. */
static inline ssize_t round_bad_break(const int64_t *b, ssize_t n, ssize_t count,
                                      ssize_t short_index) {
    int after_short = short_index < 0;
    for (ssize_t i = 0; i < n; i++) {
        if (b[i] <= (i ? b[i - 1] : 0) || b[i] > count)
            return i;
        after_short |= b[i] == short_index + 1;
    }
    if (n == 0 || b[n - 1] != count || !after_short)
        return n;
    return -1;
}

/* Where the batch starting at record `start` ends: at the first break after it,
 * or `limit` (>= 1) records on, whichever comes first. */
static inline ssize_t round_batch_end(const int64_t *b, ssize_t n, ssize_t count, ssize_t start,
                                      ssize_t limit) {
    ssize_t lo = 0, hi = n; /* first break > start */
    while (lo < hi) {
        ssize_t mid = (lo + hi) / 2;
        if (b[mid] <= start)
            lo = mid + 1;
        else
            hi = mid;
    }
    ssize_t brk = lo < n ? (ssize_t)b[lo] : count;
    if (brk > count) /* (post() checked them; a cap costs nothing) */
        brk = count;
    return limit < brk - start ? start + limit : brk; /* (start + limit may overflow) */
}

/* The bytes of records [start, stop): the short record, if among them, is shorter. */
static inline ssize_t round_batch_bytes(ssize_t stride, ssize_t short_index, ssize_t short_len,
                                        ssize_t start, ssize_t stop) {
    ssize_t size = (stop - start) * stride;
    if (short_index >= start && short_index < stop)
        size -= stride - short_len;
    return size;
}

#endif
