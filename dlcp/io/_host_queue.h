/*
 * The host's queue of the native engine's datagrams (docs/engine.md, "The host's
 * queue"): what the qdisc in front of the NIC, or the device's ring, still holds of
 * what the data sockets sent, read with SIOCOUTQ (bytes as the kernel charges them,
 * each datagram with its buffer's overhead, from the send until the host lets it go).
 *
 * A pacer may run above the host link's rate (a receiver's claim, a message that
 * starts at initial_rate after an idle spell). What the engine then writes waits in
 * that queue, and everything the host sends after it waits behind it: the engine's
 * retransmissions and the rank's control messages (a NACK, a FINISH), which on a
 * slow link then take tens of milliseconds to leave. So the engine holds its batches
 * while the queue holds more than a limit:
 *
 *   - until it knows the link: four of the pacer's bursts, at least
 *     HOST_QUEUE_MIN_LIMIT;
 *   - once it has seen the queue drain: HOST_QUEUE_TIME of what it drains, at least
 *     HOST_QUEUE_FLOOR (and never more than the first rule's).
 *
 * The drain is measured between two reads of a queue that stayed backlogged while
 * the engine claimed nothing (it was holding its batches): what left over the time
 * between them is the link's rate, as charged; a queue found empty after such a
 * wait drained at least what it held, which raises a lower estimate. Once measured,
 * a batch claims about the room left under the limit (in its datagrams' bytes), and
 * a held batch waits until half the limit is left, not for each datagram's room.
 * The engine calls host_queue_hold, then host_queue_batch, under its lock when it
 * plans a batch, and host_queue_claim when it sends one. A queue that held anything is read
 * before every batch, an empty one once half the limit was claimed since (a
 * loopback or a veth lets a datagram go as it passes it on: there it stays empty,
 * and the first rule stands).
 */
#ifndef DLCP_HOST_QUEUE_H
#define DLCP_HOST_QUEUE_H

#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/types.h>

#define HOST_QUEUE_MIN_LIMIT (64.0 * 1024.0)
#define HOST_QUEUE_TIME 0.002
#define HOST_QUEUE_FLOOR (16.0 * 1024.0)
/* (a drain measured over less than this is too coarse to keep) */
#define HOST_QUEUE_MIN_INTERVAL 1e-4
/* the weight of each new drain measurement in the running estimate */
#define HOST_QUEUE_DRAIN_GAIN 0.25

typedef struct {
    int limited;   /* on (EndpointConfig.host_queue_limit) or off */
    double seen;   /* what it held when last read */
    double unread; /* bytes claimed since then */
    double read_t; /* when it was last read */
    double drain;  /* bytes a second it drains while backlogged; 0: not measured yet */
} HostQueue;

/* What the sockets fds still hold in the host. */
static inline double host_queue_read(const int *fds, int n_fds) {
    double sum = 0;
    for (int i = 0; i < n_fds; i++) {
        int v = 0;
        if (ioctl(fds[i], SIOCOUTQ, &v) == 0 && v > 0)
            sum += v;
    }
    return sum;
}

/* How much the queue may hold before the engine holds its batches. */
static inline double host_queue_limit(const HostQueue *q, double burst) {
    double limit = 4.0 * burst;
    if (limit < HOST_QUEUE_MIN_LIMIT)
        limit = HOST_QUEUE_MIN_LIMIT;
    if (q->drain > 0) {
        double timed = q->drain * HOST_QUEUE_TIME;
        if (timed < HOST_QUEUE_FLOOR)
            timed = HOST_QUEUE_FLOOR;
        if (timed < limit)
            limit = timed;
    }
    return limit;
}

/* Reads the queue if it is due (it held anything when last read, or half the limit
   was claimed since), and learns its drain from the read: a queue that stayed
   backlogged while nothing was claimed drained (before - now) over the time
   between; one found empty drained at least all it held then, which raises an
   estimate that was lower (a wait planned on too low a drain outlasts the queue,
   and an empty queue gives no other sample). Then whether the queue is too full for
   another batch (1), with *wake lowered to when enough of it should have left, or
   not (0). `rate`: the pacer's, what the wait assumes until the drain is known. */
static inline int host_queue_hold(HostQueue *q, const int *fds, int n_fds, double burst,
                                  double rate, double now, double *wake) {
    if (!q->limited)
        return 0;
    double limit = host_queue_limit(q, burst);
    if (q->seen > 0 || q->unread >= limit / 2) {
        double seen = host_queue_read(fds, n_fds);
        double dt = now - q->read_t;
        if (q->unread == 0 && q->seen > seen && dt >= HOST_QUEUE_MIN_INTERVAL) {
            double d = (q->seen - seen) / dt;
            if (seen > 0) /* (all of it left while it stayed backlogged) */
                q->drain = q->drain > 0 ? q->drain + HOST_QUEUE_DRAIN_GAIN * (d - q->drain) : d;
            else if (q->drain > 0 && d > q->drain) /* (at least this left) */
                q->drain = d;
            limit = host_queue_limit(q, burst);
        }
        q->seen = seen;
        q->read_t = now;
        q->unread = 0;
    }
    if (q->seen <= limit)
        return 0;
    double wait = q->drain > 0 ? (q->seen - limit / 2) / q->drain : (q->seen - limit) / rate;
    /* (not measured yet: the next read comes late enough to measure it) */
    double least = q->drain > 0 ? 5e-5 : HOST_QUEUE_MIN_INTERVAL;
    double t = now + (wait > least ? wait : least);
    if (t < *wake)
        *wake = t;
    return 1;
}

/* The most records of `stride` bytes the next batch may claim (at least one, at most
   `most`), once the drain is known: the room left under the limit at the read
   host_queue_hold just made, in the records' own bytes (the kernel charges each
   datagram more: the queue may pass the limit by that much). */
static inline ssize_t host_queue_batch(const HostQueue *q, double burst, ssize_t stride,
                                       ssize_t most) {
    if (!q->limited || q->drain <= 0 || stride <= 0)
        return most;
    double room = host_queue_limit(q, burst) - q->seen - q->unread;
    ssize_t n = room > 0 ? (ssize_t)(room / (double)stride) : 0;
    if (n < 1)
        n = 1;
    return n < most ? n : most;
}

/* A batch of nbytes went into the queue (counted where it is sent, so a batch
   planned but not sent is not). */
static inline void host_queue_claim(HostQueue *q, double nbytes) {
    q->unread += nbytes;
}

#endif
