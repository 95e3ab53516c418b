/*
 * dlcp.io._engine: the native send engine of the DLCP endpoint.
 *
 * The protocol decides what goes (dlcp.proto: chunking, classes, records,
 * recovery); this module decides *when*, and puts it on the wire, in threads of
 * its own that never take the GIL (one by default; Engine(threads=N) runs N).
 * Python posts one transmission round of a message at a time (its records,
 * built by the packetizer, with a TOS byte, a path and a priority class per
 * record) and hears back once, when the round's
 * last record has gone: one Python call per round instead of one per pacing
 * decision (a 25 MB message at MTU 1500 was ~50 decisions, each ~100 Python
 * calls on the sending thread).
 *
 * Rules the engine follows, the same as dlcp.proto.outbox.Outbox (the
 * executable reference) follows when it paces in Python:
 *
 *  1. Per destination, of the rounds with records left, only the earliest
 *     posted message of each step may send; of those, the one whose next record
 *     has the highest priority class goes (the earliest message on a tie). A
 *     thread claims the batch it sends: the round's cursor moves past it before
 *     the lock is released, so another thread may claim the round's next batch
 *     meanwhile. A round with a batch on its way holds its step even when all
 *     its records are claimed: the next message of the step waits until it has
 *     gone. A round one of whose batches failed has no more claimed.
 *  2. A batch is at most batch_packets records, at most one burst of the pacer
 *     (never none), of one class, and the message's short last record only as
 *     its last (what UDP GSO allows).
 *  3. A batch goes when the destination's pacer allows it (Pacer below: the
 *     receiver-driven token bucket of dlcp.proto.pacing.ReceiverDrivenPacer,
 *     ported line for line; tests/io/test_engine_pacer.py drives both with
 *     the same calls and compares every answer). The pacer is asked and
 *     charged under the engine's lock when the batch is claimed, so the rate
 *     holds whatever the number of threads. With queue_limit (the default), it
 *     goes only while the host holds little of the engine's datagrams (four
 *     bursts, then 2 ms of what the host's queue was seen to drain; a batch of
 *     about the room left: _host_queue.h): a pacer above the host link's rate
 *     would otherwise fill the host's qdisc, which reaches the switch at the
 *     link's rate whatever the pacer learns later, and which the rank's
 *     retransmissions and control messages wait behind.
 *  4. Within a batch, runs of records with the same path go in sendmmsg calls,
 *     per_message datagrams (the round's) per (GSO) message, with the batch's
 *     TOS byte, from the round's own memory (no copy). One thread sends a
 *     batch, in record order; with several threads, batches of one round may
 *     leave side by side, their datagrams interleaved.
 *  5. A round is complete when no batch of it is on its way and either every
 *     record was claimed (sent) or a batch failed (failed, with the first
 *     failure's errno, however many of its batches failed): it is queued for
 *     reap() once and the eventfd (fileno()) is written once.
 *  6. cancel() waits while any batch of the round is being sent (the lock is
 *     not held during the system calls), so that the round's memory can be
 *     reused as soon as cancel() returns.
 *  7. post() itself sends a round of one batch (a small message, most
 *     retransmissions) from the caller's thread when the destination's pacer lets
 *     it go at once and it is next in line, and returns its report: the caller's
 *     FINISH then follows without a wake-up of either thread (the engine's
 *     threads are not signalled for a round sent so). It keeps the GIL while
 *     every mutex it takes is free when it asks (lock_from), and lets it go around
 *     a send of more than SEND_WITH_GIL_BYTES. A longer round goes to the engine's
 *     threads at once: sending its
 *     first burst here held the caller (and the endpoint's lock) up, and a DDP
 *     job's iteration got slower (bench.ddp lossless 1.57x Gloo against 1.35x).
 *     post()'s batch is claimed as the threads' are (rule 1).
 *  8. An authenticated round (post()'s key and nonces) is sealed a batch at a
 *     time, in the thread that sends the batch, just before it goes: nonces for
 *     the batch's records are reserved from the session's counter cell with one
 *     atomic add (the cell Python's NonceCounter and every other thread draw
 *     from, so no nonce is drawn twice), and each record gets its nonce and its
 *     AES-GMAC tag (docs/spec.md §3; ../proto/gmac.h, with libcrypto). A batch
 *     sent again (a new round) gets new nonces. A Gmac (the expanded key) is
 *     for one thread at a time: each batch on its way seals with one of the
 *     round's n_threads + 1 expansions that no other batch holds. A lent round
 *     seals too: its records are the data header and the trailer, the tag
 *     covers header, lent payload and nonce where they lie, and each datagram
 *     goes out gathered from three iovecs (header, payload, trailer), so
 *     authentication costs no copy of the payload. Built without libcrypto
 *     (SEALS is 0), post() refuses a key.
 *  9. A round posted with its FINISH (post()'s finish: the frame the receiver's
 *     control connection carries, sealed already in an authenticating job) that a
 *     send thread completes, sent, while its rank's control connection is adopted
 *     (adopt_control) and no write on it failed, is queued for reap() without the
 *     eventfd being written, and that thread writes the FINISH on the connection
 *     (../io/_control_writes.h: one mutex a connection, held for a whole frame;
 *     Python's own frames to the rank go through control_send). Its report says
 *     so (finish_sent) with the time the round ended (ended_t): Python, which reaps
 *     at every turn while rounds are under way, then neither wakes for it nor writes
 *     the FINISH. A write that fails after the report was queued is the
 *     connection's error from then on (Python's next write raises it) and the
 *     FINISH is lost as one lost on the way is: the sender's FINISH timer sends it
 *     again. A round post() sent (rule 7), or one without its connection, wakes
 *     Python as before, which writes its FINISH itself.
 * 10. A round whose receiver's STOP the receive loop read (dlcp.io._udpio,
 *     ../io/_control_watch.h, through PACER_API's stop_round) is stopped: no more
 *     of its batches are claimed, the batch on its way finishes, and the round
 *     never completes (no report, no FINISH); Python, which applies the STOP at
 *     its next turn, cancels it as it cancels any round a STOP ended.
 *
 * Pacer objects may be used alone (tests) or attached to an engine
 * (Engine.add_peer); attached, their methods take the engine's lock and wake
 * one of the engine's threads (a new rate may let a batch go sooner).
 *
 * With several send threads, all share the engine's lock and condition
 * variable. A thread that claims a batch signals another (which may claim the
 * next, of the same round or another peer's) before it sends; an idle thread
 * waits for the pacer's earliest deadline if no other idle thread already does
 * (Engine.timed_wait), else for a signal, so that a deadline wakes one thread.
 *
 * A Python method takes the engine's lock or a pacer's through LOCKED: at once
 * if it is free; else it waits for it, and does what it does under it, with the
 * GIL released. A send thread descheduled while holding the lock then stalls no
 * Python thread, and no thread waits for the GIL while holding the lock (a send
 * thread would then wait for it too, up to the interpreter's switch interval of
 * 5 ms after a batch). What runs under the lock touches no Python object. The
 * send threads never take the GIL.
 */
#define _GNU_SOURCE /* pthread_setname_np */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "_round_geometry.h" /* post()'s checks and the batches of a round */
#include "_control_writes.h"
#include "_pacer_api.h" /* the pacers as the receive loop's linger feeds them */
#include "_host_queue.h" /* rule 3: the host's queue of the engine's datagrams */
#include "_sendmmsg.h"
#ifdef DLCP_LIBCRYPTO
#include "../proto/gmac.h"
#endif

#define MIN_BURST (16.0 * 1024.0)
#define EPS 1e-6
#define UNLIMITED ((double)(1LL << 62))
/* send threads an engine may run (the key expansions of a sealed round, one per
   batch in flight, are a 64-bit set: rule 8) */
#define MAX_SEND_THREADS 32

struct Engine;

/* ------------------------------------------------------------------ pacer */

typedef struct {
    PyObject_HEAD
    int unpaced;
    double initial_rate, min_rate, max_rate;
    long long burst_bytes;
    double gain, idle_reset, used_fraction, max_lateness, loss_tolerance, backoff, max_cut,
        probe, probe_interval, cautious_burst, burst_time, ceiling_step, share_hold;
    double rate, raised_at, tokens, last, last_active, budget, wasted, due, ceiling;
    /* held: the rate a shared report's cap replaced (has_held), capped at held_at */
    double held, held_at;
    int cautious, has_last, has_last_active, backlogged, has_due, has_held;
    /* guards the state above: the engine's threads and Python's calls (LOCKED)
       take it, a thread inside the engine's lock (never the other way round),
       each for a few arithmetic operations */
    pthread_mutex_t lock;
    struct Engine *engine; /* attached: woken when the rate changes */
} Pacer;

static double ulp(double x) {
    x = fabs(x);
    return nextafter(x, INFINITY) - x;
}

static double pacer_burst(const Pacer *p) {
    if (p->unpaced)
        return UNLIMITED;
    double cap = (double)p->burst_bytes;
    if (p->burst_time > 0) {
        double b = p->rate * p->burst_time;
        if (b < MIN_BURST)
            b = MIN_BURST;
        if (b < cap)
            cap = (double)(long long)b;
    }
    if (!p->cautious)
        return cap;
    double b = p->rate * p->cautious_burst;
    if (b < MIN_BURST)
        b = MIN_BURST;
    if (b > cap)
        b = cap;
    return (double)(long long)b;
}

/* a shared report's cap ends: the held rate comes back (or the rate, if more) */
static void pacer_release(Pacer *p) {
    if (p->has_held) {
        if (p->held > p->rate)
            p->rate = p->held;
        p->has_held = 0;
    }
}

static void pacer_advance(Pacer *p, double now) {
    if (!p->has_last) {
        p->last = now;
        p->has_last = 1;
        return;
    }
    double dt = now - p->last;
    if (dt <= 0)
        return;
    double earned = p->rate * dt;
    double cap = pacer_burst(p);
    if (p->has_due && now > p->due) {
        if (now - p->due <= p->max_lateness) {
            double late = now - p->due;
            if (p->cautious && late > p->cautious_burst / 2)
                late = p->cautious_burst / 2;
            cap += p->rate * late;
        } else {
            p->has_due = 0;
        }
    }
    double room = cap - p->tokens;
    if (room < 0)
        room = 0;
    p->budget += earned;
    if (earned > room) {
        p->wasted += earned - room;
        if (cap > p->tokens)
            p->tokens = cap;
    } else {
        p->tokens += earned;
    }
    p->last = now;
    if (p->has_held && now - p->held_at > p->share_hold)
        pacer_release(p);
    if (p->has_last_active && now - p->last_active > p->idle_reset) {
        p->has_last_active = 0;
        p->backlogged = 0;
        pacer_release(p);
        /* after congestion the rate, the caution and the ceiling stay */
        if (!p->cautious)
            p->rate = p->initial_rate;
    }
}

static double pacer_slack(const Pacer *p) {
    return EPS + 4.0 * p->rate * ulp(p->has_last ? p->last : 0.0);
}

static void pacer_on_sent(Pacer *p, double nbytes, double now) {
    if (p->unpaced)
        return;
    pacer_advance(p, now);
    p->tokens -= nbytes;
    p->has_due = 0;
    p->has_last_active = 1;
    p->last_active = p->last;
    double need = nbytes < 1 ? 1 : nbytes;
    double burst = pacer_burst(p);
    if (p->tokens + pacer_slack(p) < (need < burst ? need : burst))
        p->backlogged = 1;
}

static double pacer_next_send_time(Pacer *p, double nbytes, double now) {
    if (p->unpaced)
        return now;
    pacer_advance(p, now);
    double burst = pacer_burst(p);
    double need = nbytes < burst ? nbytes : burst;
    if (p->tokens + pacer_slack(p) >= need)
        return now;
    p->backlogged = 1;
    p->has_last_active = 1;
    p->last_active = p->last;
    p->has_due = 1;
    p->due = now + (need - p->tokens) / p->rate;
    return p->due;
}

static double pacer_allowance(Pacer *p, double now) {
    if (p->unpaced)
        return UNLIMITED;
    pacer_advance(p, now);
    double a = floor(p->tokens + pacer_slack(p));
    return a > 0 ? a : 0;
}

static void pacer_note_backlogged(Pacer *p, double now) {
    if (p->unpaced)
        return;
    pacer_advance(p, now);
    p->backlogged = 1;
    p->has_last_active = 1;
    p->last_active = p->last;
}

/* the most probe steps one report's raise takes (dlcp.proto.pacing.MAX_PROBE_STEPS) */
#define MAX_PROBE_STEPS 8

/* a report's rules, never above cap; a report measured over window seconds */
static void pacer_follow(Pacer *p, double reported, double cap, double window) {
    double target = p->gain * reported;
    if (target < p->min_rate)
        target = p->min_rate;
    if (target > p->max_rate)
        target = p->max_rate;
    if (target > cap)
        target = cap;
    int pacer_limited = p->backlogged && p->budget > 0 &&
                        p->wasted <= (1.0 - p->used_fraction) * p->budget;
    double at = p->last;
    if (p->cautious) {
        /* (only while the rate held the sender back, never above the ceiling or
           a step above the report, whichever is more; held back above both, it
           falls to them) */
        double stepped = reported * (1.0 + p->probe);
        double limit = stepped > p->ceiling ? stepped : p->ceiling;
        if (limit > cap)
            limit = cap;
        double raised = p->rate * (1.0 + p->probe);
        if (window > p->probe_interval) { /* a step per probe_interval it spans */
            double since = at - p->raised_at;
            double span = (window < since ? window : since) / p->probe_interval;
            int steps = span >= MAX_PROBE_STEPS ? MAX_PROBE_STEPS : (int)span;
            for (int i = 1; i < steps; i++)
                raised *= 1.0 + p->probe;
        }
        if (target < raised)
            raised = target;
        if (limit < raised)
            raised = limit;
        if (pacer_limited && p->rate > limit) {
            p->rate = limit;
        } else if (pacer_limited && raised > p->rate &&
                   at - p->raised_at >= 0.8 * p->probe_interval) {
            p->rate = raised;
            p->raised_at = at;
        }
    } else if (target >= p->rate || pacer_limited) {
        p->rate = target;
    }
}

/* a shared report: a cap while the senders share the receiver */
static void pacer_on_share(Pacer *p, double reported) {
    double cap = reported;
    if (cap < p->min_rate)
        cap = p->min_rate;
    if (cap > p->max_rate)
        cap = p->max_rate;
    if (p->rate > cap) {
        if (!p->has_held) {
            p->held = p->rate;
            p->has_held = 1;
        }
        p->rate = cap;
        p->held_at = p->last;
        double burst = pacer_burst(p);
        if (p->tokens > burst)
            p->tokens = burst;
    } else if (p->has_held) {
        p->rate = p->held < cap ? p->held : cap;
        p->held_at = p->last;
        if (p->rate >= p->held)
            p->has_held = 0;
    } else {
        pacer_follow(p, reported, cap, 0.0);
    }
}

static void pacer_on_feedback(Pacer *p, double reported, int shared, double window,
                              double now) {
    if (p->unpaced)
        return;
    pacer_advance(p, now);
    if (shared) {
        pacer_on_share(p, reported);
    } else {
        pacer_release(p);
        pacer_follow(p, reported, INFINITY, window);
    }
    p->backlogged = 0;
    p->budget = 0;
    p->wasted = 0;
}

static void pacer_on_loss(Pacer *p, double lost, double sent_at, int queue, double now) {
    if (p->unpaced)
        return;
    pacer_advance(p, now);
    if (lost <= p->loss_tolerance && !queue) {
        if (p->rate >= p->ceiling)
            p->ceiling *= 1.0 + p->ceiling_step;
        return;
    }
    double factor = p->backoff * (1.0 - lost);
    if (factor < p->max_cut)
        factor = p->max_cut;
    double fallback = (queue && p->ceiling < INFINITY ? p->rate : sent_at) * factor;
    if (fallback < p->min_rate)
        fallback = p->min_rate;
    double through = p->rate * factor;
    if (through < fallback)
        through = fallback;
    if (through < p->ceiling)
        p->ceiling = through;
    p->cautious = 1;
    p->has_held = 0; /* (a shared report's cap ends: loss says more) */
    if (fallback < p->rate) {
        p->rate = fallback;
        p->raised_at = p->last;
    }
    double burst = pacer_burst(p);
    if (p->tokens > burst)
        p->tokens = burst;
    p->has_due = 0;
}

/* ------------------------------------------------------------------ engine types */

typedef struct Round {
    struct Round *next;
    int dst;
    uint32_t step;
    uint32_t msg;
    unsigned long long order;
    Py_buffer records, tos, path, prio, breaks;
    /* a lent round: records are headers of `head` bytes and the payloads are
       chunks of `payload` (chunk_bytes each, seqs[i] for record i); else empty.
       Sealed, a record is the header, then the trailer (`trailer` bytes, which
       go out after the payload) */
    Py_buffer payload, seqs;
    Py_ssize_t head, trailer, chunk_bytes;
    /* cursor: the first record no batch has claimed yet (rule 1) */
    Py_ssize_t count, stride, per_message, short_index, short_len, n_breaks, cursor;
    /* in_flight: batches of it claimed and not yet sent (rules 5, 6); failed: one
       of them failed, so no more are claimed and the round ends failed */
    int in_flight, failed, cancelled, started, status, err;
    /* rule 10: the receiver's STOP came (the receive loop read it): no batch is
       claimed, and the round never completes; Python's cancel() takes it back */
    int stopped;
    double began_t, last_t, ended_t;
    unsigned long long began_b, last_b;
    /* rule 9: the round's FINISH frame, as the control connection carries it (NULL:
       none given, or the sending thread took it); finish_sent: the engine writes it */
    uint8_t *finish;
    Py_ssize_t finish_len;
    int finish_sent;
    int sealed; /* rule 8: each batch gets nonces and tags as it goes */
#ifdef DLCP_LIBCRYPTO
    /* the key of the pair (sender, dst), expanded once per batch that may be in
       flight at once (a Gmac is for one thread at a time): seals[0] at post(), the
       others when a batch first needs them; seals_used: which a batch holds */
    Gmac *seals;
    int n_seals;
    uint64_t seals_used;
    uint8_t key[32];
    size_t key_len;
    Py_buffer nonces;  /* the session's data nonce counter: one uint64 */
#endif
} Round;

typedef struct {
    int dst;
    struct sockaddr_in addr;
    Pacer *pacer;
    Round *rounds; /* sorted by order */
    unsigned long long sent_bytes;
} Peer;

typedef struct Engine {
    PyObject_HEAD
    pthread_mutex_t lock;
    pthread_cond_t cond;    /* wakes the send thread */
    pthread_cond_t settled; /* a batch's send ended (cancel waits on it) */
    pthread_t *threads;     /* the send threads: n_threads asked, started of them running */
    int n_threads, started, stop, efd, inited;
    /* the deadline one idle thread waits for (INFINITY: none does); the other idle
       threads wait for a signal, so that a deadline wakes one thread, not all */
    double timed_wait;
    int *fds;
    int n_fds;
    Py_ssize_t batch_packets;
    Peer **peers; /* by rank */
    int n_peers;
    Round *done_head, *done_tail; /* completed, for reap() */
    unsigned long long batches, datagrams, send_calls;
    /* the host's queue of this engine's datagrams (_host_queue.h) */
    HostQueue queue;
    /* rule 9: the control connections by rank (NULL: none adopted yet; an entry
       lives as long as the engine), how long a write may wait for room, and what
       the send threads wrote; signalled: the eventfd was written since reap()
       last read it */
    ControlConn **controls;
    int n_controls, signalled;
    double control_timeout;
    unsigned long long finishes, finish_errors;
} Engine;

enum { ROUND_SENT = 0, ROUND_FAILED = 1 };

static double monotonic_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void release_round(Round *r) {
    PyBuffer_Release(&r->records);
    PyBuffer_Release(&r->tos);
    PyBuffer_Release(&r->path);
    PyBuffer_Release(&r->prio);
    PyBuffer_Release(&r->breaks);
    PyBuffer_Release(&r->payload); /* (no-ops on a round that lent nothing) */
    PyBuffer_Release(&r->seqs);
    PyMem_RawFree(r->finish);
#ifdef DLCP_LIBCRYPTO
    for (int i = 0; i < r->n_seals; i++) /* (no-ops where nothing was set up) */
        gmac_free(&r->seals[i]);
    PyBuffer_Release(&r->nonces);
    PyMem_RawFree(r->seals);
    OPENSSL_cleanse(r->key, sizeof r->key);
#endif
    PyMem_RawFree(r);
}

/* The bytes the tag of record i of r covers beyond a lent round's record row:
 * its chunk of the lent payload (*len bytes), or (not lent) the whole record. */
static const uint8_t *sealed_bytes(const Round *r, Py_ssize_t i, Py_ssize_t *len) {
    if (r->head) {
        *len = i == r->short_index ? r->short_len - r->head : r->chunk_bytes;
        return (const uint8_t *)r->payload.buf + ((const int64_t *)r->seqs.buf)[i] * r->chunk_bytes;
    }
    *len = i == r->short_index ? r->short_len : r->stride;
    return (const uint8_t *)r->records.buf + i * r->stride;
}

/* Datagrams sealed ahead of their bytes being asked for from memory: the tag is
 * the first to read a lent chunk, and a 64 MiB tensor is not in the cache (the
 * kernel's copy then finds it there). Measured, sealing 1,432-byte datagrams of a
 * 64 MiB buffer: 458 ns a datagram without, 300 asking two ahead (CPU time, best
 * of 4 runs on a busy 2-core VM). */
#define SEAL_PREFETCH_AHEAD 2

/* Rule 8: the nonces and tags of records [start, stop) of r, with the key's
 * expansion `seal` (r->seals[seal], which the batch holds: set up here the first
 * time), without the lock: 0, or an errno (EOVERFLOW: the nonce counter is spent;
 * EIO: libcrypto failed). */
static int seal_batch(Round *r, int seal, Py_ssize_t start, Py_ssize_t stop) {
#ifdef DLCP_LIBCRYPTO
    uint64_t first;
    if (!r->sealed)
        return 0;
    Gmac *gmac = &r->seals[seal];
    if (!gmac_ready(gmac) && gmac_init(gmac, r->key, r->key_len) < 0)
        return EIO;
    if (gmac_take_nonces((uint64_t *)r->nonces.buf, (uint64_t)(stop - start), &first) < 0)
        return EOVERFLOW;
    uint8_t *base = (uint8_t *)r->records.buf;
    for (Py_ssize_t i = start; i < stop; i++) {
        uint64_t nonce = first + (uint64_t)(i - start);
        Py_ssize_t len, ahead_len;
        if (i + SEAL_PREFETCH_AHEAD < stop) {
            const uint8_t *ahead = sealed_bytes(r, i + SEAL_PREFETCH_AHEAD, &ahead_len);
            for (Py_ssize_t at = 0; at < ahead_len; at += 64)
                __builtin_prefetch(ahead + at);
        }
        const uint8_t *bytes = sealed_bytes(r, i, &len);
        int bad;
        if (r->head) { /* lent: header and trailer here, the payload in the sender's memory */
            uint8_t *record = base + i * r->head;
            bad = gmac_seal_gathered(gmac, record, bytes, (size_t)len,
                                     record + r->head - r->trailer, nonce) < 0;
        } else {
            bad = gmac_seal_data(gmac, base + i * r->stride, (size_t)len, nonce) < 0;
        }
        if (bad)
            return EIO;
    }
#else
    (void)r, (void)seal, (void)start, (void)stop;
#endif
    return 0;
}

/* Which of r's key expansions a batch claimed now seals with (rule 8), with the
 * lock held: one no batch in flight holds (there are n_threads + 1 of them, and a
 * batch in flight per sending thread at most); -1 for a round not sealed. */
static int take_seal(Round *r) {
#ifdef DLCP_LIBCRYPTO
    if (!r->sealed)
        return -1;
    int seal = __builtin_ctzll(~r->seals_used);
    r->seals_used |= 1ULL << seal;
    return seal;
#else
    (void)r;
    return -1;
#endif
}

static void give_seal(Round *r, int seal) {
#ifdef DLCP_LIBCRYPTO
    if (seal >= 0)
        r->seals_used &= ~(1ULL << seal);
#else
    (void)r, (void)seal;
#endif
}

/* ------------------------------------------------------------------ sending */

/* Datagrams [start, stop) of r, with one path, to peer (rule 4), without the lock:
 * 0 or an errno; *datagrams and *calls count what was done. */
static int send_run(const Engine *e, const struct sockaddr_in *addr, const Round *r,
                    Py_ssize_t start,
                    Py_ssize_t stop, int tos, int path, unsigned long long *datagrams,
                    unsigned long long *calls) {
    ssize_t sent = 0;
    int fd = e->fds[path % e->n_fds];
    if (r->head) { /* lent: header from the records, payload from the sender's memory */
        int has_short = r->short_index >= start && r->short_index < stop;
        int err = send_gathered(fd, addr, (const char *)r->records.buf + start * r->head, r->head,
                                r->trailer, (const char *)r->payload.buf, (const int64_t *)r->seqs.buf + start,
                                r->chunk_bytes, stop - start,
                                has_short ? r->short_index - start : -1,
                                r->short_len - r->head, r->per_message, tos, &sent, calls);
        *datagrams += (unsigned long long)sent;
        return err;
    }
    /* (the short record, if among them, is the run's last) */
    Py_ssize_t len = round_batch_bytes(r->stride, r->short_index, r->short_len, start, stop);
    int err = send_datagrams(fd, addr, (const char *)r->records.buf + start * r->stride, len,
                             r->stride, r->per_message, tos, &sent, calls);
    *datagrams += (unsigned long long)sent;
    return err;
}

/* Rule 2: where the batch starting at `start` ends. */
static Py_ssize_t batch_end(const Round *r, Py_ssize_t start, Py_ssize_t limit) {
    return round_batch_end((const int64_t *)r->breaks.buf, r->n_breaks, r->count, start, limit);
}

static Py_ssize_t batch_nbytes(const Round *r, Py_ssize_t start, Py_ssize_t stop) {
    return round_batch_bytes(r->stride, r->short_index, r->short_len, start, stop);
}

/* Whether r may have a batch claimed (rule 1): records left, and none of its
 * batches failed. */
static int claimable(const Round *r) {
    return r->cursor < r->count && !r->failed && !r->stopped;
}

/* Rule 1. */
static Round *first_to_send(Peer *peer) {
    Round *best = NULL;
    int best_prio = -1;
    uint32_t seen[64];
    int n_seen = 0, overflow = 0;
    for (Round *r = peer->rounds; r; r = r->next) {
        /* (a round with a batch in flight holds its step, even with nothing left
           to claim: the next message of the step waits until it has gone) */
        if (!claimable(r) && r->in_flight == 0)
            continue;
        int dup = 0;
        for (int i = 0; i < n_seen; i++)
            if (seen[i] == r->step)
                dup = 1;
        if (!dup && overflow) /* (more than 64 steps in flight: scan the earlier ones) */
            for (Round *q = peer->rounds; q != r; q = q->next)
                if ((claimable(q) || q->in_flight > 0) && q->step == r->step)
                    dup = 1;
        if (dup)
            continue;
        if (n_seen < 64)
            seen[n_seen++] = r->step;
        else
            overflow = 1;
        if (!claimable(r))
            continue;
        int prio = ((const uint8_t *)r->prio.buf)[r->cursor];
        if (prio > best_prio) {
            best_prio = prio;
            best = r;
        }
    }
    return best;
}

static void unlink_round(Peer *peer, Round *r) {
    for (Round **p = &peer->rounds; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            r->next = NULL;
            return;
        }
}

/* Rule 5 (and 9: wake 0 queues the report without writing the eventfd). Called
   with the lock held. */
static void complete_round(Engine *e, Peer *peer, Round *r, int status, int err, int wake) {
    unlink_round(peer, r);
    r->status = status;
    r->err = err;
    r->ended_t = monotonic_now();
    if (e->done_tail)
        e->done_tail->next = r;
    else
        e->done_head = r;
    e->done_tail = r;
    if (!wake)
        return;
    uint64_t one = 1;
    ssize_t w = write(e->efd, &one, sizeof one); /* (a full counter still wakes) */
    (void)w;
    e->signalled = 1;
}

/* Rule 9: a round r of peer that a send thread finished (send_batch_of returned 1),
   completed; its FINISH written by this thread where one was given, the round was
   sent and its rank's control connection takes frames. Called with the lock held;
   returns with it, having let it go around the write. */
static void round_done(Engine *e, Peer *peer, Round *r) {
    ControlConn *c = r->dst < e->n_controls ? e->controls[r->dst] : NULL;
    uint8_t *finish = NULL;
    size_t len = 0;
    if (r->status == ROUND_SENT && r->finish != NULL && control_usable(c)) {
        finish = r->finish; /* (ours now: reap() may free r as soon as the lock goes) */
        len = (size_t)r->finish_len;
        r->finish = NULL;
        r->finish_sent = 1;
    }
    complete_round(e, peer, r, r->status, r->err, finish == NULL);
    if (finish == NULL)
        return;
    double timeout = e->control_timeout;
    pthread_mutex_unlock(&e->lock);
    pthread_mutex_lock(&c->lock);
    int err = control_write_locked(c, finish, len, timeout);
    pthread_mutex_unlock(&c->lock);
    PyMem_RawFree(finish);
    pthread_mutex_lock(&e->lock);
    if (err)
        e->finish_errors++;
    else
        e->finishes++;
}

/* Lock m from a thread that may hold the GIL: post() keeps it (rule 7), *gil NULL
   while it does. At once if m is free; else the GIL goes first
   (*gil keeps the thread's state, for post() to take the GIL back once it holds no
   mutex), as LOCKED does: a thread that holds the GIL never waits for a mutex, so a
   send thread descheduled while it holds one stalls no Python thread. gil NULL:
   a send thread (no GIL), or the GIL is gone already. */
static void lock_from(pthread_mutex_t *m, PyThreadState **gil) {
    if (gil != NULL && *gil == NULL) {
        if (pthread_mutex_trylock(m) == 0)
            return;
        *gil = PyEval_SaveThread();
    }
    pthread_mutex_lock(m);
}

/* One batch of r to peer (rule 2-4): records [r->cursor, stop), claimed here
 * (the cursor moves past them before the lock is released, so another thread may
 * claim the next batch of r meanwhile). Called with the lock held; returns with
 * it, 1 when r has ended (rule 5: every record claimed, or a batch failed, and no
 * batch in flight; r->status says which), for the caller to complete. */
static int send_batch_of(Engine *e, Peer *peer, Round *r, Py_ssize_t stop, double nbytes,
                         double now, PyThreadState **gil) {
    Py_ssize_t start = r->cursor;
    if (!r->started) {
        r->started = 1;
        r->began_t = now;
        r->began_b = peer->sent_bytes;
    }
    r->last_t = now;
    r->last_b = peer->sent_bytes;
    host_queue_claim(&e->queue, nbytes);
    /* the pacer is charged now, as the Python engine charges it when it decides:
       another thread deciding while this batch is on its way sees it spent */
    lock_from(&peer->pacer->lock, gil);
    pacer_on_sent(peer->pacer, nbytes, now);
    pthread_mutex_unlock(&peer->pacer->lock);
    peer->sent_bytes += (unsigned long long)nbytes;
    const uint8_t *paths = (const uint8_t *)r->path.buf;
    int tos = ((const uint8_t *)r->tos.buf)[start];
    struct sockaddr_in addr = peer->addr; /* (add_peer may change it meanwhile) */
    r->cursor = stop;
    r->in_flight++;
    int seal = take_seal(r);
    if (e->n_threads > 1) /* (an idle thread may send the next batch, of r or another) */
        pthread_cond_signal(&e->cond);
    pthread_mutex_unlock(&e->lock);
    int err = seal_batch(r, seal, start, stop);
    unsigned long long datagrams = 0, calls = 0;
    for (Py_ssize_t s = start; s < stop && !err;) {
        Py_ssize_t t = s + 1;
        while (t < stop && paths[t] == paths[s])
            t++;
        err = send_run(e, &addr, r, s, t, tos, paths[s], &datagrams, &calls);
        s = t;
    }
    lock_from(&e->lock, gil);
    e->datagrams += datagrams;
    e->send_calls += calls;
    e->batches++;
    give_seal(r, seal);
    r->in_flight--;
    if (err && !r->failed) { /* (the first failure is the round's) */
        r->failed = 1;
        r->err = err;
    }
    pthread_cond_broadcast(&e->settled);
    if (r->cancelled) /* cancel() unlinked it and frees it */
        return 0;
    if (r->in_flight > 0 || claimable(r) || r->stopped) /* (rule 10: no FINISH) */
        return 0;
    r->status = r->failed ? ROUND_FAILED : ROUND_SENT;
    return 1;
}

/* The next batch to peer if its pacer lets it go at `now`: its round (NULL if
 * none, or none may go yet: *wake then says when one may), its end and bytes.
 * With the lock held. */
static Round *next_batch(Engine *e, Peer *peer, double now, Py_ssize_t *stop, double *nbytes,
                         double *wake, PyThreadState **gil) {
    Round *r = first_to_send(peer);
    if (r == NULL)
        return NULL;
    lock_from(&peer->pacer->lock, gil);
    double burst = pacer_burst(peer->pacer);
    Py_ssize_t most = (Py_ssize_t)(burst / (double)r->stride);
    if (most < 1)
        most = 1;
    if (most > e->batch_packets)
        most = e->batch_packets;
    *stop = batch_end(r, r->cursor, most);
    *nbytes = (double)batch_nbytes(r, r->cursor, *stop);
    double t = pacer_next_send_time(peer->pacer, *nbytes, now);
    double rate = peer->pacer->rate;
    pthread_mutex_unlock(&peer->pacer->lock);
    if (t > now) {
        if (t < *wake)
            *wake = t;
        return NULL;
    }
    if (isinf(rate))
        return r;
    if (host_queue_hold(&e->queue, e->fds, e->n_fds, burst, rate, now, wake))
        return NULL;
    Py_ssize_t room = host_queue_batch(&e->queue, burst, r->stride, *stop - r->cursor);
    if (room < *stop - r->cursor) { /* (fewer records: the pacer's answer holds) */
        *stop = batch_end(r, r->cursor, room);
        *nbytes = (double)batch_nbytes(r, r->cursor, *stop);
    }
    return r;
}

static void *send_thread(void *arg) {
    Engine *e = (Engine *)arg;
    pthread_mutex_lock(&e->lock);
    unsigned turn = 0;
    while (!e->stop) {
        double now = monotonic_now();
        double wake = INFINITY;
        int sent = 0;
        turn = e->n_peers > 0 ? (turn + 1) % (unsigned)e->n_peers : 0;
        for (int k = 0; k < e->n_peers && !e->stop; k++) {
            Peer *peer = e->peers[((unsigned)k + turn) % (unsigned)e->n_peers];
            if (peer == NULL || peer->rounds == NULL)
                continue;
            Py_ssize_t stop;
            double nbytes;
            Round *r = next_batch(e, peer, now, &stop, &nbytes, &wake, NULL);
            if (r == NULL)
                continue;
            if (send_batch_of(e, peer, r, stop, nbytes, now, NULL))
                round_done(e, peer, r);
            sent = 1;
            now = monotonic_now();
        }
        if (sent || e->stop)
            continue;
        /* idle: the thread with the earliest deadline waits for it, the others for
           a signal (a post, a claimed batch, a new rate, a cancel) */
        if (isinf(wake) || wake >= e->timed_wait) {
            pthread_cond_wait(&e->cond, &e->lock);
        } else {
            struct timespec ts;
            double whole = floor(wake);
            ts.tv_sec = (time_t)whole;
            ts.tv_nsec = (long)((wake - whole) * 1e9);
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            e->timed_wait = wake;
            pthread_cond_timedwait(&e->cond, &e->lock, &ts);
            if (e->timed_wait == wake) /* (else a thread with an earlier one took over) */
                e->timed_wait = INFINITY;
        }
    }
    pthread_mutex_unlock(&e->lock);
    return NULL;
}

/* ------------------------------------------------------------------ Pacer type */

static PyObject *Pacer_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *names[] = {"unpaced",        "initial_rate", "min_rate",      "max_rate",
                            "burst_bytes",    "gain",         "idle_reset",    "used_fraction",
                            "max_lateness",   "loss_tolerance", "backoff",     "max_cut",
                            "probe",          "probe_interval", "cautious_burst", "burst_time",
                            "ceiling_step",   "share_hold",   NULL};
    int unpaced = 0;
    double initial = 1.0, min_rate = 1.0, max_rate = INFINITY, gain = 1.25, idle_reset = 1.0,
           used = 0.9, lateness = 0.005, tolerance = 0.05, backoff = 0.9, max_cut = 0.5,
           probe = 0.05, probe_interval = 0.005, cautious_burst = 0.002, burst_time = 0.0,
           ceiling_step = 0.005, share_hold = 0.02;
    long long burst = 65536;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$pdddLddddddddddddd:Pacer", names, &unpaced,
                                     &initial, &min_rate, &max_rate, &burst, &gain, &idle_reset,
                                     &used, &lateness, &tolerance, &backoff, &max_cut, &probe,
                                     &probe_interval, &cautious_burst, &burst_time, &ceiling_step,
                                     &share_hold))
        return NULL;
    if (!unpaced && !(min_rate > 0 && isfinite(initial) && initial >= min_rate &&
                      initial <= max_rate && burst >= 1)) {
        PyErr_SetString(PyExc_ValueError,
                        "Pacer: needs 0 < min_rate <= initial_rate <= max_rate and burst_bytes >= 1"
                        " (dlcp.proto.pacing.ReceiverDrivenPacer checks each option)");
        return NULL;
    }
    Pacer *p = (Pacer *)type->tp_alloc(type, 0);
    if (p == NULL)
        return NULL;
    pthread_mutex_init(&p->lock, NULL);
    p->unpaced = unpaced;
    p->initial_rate = initial;
    p->min_rate = min_rate;
    p->max_rate = max_rate;
    p->burst_bytes = burst;
    p->gain = gain;
    p->idle_reset = idle_reset;
    p->used_fraction = used;
    p->max_lateness = lateness;
    p->loss_tolerance = tolerance;
    p->backoff = backoff;
    p->max_cut = max_cut;
    p->probe = probe;
    p->probe_interval = probe_interval;
    p->cautious_burst = cautious_burst;
    p->burst_time = burst_time;
    p->ceiling_step = ceiling_step;
    p->share_hold = share_hold;
    p->ceiling = INFINITY;
    p->rate = unpaced ? INFINITY : initial;
    p->tokens = unpaced ? UNLIMITED : pacer_burst(p); /* (the bucket starts full) */
    return (PyObject *)p;
}

static void Pacer_dealloc(Pacer *p) {
    pthread_mutex_destroy(&p->lock);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static int check_time(double now) {
    if (!isfinite(now)) {
        PyErr_SetString(PyExc_ValueError, "now must be a finite time in seconds");
        return -1;
    }
    return 0;
}

/* Runs `body` (statements that touch no Python object) with mutex m held, from a
 * thread that holds the GIL: at once if m is free, else with the GIL released
 * while it waits for m and runs body (see the top of this file). */
#define LOCKED(m, body)                                                                     \
    do {                                                                                    \
        if (pthread_mutex_trylock(m) == 0) {                                                \
            body;                                                                           \
            pthread_mutex_unlock(m);                                                        \
        } else {                                                                            \
            Py_BEGIN_ALLOW_THREADS                                                          \
            pthread_mutex_lock(m);                                                          \
            body;                                                                           \
            pthread_mutex_unlock(m);                                                        \
            Py_END_ALLOW_THREADS                                                            \
        }                                                                                   \
    } while (0)

/* A new rate may let a batch go sooner: an idle send thread re-plans its wait
   (signalled under the engine's lock: the thread cannot miss it). */
static void pacer_wake(Pacer *p) {
    struct Engine *e = p->engine;
    if (e != NULL)
        LOCKED(&e->lock, pthread_cond_signal(&e->cond));
}

/* The (nbytes, *, now) arguments of on_sent and next_send_time (`format` names
 * the method), checked as the Python pacer checks them; -1 with ValueError. */
static int bytes_and_time(PyObject *args, PyObject *kw, const char *format, double *nbytes,
                          double *now) {
    static char *names[] = {"nbytes", "now", NULL};
    long long n;
    if (!PyArg_ParseTupleAndKeywords(args, kw, format, names, &n, now))
        return -1;
    if (n < 0) {
        PyErr_Format(PyExc_ValueError, "nbytes=%lld must be a non-negative integer", n);
        return -1;
    }
    *nbytes = (double)n;
    return check_time(*now);
}

static PyObject *Pacer_on_sent(Pacer *p, PyObject *args, PyObject *kw) {
    double nbytes, now;
    if (bytes_and_time(args, kw, "L$d:on_sent", &nbytes, &now) < 0)
        return NULL;
    LOCKED(&p->lock, pacer_on_sent(p, nbytes, now));
    Py_RETURN_NONE;
}

static PyObject *Pacer_next_send_time(Pacer *p, PyObject *args, PyObject *kw) {
    double nbytes, now;
    if (bytes_and_time(args, kw, "L$d:next_send_time", &nbytes, &now) < 0)
        return NULL;
    double t = 0;
    LOCKED(&p->lock, t = pacer_next_send_time(p, nbytes, now));
    return PyFloat_FromDouble(t);
}

static PyObject *Pacer_allowance(Pacer *p, PyObject *args, PyObject *kw) {
    static char *names[] = {"now", NULL};
    double now;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "$d:allowance", names, &now))
        return NULL;
    if (check_time(now) < 0)
        return NULL;
    double a = 0;
    LOCKED(&p->lock, a = pacer_allowance(p, now));
    return PyLong_FromDouble(a);
}

static PyObject *Pacer_note_backlogged(Pacer *p, PyObject *args, PyObject *kw) {
    static char *names[] = {"now", NULL};
    double now;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "$d:note_backlogged", names, &now))
        return NULL;
    if (check_time(now) < 0)
        return NULL;
    LOCKED(&p->lock, pacer_note_backlogged(p, now));
    Py_RETURN_NONE;
}

static PyObject *Pacer_on_feedback(Pacer *p, PyObject *args, PyObject *kw) {
    static char *names[] = {"bytes_per_s", "now", "shared", "window", NULL};
    double rate, now = NAN, window = 0.0;
    int shared = 0;
    /* (keyword-only arguments are optional to PyArg: `now` is checked below) */
    if (!PyArg_ParseTupleAndKeywords(args, kw, "d|$dpd:on_feedback", names, &rate, &now,
                                     &shared, &window))
        return NULL;
    if (kw == NULL || PyDict_GetItemString(kw, "now") == NULL) {
        PyErr_SetString(PyExc_TypeError, "on_feedback() missing required keyword argument 'now'");
        return NULL;
    }
    if (!(isfinite(rate) && rate >= 0)) {
        PyErr_SetString(PyExc_ValueError, "bytes_per_s must be a finite rate >= 0");
        return NULL;
    }
    if (!(isfinite(window) && window >= 0)) {
        PyErr_SetString(PyExc_ValueError, "window must be a finite duration >= 0 seconds");
        return NULL;
    }
    if (check_time(now) < 0)
        return NULL;
    LOCKED(&p->lock, pacer_on_feedback(p, rate, shared, window, now));
    pacer_wake(p);
    Py_RETURN_NONE;
}

/* Pacer.on_feedback for the receive loop's linger (dlcp/io/_control_frames.h), which
 * calls it without the GIL with a report it read: its rate and window are finite
 * and >= 0 by construction, its time the monotonic clock's. It waits for the
 * locks as plain mutexes (LOCKED and pacer_wake would let go of a GIL it does not
 * hold when one is busy). The I/O thread that lingers is the one that closes the
 * engine (p->engine), never while it lingers. */
static void pacer_feedback_without_gil(PyObject *obj, double rate, int shared, double window,
                                       double now) {
    Pacer *p = (Pacer *)obj;
    pthread_mutex_lock(&p->lock);
    pacer_on_feedback(p, rate, shared, window, now);
    pthread_mutex_unlock(&p->lock);
    struct Engine *e = p->engine;
    if (e != NULL) { /* (pacer_wake's signal) */
        pthread_mutex_lock(&e->lock);
        pthread_cond_signal(&e->cond);
        pthread_mutex_unlock(&e->lock);
    }
}

/* Rule 10, for the receive loop (_control_watch.h), without the GIL: the round of
 * message (step, msg) that the engine sends with pacer p (its destination's) stops
 * where it is; 1 if there was one. The lock is taken as a plain mutex, as above. */
static int pacer_stop_round_without_gil(PyObject *obj, uint32_t step, uint32_t msg) {
    Pacer *p = (Pacer *)obj;
    struct Engine *e = p->engine;
    int found = 0;
    if (e == NULL)
        return 0;
    pthread_mutex_lock(&e->lock);
    for (int d = 0; d < e->n_peers && !found; d++) {
        Peer *peer = e->peers[d];
        if (peer == NULL || peer->pacer != p)
            continue;
        for (Round *r = peer->rounds; r; r = r->next)
            if (r->step == step && r->msg == msg && !r->cancelled) {
                r->stopped = 1;
                found = 1;
                break;
            }
    }
    pthread_mutex_unlock(&e->lock);
    return found;
}

static DlcpPacerApi pacer_api = {DLCP_PACER_API_VERSION, NULL, pacer_feedback_without_gil,
                                 pacer_stop_round_without_gil};

static PyObject *Pacer_on_loss(Pacer *p, PyObject *args, PyObject *kw) {
    static char *names[] = {"lost_fraction", "send_rate", "now", "queue", NULL};
    double lost, sent_at, now = NAN;
    int queue = 0;
    /* (keyword-only arguments are optional to PyArg: `now` is required by hand) */
    if (!PyArg_ParseTupleAndKeywords(args, kw, "dd|$dp:on_loss", names, &lost, &sent_at, &now,
                                     &queue))
        return NULL;
    if (kw == NULL || PyDict_GetItemString(kw, "now") == NULL) {
        PyErr_SetString(PyExc_TypeError, "on_loss() missing required keyword argument 'now'");
        return NULL;
    }
    if (!(lost >= 0.0 && lost <= 1.0)) {
        PyErr_SetString(PyExc_ValueError, "lost_fraction outside [0, 1]");
        return NULL;
    }
    if (!(isfinite(sent_at) && sent_at > 0)) {
        PyErr_SetString(PyExc_ValueError, "send_rate must be a finite rate > 0");
        return NULL;
    }
    if (check_time(now) < 0)
        return NULL;
    LOCKED(&p->lock, pacer_on_loss(p, lost, sent_at, queue, now));
    pacer_wake(p);
    Py_RETURN_NONE;
}

static PyObject *Pacer_get_rate(Pacer *p, void *closure) {
    (void)closure;
    double rate = 0;
    LOCKED(&p->lock, rate = p->rate);
    return PyFloat_FromDouble(rate);
}

static PyObject *Pacer_get_burst(Pacer *p, void *closure) {
    (void)closure;
    double burst = 0;
    LOCKED(&p->lock, burst = pacer_burst(p));
    return PyLong_FromDouble(burst);
}

static PyObject *Pacer_get_tokens(Pacer *p, void *closure) {
    (void)closure;
    double tokens = 0;
    LOCKED(&p->lock, tokens = p->tokens);
    return PyFloat_FromDouble(tokens);
}

static PyMethodDef Pacer_methods[] = {
    {"on_sent", (PyCFunction)(void (*)(void))Pacer_on_sent, METH_VARARGS | METH_KEYWORDS,
     "on_sent(nbytes, *, now)"},
    {"next_send_time", (PyCFunction)(void (*)(void))Pacer_next_send_time,
     METH_VARARGS | METH_KEYWORDS, "next_send_time(nbytes, *, now) -> time"},
    {"allowance", (PyCFunction)(void (*)(void))Pacer_allowance, METH_VARARGS | METH_KEYWORDS,
     "allowance(*, now) -> bytes"},
    {"note_backlogged", (PyCFunction)(void (*)(void))Pacer_note_backlogged,
     METH_VARARGS | METH_KEYWORDS, "note_backlogged(*, now)"},
    {"on_feedback", (PyCFunction)(void (*)(void))Pacer_on_feedback,
     METH_VARARGS | METH_KEYWORDS,
     "on_feedback(bytes_per_s, *, now, shared=False, window=0.0)"},
    {"on_loss", (PyCFunction)(void (*)(void))Pacer_on_loss, METH_VARARGS | METH_KEYWORDS,
     "on_loss(lost_fraction, send_rate, *, now, queue=False)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Pacer_getset[] = {
    {"rate", (getter)Pacer_get_rate, NULL, "bytes per second", NULL},
    {"burst", (getter)Pacer_get_burst, NULL, "bytes that may go at once", NULL},
    {"tokens", (getter)Pacer_get_tokens, NULL, "bytes in the bucket", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PacerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dlcp.io._engine.Pacer",
    .tp_basicsize = sizeof(Pacer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The receiver-driven pacer of dlcp.proto.pacing, in C (see the module source).",
    .tp_new = Pacer_new,
    .tp_dealloc = (destructor)Pacer_dealloc,
    .tp_methods = Pacer_methods,
    .tp_getset = Pacer_getset,
};

/* ------------------------------------------------------------------ Engine type */

static PyObject *Engine_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *names[] = {"fds",         "batch_packets",   "name", "threads",
                            "queue_limit", "control_timeout", NULL};
    PyObject *fds;
    Py_ssize_t batch_packets;
    const char *name = "dlcp-send";
    int n_threads = 1, queue_limit = 1;
    double control_timeout = 5.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "On|s$ipd:Engine", names, &fds, &batch_packets,
                                     &name, &n_threads, &queue_limit, &control_timeout))
        return NULL;
    if (!(control_timeout > 0 && control_timeout < 1e6)) {
        char said[32]; /* (PyErr_Format has no %g) */
        snprintf(said, sizeof said, "%g", control_timeout);
        PyErr_Format(PyExc_ValueError, "Engine: control_timeout=%s outside (0, 1e6) seconds",
                     said);
        return NULL;
    }
    if (n_threads < 1 || n_threads > MAX_SEND_THREADS) {
        PyErr_Format(PyExc_ValueError, "Engine: threads=%d outside 1..%d", n_threads,
                     MAX_SEND_THREADS);
        return NULL;
    }
    PyObject *seq = PySequence_Fast(fds, "fds must be a sequence of socket descriptors");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || n > 256 || batch_packets < 1) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "Engine: 1..256 fds, batch_packets >= 1");
        return NULL;
    }
    Engine *e = (Engine *)type->tp_alloc(type, 0);
    if (e == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    e->efd = -1;
    e->fds = PyMem_RawCalloc((size_t)n, sizeof(int));
    e->threads = PyMem_RawCalloc((size_t)n_threads, sizeof(pthread_t));
    if (e->fds == NULL || e->threads == NULL) {
        Py_DECREF(seq);
        Py_DECREF(e);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int fd = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        if (fd < 0) {
            Py_DECREF(seq);
            Py_DECREF(e);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "Engine: a descriptor is negative");
            return NULL;
        }
        e->fds[i] = fd;
    }
    Py_DECREF(seq);
    e->n_fds = (int)n;
    e->batch_packets = batch_packets;
    e->queue.limited = queue_limit;
    e->n_threads = n_threads;
    e->timed_wait = INFINITY;
    e->control_timeout = control_timeout;
    pthread_mutex_init(&e->lock, NULL);
    pthread_condattr_t attr; /* deadlines are CLOCK_MONOTONIC times, as Python's */
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&e->cond, &attr);
    pthread_condattr_destroy(&attr);
    pthread_cond_init(&e->settled, NULL);
    e->inited = 1;
    e->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (e->efd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(e);
        return NULL;
    }
    for (int i = 0; i < n_threads; i++) {
        int rc = pthread_create(&e->threads[i], NULL, send_thread, e);
        if (rc != 0) {
            errno = rc;
            PyErr_SetFromErrno(PyExc_OSError);
            Py_DECREF(e); /* (stops the threads started) */
            return NULL;
        }
        e->started++;
        /* what the kernel keeps of a thread's name (top -H, perf): 15 bytes; the
           first thread is `name`, the others `name`.1, `name`.2, ... */
        char cut[16];
        if (i == 0)
            snprintf(cut, sizeof cut, "%s", name);
        else
            snprintf(cut, sizeof cut, "%.*s.%d", i < 10 ? 13 : 12, name, i);
        pthread_setname_np(e->threads[i], cut);
    }
    return (PyObject *)e;
}

static void engine_stop(Engine *e) {
    if (!e->started)
        return;
    LOCKED(&e->lock, {
        e->stop = 1;
        pthread_cond_broadcast(&e->cond);
    });
    Py_BEGIN_ALLOW_THREADS
    for (int i = 0; i < e->started; i++)
        pthread_join(e->threads[i], NULL);
    Py_END_ALLOW_THREADS
    e->started = 0;
}

static void engine_free_rounds(Engine *e) {
    if (!e->inited)
        return;
    /* (the thread has stopped; a post() sending inline from another thread ends
       its batch first: it needs neither the GIL nor anything this holds) */
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&e->lock);
    for (int busy = 1; busy;) {
        busy = 0;
        for (int i = 0; i < e->n_peers; i++)
            for (Round *r = e->peers[i] ? e->peers[i]->rounds : NULL; r; r = r->next)
                busy |= r->in_flight > 0;
        if (busy)
            pthread_cond_wait(&e->settled, &e->lock);
    }
    pthread_mutex_unlock(&e->lock);
    Py_END_ALLOW_THREADS
    for (int i = 0; i < e->n_peers; i++) {
        Peer *peer = e->peers[i];
        if (peer == NULL)
            continue;
        while (peer->rounds) {
            Round *r = peer->rounds;
            peer->rounds = r->next;
            release_round(r);
        }
        peer->pacer->engine = NULL;
        Py_DECREF(peer->pacer);
        PyMem_RawFree(peer);
        e->peers[i] = NULL;
    }
    while (e->done_head) {
        Round *r = e->done_head;
        e->done_head = r->next;
        release_round(r);
    }
    e->done_tail = NULL;
}

static void Engine_dealloc(Engine *e) {
    engine_stop(e);
    engine_free_rounds(e);
    PyMem_RawFree(e->peers);
    for (int i = 0; i < e->n_controls; i++)
        if (e->controls[i] != NULL) {
            pthread_mutex_destroy(&e->controls[i]->lock);
            PyMem_RawFree(e->controls[i]);
        }
    PyMem_RawFree(e->controls);
    PyMem_RawFree(e->fds);
    PyMem_RawFree(e->threads);
    if (e->efd >= 0)
        close(e->efd);
    if (e->inited) {
        pthread_mutex_destroy(&e->lock);
        pthread_cond_destroy(&e->cond);
        pthread_cond_destroy(&e->settled);
    }
    Py_TYPE(e)->tp_free((PyObject *)e);
}

static PyObject *Engine_close(Engine *e, PyObject *unused) {
    (void)unused;
    engine_stop(e);
    engine_free_rounds(e);
    if (e->efd >= 0) {
        close(e->efd);
        e->efd = -1;
    }
    Py_RETURN_NONE;
}

/* add_peer's part under the engine's lock: rank dst's entry (made if new) sends to
 * addr paced by p. 1 if p was attached (the engine then owes it a reference; the
 * pacer it replaced, if any, is in *replaced, whose reference the engine drops), 0
 * if p already paced dst, -1 out of memory (nothing changed). The pacers' `engine`
 * fields are add_peer's to set, with the GIL: only Python's calls read them. */
static int attach_peer(Engine *e, int dst, const struct sockaddr_in *addr, Pacer *p,
                       Pacer **replaced) {
    if (dst >= e->n_peers) {
        int n = dst + 1;
        Peer **grown = PyMem_RawRealloc(e->peers, (size_t)n * sizeof(Peer *));
        if (grown == NULL)
            return -1;
        for (int i = e->n_peers; i < n; i++)
            grown[i] = NULL;
        e->peers = grown;
        e->n_peers = n;
    }
    Peer *peer = e->peers[dst];
    if (peer == NULL) {
        peer = PyMem_RawCalloc(1, sizeof(Peer));
        if (peer == NULL)
            return -1;
        peer->dst = dst;
        e->peers[dst] = peer;
    }
    peer->addr = *addr;
    if (peer->pacer == p)
        return 0;
    *replaced = peer->pacer;
    peer->pacer = p;
    return 1;
}

static PyObject *Engine_add_peer(Engine *e, PyObject *args) {
    int dst, port;
    const char *host;
    PyObject *pacer;
    if (!PyArg_ParseTuple(args, "isiO!:add_peer", &dst, &host, &port, &PacerType, &pacer))
        return NULL;
    if (dst < 0 || dst > 65535 || port <= 0 || port > 65535) {
        PyErr_Format(PyExc_ValueError, "add_peer: rank %d or port %d out of range", dst, port);
        return NULL;
    }
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((unsigned short)port);
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
        PyErr_Format(PyExc_ValueError, "add_peer: %s is not an IPv4 address", host);
        return NULL;
    }
    Pacer *p = (Pacer *)pacer;
    if (p->engine != NULL && p->engine != e) {
        PyErr_SetString(PyExc_ValueError, "add_peer: the pacer belongs to another engine");
        return NULL;
    }
    if (!e->started) {
        PyErr_SetString(PyExc_ValueError, "add_peer: the engine is closed");
        return NULL;
    }
    Pacer *replaced = NULL; /* (its reference dropped after the lock, with the GIL) */
    int attached = 0;
    LOCKED(&e->lock, attached = attach_peer(e, dst, &addr, p, &replaced));
    if (attached < 0)
        return PyErr_NoMemory();
    if (attached) {
        Py_INCREF(p); /* (the caller's reference kept it alive until now) */
        p->engine = e;
    }
    if (replaced != NULL) {
        replaced->engine = NULL;
        Py_DECREF(replaced);
    }
    Py_RETURN_NONE;
}

/* What reap() and post() say of a round that ended. */
static PyObject *round_report(const Round *r) {
    return Py_BuildValue("(iIIiidKdKid)", r->dst, (unsigned)r->step, (unsigned)r->msg,
                         r->status, r->err, r->began_t, r->began_b, r->last_t, r->last_b,
                         r->finish_sent, r->ended_t);
}

/* A FINISH frame on this rule's longest, bytes: the 4-byte length, then at most the
   64 KiB of a control datagram that dlcp.io.control reads */
#define FINISH_MAX (4 + 65536)

/* post()'s finish: a copy of the frame for rule 9. */
static int take_finish(Round *r, PyObject *finish) {
    Py_buffer view;
    if (PyObject_GetBuffer(finish, &view, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (view.len < 1 || view.len > FINISH_MAX) {
        PyErr_Format(PyExc_ValueError, "post: finish of %zd bytes (a control frame: 1..%d)",
                     view.len, FINISH_MAX);
        PyBuffer_Release(&view);
        return -1;
    }
    r->finish = PyMem_RawMalloc((size_t)view.len);
    if (r->finish == NULL) {
        PyBuffer_Release(&view);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(r->finish, view.buf, (size_t)view.len);
    r->finish_len = view.len;
    PyBuffer_Release(&view);
    return 0;
}

static int get_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, Py_ssize_t n,
                      const char *what, int writable) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if (!round_buffer_fits(view->len, itemsize, n)) {
        PyErr_Format(PyExc_ValueError, "post: %s has %zd bytes, expected %zd of %zd", what,
                     view->len, n, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* Rule 8: r is sealed with `key` (bytes, 16, 24 or 32) and nonces from the counter
 * cell `nonces` (one aligned, writable uint64), by at most `n_seals` batches at
 * once; else ValueError (or MemoryError). */
static int seal_setup(Round *r, PyObject *key, PyObject *nonces, int n_seals) {
#ifdef DLCP_LIBCRYPTO
    char *k;
    Py_ssize_t k_len;
    r->seals = PyMem_RawCalloc((size_t)n_seals, sizeof(Gmac));
    if (r->seals == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    r->n_seals = n_seals;
    if (!PyBytes_Check(key) || PyBytes_AsStringAndSize(key, &k, &k_len) < 0 ||
        (size_t)k_len > sizeof r->key ||
        gmac_init(&r->seals[0], (const uint8_t *)k, (size_t)k_len) < 0) {
        PyErr_SetString(PyExc_ValueError,
                        "post: key must be bytes of 16, 24 or 32 (an AES key)");
        return -1;
    }
    memcpy(r->key, k, (size_t)k_len); /* (the other expansions are made from it) */
    r->key_len = (size_t)k_len;
    if (nonces == Py_None ||
        PyObject_GetBuffer(nonces, &r->nonces, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError,
                            "post: a key needs nonces, the writable uint64 nonce counter cell");
        }
        return -1;
    }
    if (r->nonces.len != 8 || ((uintptr_t)r->nonces.buf & 7) != 0) {
        PyErr_SetString(PyExc_ValueError, "post: nonces must be one aligned uint64");
        return -1;
    }
    r->sealed = 1;
    return 0;
#else
    (void)r, (void)key, (void)nonces, (void)n_seals;
    PyErr_SetString(PyExc_ValueError, "post: built without libcrypto");
    return -1;
#endif
}

/* The breaks of r: strictly increasing, within (0, count], ending at count, and
 * with one just after the short record (rule 2); else ValueError. Sets n_breaks. */
static int check_breaks(Round *r) {
    const int64_t *b = (const int64_t *)r->breaks.buf;
    Py_ssize_t n = r->breaks.len / 8;
    Py_ssize_t bad = round_bad_break(b, n, r->count, r->short_index);
    if (bad >= 0 && bad < n) {
        PyErr_Format(PyExc_ValueError,
                     "post: breaks must increase within 1..%zd (break %zd is %lld)", r->count,
                     bad, (long long)b[bad]);
        return -1;
    }
    if (bad == n) {
        PyErr_Format(PyExc_ValueError,
                     "post: breaks must end at the count (%zd) and follow the short record",
                     r->count);
        return -1;
    }
    r->n_breaks = n;
    return 0;
}

/* A lent round (see RoundPost): its records are headers of stride - chunk_bytes
 * bytes, and record i's payload is chunk seqs[i] of `payload`, chunk_bytes long
 * (the short record's short_len minus the header). Every chunk must lie within
 * the payload; else ValueError. */
static int lend(Round *r, PyObject *payload, PyObject *seqs, Py_ssize_t chunk_bytes) {
    r->head = r->stride - chunk_bytes;
    if (chunk_bytes < 1 || r->head < 1 || r->head > 64 ||
        (r->short_index >= 0 && r->short_len <= r->head)) {
        PyErr_Format(PyExc_ValueError,
                     "post: a lent payload needs 1 <= chunk_bytes < stride with a header of at "
                     "most 64 bytes (chunk_bytes %zd, stride %zd, short_len %zd)",
                     chunk_bytes, r->stride, r->short_len);
        r->head = 0;
        return -1;
    }
    r->chunk_bytes = chunk_bytes;
    if (PyObject_GetBuffer(payload, &r->payload, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (PyObject_GetBuffer(seqs, &r->seqs, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    if (r->seqs.itemsize != 8 || r->seqs.format == NULL ||
        strchr("qlQL", r->seqs.format[strlen(r->seqs.format) - 1]) == NULL ||
        r->seqs.len != 8 * r->count) {
        PyErr_Format(PyExc_ValueError, "post: seqs must be %zd int64", r->count);
        return -1;
    }
    const int64_t *seq = (const int64_t *)r->seqs.buf;
    Py_ssize_t chunks = r->payload.len / chunk_bytes; /* whole chunks in the payload */
    for (Py_ssize_t i = 0; i < r->count; i++) {
        Py_ssize_t plen = i == r->short_index ? r->short_len - r->head : chunk_bytes;
        /* chunk seq[i] lies within: seq < chunks, or the short tail right after them */
        int fits = seq[i] >= 0 && (seq[i] < chunks ||
                                   (seq[i] == chunks && plen <= r->payload.len - chunks * chunk_bytes));
        if (!fits) {
            PyErr_Format(PyExc_ValueError,
                         "post: record %zd's chunk %lld (%zd bytes) lies outside the %zd-byte payload",
                         i, (long long)seq[i], plen, r->payload.len);
            return -1;
        }
    }
    return 0;
}

static PyObject *Engine_post(Engine *e, PyObject *args, PyObject *kw) {
    static char *names[] = {"dst",   "step",  "msg",  "order", "records", "stride",
                            "per_message", "count", "short", "short_len", "tos", "path",
                            "prio", "breaks", "key", "nonces", "payload", "seqs",
                            "chunk_bytes", "finish", NULL};
    int dst;
    unsigned long step, msg;
    unsigned long long order;
    PyObject *records, *tos, *path, *prio, *breaks, *key = Py_None, *nonces = Py_None;
    PyObject *payload = Py_None, *seqs = Py_None, *finish = Py_None;
    Py_ssize_t stride, per_message, count, short_index, short_len, chunk_bytes = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ikkKOnnnnnOOOO|OOOOnO:post", names, &dst, &step,
                                     &msg, &order, &records, &stride, &per_message, &count,
                                     &short_index, &short_len, &tos, &path, &prio, &breaks, &key,
                                     &nonces, &payload, &seqs, &chunk_bytes, &finish))
        return NULL;
    int sealed = key != Py_None;
#ifndef DLCP_LIBCRYPTO
    if (sealed) {
        PyErr_SetString(PyExc_ValueError,
                        "post: key given, but this engine was built without libcrypto (SEALS "
                        "is 0): it cannot tag");
        return NULL;
    }
#endif
    Py_ssize_t least = sealed ? 32 + 24 : 1; /* (a data header and a trailer) */
    if (sealed && (stride < least || (short_index >= 0 && short_len < least))) {
        PyErr_Format(PyExc_ValueError,
                     "post: records of %zd bytes (short %zd) cannot hold a data header and an "
                     "authentication trailer", stride, short_len);
        return NULL;
    }
    if (dst < 0 || dst >= e->n_peers || e->peers[dst] == NULL) {
        PyErr_Format(PyExc_ValueError, "post: rank %d has no peer entry (add_peer first)", dst);
        return NULL;
    }
    if (!round_geometry_ok(count, stride, per_message, short_index, short_len)) {
        PyErr_Format(PyExc_ValueError,
                     "post: bad geometry (count %zd, stride %zd, short %zd of %zd bytes)", count,
                     stride, short_index, short_len);
        return NULL;
    }
    Round *r = PyMem_RawCalloc(1, sizeof(Round));
    if (r == NULL)
        return PyErr_NoMemory();
    r->dst = dst;
    r->step = (uint32_t)step;
    r->msg = (uint32_t)msg;
    r->order = order;
    r->count = count;
    r->stride = stride;
    r->per_message = per_message;
    r->short_index = short_index;
    r->short_len = short_len;
    if (payload != Py_None && lend(r, payload, seqs, chunk_bytes) < 0)
        goto fail;
    if (finish != Py_None && take_finish(r, finish) < 0)
        goto fail;
    if (r->head && sealed) { /* (a record: data header, then the trailer) */
        if (r->head != 32 + 24) {
            PyErr_Format(PyExc_ValueError,
                         "post: a sealed lent round needs records of a data header and an "
                         "authentication trailer (56 bytes), got %zd", r->head);
            goto fail;
        }
        r->trailer = 24;
    }
    if (get_buffer(records, &r->records, r->head ? r->head : stride, count, "records", sealed) <
        0)
        goto fail;
    if (sealed && seal_setup(r, key, nonces, e->n_threads + 1) < 0)
        goto fail;
    if (get_buffer(tos, &r->tos, 1, count, "tos", 0) < 0)
        goto fail;
    if (get_buffer(path, &r->path, 1, count, "path", 0) < 0)
        goto fail;
    if (get_buffer(prio, &r->prio, 1, count, "prio", 0) < 0)
        goto fail;
    if (PyObject_GetBuffer(breaks, &r->breaks, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        goto fail;
    if (r->breaks.itemsize != 8 || r->breaks.format == NULL ||
        strchr("qlQL", r->breaks.format[strlen(r->breaks.format) - 1]) == NULL ||
        check_breaks(r) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "post: breaks must be int64");
        goto fail;
    }
    int ended = 0;
    /* the GIL stays until a mutex is busy (lock_from) or a batch of more than
       SEND_WITH_GIL_BYTES goes from here (rule 7) */
    PyThreadState *gil = NULL;
    lock_from(&e->lock, &gil);
    Peer *peer = e->peers[dst];
    Round **at = &peer->rounds;
    while (*at && (*at)->order <= order)
        at = &(*at)->next;
    r->next = *at;
    *at = r;
    /* rule 7: a round that is one batch, if the pacer lets it go now and it is
       next in line, goes from this thread, without waking the engine's threads */
    double wake = INFINITY, now = monotonic_now(), nbytes;
    Py_ssize_t stop;
    int here = batch_end(r, 0, e->batch_packets) == r->count &&
               next_batch(e, peer, now, &stop, &nbytes, &wake, &gil) == r && stop == r->count;
    if (here && gil == NULL && nbytes > SEND_WITH_GIL_BYTES)
        gil = PyEval_SaveThread(); /* (a long send: Python's other threads go on meanwhile) */
    if (here && send_batch_of(e, peer, r, stop, nbytes, now, &gil)) {
        unlink_round(peer, r);
        r->ended_t = monotonic_now();
        ended = 1;
    } else {
        pthread_cond_signal(&e->cond); /* (the rest is the thread's) */
    }
    pthread_mutex_unlock(&e->lock);
    if (gil != NULL)
        PyEval_RestoreThread(gil);
    if (!ended)
        Py_RETURN_NONE;
    PyObject *report = round_report(r);
    release_round(r);
    return report;
fail: /* (releasing a buffer never taken, or twice, is a no-op) */
    release_round(r);
    return NULL;
}

static PyObject *Engine_cancel(Engine *e, PyObject *args) {
    int dst;
    unsigned long step, msg;
    if (!PyArg_ParseTuple(args, "ikk:cancel", &dst, &step, &msg))
        return NULL;
    Round *found = NULL;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&e->lock);
    Peer *peer = dst >= 0 && dst < e->n_peers ? e->peers[dst] : NULL;
    if (peer != NULL) {
        for (Round *r = peer->rounds; r; r = r->next)
            if (r->step == (uint32_t)step && r->msg == (uint32_t)msg) {
                found = r;
                break;
            }
        if (found) {
            unlink_round(peer, found);
            found->cancelled = 1;
            while (found->in_flight > 0) /* rule 6 */
                pthread_cond_wait(&e->settled, &e->lock);
            pthread_cond_signal(&e->cond); /* (a later round of its step may go now) */
        }
    }
    pthread_mutex_unlock(&e->lock);
    Py_END_ALLOW_THREADS
    if (found == NULL)
        Py_RETURN_FALSE;
    release_round(found);
    Py_RETURN_TRUE;
}

static PyObject *Engine_reap(Engine *e, PyObject *unused) {
    (void)unused;
    Round *head = NULL;
    LOCKED(&e->lock, {
        head = e->done_head;
        e->done_head = e->done_tail = NULL;
        if (e->signalled && e->efd >= 0) { /* (under the lock: no later write is lost) */
            uint64_t count;
            ssize_t got = read(e->efd, &count, sizeof count);
            (void)got;
        }
        e->signalled = 0;
    });
    PyObject *out = PyList_New(0);
    while (head) {
        Round *r = head;
        head = r->next;
        if (out != NULL) {
            PyObject *item = round_report(r);
            if (item == NULL || PyList_Append(out, item) < 0)
                Py_CLEAR(out);
            Py_XDECREF(item);
        }
        release_round(r);
    }
    return out;
}

/* ------------------------------------------------------------------ rule 9 */

/* Rank dst's control connection entry (made if `make` and new; NULL if not, or out
   of memory). With the engine's lock held. */
static ControlConn *control_of(Engine *e, int dst, int make) {
    if (dst < e->n_controls && e->controls[dst] != NULL)
        return e->controls[dst];
    if (!make)
        return NULL;
    if (dst >= e->n_controls) {
        ControlConn **grown = PyMem_RawRealloc(e->controls, (size_t)(dst + 1) * sizeof *grown);
        if (grown == NULL)
            return NULL;
        for (int i = e->n_controls; i <= dst; i++)
            grown[i] = NULL;
        e->controls = grown;
        e->n_controls = dst + 1;
    }
    ControlConn *c = PyMem_RawCalloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    pthread_mutex_init(&c->lock, NULL);
    c->fd = -1;
    e->controls[dst] = c;
    return c;
}

static int control_rank(int dst, const char *what) {
    if (dst < 0 || dst > 65535) {
        PyErr_Format(PyExc_ValueError, "%s: rank %d out of range", what, dst);
        return -1;
    }
    return 0;
}

static PyObject *Engine_adopt_control(Engine *e, PyObject *args) {
    int dst, fd;
    if (!PyArg_ParseTuple(args, "ii:adopt_control", &dst, &fd) ||
        control_rank(dst, "adopt_control") < 0)
        return NULL;
    if (fd < 0) {
        PyErr_Format(PyExc_ValueError, "adopt_control: descriptor %d", fd);
        return NULL;
    }
    ControlConn *c = NULL;
    LOCKED(&e->lock, c = control_of(e, dst, 1));
    if (c == NULL)
        return PyErr_NoMemory();
    LOCKED(&c->lock, {
        __atomic_store_n(&c->err, 0, __ATOMIC_RELEASE);
        __atomic_store_n(&c->fd, fd, __ATOMIC_RELEASE);
    });
    Py_RETURN_NONE;
}

static PyObject *Engine_release_control(Engine *e, PyObject *args) {
    int dst;
    if (!PyArg_ParseTuple(args, "i:release_control", &dst) ||
        control_rank(dst, "release_control") < 0)
        return NULL;
    ControlConn *c = NULL;
    LOCKED(&e->lock, c = control_of(e, dst, 0));
    if (c != NULL) /* (waits for a write in progress) */
        LOCKED(&c->lock, {
            __atomic_store_n(&c->fd, -1, __ATOMIC_RELEASE);
            __atomic_store_n(&c->err, 0, __ATOMIC_RELEASE);
        });
    Py_RETURN_NONE;
}

/* Python's frame onto an adopted connection: one send keeping the GIL (a frame of
   a few dozen bytes fits the socket's buffer), the rest, if any, without it. */
static PyObject *Engine_control_send(Engine *e, PyObject *args) {
    int dst;
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "iy*:control_send", &dst, &data))
        return NULL;
    if (control_rank(dst, "control_send") < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    ControlConn *c = NULL;
    LOCKED(&e->lock, c = control_of(e, dst, 0));
    int err = ENOTCONN;
    if (c != NULL) {
        PyThreadState *gil = NULL;
        lock_from(&c->lock, &gil);
        err = c->fd < 0 ? ENOTCONN : c->err;
        if (!err) {
            size_t done = 0, len = (size_t)data.len;
            double deadline = control_clock() + e->control_timeout;
            err = control_write_rest(c->fd, data.buf, len, &done, gil == NULL ? -INFINITY
                                                                              : deadline);
            if (err == ETIMEDOUT && gil == NULL) { /* (the buffer is full: wait without it) */
                gil = PyEval_SaveThread();
                err = control_write_rest(c->fd, data.buf, len, &done, deadline);
            }
            if (err)
                __atomic_store_n(&c->err, err, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&c->lock);
        if (gil != NULL)
            PyEval_RestoreThread(gil);
    }
    PyBuffer_Release(&data);
    if (err) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

static PyObject *Engine_fileno(Engine *e, PyObject *unused) {
    (void)unused;
    return PyLong_FromLong(e->efd);
}

static PyObject *Engine_stats(Engine *e, PyObject *unused) {
    (void)unused;
    unsigned long long b = 0, d = 0, c = 0, f = 0, fe = 0;
    LOCKED(&e->lock, {
        b = e->batches;
        d = e->datagrams;
        c = e->send_calls;
        f = e->finishes;
        fe = e->finish_errors;
    });
    return Py_BuildValue("{sKsKsKsKsK}", "engine_batches", b, "engine_datagrams", d,
                         "engine_send_calls", c, "engine_finishes", f,
                         "engine_finish_errors", fe);
}

static PyMethodDef Engine_methods[] = {
    {"add_peer", (PyCFunction)Engine_add_peer, METH_VARARGS,
     "add_peer(rank, host, port, pacer): where rank's data goes, paced by pacer."},
    {"post", (PyCFunction)(void (*)(void))Engine_post, METH_VARARGS | METH_KEYWORDS,
     "post(dst=, step=, msg=, order=, records=, stride=, per_message=, count=, short=, "
     "short_len=, tos=, path=, prio=, breaks=, key=None, nonces=None, payload=None, "
     "seqs=None, chunk_bytes=0, finish=None) -> report or None: a round to send; a round "
     "of one batch the pacer lets go goes at once, and its report comes back (rule 7); "
     "with key, each batch is sealed as it goes (rule 8); finish, the frame a send thread "
     "writes on the rank's control connection after the round (rule 9)."},
    {"cancel", (PyCFunction)Engine_cancel, METH_VARARGS,
     "cancel(dst, step, msg) -> bool: stop sending a round; its memory is free on return."},
    {"reap", (PyCFunction)Engine_reap, METH_NOARGS,
     "reap() -> [(dst, step, msg, status, errno, began_t, began_bytes, last_t, last_bytes, "
     "finish_sent, ended_t)]"},
    {"adopt_control", (PyCFunction)Engine_adopt_control, METH_VARARGS,
     "adopt_control(rank, fd): rank's control connection (its hello sent) takes FINISH "
     "frames from the send threads, and Python's frames through control_send (rule 9)."},
    {"release_control", (PyCFunction)Engine_release_control, METH_VARARGS,
     "release_control(rank): no more writes on it (waits for one in progress); before "
     "the connection is closed."},
    {"control_send", (PyCFunction)Engine_control_send, METH_VARARGS,
     "control_send(rank, frame): the whole frame onto rank's adopted connection, or "
     "OSError (the connection's error once a write on it failed; ENOTCONN: none)."},
    {"fileno", (PyCFunction)Engine_fileno, METH_NOARGS,
     "fileno() -> the eventfd that is readable while reap() has something"},
    {"stats", (PyCFunction)Engine_stats, METH_NOARGS, "stats() -> counters"},
    {"close", (PyCFunction)Engine_close, METH_NOARGS, "close(): stop the thread, drop rounds"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EngineType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dlcp.io._engine.Engine",
    .tp_basicsize = sizeof(Engine),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The native send engine (see the module source).",
    .tp_new = Engine_new,
    .tp_dealloc = (destructor)Engine_dealloc,
    .tp_methods = Engine_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "dlcp.io._engine",
    "The native send engine of the DLCP endpoint: pacing and sending in a thread without "
    "the GIL.",
    -1, NULL,
};

PyMODINIT_FUNC PyInit__engine(void) {
    if (PyType_Ready(&PacerType) < 0 || PyType_Ready(&EngineType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&PacerType);
    Py_INCREF(&EngineType);
    if (PyModule_AddObject(m, "Pacer", (PyObject *)&PacerType) < 0 ||
        PyModule_AddObject(m, "Engine", (PyObject *)&EngineType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    pacer_api.pacer_type = &PacerType;
    PyObject *api = PyCapsule_New(&pacer_api, DLCP_PACER_API_NAME, NULL);
    if (api == NULL || PyModule_AddObject(m, "PACER_API", api) < 0) {
        Py_XDECREF(api);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "ROUND_SENT", ROUND_SENT);
    PyModule_AddIntConstant(m, "ROUND_FAILED", ROUND_FAILED);
#ifdef DLCP_LIBCRYPTO
    PyModule_AddIntConstant(m, "SEALS", 1);
#else
    PyModule_AddIntConstant(m, "SEALS", 0);
#endif
    return m;
}
