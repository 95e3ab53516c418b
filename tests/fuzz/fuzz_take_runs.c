/*
 * libFuzzer target: the native receive path of dlcp/io/_udpio.c (MessageTable:
 * take_next in dlcp/io/_take_runs.h) over what the receive loop read from a
 * scripted socket (scripted_socket.h) and the pre-filter kept, with registered
 * messages whose buffers are heap blocks of exactly their length; one of them
 * is removed part way through.
 *
 * Input layout (tests/fuzz/make_corpus.py writes seeds in it):
 *   read_size 2 bytes (plus one), buffer length 3 bytes, budget 3 bytes,
 *   max_reads 2 bytes, job 2 bytes,
 *   messages  1 byte (count, at most MAX_MESSAGES), then per message: src 2, step
 *             4, msg 2, chunk_elems 2, msg_elems 3, itemsize (1 << low 2 bits of
 *             1 byte), dtype byte 1, flags 1 (bit 0 streaming stores, bit 1 tagged:
 *             registered with a verifier, bit 2 payloads added to out as float32
 *             values where itemsize is 4, bits 3-7 its nonce floor's top 5 bits:
 *             a tagged datagram with a lower nonce is not taken), received 8
 *             bytes (chunk c already in if bit c % 64 is set), complete_elems 3,
 *             complete_protected 2, removed after handover number 1 byte (255:
 *             never);
 *   pool      1 byte (count, at most MAX_POOL), then per datagram: length 2 bytes
 *             and its bytes;
 *   events    of 7 bytes until the input ends: as fuzz_recv_runs.c's (kind, length,
 *             value), then 1 byte: the pool datagram the read starts with. A read
 *             is cut at its segment size; each piece is the next pool datagram,
 *             cut or padded with zeros to the piece's length.
 *
 * Tagged messages: the table's verify is a stand-in for the AES-GMAC check of
 * dlcp/io/_udpio.c (which is libcrypto's, and is tested against dlcp/proto/auth.py
 * in tests/io/test_native_receive.py): a record's "tag" is right when its last
 * byte is its length modulo 256, and the check fails (-1) when that byte is 0xFF
 * and the length odd. What is fuzzed here is the take path around it: which
 * datagrams are offered to the check, the prefix it lets through, the trailer
 * left out of the payload.
 *
 * Oracle: the handovers follow the staged runs in order (a run handed over whole,
 * the rest of a run after a taken prefix, a completion check after a run); every
 * datagram taken passes a reference of the run path's rules (a data datagram of
 * the job with no flag beyond LAST and RETRANSMIT, and AUTH exactly when its
 * message is tagged, of a registered message with its dtype and length, the
 * head's message-wide bytes, seq, offset, payload length, datagram length (with
 * the 24-byte trailer of a tagged message) and LAST flag that fit, and for a
 * tagged message a tag the stand-in accepts, the datagram at least a header and
 * a trailer long) and the first datagram a run does not take fails it; each chunk that arrives is written with the payload of the
 * first taken datagram that carried it (or, for an adding message, that payload's
 * float32 values added to what out held) and marked with its class, nothing else of
 * any buffer changes, and nothing of a removed message after its removal; the
 * counts reported equal the reference's; a completion check is handed over
 * exactly when a run brought new data and the reference counts say it is due.
 */
#include "scripted_socket.h"

#include "../../dlcp/io/_prefilter.h"
#include "../../dlcp/io/_take_runs.h"

#define MAX_MESSAGES 4
#define MAX_POOL 16
#define MAX_POOL_LEN 2048
#define MAX_OUT (1 << 18)

/* the wire layout (dlcp/proto/wire.py HEADER_DTYPE, batch.SHARED_HEADER_MASK,
 * reassembler.RUN_LAYOUT), as dlcp/io/native_receive.py passes it */
#define HL 32
#define DATA_VT 0x11
#define AUTH_FLAG 0x04
#define TRAILER 24
static const unsigned char MASK[HL] = {
    0xFF, 0xFC, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0,    0,    0,    0,    0,
    0,    0,    0,    0,    0xFF, 0xFF, 0xFF, 0xFF, 0,    0,    0xFF, 0xFF, 0, 0xFF, 0xFF, 0};
static const unsigned char LAYOUT[8] = {1, 12, 16, 24, 28, 1, 2, 0x10};
static const HeadLayout HEAD = {0, 1, 2, 4, 8, 20, 26, 29, 30};

static struct {
    uint8_t data[MAX_POOL][MAX_POOL_LEN];
    size_t len[MAX_POOL], n;
    uint8_t first[MAX_EVENTS]; /* each event's first pool datagram */
} pool;

static void fill_from_pool(size_t index, const Event *e, uint8_t *dst, ssize_t n) {
    ssize_t seg = e->kind == GRO && e->value > 0 ? e->value : n;
    size_t k = pool.first[index];
    for (ssize_t at = 0; at < n; at += seg, k++) {
        ssize_t piece = n - at < seg ? n - at : seg;
        size_t have = pool.n ? pool.len[k % pool.n] : 0;
        size_t copy = have < (size_t)piece ? have : (size_t)piece;
        if (copy)
            memcpy(dst + at, pool.data[k % pool.n], copy);
        memset(dst + at + copy, 0, (size_t)piece - copy);
    }
}

/* A registered message as the harness sees it: its buffers, a copy of each as the
 * reference says it must be, and the reference counts. */
typedef struct {
    TakenMessage m;
    uint8_t *out, *received, *cls;          /* the table's (exact heap blocks) */
    uint8_t *want_out, *want_rcv, *want_cls; /* the reference's */
    ssize_t n_chunks;
    int removed_after, removed;
    long long datagrams, nbytes, fresh, fresh_elems, fresh_drop, fresh_retx, payload_bytes;
    int bound; /* the bound byte of the first run it took (-1: none yet) */
    uint64_t nonce_next; /* one above the highest nonce taken (0: none) */
} Message;

static Message msgs[MAX_MESSAGES];

/* The stand-in tag check (see the top): the verifier must be a tagged message's. */
static int stand_in_verify(void *verifier, const unsigned char *record, size_t len) {
    int known = 0;
    for (size_t i = 0; i < MAX_MESSAGES; i++)
        known |= verifier == (void *)&msgs[i];
    EXPECT(known, "a tag checked with a verifier no message was registered with");
    EXPECT(len >= HL + TRAILER, "a tag checked on a %zu-byte record", len);
    if (record[len - 1] == 0xFF && (len & 1))
        return -1;
    return record[len - 1] == (uint8_t)len;
}

/* Whether the stand-in accepts record d of len bytes, as the table must judge it. */
static int tag_right(const uint8_t *d, ssize_t len) {
    return len >= HL + TRAILER && d[len - 1] == (uint8_t)len && !(d[len - 1] == 0xFF && (len & 1));
}
static size_t n_msgs;
static TakeTable table;
static Run staged[MAX_RUNS];
static RecvScratch scratch;

static uint32_t be(const uint8_t *p, int bytes) {
    uint32_t v = 0;
    for (int i = 0; i < bytes; i++)
        v = v << 8 | p[i];
    return v;
}

/* The registered (and not removed) message a head names, by the reference's rules. */
static Message *message_of(const uint8_t *h, unsigned job) {
    if (h[0] != DATA_VT || be(h + 2, 2) != job)
        return NULL;
    uint64_t key = take_key(be(h + 26, 2), be(h + 4, 4), be(h + 8, 2));
    for (size_t i = 0; i < n_msgs; i++) {
        Message *g = &msgs[i];
        if (!g->removed && g->m.key == key && h[29] == g->m.dtype_byte &&
            (ssize_t)be(h + 20, 4) == g->m.msg_elems)
            return (h[1] & ~3u) == (g->m.verifier != NULL ? AUTH_FLAG : 0u) ? g : NULL;
    }
    return NULL;
}

/* Whether datagram d (len bytes) fits message g of head h: the run path's rule. */
static int fits(const Message *g, const uint8_t *h, const uint8_t *d, ssize_t len) {
    if (len < HL)
        return 0;
    for (int k = 0; k < HL; k++)
        if ((d[k] ^ h[k]) & MASK[k])
            return 0;
    uint32_t seq = be(d + 12, 4);
    if ((ssize_t)seq >= g->n_chunks)
        return 0;
    long long start = (long long)seq * g->m.chunk_elems;
    long long elems = g->m.msg_elems - start < g->m.chunk_elems ? g->m.msg_elems - start
                                                                 : g->m.chunk_elems;
    uint32_t payload = be(d + 24, 2);
    ssize_t trailer = g->m.verifier != NULL ? TRAILER : 0;
    return be(d + 16, 4) == start && payload == elems * g->m.itemsize &&
           len == HL + payload + trailer &&
           ((d[1] & 1) != 0) == ((ssize_t)seq == g->n_chunks - 1);
}

/* The reference's take of datagram d into g (it fits): the counts and buffers. */
static void take_one(Message *g, const uint8_t *d, ssize_t len) {
    uint32_t seq = be(d + 12, 4), payload = be(d + 24, 2);
    g->datagrams++;
    g->payload_bytes += payload;
    (void)len;
    if (g->want_rcv[seq])
        return;
    long long start = (long long)seq * g->m.chunk_elems;
    uint8_t *at = g->want_out + start * g->m.itemsize;
    if (g->m.add)
        add_floats(at, d + HL, payload);
    else
        memcpy(at, d + HL, payload);
    g->want_rcv[seq] = 1;
    g->want_cls[seq] = d[28] >> 4;
    g->fresh++;
    g->fresh_elems += payload / g->m.itemsize;
    g->fresh_drop += (d[28] & 0x10) != 0;
    g->fresh_retx += (d[1] & 2) != 0;
    g->m.received_elems += payload / g->m.itemsize;
    g->m.received_protected += (d[28] & 0x10) == 0;
}

/* The reference over one staged run: how many leading datagrams it takes (into the
 * message), and whether that brought new data. */
static ssize_t reference_run(Run r, const uint8_t *buf, unsigned job, Message **into,
                             int *fresh) {
    ssize_t len = r.end - r.start;
    *into = NULL;
    *fresh = 0;
    if (r.seg < HL || len < HL)
        return 0;
    const uint8_t *h = buf + r.start;
    Message *g = message_of(h, job);
    if (g == NULL)
        return 0;
    *into = g;
    long long before = g->fresh;
    ssize_t taken = 0;
    for (ssize_t at = 0; at < len; at += r.seg, taken++) {
        ssize_t n = len - at < r.seg ? len - at : r.seg;
        const uint8_t *d = buf + r.start + at;
        uint64_t nonce = n >= TRAILER ? ((uint64_t)be(d + n - TRAILER, 4) << 32) |
                                            be(d + n - TRAILER + 4, 4)
                                      : 0;
        if ((g->m.verifier != NULL && (!tag_right(d, n) || nonce < g->m.nonce_floor)) ||
            !fits(g, h, d, n))
            break;
        take_one(g, d, n); /* (its bytes: the caller, per run) */
        if (g->m.verifier != NULL && nonce >= g->nonce_next)
            g->nonce_next = nonce < UINT64_MAX ? nonce + 1 : UINT64_MAX;
    }
    if (taken && g->bound < 0)
        g->bound = h[30]; /* (the first taken head's bound byte: HEAD.bound) */
    *fresh = g->fresh > before;
    return taken;
}

static int report(void *context, const TakenMessage *m) {
    (void)context;
    for (size_t i = 0; i < n_msgs; i++) {
        Message *g = &msgs[i];
        if (g->m.key != m->key || g->removed)
            continue;
        EXPECT(m->datagrams == g->datagrams && m->nbytes == g->nbytes && m->fresh == g->fresh &&
                   m->fresh_elems == g->fresh_elems && m->fresh_drop == g->fresh_drop &&
                   m->fresh_retx == g->fresh_retx && m->payload_bytes == g->payload_bytes,
               "message %zu: counts %lld %lld %lld %lld %lld %lld %lld, reference %lld %lld "
               "%lld %lld %lld %lld %lld",
               i, m->datagrams, m->nbytes, m->fresh, m->fresh_elems, m->fresh_drop, m->fresh_retx,
               m->payload_bytes, g->datagrams, g->nbytes, g->fresh, g->fresh_elems, g->fresh_drop,
               g->fresh_retx, g->payload_bytes);
        EXPECT(m->received_elems == g->m.received_elems &&
                   m->received_protected == g->m.received_protected,
               "message %zu: received counts", i);
        EXPECT(m->bound == g->bound, "message %zu: bound %d reported, reference %d", i, m->bound,
               g->bound);
        EXPECT(m->nonce_next == g->nonce_next, "message %zu: nonce_next %llu, reference %llu", i,
               (unsigned long long)m->nonce_next, (unsigned long long)g->nonce_next);
        g->datagrams = g->nbytes = g->fresh = g->fresh_elems = 0;
        g->fresh_drop = g->fresh_retx = g->payload_bytes = 0;
        return 0;
    }
    EXPECT(0, "counts reported for a message not registered");
    return 0;
}

static void check_buffers(void) {
    for (size_t i = 0; i < n_msgs; i++) {
        Message *g = &msgs[i];
        size_t out_len = (size_t)(g->m.msg_elems * g->m.itemsize);
        EXPECT(g->m.add ? same_floats(g->out, g->want_out, out_len)
                        : memcmp(g->out, g->want_out, out_len) == 0,
               "message %zu: out differs", i);
        EXPECT(memcmp(g->received, g->want_rcv, (size_t)g->n_chunks) == 0 &&
                   memcmp(g->cls, g->want_cls, (size_t)g->n_chunks) == 0,
               "message %zu: chunk maps differ", i);
    }
}

/* Copies the first `period` bytes of buf (of len) over the rest, doubling what is
 * written: a buffer of up to 256 KB filled by a loop over every byte took most of an
 * input's time, since the fuzzer traces each comparison of the loop's counter. */
static void repeat_period(uint8_t *buf, size_t len, size_t period) {
    size_t done = len < period ? len : period;
    while (done < len) {
        size_t more = len - done < done ? len - done : done;
        memcpy(buf + done, buf, more);
        done += more;
    }
}

/* out[k] = k * 7 + 1 (mod 256), whose period is 256 bytes. */
static void fill_pattern(uint8_t *out, size_t len) {
    for (size_t k = 0; k < len && k < 256; k++)
        out[k] = (uint8_t)(k * 7 + 1);
    repeat_period(out, len, 256);
}

static void read_message(FuzzInput *in, Message *g) {
    memset(g, 0, sizeof *g);
    g->m.bound = g->bound = -1; /* (as MessageTable.register sets it) */
    unsigned src = (unsigned)take_uint(in, 2), step = (unsigned)take_uint(in, 4);
    unsigned msg = (unsigned)take_uint(in, 2);
    ssize_t chunk = (ssize_t)take_uint(in, 2), elems = (ssize_t)take_uint(in, 3);
    ssize_t itemsize = (ssize_t)1 << (take_uint(in, 1) & 3);
    chunk = chunk ? chunk : 1;
    elems = elems ? elems : 1;
    if (elems * itemsize > MAX_OUT)
        elems = MAX_OUT / itemsize;
    g->m.key = take_key(src, step, msg);
    g->m.chunk_elems = chunk;
    g->m.msg_elems = elems;
    g->m.itemsize = itemsize;
    g->m.dtype_byte = (unsigned)take_uint(in, 1);
    unsigned flags = (unsigned)take_uint(in, 1);
    g->m.stream = (int)(flags & 1);
    g->m.add = (flags & 4) && itemsize == 4; /* (MessageTable.register refuses the rest) */
    g->m.verifier = flags & 2 ? (void *)g : NULL;
    g->m.nonce_floor = (uint64_t)(flags >> 3) << 59;
    uint64_t in_already = take_uint(in, 8);
    g->n_chunks = (elems - 1) / chunk + 1;
    size_t out_len = (size_t)(elems * itemsize);
    g->out = exact_alloc(out_len);
    g->received = exact_alloc((size_t)g->n_chunks);
    g->cls = exact_alloc((size_t)g->n_chunks);
    fill_pattern(g->out, out_len);
    /* chunk c in already where bit c % 64 is set, of class c % 256 (by periods) */
    size_t n = (size_t)g->n_chunks;
    for (size_t c = 0; c < n && c < 64; c++)
        g->received[c] = (in_already >> c) & 1;
    repeat_period(g->received, n, 64);
    for (size_t c = 0; c < n && c < 256; c++)
        g->cls[c] = (uint8_t)c;
    repeat_period(g->cls, n, 256);
    /* their elements: every chunk holds chunk_elems, the last the rest */
    unsigned long long all = (unsigned long long)__builtin_popcountll(in_already);
    unsigned long long part = n % 64 ? in_already & ((1ULL << (n % 64)) - 1) : 0;
    long long set = (long long)(all * (n / 64) + (unsigned long long)__builtin_popcountll(part));
    g->m.received_elems = set * chunk;
    if (g->received[n - 1]) /* (the last chunk's share) */
        g->m.received_elems -= chunk - (elems - (long long)(n - 1) * chunk);
    g->m.received_protected = g->m.received_elems / chunk;
    g->m.complete_elems = (long long)take_uint(in, 3);
    g->m.complete_protected = (long long)take_uint(in, 2);
    g->removed_after = (int)take_uint(in, 1);
    g->want_out = exact_copy(g->out, out_len);
    g->want_rcv = exact_copy(g->received, (size_t)g->n_chunks);
    g->want_cls = exact_copy(g->cls, (size_t)g->n_chunks);
    g->m.out = g->out;
    g->m.out_len = (ssize_t)out_len;
    g->m.received = g->received;
    g->m.received_class = g->cls;
    g->m.received_len = g->m.received_class_len = g->n_chunks;
}

static void free_messages(void) {
    for (size_t i = 0; i < n_msgs; i++) {
        Message *g = &msgs[i];
        free(g->out);
        free(g->received);
        free(g->cls);
        free(g->want_out);
        free(g->want_rcv);
        free(g->want_cls);
    }
    n_msgs = 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FuzzInput in = {data, size};
    ssize_t read_size = (ssize_t)take_uint(&in, 2) + 1;
    ssize_t len = (ssize_t)(take_uint(&in, 3) % ((1 << 18) + 1));
    ssize_t budget = (ssize_t)take_uint(&in, 3);
    ssize_t max_reads = (ssize_t)take_uint(&in, 2);
    unsigned job = (unsigned)take_uint(&in, 2);
    n_msgs = (size_t)(take_uint(&in, 1) % (MAX_MESSAGES + 1));
    for (size_t i = 0; i < n_msgs; i++)
        read_message(&in, &msgs[i]);
    pool.n = (size_t)(take_uint(&in, 1) % (MAX_POOL + 1));
    for (size_t k = 0; k < pool.n; k++) {
        pool.len[k] = (size_t)take_uint(&in, 2) % (MAX_POOL_LEN + 1);
        take_bytes(&in, pool.data[k], pool.len[k]);
    }
    sock.n = sock.next = sock.reads = sock.sent_len = 0;
    sock.error_seen = sock.last_failed = 0;
    sock.fill = fill_from_pool;
    while (in.left && sock.n < MAX_EVENTS) {
        unsigned kind = (unsigned)take_uint(&in, 1);
        ssize_t dlen = (ssize_t)take_uint(&in, 2);
        uint32_t raw = (uint32_t)take_uint(&in, 3);
        uint8_t first = (uint8_t)take_uint(&in, 1);
        int32_t value = (int32_t)(raw << 8) >> 8; /* signed 24 bits */
        int k = (int)(kind & 7) > EMPTY ? PLAIN : (int)(kind & 7);
        if (k == ERROR)
            value = (int[]){EAGAIN, EINTR, ECONNREFUSED, ENOMEM, EHOSTUNREACH}[raw % 5];
        for (unsigned r = 0; r <= kind >> 3 && sock.n < MAX_EVENTS; r++) {
            pool.first[sock.n] = first;
            sock.events[sock.n++] = (Event){k, k == EMPTY ? 0 : dlen, value};
        }
    }

    /* the table, as MessageTable sets it up */
    memset(&table, 0, sizeof table);
    table.job = job;
    table.data_vt = DATA_VT;
    table.per_packet_flags = 3;
    table.head = HEAD;
    memcpy(table.mask, MASK, HL);
    memcpy(table.layout, LAYOUT, 8);
    table.header_len = HL;
    table.auth_flag = AUTH_FLAG;
    table.trailer_len = TRAILER;
    table.verify = stand_in_verify;
    table.runs = malloc(sizeof(Run) * MAX_RUNS);
    if (table.runs == NULL)
        abort();
    for (size_t i = 0; i < n_msgs; i++) { /* (a later one of the same key replaces it) */
        for (size_t j = 0; j < i; j++)
            if (msgs[j].m.key == msgs[i].m.key)
                msgs[j].removed = 1;
        EXPECT(take_register(&table, &msgs[i].m) >= 0, "register failed");
    }

    /* the receive step: read, pre-filter, stage */
    uint8_t *buf = exact_alloc((size_t)len);
    RecvRuns got;
    recv_runs_loop(3, (char *)buf, len, budget, max_reads, read_size, staged, &scratch, &got);
    PfRules rules = {job, 0, TRAILER}; /* (a tagged datagram keeps its trailer) */
    int64_t counts[PF_REASONS] = {0};
    ssize_t n_staged = 0;
    for (ssize_t i = 0; i < got.n_runs; i++) {
        Run r = staged[i];
        r.end = r.start + (ssize_t)pf_filter_run(buf + r.start, (size_t)(r.end - r.start),
                                                 (size_t)r.seg, &rules, counts);
        if (r.end > r.start)
            staged[n_staged++] = r;
    }
    EXPECT(take_stage(&table, staged, n_staged, len) == 0, "staging the loop's runs failed");

    /* the take steps, each against the reference */
    int handovers = 0;
    ssize_t next_run = 0; /* the first staged run the reference has not seen */
    for (;;) {
        Run h = {0, 0, 0};
        int kind = take_next(&table, buf, len, &h);
        EXPECT(kind >= TAKE_DONE && kind <= TAKE_CHECK, "kind %d", kind);
        ssize_t upto = kind == TAKE_DONE ? n_staged : table.cursor;
        EXPECT(upto <= n_staged && upto >= next_run, "cursor %zd of %zd runs", upto, n_staged);
        for (ssize_t i = next_run; i < upto; i++) {
            Run r = staged[i];
            Message *g;
            int fresh;
            ssize_t taken = reference_run(r, buf, job, &g, &fresh);
            ssize_t n = (r.end - r.start - 1) / r.seg + 1;
            if (taken)
                g->nbytes += taken == n ? r.end - r.start : taken * r.seg;
            int last = i == upto - 1 && kind != TAKE_DONE;
            if (!last) {
                EXPECT(taken == n, "run %zd handed over nothing, the reference takes %zd of %zd",
                       i, taken, n);
                EXPECT(!fresh || !take_check_due(&g->m), "run %zd: a check due, none handed over",
                       i);
                continue;
            }
            if (kind == TAKE_WHOLE) {
                EXPECT(taken == 0, "run %zd handed over whole, the reference takes %zd", i, taken);
                EXPECT(h.start == r.start && h.end == r.end && h.seg == r.seg,
                       "run %zd: handover is not the run", i);
            } else if (kind == TAKE_REST) {
                EXPECT(taken > 0 && taken < n && h.start == r.start + taken * r.seg &&
                           h.end == r.end && h.seg == r.seg,
                       "run %zd: rest [%zd, %zd) after %zd taken, reference %zd of %zd", i,
                       h.start, h.end, (h.start - r.start) / r.seg, taken, n);
            } else {
                EXPECT(taken == n && fresh && take_check_due(&g->m) && h.start == r.end &&
                           h.end == r.end,
                       "run %zd: a check handed over, the reference takes %zd of %zd (fresh %d)",
                       i, taken, n, fresh);
            }
        }
        next_run = upto;
        take_report(&table, report, NULL);
        for (size_t i = 0; i < n_msgs; i++)
            EXPECT(msgs[i].removed || msgs[i].datagrams == 0, "message %zu: counts unreported", i);
        check_buffers();
        if (kind == TAKE_DONE)
            break;
        handovers++;
        for (size_t i = 0; i < n_msgs; i++) /* removed: never written again */
            if (!msgs[i].removed && msgs[i].removed_after == handovers) {
                int shared = 0; /* (not while a later registration holds the key) */
                for (size_t j = i + 1; j < n_msgs; j++)
                    shared |= msgs[j].m.key == msgs[i].m.key;
                if (!shared) {
                    EXPECT(take_unregister(&table, msgs[i].m.key) >= 0, "unregister failed");
                    msgs[i].removed = 1;
                }
            }
    }
    EXPECT(table.n_live >= 0, "%zd live messages", table.n_live);
    free(buf);
    free(table.runs);
    free(table.slots);
    free(table.index);
    free(table.touched);
    free_messages();
    return 0;
}
