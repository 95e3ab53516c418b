/*
 * The native receive path without Python: a table of the messages under way
 * that the receive loop scatters itself, and the step that takes the runs of
 * datagrams recv_runs_loop read (_recv_runs.h) into them with the scatter_run
 * core (dlcp/proto/_kernels_core.h). _udpio.c wraps it for Python (MessageTable)
 * and calls take_next without the GIL; tests/fuzz/fuzz_take_runs.c calls it under
 * libFuzzer with a scripted socket.
 *
 * What a run's head decides, as Inbox._receive_run (dlcp/proto/receive_paths.py)
 * decides it: a run is offered to the core when it is at least one header long
 * with a segment size of at least a header, and its first datagram is a data
 * datagram of the table's job, of a registered message, with that message's
 * element type and length, and with no flag beyond the per-packet ones but the
 * AUTH flag exactly when the message was registered with a key. The core then
 * takes the leading datagrams that fit (same message-wide header bytes as the
 * head, geometry of the message). Everything else is handed back to Python, in
 * arrival order:
 *
 *   TAKE_WHOLE  a run the table does not take at all (a new message, a foreign
 *               or bad head, a first tag that does not verify, ...): Python
 *               receives it as before;
 *   TAKE_REST   the datagrams of a run after its taken prefix: Python's general
 *               path (parse_batch) takes them, as after Python's run path;
 *   TAKE_CHECK  a run was taken whole and its message may now be complete:
 *               Python applies the counts and runs the completion check before
 *               anything later is taken (a message that completes mid-call must
 *               not take the datagrams behind: they are late);
 *   TAKE_DONE   every staged run was handled.
 *
 * Before acting on a handover Python applies what the table took since the last
 * one (each message's counts, reported once by take_report), so that its state
 * is what the run path would have left.
 *
 * Authenticated messages (spec §3): a message registered with a verifier (the
 * key of the pair source -> this rank, expanded by the caller) takes only the
 * leading datagrams of a run whose tags verify, as Python's run path takes the
 * verified_prefix of dlcp/proto/auth.py, and writes their payloads without the
 * trailer (nonce and tag). The first datagram whose tag does not verify, and
 * everything after it, is handed back (TAKE_WHOLE or TAKE_REST), so that
 * Python's general path verifies it again and rejects it by its reason
 * (auth_failed). The check itself is the caller's (TakeTable.verify): the
 * wrapper's is libcrypto's AES-GMAC (dlcp/proto/gmac.h); this file does no
 * cryptography.
 *
 * Memory: the table holds no Python objects; the caller keeps every registered
 * message's buffers alive while it is registered (the wrapper holds a Py_buffer
 * of each) and removes a message before they may go. No allocation happens in
 * take_next.
 */
#ifndef DLCP_TAKE_RUNS_H
#define DLCP_TAKE_RUNS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "../proto/_kernels_core.h"
#include "_recv_runs.h"

enum { TAKE_DONE = 0, TAKE_WHOLE, TAKE_REST, TAKE_CHECK };

/* Where the run's head keeps the fields a message is found by: byte offsets in
 * the data header of ver_type (1 byte), flags (1), job (2), step (4), msg (2),
 * msg_elems (4), src (2) and the dtype byte (1), big-endian on the wire; and of
 * the bound byte (1), which the table reports (the sender's loss bound, which
 * a message registered before its data learns from it). */
typedef struct {
    unsigned char ver_type, flags, job, step, msg, msg_elems, src, dtype, bound;
} HeadLayout;

#define HEAD_LAYOUT_LEN 9

/* One registered message: its buffers, geometry, the copies of its counters
 * that decide when its completion check is due, and what was taken since the
 * last report. */
typedef struct {
    uint64_t key;
    int live;
    unsigned char *out, *received, *received_class;
    ssize_t out_len, received_len, received_class_len;
    ssize_t chunk_elems, msg_elems, itemsize;
    unsigned dtype_byte;
    int stream;
    int add; /* its payloads are float32 values added to out's (itemsize 4), not copied */
    /* what its datagrams' tags are verified with (TakeTable.verify's first
     * argument; the caller's, alive while registered), NULL: they carry none */
    void *verifier;
    /* tagged datagrams: the lowest nonce taken (below it, a datagram is handed
     * back to Python, which refuses it as replayed: dlcp/proto/replay.py), and
     * one above the highest nonce taken since it was registered (0: none) */
    uint64_t nonce_floor, nonce_next;
    /* the reassembler's received_elems and received_protected, and the values at
     * which Reassembler.is_complete may turn true: all elements, or (once the
     * sender's FINISH came) complete_elems with complete_protected protected chunks */
    long long received_elems, received_protected, complete_elems, complete_protected;
    /* taken since the last report */
    long long datagrams, nbytes, fresh, fresh_elems, fresh_drop, fresh_retx, payload_bytes;
    /* the bound byte of the first run taken since it was registered (-1: none yet),
     * as the first datagram Python's first path reads gives a message its bound */
    int bound;
    int reported; /* listed in the table's touched list */
} TakenMessage;

/* Whether a tagged record of len bytes (its trailer included) carries the right
 * tag under `verifier`: 1 right, 0 wrong, -1 the check failed (taken as wrong:
 * Python checks the datagram again). */
typedef int (*TakeVerify)(void *verifier, const unsigned char *record, size_t len);

/* Tags are checked this many datagrams at a time, each batch just before its
 * payloads are copied, so that the copy reads bytes the check has just read (16
 * MTU-sized datagrams: 23 KB, within a core's L2 cache). */
#define TAKE_VERIFY_BATCH 16

/* (a slot index, -1: empty) */
typedef struct {
    uint64_t key;
    ssize_t slot;
} TakeIndexCell;

typedef struct {
    unsigned job, data_vt, per_packet_flags;
    HeadLayout head;
    unsigned char mask[SCATTER_MAX_HEADER], layout[8];
    ssize_t header_len;
    /* authenticated messages: the head's AUTH flag, the trailer after each
     * payload, and the tag check (NULL, or auth_flag 0: no message has a verifier) */
    unsigned auth_flag;
    ssize_t trailer_len;
    TakeVerify verify;
    /* the messages: slots (some free), and an open-addressing index key -> slot */
    TakenMessage *slots;
    ssize_t n_slots, n_live;
    TakeIndexCell *index;
    size_t index_cap; /* a power of two, at least twice n_live; 0 before the first */
    ssize_t *touched; /* the slots with counts to report, n_slots long */
    ssize_t n_touched;
    /* the staged runs of one receive buffer, and the next to handle */
    Run *runs;
    ssize_t n_runs, cursor, staged_len;
} TakeTable;

static inline uint64_t take_key(unsigned src, unsigned step, unsigned msg) {
    return ((uint64_t)src << 48) | ((uint64_t)step << 16) | msg;
}

static inline size_t take_hash(uint64_t key, size_t cap) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return (size_t)key & (cap - 1);
}

/* The slot of `key`, or -1. */
static inline ssize_t take_find(const TakeTable *t, uint64_t key) {
    if (t->index_cap == 0)
        return -1;
    for (size_t i = take_hash(key, t->index_cap);; i = (i + 1) & (t->index_cap - 1)) {
        if (t->index[i].slot < 0)
            return -1;
        if (t->index[i].key == key)
            return t->index[i].slot;
    }
}

static inline void take_index_put(TakeIndexCell *index, size_t cap, uint64_t key, ssize_t slot) {
    size_t i = take_hash(key, cap);
    while (index[i].slot >= 0)
        i = (i + 1) & (cap - 1);
    index[i] = (TakeIndexCell){key, slot};
}

/* Room for one more message: -1 if memory ran out (nothing changed). */
static inline int take_reserve(TakeTable *t) {
    if ((size_t)(t->n_live + 1) * 2 > t->index_cap) {
        size_t cap = t->index_cap ? t->index_cap * 2 : 16;
        TakeIndexCell *index = malloc(sizeof *index * cap);
        if (index == NULL)
            return -1;
        for (size_t i = 0; i < cap; i++)
            index[i].slot = -1;
        for (size_t i = 0; i < t->index_cap; i++)
            if (t->index[i].slot >= 0)
                take_index_put(index, cap, t->index[i].key, t->index[i].slot);
        free(t->index);
        t->index = index;
        t->index_cap = cap;
    }
    if (t->n_live == t->n_slots) {
        ssize_t n = t->n_slots ? t->n_slots * 2 : 8;
        TakenMessage *slots = realloc(t->slots, sizeof *slots * (size_t)n);
        if (slots == NULL)
            return -1;
        t->slots = slots;
        ssize_t *touched = realloc(t->touched, sizeof *touched * (size_t)n);
        if (touched == NULL)
            return -1;
        t->touched = touched;
        for (ssize_t i = t->n_slots; i < n; i++)
            t->slots[i].live = 0;
        t->n_slots = n;
    }
    return 0;
}

/* Registers message m (its key, buffers, geometry and counters set by the
 * caller, counts zero), replacing one of the same key; returns its slot, or -1
 * if memory ran out. A replaced message's unreported counts are kept. */
static inline ssize_t take_register(TakeTable *t, const TakenMessage *m) {
    ssize_t slot = take_find(t, m->key);
    if (slot >= 0) {
        TakenMessage *old = &t->slots[slot];
        TakenMessage next = *m;
        next.datagrams = old->datagrams;
        next.nbytes = old->nbytes;
        next.fresh = old->fresh;
        next.fresh_elems = old->fresh_elems;
        next.fresh_drop = old->fresh_drop;
        next.fresh_retx = old->fresh_retx;
        next.payload_bytes = old->payload_bytes;
        next.bound = old->bound;
        next.nonce_next = old->nonce_next;
        next.reported = old->reported;
        next.live = 1;
        *old = next;
        return slot;
    }
    if (take_reserve(t) < 0)
        return -1;
    for (slot = 0; t->slots[slot].live; slot++)
        ;
    t->slots[slot] = *m;
    t->slots[slot].live = 1;
    t->slots[slot].reported = 0;
    take_index_put(t->index, t->index_cap, m->key, slot);
    t->n_live++;
    return slot;
}

/* Removes `key`'s message (its unreported counts are dropped with it); returns
 * its slot, or -1 if it was not registered. */
static inline ssize_t take_unregister(TakeTable *t, uint64_t key) {
    if (t->index_cap == 0)
        return -1;
    size_t mask = t->index_cap - 1, i = take_hash(key, t->index_cap);
    while (t->index[i].slot >= 0 && t->index[i].key != key)
        i = (i + 1) & mask;
    ssize_t slot = t->index[i].slot;
    if (slot < 0)
        return -1;
    /* backward-shift deletion: later cells of the probe chain move up */
    for (size_t j = (i + 1) & mask; t->index[j].slot >= 0; j = (j + 1) & mask) {
        size_t home = take_hash(t->index[j].key, t->index_cap);
        /* cell j may move to i when its home is not in (i, j] (cyclically) */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            t->index[i] = t->index[j];
            i = j;
        }
    }
    t->index[i].slot = -1;
    TakenMessage *m = &t->slots[slot];
    if (m->reported) { /* off the touched list */
        for (ssize_t k = 0; k < t->n_touched; k++)
            if (t->touched[k] == slot) {
                t->touched[k] = t->touched[--t->n_touched];
                break;
            }
    }
    m->live = 0;
    m->reported = 0;
    t->n_live--;
    return slot;
}

/* Stages the runs (n at most MAX_RUNS) of a receive buffer of buf_len bytes: 0,
 * or -1 if a run does not lie in it (nothing staged). */
static inline int take_stage(TakeTable *t, const Run *runs, ssize_t n, ssize_t buf_len) {
    if (n < 0 || n > MAX_RUNS)
        return -1;
    for (ssize_t i = 0; i < n; i++)
        if (runs[i].start < 0 || runs[i].end < runs[i].start || runs[i].end > buf_len ||
            runs[i].seg <= 0)
            return -1;
    if (n)
        memmove(t->runs, runs, sizeof *runs * (size_t)n);
    t->n_runs = n;
    t->cursor = 0;
    t->staged_len = buf_len;
    return 0;
}

static inline unsigned take_be16(const unsigned char *p) { return ((unsigned)p[0] << 8) | p[1]; }

/* The registered message a run's head belongs to, if the run may be offered to
 * the core (see the top of this file); NULL otherwise. */
static inline TakenMessage *take_message_of(const TakeTable *t, const unsigned char *head) {
    const HeadLayout *h = &t->head;
    if (head[h->ver_type] != t->data_vt || take_be16(head + h->job) != t->job)
        return NULL;
    uint64_t key = take_key(take_be16(head + h->src), (unsigned)be32(head + h->step),
                            take_be16(head + h->msg));
    ssize_t slot = take_find(t, key);
    if (slot < 0)
        return NULL;
    TakenMessage *m = &t->slots[slot];
    if (head[h->dtype] != m->dtype_byte || (ssize_t)be32(head + h->msg_elems) != m->msg_elems)
        return NULL;
    /* beyond the per-packet flags: AUTH for a tagged message, nothing for another */
    unsigned extra = head[h->flags] & ~t->per_packet_flags;
    if (m->verifier != NULL)
        return t->verify != NULL && t->auth_flag != 0 && extra == t->auth_flag ? m : NULL;
    return extra == 0 ? m : NULL;
}

/* The nonce of a tagged datagram of `size` bytes at `record` (the trailer's
 * first 8 bytes, big-endian). */
static inline uint64_t take_nonce(const TakeTable *t, const unsigned char *record, ssize_t size) {
    const unsigned char *p = record + size - t->trailer_len;
    return ((uint64_t)be32(p) << 32) | be32(p + 4);
}

/* How many of the k leading datagrams at `at` (seg apart, `bytes` in all: the
 * last may be shorter) carry a nonce of at least m's floor and the right tag
 * under m's verifier; a datagram too short for a header and a trailer ends the
 * count, as verified_prefix in dlcp/proto/auth.py counts. */
static inline ssize_t take_verified(const TakeTable *t, const TakenMessage *m,
                                    const unsigned char *at, ssize_t k, ssize_t seg,
                                    ssize_t bytes) {
    const ssize_t least = t->header_len + t->trailer_len;
    ssize_t right = 0;
    for (; right < k; right++) {
        ssize_t size = bytes - right * seg < seg ? bytes - right * seg : seg;
        if (size < least || take_nonce(t, at + right * seg, size) < m->nonce_floor ||
            t->verify(m->verifier, at + right * seg, (size_t)size) != 1)
            break;
    }
    return right;
}

/* The core over one run of len bytes (n datagrams, seg apart) whose head names
 * m: scatter_run's checks and copies, over the datagrams whose tags verify for a
 * tagged message (checked TAKE_VERIFY_BATCH at a time, each batch just before
 * it is copied); the taken prefix's counts in *r. */
static inline void take_scatter(const TakeTable *t, TakenMessage *m, const unsigned char *run,
                                ssize_t len, ssize_t n, ssize_t seg, ScatterResult *r) {
    const ssize_t hl = t->header_len;
    const ssize_t batch = m->verifier != NULL ? TAKE_VERIFY_BATCH : n;
    *r = (ScatterResult){0, 0, 0, 0, 0, 0};
    for (ssize_t first = 0; first < n; first += batch) {
        ssize_t k = n - first < batch ? n - first : batch;
        const unsigned char *at = run + first * seg;
        ssize_t bytes = len - first * seg < k * seg ? len - first * seg : k * seg;
        ssize_t offered = k;
        if (m->verifier != NULL) {
            offered = take_verified(t, m, at, k, seg, bytes);
            if (offered == 0)
                return;
            if (offered < k) /* (only the run's last datagram may be short) */
                bytes = offered * seg;
        }
        ScatterArgs a = {
            .buf = at, .buf_len = bytes, .n = offered, .stride = seg, .total = bytes,
            .tmpl = run, .mask = t->mask, .layout = t->layout,
            .tmpl_len = hl, .mask_len = hl, .layout_len = 8,
            .out = m->out, .out_len = m->out_len, .chunk_elems = m->chunk_elems,
            .msg_elems = m->msg_elems, .itemsize = m->itemsize,
            .received = m->received, .received_class = m->received_class,
            .received_len = m->received_len, .received_class_len = m->received_class_len,
            .stream = m->stream, .trailer = m->verifier != NULL ? t->trailer_len : 0,
            .add = m->add,
        };
        ScatterResult part = {0, 0, 0, 0, 0, 0};
        if (scatter_check_args(&a) == SCATTER_OK && scatter_check_buffers(&a) == SCATTER_OK)
            scatter_records(&a, &part);
        for (ssize_t i = 0; m->verifier != NULL && i < part.taken; i++) {
            ssize_t size = bytes - i * seg < seg ? bytes - i * seg : seg;
            uint64_t nonce = take_nonce(t, at + i * seg, size);
            if (nonce >= m->nonce_next)
                m->nonce_next = nonce < UINT64_MAX ? nonce + 1 : UINT64_MAX;
        }
        r->taken += part.taken;
        r->fresh += part.fresh;
        r->fresh_drop += part.fresh_drop;
        r->fresh_retx += part.fresh_retx;
        r->fresh_elems += part.fresh_elems;
        r->payload_bytes += part.payload_bytes;
        if (part.taken < k)
            return;
    }
}

/* Whether m's completion check is due (Reassembler.is_complete may be true). */
static inline int take_check_due(const TakenMessage *m) {
    return m->received_elems >= m->msg_elems ||
           (m->received_elems >= m->complete_elems &&
            m->received_protected >= m->complete_protected);
}

/* Handles the staged runs from the cursor on: takes what the registered messages
 * take, until a run needs Python. Returns TAKE_DONE, or the kind of handover with
 * its bytes in *handover (start, end and segment size in the receive buffer buf,
 * of buf_len bytes: the length it was staged with). */
static inline int take_next(TakeTable *t, unsigned char *buf, ssize_t buf_len, Run *handover) {
    const ssize_t hl = t->header_len;
    if (buf_len < t->staged_len) { /* (the wrapper passes the staged buffer again) */
        t->cursor = t->n_runs;
        return TAKE_DONE;
    }
    while (t->cursor < t->n_runs) {
        Run run = t->runs[t->cursor++];
        ssize_t len = run.end - run.start, seg = run.seg;
        TakenMessage *m = NULL;
        if (seg >= hl && len >= hl)
            m = take_message_of(t, buf + run.start);
        if (m == NULL) {
            *handover = run;
            return TAKE_WHOLE;
        }
        ssize_t n = (len - 1) / seg + 1;
        ScatterResult r;
        take_scatter(t, m, buf + run.start, len, n, seg, &r);
        if (r.taken == 0) {
            *handover = run;
            return TAKE_WHOLE;
        }
        ssize_t taken_bytes = r.taken == n ? len : r.taken * seg;
        m->datagrams += r.taken;
        m->nbytes += taken_bytes;
        m->fresh += r.fresh;
        m->fresh_elems += r.fresh_elems;
        m->fresh_drop += r.fresh_drop;
        m->fresh_retx += r.fresh_retx;
        m->payload_bytes += r.payload_bytes;
        if (m->bound < 0)
            m->bound = buf[run.start + t->head.bound];
        m->received_elems += r.fresh_elems;
        m->received_protected += r.fresh - r.fresh_drop;
        if (!m->reported) {
            m->reported = 1;
            t->touched[t->n_touched++] = m - t->slots;
        }
        if (r.taken < n) {
            *handover = (Run){run.start + taken_bytes, run.end, seg};
            return TAKE_REST;
        }
        if (r.fresh && take_check_due(m)) {
            *handover = (Run){run.end, run.end, seg};
            return TAKE_CHECK;
        }
    }
    return TAKE_DONE;
}

/* Hands the counts of each message taken into since the last call to
 * report(context, message), zeroing them, until report returns -1 (it could not
 * pass them on: those of that message and the ones after it stay for the next
 * call). Returns 0, or -1 if report did. */
static inline int take_report(TakeTable *t, int (*report)(void *, const TakenMessage *),
                              void *context) {
    ssize_t k = 0;
    for (; k < t->n_touched; k++) {
        TakenMessage *m = &t->slots[t->touched[k]];
        if (report(context, m) < 0)
            break;
        m->datagrams = m->nbytes = m->fresh = m->fresh_elems = 0;
        m->fresh_drop = m->fresh_retx = m->payload_bytes = 0;
        m->reported = 0;
    }
    ssize_t left = t->n_touched - k;
    if (left && k)
        memmove(t->touched, t->touched + k, sizeof *t->touched * (size_t)left);
    t->n_touched = left;
    return left ? -1 : 0;
}

#endif
