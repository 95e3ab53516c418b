/*
 * A junk flooder for DLCP's receive path: sends UDP datagrams to one address as
 * fast as one core can (or at a given rate) with sendmmsg, until its time is up
 * or it gets SIGTERM / SIGINT. Built and run by dlcp/bench/flooder.py.
 *
 *   flooder HOST PORT SECONDS KIND JOB SEED [RATE]
 *
 * KIND random: datagrams of 1-1472 random bytes.
 * KIND header: 32-1472 bytes that start like a DLCP data datagram of job JOB
 *   (ver_type 0x11, the job's 16 bits), the rest random: what an outsider who
 *   knows the job id sends. Most break a later rule of spec §6.1.
 * RATE: datagrams per second (0 or absent: as fast as it goes).
 *
 * It writes "ready" on stdout once its socket is connected and its datagrams
 * are drawn, and at the end one JSON line: datagrams handed to the kernel,
 * send errors (ECONNREFUSED after the port closed, ENOBUFS), seconds and rate.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define POOL 4096    /* distinct datagrams, sent round and round */
#define BATCH 64     /* datagrams per sendmmsg */
#define MAX_LEN 1472 /* an MTU-1500 IPv4 datagram's payload */

static volatile sig_atomic_t stop;

static void on_signal(int sig) {
    (void)sig;
    stop = 1;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* xorshift64*: reproducible junk from SEED */
static uint64_t next_random(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

int main(int argc, char **argv) {
    if (argc < 7 || argc > 8) {
        fprintf(stderr, "usage: %s HOST PORT SECONDS random|header JOB SEED [RATE]\n", argv[0]);
        return 2;
    }
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[2]))};
    if (inet_pton(AF_INET, argv[1], &to.sin_addr) != 1) {
        fprintf(stderr, "flooder: bad IPv4 address %s\n", argv[1]);
        return 2;
    }
    double seconds = atof(argv[3]);
    int header = strcmp(argv[4], "header") == 0;
    if (!header && strcmp(argv[4], "random") != 0) {
        fprintf(stderr, "flooder: KIND must be random or header, got %s\n", argv[4]);
        return 2;
    }
    unsigned job = (unsigned)atoi(argv[5]);
    uint64_t seed = strtoull(argv[6], NULL, 10) | 1;
    double rate = argc == 8 ? atof(argv[7]) : 0.0;

    static unsigned char pool[POOL][MAX_LEN];
    static struct iovec iov[POOL];
    for (int i = 0; i < POOL; i++) {
        for (int j = 0; j < MAX_LEN; j += 8) {
            uint64_t r = next_random(&seed);
            memcpy(pool[i] + j, &r, MAX_LEN - j < 8 ? (size_t)(MAX_LEN - j) : 8);
        }
        size_t min_len = header ? 32 : 1;
        size_t len = min_len + next_random(&seed) % (MAX_LEN - min_len + 1);
        if (header) {
            pool[i][0] = 0x11;
            pool[i][2] = (unsigned char)(job >> 8);
            pool[i][3] = (unsigned char)job;
        }
        iov[i] = (struct iovec){pool[i], len};
    }
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&to, sizeof to) < 0) {
        perror("flooder: socket");
        return 1;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    struct mmsghdr msgs[BATCH];
    printf("ready\n");
    fflush(stdout);
    unsigned long long sent = 0, errors = 0;
    double start = now_s(), t = start;
    int at = 0;
    while (!stop && t - start < seconds) {
        if (rate > 0) { /* wait until this batch is due */
            double due = start + (double)sent / rate;
            if (due > t) {
                double wait = due - t;
                struct timespec d = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
                nanosleep(&d, NULL);
            }
        }
        memset(msgs, 0, sizeof msgs);
        for (int i = 0; i < BATCH; i++) {
            msgs[i].msg_hdr.msg_iov = &iov[(at + i) % POOL];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        int n = sendmmsg(fd, msgs, BATCH, 0);
        if (n < 0) {
            if (errno != EINTR)
                errors++;
        } else {
            sent += (unsigned long long)n;
            at = (at + n) % POOL;
        }
        t = now_s();
    }
    double elapsed = t - start;
    printf("{\"sent\": %llu, \"errors\": %llu, \"seconds\": %.6f, \"rate\": %.1f}\n", sent, errors,
           elapsed, elapsed > 0 ? (double)sent / elapsed : 0.0);
    close(fd);
    return 0;
}
