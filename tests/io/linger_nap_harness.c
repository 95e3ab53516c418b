/*
 * A trickle's nap (linger_nap in dlcp/io/_linger.h) with the I/O thread's other
 * files in an epoll set, driven without sleeps: a control frame the wait takes
 * itself (absorb), then a file it must hand to Python (a caller's wake-up).
 *
 *   wake: the frame is absorbed first, then the wake-up comes; the nap must end
 *         at the wake-up (0), not sleep out its 5 s (then 1).
 *   due:  the absorbed frame is a STOP kept for Python, due at once; the nap must
 *         end then (1, well before its 5 s).
 *
 * Prints "returned R after MS ms". Built and run by tests/io/test_linger_nap.py.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "_linger.h"

#define NAP_NS 5000000000LL

static int frame_pipe[2], wake_pipe[2], absorbed_pipe[2];
static int64_t due = INT64_MAX;
static int keep_stop;

/* takes the frame, says so to the writer, and (a kept STOP) sets when it is due */
static int absorb_frame(void *ctx, int fd) {
    (void)ctx;
    char c;
    if (fd != frame_pipe[0] || read(fd, &c, 1) != 1)
        return 0;
    if (keep_stop)
        __atomic_store_n(&due, linger_clock_ns(), __ATOMIC_RELAXED);
    if (write(absorbed_pipe[1], "a", 1) != 1)
        return 0;
    return 1;
}

static void *writer(void *arg) {
    (void)arg;
    char c;
    if (write(frame_pipe[1], "f", 1) != 1 || read(absorbed_pipe[0], &c, 1) != 1)
        return NULL;
    if (!keep_stop && write(wake_pipe[1], "w", 1) != 1)
        return NULL;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2 || (strcmp(argv[1], "wake") != 0 && strcmp(argv[1], "due") != 0)) {
        fprintf(stderr, "usage: %s wake|due\n", argv[0]);
        return 2;
    }
    keep_stop = strcmp(argv[1], "due") == 0;
    int data[2]; /* the data socket: nothing comes on it */
    if (pipe(frame_pipe) || pipe(wake_pipe) || pipe(absorbed_pipe) || pipe(data))
        return 2;
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN};
    ev.data.fd = frame_pipe[0];
    epoll_ctl(ep, EPOLL_CTL_ADD, frame_pipe[0], &ev);
    ev.data.fd = wake_pipe[0];
    epoll_ctl(ep, EPOLL_CTL_ADD, wake_pipe[0], &ev);
    LingerAbsorb absorb = {absorb_frame, NULL, &due};
    pthread_t t;
    pthread_create(&t, NULL, writer, NULL);
    int64_t idle = 0, start = linger_clock_ns();
    int r = linger_nap(data[0], ep, &absorb, start + 2 * NAP_NS, NAP_NS, &idle);
    printf("returned %d after %.3f ms\n", r, (double)(linger_clock_ns() - start) / 1e6);
    pthread_join(t, NULL);
    return 0;
}
