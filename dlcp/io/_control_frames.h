/*
 * The control frames at the head of a control connection that the receive loop
 * takes itself wherever the I/O thread waits (MessageTable.receive's linger and
 * MessageTable.wait in _udpio.c), without Python: RATE reports and STOPs.
 *
 * Why: RATE is the most frequent control message (a receiver reports each
 * sender's rate every 5 to 20 ms), and each one the I/O thread's Python reads
 * ends the linger and costs a turn (a select, a read, a decode, the pacer's
 * call, the turn's settling: ~0.2 ms of CPU) to change a few numbers in the
 * native engine's pacer, which is C. A STOP ends a send, and was the sender's
 * one turn a message of its own: the loop stops the engine's round at once
 * (rule 10 of _engine.c: no more of it goes, and no FINISH) and keeps the frame
 * for Python's next turn, which applies it as if it had just read it. A FINISH
 * that comes after its message completed here (it crossed the receiver's STOP:
 * the data alone completed the message, the usual case without loss) is one
 * Python would read and do nothing with: the loop drops it. So while the loop
 * waits, a control connection that turns readable is looked at here first: the
 * whole RATE, STOP and such FINISH frames at its head are taken from the socket
 * (control_frames below says which), and the wait goes on; anything else
 * (another message, a tagged frame, a frame cut short, the connection's end)
 * stays on the socket for Python's read, and ends the wait as before.
 *
 * A frame is a 4-byte big-endian length and one control datagram (docs/spec.md
 * §5: dlcp.io.control frames them): a 16-byte header (version and type, flags,
 * job, step, msg, src, body length, reserved: struct ">BBHIHHHH"), then the
 * body: a RATE's 12 bytes (bytes per second, u64; the window, u32
 * microseconds), a STOP's 4 (the elements received, u32), a FINISH's 76 and 4 a
 * tail chunk (docs/spec.md §5.3). What is taken here is exactly what
 * dlcp.proto.control.decode_control accepts as an untagged RATE, STOP or FINISH,
 * from the rank the connection's hello named.
 *
 * In a job that authenticates (rules.auth_flag), exactly what decode_control
 * accepts there instead: each frame carries the AUTH flag, and its datagram ends
 * with the 24-byte trailer (nonce and AES-GMAC tag, docs/spec.md §3) whose tag
 * verifies under the key of the pair (the source -> this rank) in the control
 * domain (a TagCheck: the table's key of the source, ../proto/gmac.h). The tag is
 * checked last, once the frame is otherwise one the walk takes; an untagged frame,
 * or one whose tag does not verify, ends the walk: Python's read refuses it
 * (auth_required, auth_failed) as it always did.
 */
#ifndef DLCP_CONTROL_FRAMES_H
#define DLCP_CONTROL_FRAMES_H

#include <stddef.h>
#include <stdint.h>

#define CONTROL_FRAME_PREFIX 4
#define CONTROL_HEADER_BYTES 16
#define RATE_BODY_BYTES 12
#define STOP_BODY_BYTES 4
#define FINISH_BODY_BYTES 76 /* then tail_count x u32 */
#define FINISH_MAX_TAIL 256
/* an authenticated datagram's trailer: its nonce (8 bytes) and tag (16) */
#define CONTROL_TRAILER_BYTES 24
/* one untagged frame on the wire, length prefix included */
#define RATE_FRAME_BYTES (CONTROL_FRAME_PREFIX + CONTROL_HEADER_BYTES + RATE_BODY_BYTES)
#define STOP_FRAME_BYTES (CONTROL_FRAME_PREFIX + CONTROL_HEADER_BYTES + STOP_BODY_BYTES)
/* a STOP's datagram, as Python's decode_control takes it: untagged, and at most */
#define STOP_DATAGRAM_BYTES (CONTROL_HEADER_BYTES + STOP_BODY_BYTES)
#define STOP_DATAGRAM_MAX (STOP_DATAGRAM_BYTES + CONTROL_TRAILER_BYTES)
/* the longest FINISH frame (256 tail chunks, tagged) */
#define FINISH_FRAME_MAX                                                                       \
    (CONTROL_FRAME_PREFIX + CONTROL_HEADER_BYTES + FINISH_BODY_BYTES + 4 * FINISH_MAX_TAIL + \
     CONTROL_TRAILER_BYTES)

/* What the frames this endpoint takes look like (from Python's wire constants). */
typedef struct {
    uint8_t first;       /* a RATE's first byte: (version << 4) | RATE; 0: RATEs are Python's */
    uint8_t shared_flag; /* the one header flag an untagged RATE may carry */
    uint16_t job;
    uint8_t stop_first;   /* a STOP's first byte; 0: every STOP is Python's */
    uint8_t finish_first; /* a FINISH's first byte; 0: every FINISH is Python's */
    uint8_t auth_flag;    /* the job authenticates: the AUTH flag every frame carries; 0: none */
} ControlRules;

/* In a job that authenticates: whether the `len`-byte control datagram d (trailer
 * included) from rank src carries a tag that verifies (1; 0 if not, or if there is
 * no key for src). */
typedef struct {
    int (*verifies)(void *ctx, unsigned src, const uint8_t *d, size_t len);
    void *ctx;
} TagCheck;

/* Whether a FINISH for message (step, msg) from the walk's source may be taken
 * (the caller knows which messages ended here: _control_watch.h). */
typedef struct {
    int (*taken)(void *ctx, uint32_t step, uint32_t msg);
    void *ctx;
} FinishFilter;

/* One report, as the pacer takes it. */
typedef struct {
    double bytes_per_s, window; /* (the window in seconds) */
    int shared;
} RateReport;

enum { FRAME_RATE = 1, FRAME_STOP = 2, FRAME_FINISH = 3 };

/* One frame taken: where it starts in the walked bytes, how long it is, and what it says. */
typedef struct {
    int kind;
    size_t at, len;
    RateReport rate;    /* FRAME_RATE */
    uint32_t step, msg; /* FRAME_STOP, FRAME_FINISH: the message it is about */
} ControlFrame;

static inline uint16_t frame_be16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }

static inline uint32_t frame_be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* The bytes after the body of each datagram under rules: the trailer where the job
 * authenticates. */
static inline size_t frame_trailer(const ControlRules *rules) {
    return rules->auth_flag ? CONTROL_TRAILER_BYTES : 0;
}

/* Whether the header at d (after a length prefix of `length`) is one of job's,
 * from rank src, with first byte `first`, only the flags in `flags_allowed`, a body
 * of `body` bytes and, where the job authenticates, the AUTH flag and a trailer
 * (whose tag frame_tag checks), else no tag. */
static inline int frame_header(uint32_t length, const uint8_t *d, const ControlRules *rules,
                               unsigned src, uint8_t first, uint8_t flags_allowed, unsigned body) {
    uint8_t auth = rules->auth_flag;
    return length == CONTROL_HEADER_BYTES + body + frame_trailer(rules) && d[0] == first &&
           (d[1] & (uint8_t)~(flags_allowed | auth)) == 0 && (d[1] & auth) == auth &&
           frame_be16(d + 2) == rules->job && frame_be16(d + 10) == src &&
           frame_be16(d + 12) == body && frame_be16(d + 14) == 0;
}

/* Whether the frame at f, whose header frame_header accepted, may be taken: no tag
 * needed, or its tag verifies (tags NULL, or without a check: none does). */
static inline int frame_tag(const uint8_t *f, const ControlRules *rules, const TagCheck *tags,
                            unsigned src) {
    if (!rules->auth_flag)
        return 1;
    return tags != NULL && tags->verifies != NULL &&
           tags->verifies(tags->ctx, src, f + CONTROL_FRAME_PREFIX, frame_be32(f)) == 1;
}

/* Whether the `left` bytes at f begin with one RATE frame from rank `src` that
 * decode_control accepts (untagged, or tagged where the job authenticates); its
 * report in *out and its length in *len if so. */
static inline int rate_frame(const uint8_t *f, size_t left, const ControlRules *rules,
                             const TagCheck *tags, unsigned src, RateReport *out, size_t *len) {
    const uint8_t *d = f + CONTROL_FRAME_PREFIX;
    size_t bytes = RATE_FRAME_BYTES + frame_trailer(rules);
    if (rules->first == 0 || left < bytes ||
        !frame_header(frame_be32(f), d, rules, src, rules->first, rules->shared_flag,
                      RATE_BODY_BYTES) ||
        !frame_tag(f, rules, tags, src))
        return 0;
    *len = bytes;
    const uint8_t *body = d + CONTROL_HEADER_BYTES;
    uint64_t rate = (uint64_t)frame_be32(body) << 32 | frame_be32(body + 4);
    out->bytes_per_s = (double)rate;
    out->window = (double)frame_be32(body + 8) * 1e-6;
    out->shared = (d[1] & rules->shared_flag) != 0;
    return 1;
}

/* Whether the `left` bytes at f begin with one STOP frame from rank `src` that
 * decode_control accepts (no flag but AUTH where the job authenticates); the
 * message it ends in *step, *msg and its length in *len if so. */
static inline int stop_frame(const uint8_t *f, size_t left, const ControlRules *rules,
                             const TagCheck *tags, unsigned src, uint32_t *step, uint32_t *msg,
                             size_t *len) {
    const uint8_t *d = f + CONTROL_FRAME_PREFIX;
    size_t bytes = STOP_FRAME_BYTES + frame_trailer(rules);
    if (rules->stop_first == 0 || left < bytes ||
        !frame_header(frame_be32(f), d, rules, src, rules->stop_first, 0, STOP_BODY_BYTES) ||
        !frame_tag(f, rules, tags, src))
        return 0;
    *len = bytes;
    *step = frame_be32(d + 4);
    *msg = frame_be16(d + 8);
    return 1;
}

/* Whether the `left` bytes at f begin with one FINISH frame from rank `src` that
 * decode_control accepts (no flag but AUTH where the job authenticates; a tail of
 * at most 256 chunks, each inside the message; protected_chunks <= total_chunks =
 * the sum of the 16 class counts) and Inbox.on_finish does not refuse
 * (total_chunks > 0); the message it is about in *step, *msg and its length in
 * *len if so. Its tag is not checked here (control_frames checks it last). */
static inline int finish_frame(const uint8_t *f, size_t left, const ControlRules *rules,
                               unsigned src, uint32_t *step, uint32_t *msg, size_t *len) {
    const uint8_t *d = f + CONTROL_FRAME_PREFIX;
    if (rules->finish_first == 0 ||
        left < CONTROL_FRAME_PREFIX + CONTROL_HEADER_BYTES + FINISH_BODY_BYTES)
        return 0;
    const uint8_t *body = d + CONTROL_HEADER_BYTES;
    unsigned tail = frame_be16(body + 2);
    size_t body_len = FINISH_BODY_BYTES + 4 * (size_t)tail;
    size_t bytes = CONTROL_FRAME_PREFIX + CONTROL_HEADER_BYTES + body_len + frame_trailer(rules);
    if (tail > FINISH_MAX_TAIL || left < bytes ||
        !frame_header(frame_be32(f), d, rules, src, rules->finish_first, 0, (unsigned)body_len))
        return 0;
    uint32_t total = frame_be32(body + 4), protected_chunks = frame_be32(body + 8);
    uint64_t classed = 0;
    for (int i = 0; i < 16; i++)
        classed += frame_be32(body + 12 + 4 * i);
    if (total == 0 || protected_chunks > total || classed != total)
        return 0;
    for (unsigned i = 0; i < tail; i++)
        if (frame_be32(body + FINISH_BODY_BYTES + 4 * i) >= total)
            return 0;
    *step = frame_be32(d + 4);
    *msg = frame_be16(d + 8);
    *len = bytes;
    return 1;
}

/* How many bytes at the head of buf (n of them) are whole RATE, STOP and FINISH
 * frames from rank `src` (rate_frame, stop_frame, finish_frame), at most max_out
 * frames of which at most max_stops STOPs, no RATE behind a STOP, and FINISHes only
 * where `finishes` (NULL: none) takes them; where the job authenticates, each with a
 * tag that `tags` verifies (frame_tag). Each goes to out, in stream order, and
 * *count says how many. The first frame that is none of these, or that the limits
 * leave, ends the walk. */
static inline size_t control_frames(const uint8_t *buf, size_t n, const ControlRules *rules,
                                    const TagCheck *tags, unsigned src, ControlFrame *out,
                                    size_t max_out, size_t max_stops,
                                    const FinishFilter *finishes, size_t *count) {
    size_t at = 0, k = 0, stops = 0;
    while (k < max_out) {
        ControlFrame *f = &out[k];
        /* (a RATE behind a STOP taken would reach the pacer before the STOP, which
           Python applies later: it is left to Python, after the STOP) */
        if (stops == 0 && rate_frame(buf + at, n - at, rules, tags, src, &f->rate, &f->len)) {
            f->kind = FRAME_RATE;
        } else if (stops < max_stops &&
                   stop_frame(buf + at, n - at, rules, tags, src, &f->step, &f->msg, &f->len)) {
            f->kind = FRAME_STOP;
            stops++;
        } else if (finishes != NULL &&
                   finish_frame(buf + at, n - at, rules, src, &f->step, &f->msg, &f->len) &&
                   finishes->taken(finishes->ctx, f->step, f->msg) &&
                   frame_tag(buf + at, rules, tags, src)) {
            f->kind = FRAME_FINISH;
        } else {
            break;
        }
        f->at = at;
        at += f->len;
        k++;
    }
    *count = k;
    return at;
}

#endif
