/*
 * Sending a run of equal-size datagrams with sendmmsg and UDP GSO: shared by
 * dlcp.io._udpio (send_batch, the Python engine) and dlcp.io._engine (the
 * native engine's thread). Call without the GIL; no Python API here.
 */
#ifndef DLCP_SENDMMSG_H
#define DLCP_SENDMMSG_H

#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>

#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif

/* messages per sendmmsg call */
#define SEND_BATCH 256

/* A send of at most this many bytes keeps the GIL (_udpio's send_batch, the
   engine's post(), rule 7): its system call takes microseconds, and a thread that
   lets the GIL go for it waits for it again behind whichever thread took it (on a
   busy core, that thread's whole turn) */
#define SEND_WITH_GIL_BYTES 65536

/* The ancillary data of a send: TOS and segment size for a message of several
 * datagrams, TOS alone for a message of one. */
typedef struct {
    union {
        char space[CMSG_SPACE(sizeof(int)) + CMSG_SPACE(sizeof(uint16_t))];
        struct cmsghdr align;
    } both, tos_only;
} Controls;

static void controls_init(Controls *cm, int tos, ssize_t seg) {
    memset(cm, 0, sizeof *cm);
    struct msghdr proto;
    memset(&proto, 0, sizeof proto);
    proto.msg_control = cm->both.space;
    proto.msg_controllen = sizeof cm->both.space;
    struct cmsghdr *c = CMSG_FIRSTHDR(&proto);
    c->cmsg_level = IPPROTO_IP;
    c->cmsg_type = IP_TOS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &tos, sizeof tos);
    c = CMSG_NXTHDR(&proto, c);
    c->cmsg_level = SOL_UDP;
    c->cmsg_type = UDP_SEGMENT;
    c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
    uint16_t seg16 = (uint16_t)seg;
    memcpy(CMSG_DATA(c), &seg16, sizeof seg16);
    c = (struct cmsghdr *)cm->tos_only.space;
    c->cmsg_level = IPPROTO_IP;
    c->cmsg_type = IP_TOS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &tos, sizeof tos);
}

/* Message m to `addr` over iovecs [iov, iov + iovlen), with the ancillary data of
 * a GSO message of several datagrams (`gso`) or of a plain datagram. */
static inline void message_init(struct mmsghdr *m, const struct sockaddr_in *addr,
                                struct iovec *iov, size_t iovlen, Controls *cm, int gso) {
    memset(m, 0, sizeof *m);
    m->msg_hdr.msg_name = (void *)addr;
    m->msg_hdr.msg_namelen = sizeof *addr;
    m->msg_hdr.msg_iov = iov;
    m->msg_hdr.msg_iovlen = iovlen;
    if (gso) {
        m->msg_hdr.msg_control = cm->both.space; /* read-only for the kernel */
        m->msg_hdr.msg_controllen = sizeof cm->both.space;
    } else {
        m->msg_hdr.msg_control = cm->tos_only.space;
        m->msg_hdr.msg_controllen = CMSG_SPACE(sizeof(int));
    }
}

/*
 * ENOBUFS from sendmmsg: the host's own egress queue (a qdisc) was full and
 * dropped the batch's first message; the kernel says so only to a socket with
 * IP_RECVERR (without it the drop is silent, counted in SndbufErrors). Either
 * way it is a lost packet, as one the network drops, not a refused send: the
 * senders below count the message as gone and go on with the next one, and the
 * receiver asks for what it misses as for any loss.
 */
static inline int host_queue_dropped(int err) { return err == ENOBUFS; }

/*
 * Sends the `len` bytes at `buf` to `addr` as datagrams of `seg` bytes (the last
 * may be shorter), `per_message` datagrams per message: more than one goes as one
 * UDP GSO message (UDP_SEGMENT ancillary data), one as a plain datagram; every
 * message with IP_TOS `tos`; up to SEND_BATCH messages per sendmmsg call. Retries
 * on EINTR; a message the host's queue dropped (ENOBUFS) is skipped. Returns 0 or
 * the errno of the call that failed; *sent counts the datagrams sent (before a
 * failure too; not those dropped) and *calls the sendmmsg calls.
 * The caller checks 0 < seg, 0 < per_message <= 65535 / seg.
 */
static int send_datagrams(int fd, const struct sockaddr_in *addr, const char *buf, ssize_t len,
                          ssize_t seg, ssize_t per_message, int tos, ssize_t *sent,
                          unsigned long long *calls) {
    Controls cm;
    controls_init(&cm, tos, seg);
    ssize_t step = seg * per_message, at = 0;
    struct mmsghdr msgs[SEND_BATCH];
    struct iovec iov[SEND_BATCH];
    *sent = 0;
    while (at < len) {
        int k = 0;
        for (ssize_t pos = at; k < SEND_BATCH && pos < len; k++) {
            ssize_t n = len - pos < step ? len - pos : step;
            iov[k].iov_base = (char *)buf + pos;
            iov[k].iov_len = (size_t)n;
            message_init(&msgs[k], addr, &iov[k], 1, &cm, n > seg);
            pos += n;
        }
        int r = sendmmsg(fd, msgs, (unsigned)k, 0);
        (*calls)++;
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (!host_queue_dropped(errno))
                return errno;
            at += (ssize_t)iov[0].iov_len; /* the first message is lost */
            continue;
        }
        for (int i = 0; i < r; i++) {
            at += (ssize_t)iov[i].iov_len;
            *sent += ((ssize_t)iov[i].iov_len + seg - 1) / seg;
        }
    }
    return 0;
}

/*
 * As send_datagrams, but each datagram is gathered from two or three places (no
 * copy into a send buffer): datagram i of the n is the first head - trailer bytes
 * of its record (`head` bytes at heads + i * head), then chunk seqs[i] of
 * `payload`: `chunk` bytes from seqs[i] * chunk, or `short_plen` for datagram
 * `short_at` (the run's last; -1: none), then, when `trailer` > 0, the record's
 * last `trailer` bytes (an authentication trailer: 0 <= trailer < head). `seg` is
 * head + chunk. GSO messages of `per_message` datagrams, two or three iovecs a
 * datagram; a message the host's queue dropped is skipped, and *sent does not
 * count its datagrams. The caller checked that every chunk lies within the payload.
 */
static inline int send_gathered(int fd, const struct sockaddr_in *addr, const char *heads,
                                ssize_t head, ssize_t trailer, const char *payload,
                                const int64_t *seqs, ssize_t chunk, ssize_t n, ssize_t short_at,
                                ssize_t short_plen, ssize_t per_message, int tos, ssize_t *sent,
                                unsigned long long *calls) {
    enum { GATHER_BATCH = 16, GATHER_PER_MESSAGE = 64 };
    Controls cm;
    controls_init(&cm, tos, head + chunk);
    struct mmsghdr msgs[GATHER_BATCH];
    struct iovec iov[GATHER_BATCH * 3 * GATHER_PER_MESSAGE];
    const size_t parts = trailer > 0 ? 3 : 2, front = (size_t)(head - trailer);
    ssize_t done = 0; /* datagrams sent or dropped by the host's queue */
    *sent = 0;
    if (per_message > GATHER_PER_MESSAGE)
        per_message = GATHER_PER_MESSAGE;
    while (done < n) {
        int k = 0;
        size_t v = 0;
        for (ssize_t pos = done; k < GATHER_BATCH && pos < n; k++) {
            ssize_t count = n - pos < per_message ? n - pos : per_message;
            message_init(&msgs[k], addr, &iov[v], parts * (size_t)count, &cm, count > 1);
            for (ssize_t i = pos; i < pos + count; i++) {
                char *record = (char *)heads + i * head;
                iov[v++] = (struct iovec){record, front};
                iov[v++] = (struct iovec){(char *)payload + seqs[i] * chunk,
                                          (size_t)(i == short_at ? short_plen : chunk)};
                if (trailer > 0)
                    iov[v++] = (struct iovec){record + front, (size_t)trailer};
            }
            pos += count;
        }
        int r = sendmmsg(fd, msgs, (unsigned)k, 0);
        (*calls)++;
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (!host_queue_dropped(errno))
                return errno;
            done += (ssize_t)(msgs[0].msg_hdr.msg_iovlen / parts); /* the first is lost */
            continue;
        }
        for (int i = 0; i < r; i++) {
            ssize_t datagrams = (ssize_t)(msgs[i].msg_hdr.msg_iovlen / parts);
            done += datagrams;
            *sent += datagrams;
        }
    }
    return 0;
}

#endif
