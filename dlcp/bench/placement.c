/*
 * Probe: what placing received datagrams straight into a message's buffer would
 * save on the receive side (docs/benchmarks.md, "Receive path"). One thread sends
 * bursts of 4,400 loopback UDP datagrams of 1,432 bytes (a 32-byte header and a
 * 1,400-byte payload, as DLCP's at MTU 1500) as 64 KB GSO messages, then receives
 * them; the receiving part's thread CPU time is counted, per datagram, for three
 * placements taking turns burst by burst:
 *
 *   copy   one iovec per read into a receive buffer, then each payload copied
 *          (memcpy) to its place in a message buffer: the native receive path;
 *   place  a header iovec and a payload iovec per datagram, the payloads straight
 *          at their places in the message buffer: placement by prediction, without
 *          its header checks (a lower bound of its cost);
 *   none   one iovec per read into the receive buffer and nothing more: the
 *          kernel's copy alone.
 *
 *   cc -O2 -o placement dlcp/bench/placement.c && ./placement 1 && ./placement 0
 *
 * The argument turns UDP GRO on (1: reads of up to 44 datagrams) or off (0: a
 * read per datagram). Each payload carries its datagram's number, and every one
 * is checked at its place in the message buffer (copy, place): a run that
 * misplaced or lost one exits 1.
 */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <netinet/udp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define HDR 32
#define PAY 1400
#define SEG (HDR + PAY)
#define PER_GSO 44 /* 44 * 1,432 = 63,008 bytes a GSO message */
#define BURST 4400
#define ROUNDS 40
#ifndef UDP_GRO
#define UDP_GRO 104
#endif
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif

static double thread_cpu(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int gro = argc > 1 && atoi(argv[1]);
    int rx = socket(AF_INET, SOCK_DGRAM, 0), tx = socket(AF_INET, SOCK_DGRAM, 0);
    int big = 64 << 20, seg = SEG, one = 1;
    if (setsockopt(rx, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof big) < 0 ||
        setsockopt(tx, SOL_SOCKET, SO_SNDBUFFORCE, &big, sizeof big) < 0) {
        perror("placement: 64 MB socket buffers need root (SO_RCVBUFFORCE)");
        return 2;
    }
    if (gro && setsockopt(rx, SOL_UDP, UDP_GRO, &one, sizeof one) < 0) {
        perror("placement: UDP_GRO");
        return 2;
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
    socklen_t alen = sizeof a;
    if (bind(rx, (struct sockaddr *)&a, sizeof a) < 0 ||
        getsockname(rx, (struct sockaddr *)&a, &alen) < 0 ||
        setsockopt(tx, SOL_UDP, UDP_SEGMENT, &seg, sizeof seg) < 0) {
        perror("placement: socket setup");
        return 2;
    }
    unsigned char *msgbuf = aligned_alloc(4096, (size_t)BURST * PAY);
    unsigned char *ring = aligned_alloc(4096, 1 << 16);
    unsigned char *sendbuf = malloc((size_t)BURST * SEG);
    static unsigned char heads[PER_GSO][HDR];
    if (msgbuf == NULL || ring == NULL || sendbuf == NULL)
        return 2;
    for (int i = 0; i < BURST; i++) /* payload i: its number, then filler */
        memset(sendbuf + (size_t)i * SEG, i & 0xFF, SEG);
    memset(msgbuf, 0, (size_t)BURST * PAY);
    const char *names[3] = {"copy", "place", "none"};
    double spent[3] = {0};
    long got[3] = {0};
    for (int r = 0; r < ROUNDS * 3; r++) {
        int mode = r % 3;
        for (int i = 0; i < BURST; i += PER_GSO)
            if (sendto(tx, sendbuf + (size_t)i * SEG, PER_GSO * SEG, 0, (struct sockaddr *)&a,
                       sizeof a) < 0) {
                perror("placement: send");
                return 2;
            }
        double t0 = thread_cpu();
        long n = 0;
        for (;;) {
            struct iovec iov[2 * PER_GSO];
            struct msghdr m = {0};
            if (mode == 1) { /* (n is a multiple of PER_GSO with GRO: whole sends) */
                int k = gro ? PER_GSO : 1;
                for (int i = 0; i < k && n + i < BURST; i++) {
                    iov[2 * i] = (struct iovec){heads[i], HDR};
                    iov[2 * i + 1] = (struct iovec){msgbuf + (size_t)(n + i) * PAY, PAY};
                    m.msg_iovlen = (size_t)(2 * i + 2);
                }
            } else {
                iov[0] = (struct iovec){ring, 1 << 16};
                m.msg_iovlen = 1;
            }
            m.msg_iov = iov;
            ssize_t len = n < BURST ? recvmsg(rx, &m, MSG_DONTWAIT) : -1;
            if (len <= 0)
                break;
            long k = len / SEG;
            if (mode == 0)
                for (long i = 0; i < k; i++)
                    memcpy(msgbuf + (size_t)(n + i) * PAY, ring + i * SEG + HDR, PAY);
            n += k;
        }
        spent[mode] += thread_cpu() - t0;
        got[mode] += n;
        if (n != BURST) {
            fprintf(stderr, "placement: %s: %ld of %d datagrams\n", names[mode], n, BURST);
            return 1;
        }
        for (long i = 0; mode != 2 && i < BURST; i++)
            if (msgbuf[i * PAY] != (unsigned char)(i & 0xFF) ||
                msgbuf[i * PAY + PAY - 1] != (unsigned char)(i & 0xFF)) {
                fprintf(stderr, "placement: %s: payload %ld misplaced\n", names[mode], i);
                return 1;
            }
        memset(msgbuf, 0, (size_t)BURST * PAY);
    }
    for (int m = 0; m < 3; m++)
        printf("gro %d %-5s %ld datagrams %.1f ns/datagram\n", gro, names[m], got[m],
               spent[m] / (double)got[m] * 1e9);
    return 0;
}
