/*
 * The receive loop's linger: after the data socket ran dry, wait a little for
 * more data in C instead of returning to Python, as long as nothing else is
 * ready (MessageTable.receive in _udpio.c).
 *
 * Why: a message's datagrams arrive in bursts a few tens of microseconds apart
 * (the sender's batches). Each time the socket runs dry the I/O thread returns
 * to Python for a whole turn (apply the counts, settle, wait in select), which
 * costs far more CPU than the gap it covers. Waiting for the next burst here
 * makes one turn of several.
 *
 * What ends the wait: data on the socket (the loop reads it), the end of the
 * linger (the caller gives the earlier of its bound and the I/O thread's next
 * deadline), or any other file of the I/O thread's turning readable (the epoll
 * set of those files, dlcp.io.readiness.ReadSelector.others_fileno):
 * a control message, the native engine's reports, a caller's wake-up. So the
 * linger never holds back what the turn would have handled, only the Python
 * turn that would have found nothing else to do.
 *
 * What ends the lingering: a wait after which less than LINGER_MIN_BURST bytes
 * came before the socket ran dry again (a trickle). Data that trickles in
 * (datagrams one by one: offloads off, a slow link) would wake a thread waiting
 * on the socket for each datagram or two, and each wake-up costs the sender's
 * enqueue too (measured: the DDP job under 1 % loss with offloads off took 4-7 %
 * longer with a linger that kept waiting on the socket).
 *
 * Unless the caller gives a nap: then a trickle is taken in naps (linger_nap),
 * the thread asleep off the socket's wait queue, so that no datagram wakes it;
 * after each nap it takes what came, until the trickle's own end (later than
 * the linger's: the caller's next deadline or a few milliseconds) or until
 * another file is ready. Without naps, a receiver on a slow link (50 Mbit/s:
 * a datagram every 230 us) ran a Python turn for every datagram or two, about
 * 100 us of CPU each.
 */
#ifndef DLCP_LINGER_H
#define DLCP_LINGER_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* (ppoll; Python.h defines it first where it is included) */
#endif
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <time.h>

/* Bytes that must come after a wait for the loop to wait again: half a full
 * GSO or GRO message at MTU 1500 (45 datagrams, 64 KB). */
#define LINGER_MIN_BURST (32 << 10)

/* A trickle is taken in naps only while the receive call's data came slower than
 * this (bytes per second, about 1 Gbit/s): a slow link's trickle. A fast flow
 * whose wait brought little (its next burst had only begun) ends the linger as
 * before: napping there cost a lossless 64 MiB transfer 5-17 % of its throughput. */
#define LINGER_NAP_MAX_RATE (128LL << 20)

/* (CLOCK_MONOTONIC in nanoseconds: the clock of time.monotonic) */
static inline int64_t linger_clock_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Whether `bytes` read since since_ns (a receive call's start) came slower than
 * LINGER_NAP_MAX_RATE. */
static inline int linger_slow(int64_t bytes, int64_t since_ns) {
    int64_t elapsed = linger_clock_ns() - since_ns;
    return elapsed > 0 && (double)bytes * 1e9 < (double)LINGER_NAP_MAX_RATE * (double)elapsed;
}

/* What the linger may handle itself of a ready file: absorb(ctx, fd) is 1 when
 * it took all that was ready on fd (then the file does not end the linger), 0
 * when the file is Python's (MessageTable's control connections: RATE reports
 * and STOPs, _control_frames.h). What it took may need Python by a time: the
 * linger ends by *due_ns (NULL: never). */
typedef struct {
    int (*absorb)(void *ctx, int fd);
    void *ctx;
    const int64_t *due_ns;
} LingerAbsorb;

/* end_ns, or earlier if what absorb took is due sooner. */
static inline int64_t linger_end_by(const LingerAbsorb *absorb, int64_t end_ns) {
    if (absorb == NULL || absorb->due_ns == NULL)
        return end_ns;
    int64_t due = __atomic_load_n(absorb->due_ns, __ATOMIC_RELAXED); /* (Python's turn clears it) */
    return due < end_ns ? due : end_ns;
}

/* Whether a file other than data_fd is ready in the epoll set epfd (which may
 * hold data_fd too: CPython's select.epoll keeps each file's descriptor as its
 * event data) that `absorb` (NULL: none) did not take. A full event array counts
 * as "yes": it may hide others. *data_ready (NULL: not asked) says whether data_fd
 * was among the files ready. */
static inline int linger_others_ready(int epfd, int data_fd, const LingerAbsorb *absorb,
                                      int *data_ready) {
    struct epoll_event events[8];
    int n = epoll_wait(epfd, events, 8, 0);
    if (n < 0)
        return errno != EINTR; /* (a bad set ends the linger: Python's turn will say why) */
    if (n == 8)
        return 1;
    for (int i = 0; i < n; i++) {
        if (events[i].data.fd == data_fd) {
            if (data_ready != NULL)
                *data_ready = 1;
        } else if (!(absorb != NULL && absorb->absorb(absorb->ctx, events[i].data.fd))) {
            return 1;
        }
    }
    return 0;
}

/* Waits until data_fd is readable (returns 1) or until end_ns on the monotonic
 * clock, or a file of epfd other than data_fd is ready that absorb did not take
 * (returns 0; epfd < 0: none is watched). Adds the time spent blocked to *idle_ns. */
static inline int linger_for_data(int data_fd, int epfd, const LingerAbsorb *absorb,
                                  int64_t end_ns, int64_t *idle_ns) {
    for (;;) {
        int64_t now = linger_clock_ns(), end = linger_end_by(absorb, end_ns);
        if (now >= end)
            return 0;
        struct pollfd fds[2] = {{data_fd, POLLIN, 0}, {epfd, POLLIN, 0}};
        int64_t left = end - now;
        struct timespec ts = {(time_t)(left / 1000000000LL), (long)(left % 1000000000LL)};
        int n = ppoll(fds, epfd >= 0 ? 2 : 1, &ts, NULL);
        *idle_ns += linger_clock_ns() - now;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return 0;
        }
        if (n == 0)
            return 0;
        if (epfd >= 0 && (fds[1].revents & POLLIN) &&
            linger_others_ready(epfd, data_fd, absorb, NULL))
            return 0;
        if (fds[0].revents & (POLLERR | POLLNVAL | POLLHUP))
            return 0; /* (the read that follows would not block: let the turn see it) */
        if (fds[0].revents & POLLIN)
            return 1;
    }
}

/* Sleeps nap_ns (at most until end_ns), off the data socket's wait queue, for
 * a receive that is taking data in a trickle: 1 to go on reading, 0 at the
 * linger's end or when a file of epfd other than data_fd is ready (and absorb did
 * not take it), which ends the nap at once if epfd does not hold data_fd (the I/O
 * thread's set of its other files; one that holds it wakes the nap whenever data
 * is queued: then it sleeps on to the nap's end). After frames absorb took, the
 * nap goes on watching epfd until its end, which those frames may bring closer
 * (a STOP kept for Python: LingerAbsorb's due_ns). Adds the time slept to *idle_ns. */
static inline int linger_nap(int data_fd, int epfd, const LingerAbsorb *absorb, int64_t end_ns,
                             int64_t nap_ns, int64_t *idle_ns) {
    int64_t now = linger_clock_ns();
    if (now >= linger_end_by(absorb, end_ns))
        return 0;
    for (int64_t t = now;; t = linger_clock_ns()) {
        int64_t end = linger_end_by(absorb, end_ns);
        int64_t until = end - now < nap_ns ? end : now + nap_ns;
        if (t >= until)
            break;
        int64_t left = until - t;
        struct timespec ts = {(time_t)(left / 1000000000LL), (long)(left % 1000000000LL)};
        struct pollfd fd = {epfd, POLLIN, 0};
        int n = ppoll(&fd, epfd >= 0 ? 1 : 0, &ts, NULL); /* (no epfd: a plain sleep) */
        int data_ready = 0;
        if (n > 0 && linger_others_ready(epfd, data_fd, absorb, &data_ready)) {
            *idle_ns += linger_clock_ns() - now;
            return 0;
        }
        if (data_ready) { /* (data_fd in epfd: sleep out the nap without polling) */
            end = linger_end_by(absorb, end_ns);
            until = end < until ? end : until;
            struct timespec at = {(time_t)(until / 1000000000LL), (long)(until % 1000000000LL)};
            while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL) == EINTR)
                ;
        }
        if (n < 0 && errno != EINTR)
            break;
    }
    *idle_ns += linger_clock_ns() - now;
    return 1;
}

#endif
