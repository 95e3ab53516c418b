/*
 * The control connections the native engine writes on besides Python: a round's
 * FINISH goes from the send thread that sent the round's last batch, and every
 * other control frame to the same rank from Python (dlcp.io.control), both through
 * one ControlConn a rank. Its mutex is held for a whole frame, so frames never
 * interleave however a write is cut; a write that fails or times out leaves the
 * connection's stream in doubt, so none follows it on this connection (`err`),
 * and Python's next write on it raises that error, which drops the connection
 * (a reset one is opened again).
 *
 * Python's side keeps the connections: it adopts one (its descriptor) once the
 * hello went, and releases it before closing it; a release waits for a write in
 * progress. Nothing here reads.
 */
#ifndef DLCP_CONTROL_WRITES_H
#define DLCP_CONTROL_WRITES_H

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <time.h>

typedef struct {
    pthread_mutex_t lock; /* held for a whole frame */
    int fd;               /* -1: none adopted (Python writes alone) */
    int err;              /* errno of a failed write: none follows on this connection */
} ControlConn;

static double control_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Whether a frame may go on c now, as a send thread judges it before it takes c's
   lock (a release meanwhile is seen under the lock: control_write_locked). */
static int control_usable(ControlConn *c) {
    return c != NULL && __atomic_load_n(&c->fd, __ATOMIC_ACQUIRE) >= 0 &&
           __atomic_load_n(&c->err, __ATOMIC_ACQUIRE) == 0;
}

/* The rest of a frame, data[*done..len), onto non-blocking stream fd: one send,
 * then (if the socket buffer is full) waits for room, at most until `deadline`
 * (CLOCK_MONOTONIC seconds; a deadline passed ends with ETIMEDOUT). 0 when it all
 * went, else errno; *done counts what went either way. */
static int control_write_rest(int fd, const uint8_t *data, size_t len, size_t *done,
                              double deadline) {
    while (*done < len) {
        ssize_t n = send(fd, data + *done, len - *done, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
            *done += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return errno;
        double left = deadline - control_clock();
        if (left <= 0)
            return ETIMEDOUT;
        struct pollfd p = {.fd = fd, .events = POLLOUT, .revents = 0};
        int ms = left >= 2e6 ? 2000000000 : (int)ceil(left * 1e3);
        if (poll(&p, 1, ms) < 0 && errno != EINTR)
            return errno;
    }
    return 0;
}

/* A whole frame onto c, whose lock the caller holds: 0 when it went; else the
 * error that stops it (the connection's own, or this write's, which becomes the
 * connection's). ENOTCONN where nothing is adopted. */
static int control_write_locked(ControlConn *c, const uint8_t *data, size_t len,
                                double timeout) {
    if (c->fd < 0)
        return ENOTCONN;
    if (c->err)
        return c->err;
    size_t done = 0;
    int err = control_write_rest(c->fd, data, len, &done, control_clock() + timeout);
    if (err)
        __atomic_store_n(&c->err, err, __ATOMIC_RELEASE);
    return err;
}

#endif
