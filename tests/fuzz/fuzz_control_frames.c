/*
 * libFuzzer target: control_frames of dlcp/io/_control_frames.h, which finds the
 * RATE, STOP and FINISH frames at the head of a control connection's stream that
 * the receive loop's waits take themselves (the bytes come from a peer's TCP
 * connection).
 *
 * Input layout (tests/fuzz/make_corpus.py writes seeds in it):
 *   job       2 bytes: the endpoint's job
 *   src       2 bytes: the rank the connection's hello named
 *   max_out   1 byte: the most frames the walk may take (0-255)
 *   max_stops 1 byte: the most STOPs among them; its top bit set: STOPs are
 *             Python's (the rules' stop_first is 0)
 *   finishes  1 byte: its low 7 bits 0 FINISHes are Python's (no filter), 1
 *             every valid one is taken, 2 those whose step + msg is odd (the
 *             filter says which messages completed), anything else:
 *             finish_first 0 with a filter; its top bit set: the job
 *             authenticates (every frame must carry the AUTH flag and a trailer
 *             whose tag the check accepts: here, a stand-in for AES-GMAC that
 *             accepts a tag of 16 bytes equal to the datagram's length, low
 *             byte, xor the source's low byte, so that the fuzzer can reach both
 *             answers; tests/io/test_control_tags_in_waits.py holds the real tags
 *             to decode_control)
 *   stream    the rest: the bytes queued on the connection (a heap block of
 *             exactly their length)
 *
 * Oracle: a reference walk over the same bytes, written field by field from
 * the frame layout (a 4-byte length, then the control header ">BBHIHHHH" and
 * RATE's ">QI" body, STOP's ">I", or FINISH's ">HHII16I" and its tail of u32
 * chunks, with the spec's rules for each, and the trailer where the job
 * authenticates; no RATE behind a STOP taken): the
 * bytes taken, the count and every
 * frame (kind, place, length, report or message) equal its, the frames taken lie
 * whole and back to back within the stream, and the walk stops at its limits.
 */
#include "fuzz_input.h"

#include "../../dlcp/io/_control_frames.h"

#define RATE_FIRST ((1 << 4) | 5) /* version 1, RATE */
#define STOP_FIRST ((1 << 4) | 2) /* version 1, STOP */
#define FINISH_FIRST ((1 << 4) | 3) /* version 1, FINISH */

static int odd_message(void *ctx, uint32_t step, uint32_t msg) {
    (void)ctx;
    return (step + msg) & 1;
}

static int every_message(void *ctx, uint32_t step, uint32_t msg) {
    (void)ctx, (void)step, (void)msg;
    return 1;
}
#define SHARED 0x01
#define AUTH 0x04 /* dlcp.proto.wire.Flags.AUTH */
#define TRAILER 24

/* The stand-in tag check: the tag's 16 bytes all equal (len ^ src) & 0xFF. */
static uint8_t stand_in_tag(unsigned src, size_t len) { return (uint8_t)((len ^ src) & 0xFF); }

static int stand_in_verifies(void *ctx, unsigned src, const uint8_t *d, size_t len) {
    (void)ctx;
    if (len < TRAILER)
        abort(); /* (the walk checks the tag of a whole tagged datagram only) */
    for (size_t i = len - 16; i < len; i++)
        if (d[i] != stand_in_tag(src, len))
            return 0;
    return 1;
}

/* Whether the `length`-byte datagram at d carries what the reference's job asks:
 * no tag, or (auth) the AUTH flag and the stand-in's tag. */
static int reference_tag(const uint8_t *d, uint64_t length, unsigned src, int auth) {
    if (!auth)
        return 1;
    if (!(d[1] & AUTH) || length < TRAILER)
        return 0;
    for (uint64_t i = length - 16; i < length; i++)
        if (d[i] != stand_in_tag(src, (size_t)length))
            return 0;
    return 1;
}

static uint64_t field(const uint8_t *p, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v = v << 8 | p[i];
    return v;
}

/* The frame at f (left bytes of it in the stream), by the spec's rules for a RATE,
 * STOP or FINISH from src of job, untagged or (auth) tagged: its kind and what it
 * says, or 0. */
static int reference_frame(const uint8_t *f, size_t left, unsigned job, unsigned src,
                           int rates, int stops, int finishes, int auth, ControlFrame *out) {
    if (left < 20)
        return 0;
    uint64_t length = field(f, 4);
    const uint8_t *d = f + 4;
    unsigned vt = d[0], flags = d[1];
    size_t tr = auth ? TRAILER : 0; /* (the trailer's bytes) */
    if (auth) { /* (the AUTH flag aside, the rules below are the untagged ones) */
        if (!(flags & AUTH))
            return 0;
        flags &= ~(unsigned)AUTH;
    }
    uint64_t hjob = field(d + 2, 2), hsrc = field(d + 10, 2), body = field(d + 12, 2),
             reserved = field(d + 14, 2);
    if (hjob != job || hsrc != src || reserved != 0)
        return 0;
    if (vt == RATE_FIRST && !rates) /* (behind a STOP taken: Python's) */
        return 0;
    if (left >= 32 + tr && length == 28 + tr && vt == RATE_FIRST && (flags | SHARED) == SHARED &&
        body == 12 && reference_tag(d, length, src, auth)) {
        out->kind = FRAME_RATE;
        out->len = 32 + tr;
        out->rate.bytes_per_s = (double)field(d + 16, 8);
        out->rate.window = (double)field(d + 24, 4) * 1e-6;
        out->rate.shared = flags == SHARED;
        return 1;
    }
    if (stops && left >= 24 + tr && length == 20 + tr && vt == STOP_FIRST && flags == 0 &&
        body == 4 && reference_tag(d, length, src, auth)) {
        out->kind = FRAME_STOP;
        out->len = 24 + tr;
        out->step = (uint32_t)field(d + 4, 4);
        out->msg = (uint32_t)field(d + 8, 2);
        return 1;
    }
    if (finishes && left >= 96 && vt == FINISH_FIRST && flags == 0) {
        const uint8_t *b = d + 16;
        uint64_t tail = field(b + 2, 2), total = field(b + 4, 4), protected_chunks = field(b + 8, 4);
        uint64_t sum = 0;
        for (int i = 0; i < 16; i++)
            sum += field(b + 12 + 4 * i, 4);
        if (tail > 256 || body != 76 + 4 * tail || length != 16 + body + tr ||
            left < 4 + length || total == 0 || protected_chunks > total || sum != total)
            return 0;
        for (uint64_t i = 0; i < tail; i++)
            if (field(b + 76 + 4 * i, 4) >= total)
                return 0;
        out->kind = FRAME_FINISH;
        out->len = (size_t)(4 + length);
        out->step = (uint32_t)field(d + 4, 4);
        out->msg = (uint32_t)field(d + 8, 2);
        return (finishes == 1 || ((out->step + out->msg) & 1)) &&
               reference_tag(d, length, src, auth);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FuzzInput in = {data, size};
    unsigned job = (unsigned)take_uint(&in, 2), src = (unsigned)take_uint(&in, 2);
    size_t max_out = (size_t)take_uint(&in, 1);
    unsigned stop_byte = (unsigned)take_uint(&in, 1);
    int stops_on = !(stop_byte & 0x80);
    size_t max_stops = stop_byte & 0x7F;
    unsigned finish_byte = (unsigned)take_uint(&in, 1);
    unsigned finish_mode = finish_byte & 0x7F;
    int auth = (finish_byte & 0x80) != 0;
    /* (the reference's: 0 none, 1 every valid one, 2 the odd ones) */
    int finishes = finish_mode <= 2 ? (int)finish_mode : 0;
    size_t n = in.left;
    uint8_t *stream = exact_alloc(n);
    take_bytes(&in, stream, n);
    ControlFrame *got = malloc((max_out + 1) * sizeof *got), *want = malloc(256 * sizeof *want);
    if (got == NULL || want == NULL)
        abort();
    ControlRules rules = {RATE_FIRST, SHARED, (uint16_t)job, stops_on ? STOP_FIRST : 0,
                          finish_mode <= 2 ? FINISH_FIRST : 0, auth ? AUTH : 0};
    FinishFilter filter = {finish_mode == 2 ? odd_message : every_message, NULL};
    TagCheck tags = {stand_in_verifies, NULL};
    size_t count = 0;
    size_t taken = control_frames(stream, n, &rules, auth ? &tags : NULL, src, got, max_out,
                                  max_stops, finish_mode == 0 ? NULL : &filter, &count);

    size_t at = 0, k = 0, stops = 0;
    while (k < max_out &&
           reference_frame(stream + at, n - at, job, src, stops == 0,
                           stops_on && stops < max_stops, finishes, auth, &want[k])) {
        want[k].at = at;
        stops += want[k].kind == FRAME_STOP;
        at += want[k].len;
        k++;
    }
    if (taken != at || count != k || taken > n || count > max_out || stops > max_stops) {
        fprintf(stderr, "control_frames took %zu bytes, %zu frames; the reference %zu, %zu\n",
                taken, count, at, k);
        abort();
    }
    size_t end = 0;
    for (size_t i = 0; i < count; i++) {
        const ControlFrame *g = &got[i], *w = &want[i];
        int same = g->kind == w->kind && g->at == w->at && g->len == w->len && g->at == end;
        if (same && g->kind == FRAME_RATE)
            same = g->rate.bytes_per_s == w->rate.bytes_per_s &&
                   g->rate.window == w->rate.window && g->rate.shared == w->rate.shared;
        if (same && g->kind != FRAME_RATE)
            same = g->step == w->step && g->msg == w->msg;
        if (!same) {
            fprintf(stderr, "frame %zu differs from the reference\n", i);
            abort();
        }
        end += g->len;
    }
    if (end != taken)
        abort();
    free(got);
    free(want);
    free(stream);
    return 0;
}
