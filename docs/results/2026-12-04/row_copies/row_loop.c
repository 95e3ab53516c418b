#include "_kernels_core.h"
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
__attribute__((target("avx512f"))) static void row512(char *d, const char *s, size_t n) {
    while (((uintptr_t)d & 63) && n >= 16) { _mm_stream_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s)); d += 16; s += 16; n -= 16; }
    for (; n >= 64; n -= 64, d += 64, s += 64) _mm512_stream_si512((void *)d, _mm512_loadu_si512((const void *)s));
    for (; n >= 16; n -= 16, d += 16, s += 16) _mm_stream_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s));
    memcpy(d, s, n);
}
__attribute__((target("avx2"))) static void row256(char *d, const char *s, size_t n) {
    while (((uintptr_t)d & 31) && n >= 16) { _mm_stream_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s)); d += 16; s += 16; n -= 16; }
    for (; n >= 64; n -= 64, d += 64, s += 64) { _mm256_stream_si256((__m256i *)d, _mm256_loadu_si256((const __m256i *)s)); _mm256_stream_si256((__m256i *)(d+32), _mm256_loadu_si256((const __m256i *)(s+32))); }
    for (; n >= 16; n -= 16, d += 16, s += 16) _mm_stream_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s));
    memcpy(d, s, n);
}
enum { ROW = 1440, STRIDE = 1472 };
int main(void) {
    size_t total = 64u << 20, rows = total / ROW;
    char *src = aligned_alloc(64, rows * STRIDE + 64), *dst = aligned_alloc(64, total + 64), *big = aligned_alloc(64, total);
    memset(src, 1, rows * STRIDE); memset(dst, 0, total); memset(big, 2, total);
    for (int rep = 0; rep < 5; rep++) {
        double t[10]; int k = 0;
        t[k++] = now(); memcpy(dst, big, total); t[k++] = now(); memset(dst, 0, total);
        t[k++] = now(); for (size_t r = 0; r < rows; r++) copy_row(dst + r * ROW, src + r * STRIDE + 32, ROW, 1); _mm_sfence(); t[k++] = now(); memset(dst, 0, total);
        t[k++] = now(); for (size_t r = 0; r < rows; r++) row256(dst + r * ROW, src + r * STRIDE + 32, ROW); _mm_sfence(); t[k++] = now(); memset(dst, 0, total);
        t[k++] = now(); for (size_t r = 0; r < rows; r++) row512(dst + r * ROW, src + r * STRIDE + 32, ROW); _mm_sfence(); t[k++] = now(); memset(dst, 0, total);
        printf("memcpy %.1f | rows sse2 %.1f | avx2 %.1f | avx512 %.1f ms\n", (t[1]-t[0])*1e3, (t[3]-t[2])*1e3, (t[5]-t[4])*1e3, (t[7]-t[6])*1e3);
    }
}
