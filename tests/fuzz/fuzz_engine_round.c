/*
 * libFuzzer target: the geometry checks of the native send engine's post() and
 * the batches it then cuts a round into (dlcp/io/_round_geometry.h, called by
 * dlcp/io/_engine.c). Python hands post() a record buffer of count * stride
 * bytes, a short last record and the breaks between batches; the engine's thread
 * then sends [start, stop) batches straight from that buffer, so a round the
 * checks let through must never make it send bytes outside the buffer, nor a
 * short datagram anywhere but last in a GSO message.
 *
 * Input layout:
 *   mode      1 byte: bit 0 geometry as 8-byte signed numbers (else 2-byte),
 *             bit 1 breaks as 8-byte signed numbers (else 2-byte), bit 2 the
 *             record buffer's length as given (else count * stride)
 *   geometry  count, stride, per_message, short_index (2-byte: minus one),
 *             short_len, limit (the batch size the pacer allows, at least 1),
 *             the record buffer's length
 *   breaks    1 byte n, then n numbers
 *
 * Oracle: the verdicts on geometry, record buffer and breaks equal ones
 * recomputed in 128-bit arithmetic from post()'s contract; on an accepted round, walking its batches
 * (at the given limit and at 1): each is non-empty, ends at a break or `limit`
 * records on, never crosses a break, holds the short record only as its last,
 * and its bytes lie inside the count * stride of the record buffer and equal
 * the sum of its records' lengths.
 */
#include "fuzz_input.h"

#include "../../dlcp/io/_round_geometry.h"

typedef __int128 i128;

#define MAX_BATCHES 4096 /* batches walked per limit */

static int64_t take_number(FuzzInput *in, int wide) {
    return wide ? take_int64(in) : (int64_t)take_uint(in, 2);
}

static int reference_geometry(i128 count, i128 stride, i128 per_message, i128 short_index,
                              i128 short_len) {
    if (count < 1 || stride < 1 || stride > 65535 || per_message < 1 || per_message > 64)
        return 0;
    if (per_message * stride > 65535)
        return 0;
    if (short_index < -1 || short_index >= count)
        return 0;
    return short_index < 0 || (short_len >= 1 && short_len <= stride);
}

static int reference_breaks(const int64_t *b, int n, int64_t count, int64_t short_index) {
    int after_short = short_index < 0;
    for (int i = 0; i < n; i++) {
        if (b[i] < 1 || b[i] > count || (i && b[i] <= b[i - 1]))
            return 0;
        after_short |= (i128)b[i] == (i128)short_index + 1;
    }
    return n > 0 && b[n - 1] == count && after_short;
}

static void walk(const int64_t *b, int n, int64_t count, int64_t stride, int64_t short_index,
                 int64_t short_len, int64_t limit) {
    int64_t start = 0;
    for (int batches = 0; start < count && batches < MAX_BATCHES; batches++) {
        int64_t stop = round_batch_end(b, n, count, start, limit);
        EXPECT(stop > start && stop <= count && (i128)stop - start <= limit,
               "batch from %lld ends at %lld (count %lld, limit %lld)", (long long)start,
               (long long)stop, (long long)count, (long long)limit);
        int at_break = 0;
        for (int i = 0; i < n; i++) {
            EXPECT(!(b[i] > start && b[i] < stop), "batch [%lld, %lld) crosses break %lld",
                   (long long)start, (long long)stop, (long long)b[i]);
            at_break |= b[i] == stop;
        }
        EXPECT(at_break || stop - start == limit, "batch [%lld, %lld) ends nowhere",
               (long long)start, (long long)stop);
        int has_short = short_index >= start && short_index < stop;
        EXPECT(!has_short || short_index == stop - 1, "short record %lld inside [%lld, %lld)",
               (long long)short_index, (long long)start, (long long)stop);
        i128 want = (i128)(stop - start) * stride - (has_short ? stride - short_len : 0);
        ssize_t bytes = round_batch_bytes(stride, short_index, short_len, start, stop);
        EXPECT(bytes == want && bytes > 0, "batch [%lld, %lld): %zd bytes, %lld expected",
               (long long)start, (long long)stop, bytes, (long long)want);
        EXPECT((i128)start * stride + bytes <= (i128)count * stride,
               "batch [%lld, %lld) ends past the records", (long long)start, (long long)stop);
        start = stop;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FuzzInput in = {data, size};
    unsigned mode = (unsigned)take_uint(&in, 1);
    int wide = (mode & 1) != 0, wide_breaks = (mode & 2) != 0;
    int64_t count = take_number(&in, wide), stride = take_number(&in, wide),
            per_message = take_number(&in, wide), short_index = take_number(&in, wide),
            short_len = take_number(&in, wide), limit = take_number(&in, wide),
            records_len = take_number(&in, wide);
    if (!(mode & 4)) /* the buffer Python hands over, where its length fits 63 bits */
        records_len = (i128)count * stride == (int64_t)((i128)count * stride)
                          ? (int64_t)((i128)count * stride)
                          : records_len;
    if (!wide)
        short_index -= 1; /* -1 (no short record) from a zero */
    if (limit < 1)
        limit = 1; /* (the engine's batch size is at least one record) */
    int n = (int)take_uint(&in, 1);
    int64_t *breaks = (int64_t *)exact_alloc(sizeof(int64_t) * (size_t)n);
    for (int i = 0; i < n; i++)
        breaks[i] = take_number(&in, wide_breaks);

    int ok = round_geometry_ok(count, stride, per_message, short_index, short_len);
    EXPECT(ok == reference_geometry(count, stride, per_message, short_index, short_len),
           "geometry verdict %d: count %lld stride %lld per_message %lld short %lld of %lld", ok,
           (long long)count, (long long)stride, (long long)per_message, (long long)short_index,
           (long long)short_len);
    if (ok) {
        int fits = round_buffer_fits(records_len, stride, count);
        EXPECT(fits == ((i128)count * stride == records_len),
               "records verdict %d: %lld bytes for %lld of %lld", fits, (long long)records_len,
               (long long)count, (long long)stride);
        ok = fits;
    }
    if (ok) {
        ssize_t bad = round_bad_break(breaks, n, count, short_index);
        EXPECT(bad >= -1 && bad <= n, "bad break index %zd of %d", bad, n);
        EXPECT((bad == -1) == reference_breaks(breaks, n, count, short_index),
               "breaks verdict %zd (%d breaks, count %lld, short %lld)", bad, n,
               (long long)count, (long long)short_index);
        if (bad == -1) {
            walk(breaks, n, count, stride, short_index, short_len, limit);
            walk(breaks, n, count, stride, short_index, short_len, 1);
        }
    }
    free(breaks);
    return 0;
}
