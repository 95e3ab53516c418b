/*
 * libFuzzer target: scatter_run, the receive fast path of dlcp/proto/_kernels.c
 * (its Python-free core, dlcp/proto/_kernels_core.h), on records and geometry
 * taken from the input.
 *
 * Input layout (tests/fuzz/make_corpus.py writes seeds in it):
 *   mode      1 byte: bit 0 the template is the first record's header (as the
 *             endpoint calls it), bit 1 streaming stores, bit 2 geometry as 8-byte
 *             signed numbers (else 2-byte unsigned), bit 3 n and total as given
 *             (else derived from the records' length, as dlcp/proto/kernels.py does),
 *             bit 4 a 24-byte authentication trailer after each payload, bit 5
 *             payloads added to out as float32 values (add)
 *   hl        1 byte: header length (template and mask bytes)
 *   layout    8 bytes
 *   geometry  stride, chunk_elems, msg_elems, itemsize, n, total, out_len, maps_len
 *   received  8 bytes: chunk c already received if bit c % 64 is set
 *   mask      hl bytes, then the template (hl bytes) unless mode bit 0
 *   records   the rest
 *
 * Oracle: the core's verdict on the arguments equals one recomputed here in
 * 128-bit arithmetic (accept exactly when every record, chunk and map entry the
 * geometry names lies inside its buffer); on accepted arguments, the result and
 * the whole of out, received and received_class equal a reference scatter written
 * from the contract in _kernels.c (the bytes of out that no fresh chunk covers keep
 * their previous contents). Every buffer is a heap block of exactly its length, so
 * AddressSanitizer reports any access outside it.
 */
#include "fuzz_input.h"

#include "../../dlcp/proto/_kernels_core.h"

typedef __int128 i128;

#define LIMIT (1 << 16) /* the largest out or map the harness sizes to the geometry */

static int64_t take_geometry(FuzzInput *in, int wide) {
    return wide ? take_int64(in) : (int64_t)take_uint(in, 2);
}

/* The reference verdict: whether the arguments are sound, in exact arithmetic. */
static int sound(const ScatterArgs *a) {
    i128 hl = a->tmpl_len;
    if (hl <= 0 || hl > 64 || hl % 8 || a->mask_len != hl || a->layout_len != 8 ||
        a->trailer < 0 || a->trailer > 64)
        return 0;
    const unsigned char *l = a->layout;
    if (l[0] >= hl || l[1] + 4 > hl || l[2] + 4 > hl || l[3] + 2 > hl || l[4] >= hl)
        return 0;
    i128 n = a->n, stride = a->stride, total = a->total;
    if (n < 0 || stride < hl || a->chunk_elems <= 0 || a->msg_elems <= 0 || a->itemsize <= 0 ||
        (a->add && a->itemsize != 4))
        return 0;
    if (total > n * stride || (n > 0 && total <= (n - 1) * stride))
        return 0;
    i128 chunks = ((i128)a->msg_elems + a->chunk_elems - 1) / a->chunk_elems;
    return a->buf_len >= total && a->out_len >= (i128)a->msg_elems * a->itemsize &&
           a->received_len >= chunks && a->received_class_len >= chunks;
}

static uint32_t get_be(const unsigned char *p, int bytes) {
    uint32_t v = 0;
    for (int i = 0; i < bytes; i++)
        v = v << 8 | p[i];
    return v;
}

/* The contract of scatter_run, one record at a time, on copies of the state. */
static ScatterResult reference(const ScatterArgs *a, unsigned char *out, unsigned char *rcv,
                               unsigned char *cls) {
    ScatterResult res = {0, 0, 0, 0, 0, 0};
    const unsigned char *l = a->layout;
    i128 chunks = ((i128)a->msg_elems + a->chunk_elems - 1) / a->chunk_elems;
    for (ssize_t i = 0; i < a->n; i++, res.taken++) {
        const unsigned char *r = a->buf + i * a->stride;
        ssize_t len = i == a->n - 1 ? a->total - i * a->stride : a->stride;
        if (len < a->tmpl_len)
            break;
        int agrees = 1;
        for (ssize_t k = 0; k < a->tmpl_len; k++)
            agrees &= ((r[k] ^ a->tmpl[k]) & a->mask[k]) == 0;
        if (!agrees)
            break;
        i128 seq = get_be(r + l[1], 4);
        if (seq >= chunks)
            break;
        i128 start = seq * a->chunk_elems;
        i128 elems = a->msg_elems - start < a->chunk_elems ? a->msg_elems - start : a->chunk_elems;
        i128 payload = get_be(r + l[3], 2);
        int last = (r[l[0]] & l[5]) != 0;
        if (get_be(r + l[2], 4) != start || payload != elems * a->itemsize ||
            len != a->tmpl_len + payload + a->trailer || last != (seq == chunks - 1))
            break;
        res.payload_bytes += (long long)payload;
        if (rcv[seq])
            continue;
        if (a->add)
            add_floats(out + (size_t)(start * a->itemsize), r + a->tmpl_len, (size_t)payload);
        else
            memcpy(out + (size_t)(start * a->itemsize), r + a->tmpl_len, (size_t)payload);
        rcv[seq] = 1;
        cls[seq] = r[l[4]] >> 4;
        res.fresh++;
        res.fresh_elems += (long long)elems;
        res.fresh_drop += (r[l[4]] & l[7]) != 0;
        res.fresh_retx += (r[l[0]] & l[6]) != 0;
    }
    return res;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FuzzInput in = {data, size};
    unsigned mode = (unsigned)take_uint(&in, 1);
    int wide = (mode & 4) != 0, given = (mode & 8) != 0;
    ssize_t hl = (ssize_t)take_uint(&in, 1);
    uint8_t layout[8];
    take_bytes(&in, layout, 8);
    int64_t stride = take_geometry(&in, wide), chunk_elems = take_geometry(&in, wide),
            msg_elems = take_geometry(&in, wide), itemsize = take_geometry(&in, wide),
            n = take_geometry(&in, wide), total = take_geometry(&in, wide),
            out_len = (int64_t)take_uint(&in, 2), maps_len = (int64_t)take_uint(&in, 2);
    uint64_t prior = take_uint(&in, 8);
    uint8_t mask_bytes[255], tmpl_bytes[255];
    take_bytes(&in, mask_bytes, (size_t)hl);
    if (!(mode & 1))
        take_bytes(&in, tmpl_bytes, (size_t)hl);
    size_t records_len = in.left;
    if (!given) { /* as dlcp/proto/kernels.py calls it: every record of the buffer */
        total = (int64_t)records_len;
        n = stride > 0 ? total / stride + (total % stride != 0) : 0;
        /* maps and out as the reassembler sizes them, where that is small */
        if (chunk_elems > 0 && msg_elems > 0 && itemsize > 0 && msg_elems < LIMIT &&
            itemsize < LIMIT && msg_elems * itemsize < LIMIT) {
            out_len = msg_elems * itemsize;
            maps_len = msg_elems / chunk_elems + (msg_elems % chunk_elems != 0);
        }
    }
    if (mode & 1) /* the first record's header (zeros where the input is shorter) */
        for (ssize_t k = 0; k < hl; k++)
            tmpl_bytes[k] = (size_t)k < records_len ? in.p[k] : 0;

    uint8_t *buf = exact_copy(in.p, records_len);
    uint8_t *mask = exact_copy(mask_bytes, (size_t)hl), *tmpl = exact_copy(tmpl_bytes, (size_t)hl);
    uint8_t *lay = exact_copy(layout, 8);
    uint8_t *out = exact_alloc((size_t)out_len), *rcv = exact_alloc((size_t)maps_len),
            *cls = exact_alloc((size_t)maps_len);
    if (out_len)
        memset(out, 0xA5, (size_t)out_len);
    for (int64_t c = 0; c < maps_len; c++) {
        rcv[c] = (prior >> (c % 64)) & 1;
        cls[c] = rcv[c] ? 0x0F : 0;
    }
    ScatterArgs a = {buf,         (ssize_t)records_len, n,         stride,   total,  tmpl, mask,
                     lay,         hl,                   hl,        8,        out,    out_len,
                     chunk_elems, msg_elems,            itemsize,  rcv,      cls,    maps_len,
                     maps_len,    (mode & 2) != 0, /* trailer: */ (mode & 16) ? 24 : 0,
                     /* add: */ (mode & 32) != 0};
    int verdict = scatter_check_args(&a);
    if (verdict == SCATTER_OK)
        verdict = scatter_check_buffers(&a);
    EXPECT((verdict == SCATTER_OK) == sound(&a),
           "verdict %d; hl %zd n %lld stride %lld total %lld chunk %lld msg %lld item %lld "
           "buf %zu out %lld maps %lld",
           verdict, hl, (long long)n, (long long)stride, (long long)total,
           (long long)chunk_elems, (long long)msg_elems, (long long)itemsize, records_len,
           (long long)out_len, (long long)maps_len);
    if (verdict == SCATTER_OK) {
        uint8_t *want_out = exact_copy(out, (size_t)out_len);
        uint8_t *want_rcv = exact_copy(rcv, (size_t)maps_len);
        uint8_t *want_cls = exact_copy(cls, (size_t)maps_len);
        ScatterResult want = reference(&a, want_out, want_rcv, want_cls), got;
        scatter_records(&a, &got);
        EXPECT(got.taken == want.taken && got.fresh == want.fresh &&
                   got.fresh_elems == want.fresh_elems && got.fresh_drop == want.fresh_drop &&
                   got.fresh_retx == want.fresh_retx && got.payload_bytes == want.payload_bytes,
               "result (%zd, %zd, %lld, %zd, %zd, %lld), reference (%zd, %zd, %lld, %zd, %zd, %lld)",
               got.taken, got.fresh, got.fresh_elems, got.fresh_drop, got.fresh_retx,
               got.payload_bytes, want.taken, want.fresh, want.fresh_elems, want.fresh_drop,
               want.fresh_retx, want.payload_bytes);
        EXPECT(a.add ? same_floats(out, want_out, (size_t)out_len)
                     : memcmp(out, want_out, (size_t)out_len) == 0,
               "out differs from the reference");
        EXPECT(memcmp(rcv, want_rcv, (size_t)maps_len) == 0, "received differs");
        EXPECT(memcmp(cls, want_cls, (size_t)maps_len) == 0, "received_class differs");
        free(want_out);
        free(want_rcv);
        free(want_cls);
    }
    free(buf);
    free(mask);
    free(tmpl);
    free(lay);
    free(out);
    free(rcv);
    free(cls);
    return 0;
}
