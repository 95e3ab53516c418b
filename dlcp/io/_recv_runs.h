/*
 * The receive loop of dlcp.io._udpio's recv_runs without Python: reads datagrams
 * from a non-blocking UDP socket into one buffer and groups them into runs of
 * same-size datagrams (see _udpio.c for the contract). _udpio.c calls it without
 * the GIL; tests/fuzz/ calls it under libFuzzer with the two receive calls
 * (recvmsg, recvmmsg) replaced by a scripted socket.
 */
#ifndef DLCP_RECV_RUNS_H
#define DLCP_RECV_RUNS_H

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>

#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

#define MAX_RUNS 4096
#define MMSG_BATCH 64
#define MMSG_SMALL 9216

typedef struct {
    ssize_t start, end, seg;
} Run;

/* Where the reads of recv_runs stand: buf filled up to `fill`, the open run
 * starting at `start` with datagrams of `seg_size`. */
typedef struct {
    Run *runs;
    ssize_t n_runs, fill, start, seg_size;
} Runs;

/* The UDP_GRO segment size of a received message, or n (one plain datagram). */
static inline ssize_t gro_segment(struct msghdr *msg, ssize_t n) {
    ssize_t seg = n;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c != NULL; c = CMSG_NXTHDR(msg, c)) {
        if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO &&
            c->cmsg_len >= CMSG_LEN(sizeof(int))) {
            int gso;
            memcpy(&gso, CMSG_DATA(c), sizeof gso);
            seg = gso;
        }
    }
    return seg <= 0 ? n : seg;
}

/* Account n bytes (segment size seg) just placed at r->fill. */
static inline void add_read(Runs *r, ssize_t n, ssize_t seg) {
    if (r->fill > r->start && seg != r->seg_size) { /* a different size starts a new run */
        r->runs[r->n_runs++] = (Run){r->start, r->fill, r->seg_size};
        r->start = r->fill;
    }
    r->seg_size = seg;
    r->fill += n;
    if (n % seg) { /* short last datagram: the run cannot continue after it */
        r->runs[r->n_runs++] = (Run){r->start, r->fill, r->seg_size};
        r->start = r->fill;
    }
}

typedef union {
    char space[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
} GroControl;

/* What one recv_runs call read: the runs' count (in the caller's array of
 * MAX_RUNS), bytes, reads, empty datagrams, whether it stopped on a full buffer,
 * and a receive error other than EAGAIN/EINTR (0 if none). */
typedef struct {
    ssize_t n_runs, total, reads, empty;
    int more, err;
} RecvRuns;

/* The scratch space of one call: MMSG_BATCH message headers, iovecs and control
 * buffers. */
typedef struct {
    struct mmsghdr mm[MMSG_BATCH];
    struct iovec iovs[MMSG_BATCH];
    GroControl ctl[MMSG_BATCH];
} RecvScratch;

/* Reads from fd into buf (len bytes) as recv_runs does; runs holds MAX_RUNS. */
static inline void recv_runs_loop(int fd, char *buf, ssize_t len, ssize_t budget, ssize_t max_reads,
                           ssize_t read_size, Run *runs, RecvScratch *scratch, RecvRuns *out) {
    Runs r = {runs, 0, 0, 0, 0};
    ssize_t total = 0, reads = 0, empty = 0;
    int more = 0, err = 0, batched = 0;
    struct mmsghdr *mm = scratch->mm;
    struct iovec *iovs = scratch->iovs;
    GroControl *ctl = scratch->ctl;
    while (total < budget && reads < max_reads) {
        if (len - r.fill < read_size || r.n_runs >= MAX_RUNS - 2) {
            more = 1;
            break;
        }
        /* datagrams this call may take: buffer slots, reads, runs (two per datagram
         * at most) and one more than the budget needs */
        ssize_t k = batched ? (len - r.fill) / read_size : 1;
        if (k > MMSG_BATCH)
            k = MMSG_BATCH;
        if (k > max_reads - reads)
            k = max_reads - reads;
        if (k > (MAX_RUNS - 2 - r.n_runs) / 2)
            k = (MAX_RUNS - 2 - r.n_runs) / 2;
        if (k < 1)
            k = 1;
        memset(mm, 0, sizeof(struct mmsghdr) * (size_t)k);
        for (ssize_t i = 0; i < k; i++) {
            iovs[i] = (struct iovec){buf + r.fill + i * read_size, (size_t)read_size};
            mm[i].msg_hdr.msg_iov = &iovs[i];
            mm[i].msg_hdr.msg_iovlen = 1;
            mm[i].msg_hdr.msg_control = ctl[i].space;
            mm[i].msg_hdr.msg_controllen = sizeof ctl[i].space;
        }
        int got;
        if (k == 1) {
            ssize_t n = recvmsg(fd, &mm[0].msg_hdr, MSG_DONTWAIT);
            got = n < 0 ? -1 : 1;
            if (n >= 0)
                mm[0].msg_len = (unsigned int)n;
        } else {
            got = recvmmsg(fd, mm, (unsigned int)k, MSG_DONTWAIT, NULL);
        }
        if (got < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                err = errno;
            break;
        }
        ssize_t base = r.fill;
        for (int i = 0; i < got; i++) {
            ssize_t n = (ssize_t)mm[i].msg_len;
            reads++;
            total += n;
            if (n == 0) { /* an empty datagram carries nothing; the session never sees it */
                empty++;
                continue;
            }
            ssize_t seg = gro_segment(&mm[i].msg_hdr, n);
            char *at = buf + base + i * read_size;
            if (at != buf + r.fill)
                memmove(buf + r.fill, at, (size_t)n); /* down to the end of the data */
            add_read(&r, n, seg);
            batched = seg == n && n <= MMSG_SMALL;
        }
        if (got < k) /* drained */
            break;
    }
    if (r.fill > r.start)
        r.runs[r.n_runs++] = (Run){r.start, r.fill, r.seg_size};
    *out = (RecvRuns){r.n_runs, total, reads, empty, more, err};
}

#endif
