/*
 * The control connections whose RATE and STOP frames a MessageTable's waits take
 * themselves (_control_frames.h says which frames and why), and the native
 * engine's pacers their RATEs go to and whose rounds their STOPs stop
 * (_pacer_api.h). Used by _udpio.c: the table's methods change this under the
 * table's lock, and the receive call and wait, which hold that lock while they
 * look at a connection, read it without the GIL.
 *
 * Python decides what is watched (dlcp.io.io_loop): an inbound connection whose
 * hello named its rank, that has carried a valid message already (trusted), and
 * whose frames Python holds no partial bytes of, so that the frames at the head
 * of its socket are the next ones of its stream; and, per source rank, the
 * pacer of the messages this rank sends it. It unwatches a connection before it
 * closes it, and whenever its read left a partial frame in Python's buffer.
 *
 * A STOP taken is kept here (the stash, with its source and time) for Python,
 * which takes the stash at the start of its next turn and before it reads any
 * control connection, and applies each STOP as if it had read it then. The waits
 * end by `due_ns` (the first STOP kept plus `hold_ns`) so that a STOP waits for
 * Python's next turn at most that long; a full stash takes no more STOPs. Nor is
 * one taken while a caller waits for a send (`waiters`): the STOP that settles
 * it must wake the I/O thread. A caller counts itself first and then looks at
 * the stash under the table's lock (waking the I/O thread if a STOP is kept), and
 * a wait looks at the count under that lock before it keeps a STOP, so every
 * STOP is either left for Python's turn or seen by the caller.
 */
#ifndef DLCP_CONTROL_WATCH_H
#define DLCP_CONTROL_WATCH_H

#include <Python.h>
#include <sys/socket.h>

#include "_control_frames.h"
#include "_linger.h"
#include "_pacer_api.h"

/* frames one look at a connection takes at most (the rest waits for the next) */
#define CONTROL_WATCH_FRAMES 32
/* STOPs the stash holds at most (Python's turn takes them all) */
#define CONTROL_STASH_STOPS 256
/* the messages that ended here last, that a FINISH may be dropped for: at most
 * Python's own memory of ended messages (its completed_memory), which holds them
 * all then (it forgets the oldest first) */
#define CONTROL_ENDED_KEYS 256
/* bytes one look at a connection peeks: 32 frames of RATE's size, or a long FINISH */
#define CONTROL_WATCH_PEEK 4096
_Static_assert(CONTROL_WATCH_PEEK >= FINISH_FRAME_MAX, "a look must hold the longest FINISH");

/* A message that ended here (Python says so as it ends: MessageTable.ended). */
typedef struct {
    unsigned src;
    uint32_t step, msg;
    int64_t at_ns;
    int completed;
} EndedKey;

/* A STOP taken, for Python: its datagram as decode_control reads it (with its
 * trailer where the job authenticates: Python verifies it again). */
typedef struct {
    unsigned src;
    int64_t t_ns; /* when it was taken (CLOCK_MONOTONIC) */
    uint8_t len;
    uint8_t datagram[STOP_DATAGRAM_MAX];
} StashedStop;

typedef struct {
    int fd;
    unsigned src; /* the rank its hello named */
} WatchedConnection;

typedef struct {
    const DlcpPacerApi *api; /* NULL: every frame is Python's */
    PyObject *api_owner;     /* (the capsule the api came in) */
    ControlRules rules;      /* (rules.stop_first 0: every STOP is Python's) */
    TagCheck tags;           /* rules.auth_flag: the tags' check (the table's keys) */
    PyObject **pacers; /* by source rank; NULL: none */
    size_t n_pacers;
    WatchedConnection *conns;
    size_t n_conns, cap_conns;
    long long rates_taken, stops_taken, rounds_stopped;
    StashedStop stash[CONTROL_STASH_STOPS];
    size_t n_stash;
    /* callers waiting for a send's future (atomic: they count themselves without
     * the table's lock, then look at the stash under it): while any waits, STOPs
     * are Python's, whose turn settles the send at once */
    int waiters;
    int64_t hold_ns, due_ns; /* due_ns: INT64_MAX while the stash is empty */
    /* the last n_ended of the messages that ended here, a ring (the next at
     * ended_next); a FINISH for one that completed less than crossed_ns ago is
     * dropped (0: every FINISH is Python's) */
    EndedKey ended[CONTROL_ENDED_KEYS];
    size_t n_ended, ended_next, ended_cap;
    int64_t crossed_ns;
    long long finishes_taken;
    /* a read that took fewer bytes than the frames peeked: it cannot happen while
     * the I/O thread is the socket's only reader; if it did, the stream would be
     * cut and Python's read would refuse what follows and close the connection */
    long long cut_reads;
} ControlWatch;

static void control_watch_free(ControlWatch *w) {
    for (size_t i = 0; i < w->n_pacers; i++)
        Py_XDECREF(w->pacers[i]);
    PyMem_Free(w->pacers);
    PyMem_Free(w->conns);
    Py_XDECREF(w->api_owner);
    memset(w, 0, sizeof *w);
    w->due_ns = INT64_MAX;
}

/* Watch fd for src's RATE frames (again, if it was); -1 with MemoryError. */
static int control_watch_add(ControlWatch *w, int fd, unsigned src) {
    for (size_t i = 0; i < w->n_conns; i++)
        if (w->conns[i].fd == fd) {
            w->conns[i].src = src;
            return 0;
        }
    if (w->n_conns == w->cap_conns) {
        size_t cap = w->cap_conns ? 2 * w->cap_conns : 8;
        WatchedConnection *grown = PyMem_Realloc(w->conns, cap * sizeof *grown);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        w->conns = grown;
        w->cap_conns = cap;
    }
    w->conns[w->n_conns++] = (WatchedConnection){fd, src};
    return 0;
}

/* Whether fd was watched; it is not any more. */
static int control_watch_remove(ControlWatch *w, int fd) {
    for (size_t i = 0; i < w->n_conns; i++)
        if (w->conns[i].fd == fd) {
            w->conns[i] = w->conns[--w->n_conns];
            return 1;
        }
    return 0;
}

/* src's reports go to pacer from now on (NULL: to Python); -1 with MemoryError.
 * Steals no reference: takes its own. */
static int control_watch_pacer(ControlWatch *w, unsigned src, PyObject *pacer) {
    if (src >= w->n_pacers) {
        if (pacer == NULL)
            return 0;
        size_t n = src + 1 > 2 * w->n_pacers ? src + 1 : 2 * w->n_pacers;
        PyObject **grown = PyMem_Realloc(w->pacers, n * sizeof *grown);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memset(grown + w->n_pacers, 0, (n - w->n_pacers) * sizeof *grown);
        w->pacers = grown;
        w->n_pacers = n;
    }
    Py_XINCREF(pacer);
    Py_XSETREF(w->pacers[src], pacer);
    return 0;
}

/* Message (src, step, msg) ended here at at_ns (completed or not): the newest of
 * the ring, which forgets its oldest beyond ended_cap. */
static void control_watch_ended(ControlWatch *w, unsigned src, uint32_t step, uint32_t msg,
                                int64_t at_ns, int completed) {
    if (w->ended_cap == 0)
        return;
    w->ended[w->ended_next] = (EndedKey){src, step, msg, at_ns, completed};
    w->ended_next = (w->ended_next + 1) % w->ended_cap;
    if (w->n_ended < w->ended_cap)
        w->n_ended++;
}

/* The source whose frames a walk looks at, and when. */
typedef struct {
    const ControlWatch *w;
    unsigned src;
    int64_t now_ns;
} CrossedFinishes;

/* FinishFilter's test: the message completed here less than crossed_ns ago, so
 * Inbox.on_finish would do nothing with its FINISH (a STOP again is its answer
 * only from half the FINISH timeout on, which crossed_ns is). Newest first. */
static int finish_crossed(void *ctx, uint32_t step, uint32_t msg) {
    const CrossedFinishes *c = ctx;
    const ControlWatch *w = c->w;
    for (size_t i = 1; i <= w->n_ended; i++) {
        const EndedKey *e = &w->ended[(w->ended_next + w->ended_cap - i) % w->ended_cap];
        if (e->src == c->src && e->step == step && e->msg == msg)
            return e->completed && c->now_ns - e->at_ns < w->crossed_ns;
    }
    return 0;
}

/* LingerAbsorb's absorb, without the GIL: the RATE frames at the head of watched
 * connection fd go to their pacer, its STOPs stop their rounds and go to the
 * stash, and the FINISHes that crossed their message's STOP are dropped; 1 if that
 * was all fd had (the wait goes on). */
static int control_watch_absorb(void *ctx, int fd) {
    ControlWatch *w = ctx;
    const WatchedConnection *c = NULL;
    for (size_t i = 0; w->api != NULL && i < w->n_conns && c == NULL; i++)
        if (w->conns[i].fd == fd)
            c = &w->conns[i];
    /* (RATEs and STOPs go to, and stop the rounds of, the pacer of the messages to
       c->src: without one, they are Python's) */
    PyObject *pacer = c != NULL && c->src < w->n_pacers ? w->pacers[c->src] : NULL;
    if (c == NULL || (pacer == NULL && w->crossed_ns == 0))
        return 0;
    ControlRules rules = w->rules;
    if (pacer == NULL)
        rules.first = rules.stop_first = 0;
    for (size_t i = 0; i < w->n_stash && rules.first != 0; i++)
        if (w->stash[i].src == c->src) /* (its RATEs wait behind its STOP: the walk's rule) */
            rules.first = 0;
    uint8_t buf[CONTROL_WATCH_PEEK];
    ssize_t n = recv(fd, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT);
    if (n <= 0) /* (its end, an error or nothing after all: Python's read says) */
        return 0;
    ControlFrame frames[CONTROL_WATCH_FRAMES];
    size_t count, room = __atomic_load_n(&w->waiters, __ATOMIC_SEQ_CST) > 0
                             ? 0
                             : CONTROL_STASH_STOPS - w->n_stash;
    int64_t now_ns = linger_clock_ns();
    CrossedFinishes crossed = {w, c->src, now_ns};
    FinishFilter finishes = {finish_crossed, &crossed};
    size_t take = control_frames(buf, (size_t)n, &rules, &w->tags, c->src, frames,
                                 CONTROL_WATCH_FRAMES, room,
                                 w->crossed_ns > 0 ? &finishes : NULL, &count);
    if (take == 0)
        return 0;
    ssize_t got = recv(fd, buf, take, MSG_DONTWAIT);
    if (got <= 0) /* (nothing taken: Python reads them) */
        return 0;
    if ((size_t)got < take)
        w->cut_reads++;
    double now = (double)now_ns * 1e-9;
    for (size_t i = 0; i < count && frames[i].at + frames[i].len <= (size_t)got; i++) {
        const ControlFrame *f = &frames[i];
        if (f->kind == FRAME_RATE) {
            w->api->feedback(pacer, f->rate.bytes_per_s, f->rate.shared, f->rate.window, now);
            w->rates_taken++;
            continue;
        }
        if (f->kind == FRAME_FINISH) { /* (crossed its STOP: nothing to do) */
            w->finishes_taken++;
            continue;
        }
        w->rounds_stopped += w->api->stop_round(pacer, f->step, f->msg);
        StashedStop *kept = &w->stash[w->n_stash++];
        kept->src = c->src;
        kept->t_ns = now_ns;
        kept->len = (uint8_t)(f->len - CONTROL_FRAME_PREFIX);
        memcpy(kept->datagram, buf + f->at + CONTROL_FRAME_PREFIX, kept->len);
        if (w->n_stash == 1) /* (read by waits that do not hold the table's lock) */
            __atomic_store_n(&w->due_ns, now_ns + w->hold_ns, __ATOMIC_RELAXED);
        w->stops_taken++;
    }
    return (size_t)got == take && take == (size_t)n && (size_t)n < sizeof buf;
}

#endif
