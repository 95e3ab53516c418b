/*
 * RATE reports at the head of a control connection, as the receive loop's
 * linger reads them (MessageTable.receive in _udpio.c), without Python.
 *
 * Why: RATE is the most frequent control message (a receiver reports each
 * sender's rate every 5 to 20 ms), and each one the I/O thread's Python reads
 * ends the linger and costs a turn (a select, a read, a decode, the pacer's
 * call, the turn's settling: ~0.2 ms of CPU) to change a few numbers in the
 * native engine's pacer, which is C. So while the loop lingers, a control
 * connection that turns readable is looked at here first: the whole RATE
 * frames at its head are taken from the socket and handed to their pacer
 * (rate_frames below says which), and the linger goes on; anything else (another
 * message, a tagged RATE, a frame cut short, the connection's end) stays on
 * the socket for Python's read, and ends the linger as before.
 *
 * A frame is a 4-byte big-endian length and one control datagram (docs/spec.md
 * §5: dlcp.io.control frames them): a 16-byte header (version and type, flags,
 * job, step, msg, src, body length, reserved: struct ">BBHIHHHH"), then a
 * RATE's 12-byte body (bytes per second, u64; the window, u32 microseconds).
 * What is taken here is exactly what dlcp.proto.control.decode_control accepts
 * as an untagged RATE, from the rank the connection's hello named.
 */
#ifndef DLCP_CONTROL_RATES_H
#define DLCP_CONTROL_RATES_H

#include <stddef.h>
#include <stdint.h>

#define CONTROL_FRAME_PREFIX 4
#define CONTROL_HEADER_BYTES 16
#define RATE_BODY_BYTES 12
/* one RATE frame on the wire, length prefix included */
#define RATE_FRAME_BYTES (CONTROL_FRAME_PREFIX + CONTROL_HEADER_BYTES + RATE_BODY_BYTES)

/* What a RATE this endpoint takes looks like (from Python's wire constants). */
typedef struct {
    uint8_t first;       /* the first byte: (version << 4) | RATE */
    uint8_t shared_flag; /* the one header flag an untagged RATE may carry */
    uint16_t job;
} RateRules;

/* One report, as the pacer takes it. */
typedef struct {
    double bytes_per_s, window; /* (the window in seconds) */
    int shared;
} RateReport;

static inline uint16_t rate_be16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }

static inline uint32_t rate_be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Whether the RATE_FRAME_BYTES at f are one RATE frame from rank `src`, with no
 * field decode_control refuses and no tag (a tagged one is Python's to verify);
 * its report in *out if so. */
static inline int rate_frame(const uint8_t *f, const RateRules *rules, unsigned src,
                             RateReport *out) {
    const uint8_t *d = f + CONTROL_FRAME_PREFIX;
    if (rate_be32(f) != CONTROL_HEADER_BYTES + RATE_BODY_BYTES || d[0] != rules->first ||
        (d[1] & (uint8_t)~rules->shared_flag) != 0 || rate_be16(d + 2) != rules->job ||
        rate_be16(d + 10) != src || rate_be16(d + 12) != RATE_BODY_BYTES ||
        rate_be16(d + 14) != 0)
        return 0;
    const uint8_t *body = d + CONTROL_HEADER_BYTES;
    uint64_t rate = (uint64_t)rate_be32(body) << 32 | rate_be32(body + 4);
    out->bytes_per_s = (double)rate;
    out->window = (double)rate_be32(body + 8) * 1e-6;
    out->shared = (d[1] & rules->shared_flag) != 0;
    return 1;
}

/* How many bytes at the head of buf (n of them) are whole RATE frames from
 * rank `src` (rate_frame), at most max_out of them, whose reports go to out;
 * *count says how many. The first frame that is not one ends the walk. */
static inline size_t rate_frames(const uint8_t *buf, size_t n, const RateRules *rules,
                                 unsigned src, RateReport *out, size_t max_out, size_t *count) {
    size_t at = 0, k = 0;
    while (k < max_out && n - at >= RATE_FRAME_BYTES && rate_frame(buf + at, rules, src, &out[k])) {
        at += RATE_FRAME_BYTES;
        k++;
    }
    *count = k;
    return at;
}

#endif
