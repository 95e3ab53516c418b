/* Seal 64 MiB of payload in 1,400-byte pieces gathered with a 32-byte header, as the
 * engine's send thread seals lent datagrams, with each backend; GB/s of datagram bytes. */
#include "gmac.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
    size_t pl = argc > 1 ? (size_t)atoi(argv[1]) : 1400, total = 64u << 20, n = total / pl;
    uint8_t *payload = malloc(total), header[32] = {0}, trailer[24], whole[9100];
    for (size_t i = 0; i < total; i++) payload[i] = (uint8_t)(i * 7);
    uint8_t key[16] = {1, 2, 3};
    const char *names[] = {"", "modes", "evp", "sized"};
    for (int rep = 0; rep < 3; rep++)
        for (int b = 1; b <= 3; b++) {
            Gmac g;
            if (gmac_init_backend(&g, key, 16, b) < 0) return 1;
            double t0 = now();
            for (size_t i = 0; i < n; i++)
                if (gmac_seal_gathered(&g, header, payload + i * pl, pl, trailer, i) < 0) return 2;
            double t1 = now();
            /* the same datagrams laid out in one place (cached: one buffer) */
            for (size_t i = 0; i < n; i++) {
                memcpy(whole + 32, payload + i * pl, pl);
                if (gmac_seal_data(&g, whole, 32 + pl + 24, i) < 0) return 3;
            }
            double t2 = now();
            printf("%-5s gathered %.2f GB/s  copied+contiguous %.2f GB/s  (%.0f ns a datagram gathered)\n", names[b],
                   n * (pl + 56) / (t1 - t0) / 1e9, n * (pl + 56) / (t2 - t1) / 1e9, (t1 - t0) / n * 1e9);
            gmac_free(&g);
        }
    return 0;
}
