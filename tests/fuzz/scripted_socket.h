/*
 * The scripted socket of the receive-loop fuzz targets (fuzz_recv_runs.c,
 * fuzz_take_runs.c): recvmsg and recvmmsg replaced by functions that hand out
 * the events a libFuzzer input describes (plain datagrams, UDP GRO reads with a
 * segment size in ancillary data, malformed ancillary data, empty datagrams,
 * truncation to the read size, receive errors), logging what they handed out.
 * A target sets sock.fill to write a datagram's bytes (NULL: its index and a fill
 * byte of its own, so that each can be found) and includes the loop's header
 * after this one.
 */
#ifndef DLCP_FUZZ_SCRIPTED_SOCKET_H
#define DLCP_FUZZ_SCRIPTED_SOCKET_H

#define _GNU_SOURCE /* recvmmsg and struct mmsghdr, as Python.h gives the extension */
#include <errno.h>
#include <sys/socket.h>

#include "fuzz_input.h"

static ssize_t script_recvmsg(int fd, struct msghdr *msg, int flags);
static int script_recvmmsg(int fd, struct mmsghdr *vec, unsigned int vlen, int flags,
                           struct timespec *timeout);
#define recvmsg script_recvmsg
#define recvmmsg script_recvmmsg
#include "../../dlcp/io/_recv_runs.h"
#undef recvmsg
#undef recvmmsg

enum { PLAIN, GRO, ERROR, BAD_CONTROL, EMPTY };

typedef struct {
    int kind;
    ssize_t len;
    int32_t value;
} Event;

#define MAX_EVENTS 8192

/* The scripted socket: the events still to hand out, and a log of what was. */
static struct {
    Event events[MAX_EVENTS];
    size_t n, next;
    /* the reads handed out: length, effective segment size, first byte in `sent` */
    ssize_t read_len[MAX_EVENTS], read_seg[MAX_EVENTS];
    size_t reads;
    uint8_t *sent; /* every byte handed out, back to back */
    size_t sent_len, sent_cap;
    int error_seen;  /* the errno of an error handed out (0 if none or EAGAIN/EINTR) */
    int last_failed; /* the last call returned -1 (an error, or nothing to read) */
    /* writes the n bytes event `index` hands out (NULL: its index and a fill byte) */
    void (*fill)(size_t index, const Event *e, uint8_t *dst, ssize_t n);
} sock;

static uint8_t pattern(size_t event) { return (uint8_t)(event * 131 + 3); }

/* One datagram or GRO read into msg (truncated to its buffer), as the kernel does. */
static ssize_t hand_out(struct msghdr *msg) {
    Event *e = &sock.events[sock.next];
    size_t index = sock.next++;
    ssize_t room = (ssize_t)msg->msg_iov[0].iov_len;
    ssize_t n = e->len < room ? e->len : room;
    uint8_t *dst = msg->msg_iov[0].iov_base;
    if (sock.fill != NULL) {
        sock.fill(index, e, dst, n);
    } else {
        if (n) /* its index, then a fill byte of its own */
            memset(dst, pattern(index), (size_t)n);
        for (ssize_t k = 0; k < n && k < 2; k++)
            dst[k] = (uint8_t)(index >> (8 * k));
    }
    msg->msg_flags = e->len > room ? MSG_TRUNC : 0;
    size_t control = msg->msg_controllen;
    msg->msg_controllen = 0;
    ssize_t seg = n;
    if ((e->kind == GRO || e->kind == BAD_CONTROL) && control >= CMSG_SPACE(sizeof(int))) {
        struct cmsghdr *c = (struct cmsghdr *)msg->msg_control;
        c->cmsg_level = SOL_UDP;
        c->cmsg_type = UDP_GRO;
        c->cmsg_len = e->kind == GRO ? CMSG_LEN(sizeof(int)) : CMSG_LEN(2);
        int gso = e->value;
        memcpy(CMSG_DATA(c), &gso, e->kind == GRO ? sizeof gso : 2);
        msg->msg_controllen = CMSG_SPACE(sizeof(int));
        if (e->kind == GRO && gso > 0)
            seg = gso;
    }
    if (sock.sent_len + (size_t)n > sock.sent_cap) {
        sock.sent_cap = 2 * (sock.sent_len + (size_t)n);
        sock.sent = realloc(sock.sent, sock.sent_cap);
        if (sock.sent == NULL)
            abort();
    }
    if (n) {
        memcpy(sock.sent + sock.sent_len, dst, (size_t)n);
        sock.sent_len += (size_t)n;
    }
    sock.read_len[sock.reads] = n;
    sock.read_seg[sock.reads++] = seg;
    return n;
}

/* Takes an error event off the queue: -1 with its errno. */
static int fail_with(void) {
    int err = sock.events[sock.next++].value;
    sock.last_failed = 1;
    if (err != EAGAIN && err != EWOULDBLOCK && err != EINTR)
        sock.error_seen = err;
    errno = err;
    return -1;
}

static ssize_t script_recvmsg(int fd, struct msghdr *msg, int flags) {
    (void)fd;
    EXPECT(flags & MSG_DONTWAIT, "a blocking read");
    if (sock.next == sock.n) {
        sock.last_failed = 1;
        errno = EAGAIN;
        return -1;
    }
    if (sock.events[sock.next].kind == ERROR)
        return fail_with();
    sock.last_failed = 0;
    return hand_out(msg);
}

static int script_recvmmsg(int fd, struct mmsghdr *vec, unsigned int vlen, int flags,
                           struct timespec *timeout) {
    (void)fd;
    EXPECT(flags & MSG_DONTWAIT, "a blocking read");
    EXPECT(timeout == NULL, "a timeout");
    unsigned int i = 0;
    for (; i < vlen && sock.next < sock.n; i++) {
        if (sock.events[sock.next].kind == ERROR) {
            if (i == 0)
                return fail_with();
            break; /* reported by the next call, as the kernel does */
        }
        vec[i].msg_len = (unsigned int)hand_out(&vec[i].msg_hdr);
    }
    if (i == 0) {
        sock.last_failed = 1;
        errno = EAGAIN;
        return -1;
    }
    sock.last_failed = 0;
    return (int)i;
}

#endif
