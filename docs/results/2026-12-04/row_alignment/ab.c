/* 64 MiB in rows from a hot 256 KB source into a destination at each offset in its
 * 64-byte line, streamed: copy_row as it was before 2026-12-04 (copy_row_before,
 * below, verbatim) against dlcp/proto/_kernels_core.h's, whose 64-byte loop starts
 * on a destination line. Best of REPS per case, the two taking turns.
 *
 *     cc -O2 -o ab ab.c && ./ab 7 1440 && ./ab 7 1416
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../../../dlcp/proto/_kernels_core.h"

static inline void copy_row_before(char *d, const char *s, size_t n, int stream) {
#if defined(__SSE2__)
    if (stream && n >= 64) {
        /* head: up to the first 16-byte aligned destination address */
        size_t head = (size_t)(-(uintptr_t)d & 15);
        if (((uintptr_t)d & 3) == 0) {
            stream_ragged(&d, &s, &n, head);
        } else {
            memcpy(d, s, head);
            d += head;
            s += head;
            n -= head;
        }
        for (; n >= 64; n -= 64, d += 64, s += 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)s);
            __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
            __m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
            _mm_stream_si128((__m128i *)d, a);
            _mm_stream_si128((__m128i *)(d + 16), b);
            _mm_stream_si128((__m128i *)(d + 32), c);
            _mm_stream_si128((__m128i *)(d + 48), e);
        }
        for (; n >= 16; n -= 16, d += 16, s += 16)
            _mm_stream_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s));
        stream_ragged(&d, &s, &n, n & ~(size_t)3);
        memcpy(d, s, n);
        return;
    }
#else
    (void)stream;
#endif
    memcpy(d, s, n);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 5;
    const size_t chunk = argc > 2 ? (size_t)atoi(argv[2]) : 1440, stride = chunk + 32;
    const size_t total = 64u << 20, rows = total / chunk;
    unsigned char *src = aligned_alloc(4096, 256 * 1024 + 8192);
    unsigned char *dst = aligned_alloc(4096, total + 4096);
    memset(src, 1, 256 * 1024);
    memset(dst, 2, total + 4096);
    const int offs[] = {0, 16, 32, 48};
    double best[4][2];
    for (int o = 0; o < 4; o++)
        best[o][0] = best[o][1] = 1e9;
    for (int rep = 0; rep < reps; rep++)
        for (int o = 0; o < 4; o++)
            for (int v = 0; v < 2; v++) {
                double t0 = now();
                for (size_t i = 0; i < rows; i++) {
                    const char *s = (const char *)src + (i % 170) * stride + 32;
                    char *d = (char *)dst + offs[o] + i * chunk;
                    if (v)
                        copy_row(d, s, chunk, 1);
                    else
                        copy_row_before(d, s, chunk, 1);
                }
                _mm_sfence();
                double t = now() - t0;
                if (t < best[o][v])
                    best[o][v] = t;
            }
    for (int o = 0; o < 4; o++)
        printf("destination %2d bytes into its line, rows of %zu: before %6.2f ms, "
               "now %6.2f ms (best of %d)\n",
               offs[o], chunk, best[o][0] * 1e3, best[o][1] * 1e3, reps);
    return 0;
}
