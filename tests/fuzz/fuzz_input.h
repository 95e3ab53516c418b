/*
 * Reading a libFuzzer input as a stream of fields: big-endian integers of 1-8
 * bytes and byte strings, zero (or zero bytes) once the input is used up, so that
 * every input, however short, decodes to one call.
 */
#ifndef DLCP_FUZZ_INPUT_H
#define DLCP_FUZZ_INPUT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const uint8_t *p;
    size_t left;
} FuzzInput;

/* The next `bytes` bytes as a big-endian unsigned number. */
static inline uint64_t take_uint(FuzzInput *in, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) {
        v <<= 8;
        if (in->left) {
            v |= *in->p++;
            in->left--;
        }
    }
    return v;
}

/* The next 8 bytes as a signed 64-bit number (two's complement). */
static inline int64_t take_int64(FuzzInput *in) {
    uint64_t u = take_uint(in, 8);
    int64_t v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* The next n bytes into dst, zeros past the end of the input. */
static inline void take_bytes(FuzzInput *in, uint8_t *dst, size_t n) {
    size_t got = n < in->left ? n : in->left;
    memcpy(dst, in->p, got);
    memset(dst + got, 0, n - got);
    in->p += got;
    in->left -= got;
}

/* A heap block of exactly n bytes (ASan then reports any access past them). */
static inline uint8_t *exact_alloc(size_t n) {
    uint8_t *d = malloc(n);
    if (d == NULL && n)
        abort();
    return d;
}

static inline uint8_t *exact_copy(const uint8_t *src, size_t n) {
    uint8_t *d = exact_alloc(n);
    if (n)
        memcpy(d, src, n);
    return d;
}

/* The reference's sum of the float32 values at `to` and `from` (n bytes), into
 * `to`: each sum rounded once, as the adding receive path rounds it. */
static inline void add_floats(uint8_t *to, const uint8_t *from, size_t n) {
    for (size_t k = 0; k + 4 <= n; k += 4) {
        float x, y;
        memcpy(&x, to + k, 4);
        memcpy(&y, from + k, 4);
        x = x + y;
        memcpy(to + k, &x, 4);
    }
}

/* Whether the float32 values of a and b (n bytes) are the same: bit for bit, or
 * both NaN (which NaN an add of two NaNs gives depends on the order of its
 * operands, which the compiler may choose). */
static inline int same_floats(const uint8_t *a, const uint8_t *b, size_t n) {
    if (memcmp(a, b, n) == 0) /* (the same bytes: one call, not a traced loop) */
        return 1;
    for (size_t k = 0; k + 4 <= n; k += 4) {
        float x, y;
        memcpy(&x, a + k, 4);
        memcpy(&y, b + k, 4);
        if (memcmp(a + k, b + k, 4) != 0 && !(x != x && y != y))
            return 0;
    }
    return 1;
}

/* The oracle's verdict: a mismatch names itself and aborts, which libFuzzer
 * reports as a crash with the input that caused it. */
#define EXPECT(cond, ...)                                                                  \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "oracle: %s:%d: %s: ", __FILE__, __LINE__, #cond);             \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fputc('\n', stderr);                                                           \
            abort();                                                                       \
        }                                                                                  \
    } while (0)

#endif
