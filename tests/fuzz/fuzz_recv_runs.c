/*
 * libFuzzer target: the UDP receive loop of dlcp/io/_udpio.c (recv_runs_loop in
 * dlcp/io/_recv_runs.h), with recvmsg and recvmmsg replaced by a scripted socket
 * that hands out what the input describes: plain datagrams, UDP GRO reads (a
 * segment size in ancillary data, any value), malformed ancillary data, empty
 * datagrams, truncation to the read size, and receive errors.
 *
 * Input layout (tests/fuzz/make_corpus.py writes seeds in it):
 *   read_size 2 bytes (plus one), buffer length 3 bytes, budget 3 bytes,
 *   max_reads 2 bytes, then events of 6 bytes until the input ends:
 *     kind    low 3 bits: 0 plain datagram, 1 GRO read, 2 receive error,
 *             3 GRO read with malformed ancillary data, 4 empty datagram,
 *             5-7 plain; high 5 bits: repeat count - 1
 *     length  2 bytes (a datagram's or a GRO read's bytes)
 *     value   3 bytes: a GRO read's segment size (signed 24 bits), an error's errno
 *   A datagram's bytes are its index and a fill byte of its own, so that each can
 *   be found.
 *
 * Oracle: the bytes the loop reports, buf[0, fill), are the received bytes back to
 * back (nothing moved wrongly by the batch's compaction); the runs tile [0, fill)
 * and, cut into segments, give exactly the datagrams the socket handed out, in
 * order (each read split at its GRO segment size, or whole); the byte, read and
 * empty counts add up; every datagram taken from the socket is reported (none
 * lost); the loop stops only drained, on an error it reports, with the buffer
 * full, or at its budget or read limit; at most MAX_RUNS runs. The buffer is a
 * heap block of exactly its length (AddressSanitizer).
 */
#include "scripted_socket.h"

static Run runs[MAX_RUNS];
static RecvScratch scratch;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FuzzInput in = {data, size};
    ssize_t read_size = (ssize_t)take_uint(&in, 2) + 1;
    ssize_t len = (ssize_t)(take_uint(&in, 3) % ((1 << 18) + 1));
    ssize_t budget = (ssize_t)take_uint(&in, 3);
    ssize_t max_reads = (ssize_t)take_uint(&in, 2);
    sock.n = sock.next = sock.reads = sock.sent_len = 0;
    sock.error_seen = sock.last_failed = 0;
    while (in.left && sock.n < MAX_EVENTS) {
        unsigned kind = (unsigned)take_uint(&in, 1);
        ssize_t dlen = (ssize_t)take_uint(&in, 2);
        uint32_t raw = (uint32_t)take_uint(&in, 3);
        int32_t value = (int32_t)(raw << 8) >> 8; /* signed 24 bits */
        int k = (int)(kind & 7) > EMPTY ? PLAIN : (int)(kind & 7);
        if (k == ERROR) /* errors the socket may give: would-block, signals, ICMP, memory */
            value = (int[]){EAGAIN, EINTR, ECONNREFUSED, ENOMEM, EHOSTUNREACH}[raw % 5];
        for (unsigned r = 0; r <= kind >> 3 && sock.n < MAX_EVENTS; r++)
            sock.events[sock.n++] = (Event){k, k == EMPTY ? 0 : dlen, value};
    }
    char *buf = (char *)exact_alloc((size_t)len);
    RecvRuns got;
    recv_runs_loop(3, buf, len, budget, max_reads, read_size, runs, &scratch, &got);

    /* the counts */
    size_t datagrams = sock.reads;
    ssize_t total = 0, empty = 0;
    for (size_t i = 0; i < datagrams; i++) {
        total += sock.read_len[i];
        empty += sock.read_len[i] == 0;
    }
    EXPECT(got.reads == (ssize_t)datagrams, "%zd reads reported, %zu handed out", got.reads,
           datagrams);
    EXPECT(got.total == total && got.empty == empty, "bytes %zd (%zd), empty %zd (%zd)",
           got.total, total, got.empty, empty);
    EXPECT(got.err == sock.error_seen, "errno %d reported, %d met", got.err, sock.error_seen);
    EXPECT(got.n_runs >= 0 && got.n_runs <= MAX_RUNS, "%zd runs", got.n_runs);
    EXPECT(got.reads <= max_reads || max_reads <= 0, "%zd reads over the limit %zd", got.reads,
           max_reads);
    /* the bytes: everything received, back to back */
    ssize_t fill = got.n_runs ? runs[got.n_runs - 1].end : 0;
    EXPECT(fill == (ssize_t)sock.sent_len, "runs end at %zd, %zu bytes received", fill,
           sock.sent_len);
    EXPECT(fill <= len, "runs end at %zd in a buffer of %zd", fill, len);
    EXPECT(fill == 0 || memcmp(buf, sock.sent, (size_t)fill) == 0, "buffer bytes differ");
    /* the runs tile [0, fill) and cut into the datagrams handed out */
    size_t read = 0;
    ssize_t in_read = 0; /* bytes of read `read` already matched */
    for (ssize_t i = 0; i < got.n_runs; i++) {
        Run r = runs[i];
        EXPECT(r.start == (i ? runs[i - 1].end : 0) && r.end > r.start && r.seg > 0,
               "run %zd: [%zd, %zd) seg %zd", i, r.start, r.end, r.seg);
        for (ssize_t at = r.start; at < r.end;) {
            ssize_t piece = r.end - at < r.seg ? r.end - at : r.seg;
            while (read < datagrams && sock.read_len[read] == 0)
                read++;
            EXPECT(read < datagrams, "run %zd goes past the reads", i);
            ssize_t n = sock.read_len[read], seg = sock.read_seg[read];
            ssize_t want = n - in_read < seg ? n - in_read : seg;
            EXPECT(piece == want, "run %zd cuts a %zd-byte datagram at %zd, the read had %zd", i,
                   piece, at, want);
            at += piece;
            in_read += piece;
            if (in_read == n) {
                read++;
                in_read = 0;
            }
        }
    }
    /* it stops for a reason */
    int full = len - fill < read_size || got.n_runs >= MAX_RUNS - 2;
    EXPECT(!got.more || full, "more without a full buffer");
    /* data waiting, and the last read neither failed nor came short before an error */
    if (!sock.last_failed && !got.more && sock.next < sock.n &&
        sock.events[sock.next].kind != ERROR)
        EXPECT(got.total >= budget || got.reads >= max_reads,
               "stopped with data waiting: %zd bytes of %zd, %zd reads of %zd", got.total,
               budget, got.reads, max_reads);
    free(buf);
    return 0;
}
