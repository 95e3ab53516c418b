/*
 * libFuzzer target: rate_frames of dlcp/io/_control_rates.h, which finds the RATE
 * frames at the head of a control connection's stream that the receive loop's
 * linger takes itself (the bytes come from a peer's TCP connection).
 *
 * Input layout (tests/fuzz/make_corpus.py writes seeds in it):
 *   job       2 bytes: the endpoint's job
 *   src       2 bytes: the rank the connection's hello named
 *   max_out   1 byte: the most reports the walk may take (0-255)
 *   stream    the rest: the bytes queued on the connection (a heap block of
 *             exactly their length)
 *
 * Oracle: a reference walk over the same bytes, written field by field from
 * the frame layout (a 4-byte length, then the control header ">BBHIHHHH" and
 * RATE's ">QI" body): the bytes taken, the count and every report equal its,
 * the bytes taken are whole frames within the stream, and the walk stops at
 * max_out.
 */
#include "fuzz_input.h"

#include "../../dlcp/io/_control_rates.h"

#define FIRST ((1 << 4) | 5) /* version 1, RATE */
#define SHARED 0x01

static uint64_t field(const uint8_t *p, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v = v << 8 | p[i];
    return v;
}

/* Whether the frame at f (32 bytes) is one the linger may take, by the spec's
 * rules for an untagged RATE from src of job. */
static int reference_frame(const uint8_t *f, unsigned job, unsigned src, RateReport *out) {
    uint64_t length = field(f, 4);
    const uint8_t *d = f + 4;
    unsigned vt = d[0], flags = d[1];
    uint64_t hjob = field(d + 2, 2), hsrc = field(d + 10, 2), body = field(d + 12, 2),
             reserved = field(d + 14, 2);
    if (length != 28 || vt != FIRST || (flags | SHARED) != SHARED || hjob != job ||
        hsrc != src || body != 12 || reserved != 0)
        return 0;
    out->bytes_per_s = (double)field(d + 16, 8);
    out->window = (double)field(d + 24, 4) * 1e-6;
    out->shared = flags == SHARED;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FuzzInput in = {data, size};
    unsigned job = (unsigned)take_uint(&in, 2), src = (unsigned)take_uint(&in, 2);
    size_t max_out = (size_t)take_uint(&in, 1);
    size_t n = in.left;
    uint8_t *stream = exact_alloc(n);
    take_bytes(&in, stream, n);
    RateReport *got = malloc((max_out + 1) * sizeof *got), *want = malloc(256 * sizeof *want);
    if (got == NULL || want == NULL)
        abort();
    RateRules rules = {FIRST, SHARED, (uint16_t)job};
    size_t count = 0;
    size_t taken = rate_frames(stream, n, &rules, src, got, max_out, &count);

    size_t at = 0, k = 0;
    while (k < max_out && n - at >= 32 && reference_frame(stream + at, job, src, &want[k])) {
        at += 32;
        k++;
    }
    if (taken != at || count != k || taken != 32 * count || taken > n || count > max_out) {
        fprintf(stderr, "rate_frames took %zu bytes, %zu frames; the reference %zu, %zu\n",
                taken, count, at, k);
        abort();
    }
    for (size_t i = 0; i < count; i++)
        if (got[i].bytes_per_s != want[i].bytes_per_s || got[i].window != want[i].window ||
            got[i].shared != want[i].shared) {
            fprintf(stderr, "report %zu differs from the reference\n", i);
            abort();
        }
    free(got);
    free(want);
    free(stream);
    return 0;
}
