/*
 * libFuzzer target: swap_records of dlcp/proto/_kernels.c (its Python-free core,
 * dlcp/proto/_kernels_core.h), which turns the big-endian headers of a received
 * batch into native records and finds whether they share the message-wide bits
 * (dlcp.proto.batch.parse_batch's first step).
 *
 * Input layout (tests/fuzz/make_corpus.py writes seeds in it):
 *   mode      1 byte: bit 0 geometry as 8-byte signed numbers (else 2-byte
 *             unsigned), bit 1 with a mask, bit 2 sizes as given (else dst and
 *             src hold exactly the n records, as dlcp/proto/kernels.py sizes them)
 *   fields    1 byte count k, then k bytes: (offset, size) pairs
 *   geometry  n, record_bytes, dst_stride, src_stride, dst_len, mask_len
 *   mask      mask_len bytes (with mode bit 1)
 *   src       the rest
 *
 * Oracle: the core's verdict equals one recomputed in 128-bit arithmetic (accept
 * exactly when the fields fit a record and the n records fit both buffers); on
 * accepted arguments every byte of dst equals a reference copy-and-swap (bytes
 * between and after the records keep their previous contents) and the returned
 * agreement equals a byte-by-byte comparison of each record with the first under
 * the mask. Buffers are heap blocks of exactly their length (AddressSanitizer).
 */
#include "fuzz_input.h"

#include "../../dlcp/proto/_kernels_core.h"

typedef __int128 i128;

#define LIMIT (1 << 16) /* the largest dst the harness sizes to the geometry */

static int64_t take_geometry(FuzzInput *in, int wide) {
    return wide ? take_int64(in) : (int64_t)take_uint(in, 2);
}

static int sound(const SwapArgs *a) {
    if (a->mask != NULL && a->mask_len != a->record_bytes)
        return 0;
    if (a->n < 0 || a->record_bytes < 0 || a->dst_stride < a->record_bytes ||
        a->src_stride < a->record_bytes || a->fields_len % 2)
        return 0;
    for (ssize_t f = 0; f < a->fields_len; f += 2) {
        int size = a->fields[f + 1];
        if ((size != 2 && size != 4 && size != 8) || a->fields[f] + size > a->record_bytes)
            return 0;
    }
    i128 last_d = (i128)(a->n - 1) * a->dst_stride, last_s = (i128)(a->n - 1) * a->src_stride;
    return a->n == 0 ||
           (last_d + a->record_bytes <= a->dst_len && last_s + a->record_bytes <= a->src_len);
}

/* The contract: each record copied, each named field's bytes reversed (from the
 * source, so overlapping fields each read the original bytes). */
static int reference(const SwapArgs *a, unsigned char *dst) {
    int same = 1;
    for (ssize_t i = 0; i < a->n; i++) {
        const unsigned char *s = a->src + i * a->src_stride;
        unsigned char *d = dst + i * a->dst_stride;
        memcpy(d, s, (size_t)a->record_bytes);
        for (ssize_t f = 0; f < a->fields_len; f += 2)
            for (int k = 0; k < a->fields[f + 1]; k++)
                d[a->fields[f] + k] = s[a->fields[f] + a->fields[f + 1] - 1 - k];
        if (a->mask != NULL)
            for (ssize_t k = 0; k < a->record_bytes; k++)
                if ((s[k] & a->mask[k]) != (a->src[k] & a->mask[k]))
                    same = 0;
    }
    return same;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FuzzInput in = {data, size};
    unsigned mode = (unsigned)take_uint(&in, 1);
    int wide = (mode & 1) != 0, with_mask = (mode & 2) != 0, given = (mode & 4) != 0;
    size_t fields_len = (size_t)take_uint(&in, 1);
    uint8_t field_bytes[255];
    take_bytes(&in, field_bytes, fields_len);
    int64_t n = take_geometry(&in, wide), record_bytes = take_geometry(&in, wide),
            dst_stride = take_geometry(&in, wide), src_stride = take_geometry(&in, wide);
    int64_t dst_len = (int64_t)take_uint(&in, 2), mask_len = (int64_t)take_uint(&in, 1);
    if (!given && record_bytes >= 0 && record_bytes <= 255)
        mask_len = record_bytes;
    uint8_t mask_bytes[255];
    take_bytes(&in, mask_bytes, (size_t)mask_len);
    size_t src_len = in.left;
    if (!given && n > 0 && record_bytes >= 0 && record_bytes < LIMIT && dst_stride >= 0 &&
        dst_stride < LIMIT && src_stride >= 0 && (i128)(n - 1) * dst_stride + record_bytes < LIMIT)
        dst_len = (n - 1) * dst_stride + record_bytes; /* exactly the records */

    uint8_t *fields = exact_copy(field_bytes, fields_len);
    uint8_t *mask = with_mask ? exact_copy(mask_bytes, (size_t)mask_len) : NULL;
    uint8_t *src = exact_copy(in.p, src_len);
    uint8_t *dst = exact_alloc((size_t)dst_len);
    for (int64_t k = 0; k < dst_len; k++)
        dst[k] = (uint8_t)(k * 7 + 1);
    SwapArgs a = {dst,    dst_len,      dst_stride, src,    (ssize_t)src_len, src_stride,
                  n,      record_bytes, fields,     (ssize_t)fields_len,      mask,
                  mask_len};
    ssize_t bad_field = -1;
    int verdict = swap_check_args(&a, &bad_field);
    if (verdict == SWAP_BAD_FIELD)
        EXPECT(bad_field >= 0 && bad_field + 1 < (ssize_t)fields_len && bad_field % 2 == 0,
               "bad field index %zd of %zu bytes", bad_field, fields_len);
    if (verdict == SWAP_OK)
        verdict = swap_check_buffers(&a);
    EXPECT((verdict == SWAP_OK) == sound(&a),
           "verdict %d; n %lld record %lld strides %lld %lld dst %lld src %zu fields %zu",
           verdict, (long long)n, (long long)record_bytes, (long long)dst_stride,
           (long long)src_stride, (long long)dst_len, src_len, fields_len);
    /* (n zero-byte records fit any buffer: past a million, only the verdict is checked) */
    if (verdict == SWAP_OK && n <= LIMIT * 16) {
        uint8_t *want = exact_copy(dst, (size_t)dst_len);
        int want_same = reference(&a, want);
        int same = swap_records_loop(&a);
        EXPECT(memcmp(dst, want, (size_t)dst_len) == 0, "dst differs from the reference");
        EXPECT(same == (with_mask ? want_same : 1), "agreement %d, reference %d", same,
               want_same);
        free(want);
    }
    free(fields);
    free(mask);
    free(src);
    free(dst);
    return 0;
}
