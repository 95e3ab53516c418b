/*
 * AES-GMAC of DLCP datagrams (docs/spec.md §3) with OpenSSL's libcrypto, shared by
 * dlcp.proto._gmac (batch tagging and verifying for the Python engine and the
 * receive path) and dlcp.io._engine (tagging in the send thread). The reference
 * is dlcp/proto/auth.py; tests/proto/test_gmac.py checks that both give the same
 * bytes.
 *
 * An authenticated data record ends with an 8-byte nonce (big-endian) and a
 * 16-byte tag: AES-GCM's tag over an empty plaintext, every byte before the tag
 * being the additional data, with the IV
 *     domain (1 byte) | 0 | src (16 bits) | nonce (64 bits).
 *
 * Two ways to the same tag (the backends; tests/proto/test_gmac.py holds both to
 * the reference):
 *
 * - GMAC_MODES: libcrypto's GCM mode functions (openssl/modes.h, CRYPTO_gcm128_*,
 *   with the carry-less-multiply GHASH EVP's AES-GCM ran underneath up to OpenSSL
 *   3.0), whose one block encryption per datagram (the IV's counter block) is
 *   AES-ECB through EVP (AES-NI where the CPU has it). On OpenSSL 3.0 EVP's AES-GCM
 *   costs about 260 ns a 1,432-byte datagram against 150 here (one core, CPU time):
 *   its provider layer looks parameters up by name on every IV set and tag read.
 * - GMAC_EVP: EVP's AES-GCM. From OpenSSL 3.1 on, on a CPU with AVX-512 (F, DQ, BW, VL),
 *   VAES and VPCLMULQDQ, its provider hashes with those instructions, which the mode
 *   functions do not use: measured on a 2-vCPU AMD EPYC (Zen 4) with OpenSSL 3.5.8,
 *   dlcp.bench.auth sealed 8,972-byte datagrams at 9.7-10.5 GB/s through EVP against
 *   4.5-6.6 through the mode functions (1,456 bytes: 3.6-4.2 against 3.1-3.8;
 *   docs/results/2026-12-03/auth_seal_cap/evp_backend/).
 * - GMAC_SIZED: EVP for datagrams whose tag covers GMAC_EVP_FROM bytes or more (all
 *   but the 16-byte tag), the mode functions for shorter ones (a key holds both).
 *   EVP's AVX-512 code costs more per call: on a
 *   2-vCPU Intel Xeon (Ice Lake) VM with OpenSSL 3.5.8, sealing 1,456-byte datagrams
 *   gathered as the engine sends them took 314-410 ns each through EVP against 257-376
 *   through the mode functions (behind in each of six triples), 8,972-byte ones
 *   1,119-1,240 ns against 1,269-1,551; on the AMD EPYC above EVP was ahead at both
 *   sizes (docs/results/2026-12-04/head_figures/).
 *
 * gmac_init (the engines) takes, with OpenSSL 3.1 or later on a CPU with those
 * instructions, EVP on an AMD CPU and GMAC_SIZED on others; the mode functions
 * elsewhere. It decides once per process (CPUID is slow in some VMs: microseconds).
 * gmac_init_backend takes any (dlcp.proto._gmac.use_backend: tests, benchmarks).
 */
#ifndef DLCP_GMAC_H
#define DLCP_GMAC_H

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/modes.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

enum {
    GMAC_NONCE_LEN = 8,
    GMAC_TAG_LEN = 16,
    GMAC_TRAILER_LEN = GMAC_NONCE_LEN + GMAC_TAG_LEN,
    GMAC_IV_LEN = 12,
    GMAC_DATA_HEADER_LEN = 32,
    GMAC_DATA_SRC_OFFSET = 26, /* the data header's src field */
    GMAC_CONTROL_SRC_OFFSET = 10, /* the control header's src field */
    GMAC_DOMAIN_DATA = 0x44,   /* "D" */
    GMAC_DOMAIN_CONTROL = 0x43, /* "C" */
};

/* The backends (above), and the fewest covered bytes GMAC_SIZED tags through EVP. */
enum { GMAC_AUTO = 0, GMAC_MODES = 1, GMAC_EVP = 2, GMAC_SIZED = 3 };
enum { GMAC_EVP_FROM = 4096 };

/* The block cipher GCM runs on: AES-ECB under the key, and whether a block failed. */
typedef struct {
    EVP_CIPHER_CTX *ecb;
    int failed;
} GmacBlock;

/* One key, expanded once (AES key schedule and GHASH tables): the IV is set per
 * datagram. Not for two threads at once. Once gmac_init succeeded, gcm (with block:
 * GMAC_MODES, GMAC_SIZED) or evp (GMAC_EVP, GMAC_SIZED) or both are set, and
 * datagrams of evp_from bytes or more (the bytes the tag covers) go through evp; all
 * NULL before. */
typedef struct {
    GmacBlock *block;
    GCM128_CONTEXT *gcm;
    EVP_CIPHER_CTX *evp;
    size_t evp_from;
} Gmac;

/* Whether gmac_init has set g up (and gmac_free not yet taken it down). */
static inline int gmac_ready(const Gmac *g) {
    return g->gcm != NULL || g->evp != NULL;
}

/* Whether the CPU says it is AMD's. */
static inline int gmac_cpu_is_amd(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    unsigned int a, b, c, d;
    return __get_cpuid(0, &a, &b, &c, &d) && b == 0x68747541u && d == 0x69746e65u &&
           c == 0x444d4163u; /* "AuthenticAMD" */
#else
    return 0;
#endif
}

/* Whether the CPU has, and the kernel saves the registers of, the instructions
 * OpenSSL's AVX-512 AES-GCM needs: AVX-512 F, DQ, BW and VL, VAES and VPCLMULQDQ. */
static inline int gmac_cpu_has_vaes_avx512(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    unsigned int a, b, c, d;
    if (!__get_cpuid_count(1, 0, &a, &b, &c, &d) || !(c & (1u << 27))) /* OSXSAVE */
        return 0;
    unsigned int xcr0_lo, xcr0_hi;
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    if ((xcr0_lo & 0xe6) != 0xe6) /* SSE, AVX, opmask, ZMM state */
        return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
    const unsigned int ebx = (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31); /* F DQ BW VL */
    const unsigned int ecx = (1u << 9) | (1u << 10);               /* VAES, VPCLMULQDQ */
    return (b & ebx) == ebx && (c & ecx) == ecx;
#else
    return 0;
#endif
}

/* The backend for the libcrypto loaded, on this CPU: decided on the first call
 * (per extension module) and kept. Two threads deciding at once both store the
 * same answer. */
static inline int gmac_auto_backend(void) {
    static int decided = GMAC_AUTO;
    int backend = __atomic_load_n(&decided, __ATOMIC_RELAXED);
    if (backend == GMAC_AUTO) {
        if (OpenSSL_version_num() >= 0x30100000L && gmac_cpu_has_vaes_avx512())
            backend = gmac_cpu_is_amd() ? GMAC_EVP : GMAC_SIZED;
        else
            backend = GMAC_MODES;
        __atomic_store_n(&decided, backend, __ATOMIC_RELAXED);
    }
    return backend;
}

static inline void gmac_encrypt_block(const unsigned char in[16], unsigned char out[16],
                               const void *key) {
    GmacBlock *b = (GmacBlock *)key;
    int len = 0;
    if (EVP_EncryptUpdate(b->ecb, out, &len, in, 16) != 1 || len != 16) {
        memset(out, 0, 16);
        b->failed = 1;
    }
}

static inline void gmac_free(Gmac *g) {
    if (g->gcm)
        CRYPTO_gcm128_release(g->gcm);
    if (g->block) {
        EVP_CIPHER_CTX_free(g->block->ecb);
        OPENSSL_free(g->block);
    }
    EVP_CIPHER_CTX_free(g->evp); /* (NULL: nothing) */
    g->gcm = NULL;
    g->block = NULL;
    g->evp = NULL;
}

/* AES of a key of key_len bytes in the mode of `backend` (GCM for GMAC_EVP, ECB for
 * the block the mode functions encrypt); NULL for another length. */
static inline const EVP_CIPHER *gmac_cipher(size_t key_len, int backend) {
    int gcm = backend == GMAC_EVP;
    switch (key_len) {
    case 16:
        return gcm ? EVP_aes_128_gcm() : EVP_aes_128_ecb();
    case 24:
        return gcm ? EVP_aes_192_gcm() : EVP_aes_192_ecb();
    case 32:
        return gcm ? EVP_aes_256_gcm() : EVP_aes_256_ecb();
    default:
        return NULL;
    }
}

/* g's EVP AES-GCM context under `key`: 0 or -1 (g's other fields untouched). */
static inline int gmac_init_evp(Gmac *g, const uint8_t *key, size_t key_len) {
    const EVP_CIPHER *cipher = gmac_cipher(key_len, GMAC_EVP);
    g->evp = cipher ? EVP_CIPHER_CTX_new() : NULL;
    if (g->evp == NULL || EVP_EncryptInit_ex(g->evp, cipher, NULL, key, NULL) != 1 ||
        EVP_CIPHER_CTX_iv_length(g->evp) != GMAC_IV_LEN)
        return -1;
    return 0;
}

/* g's GCM mode functions' context (and its block cipher) under `key`: 0 or -1. */
static inline int gmac_init_modes(Gmac *g, const uint8_t *key, size_t key_len) {
    const EVP_CIPHER *cipher = gmac_cipher(key_len, GMAC_MODES);
    g->block = cipher ? OPENSSL_zalloc(sizeof(GmacBlock)) : NULL;
    if (g->block == NULL)
        return -1;
    g->block->ecb = EVP_CIPHER_CTX_new();
    if (g->block->ecb == NULL || EVP_EncryptInit_ex(g->block->ecb, cipher, NULL, key, NULL) != 1 ||
        EVP_CIPHER_CTX_set_padding(g->block->ecb, 0) != 1 ||
        (g->gcm = CRYPTO_gcm128_new(g->block, gmac_encrypt_block)) == NULL || g->block->failed)
        return -1;
    return 0;
}

/* g under `key` with `backend` (GMAC_AUTO: gmac_auto_backend()'s): 0, or -1 when
 * the key is not 16, 24 or 32 bytes or libcrypto failed. */
static inline int gmac_init_backend(Gmac *g, const uint8_t *key, size_t key_len, int backend) {
    if (backend == GMAC_AUTO)
        backend = gmac_auto_backend();
    g->block = NULL;
    g->gcm = NULL;
    g->evp = NULL;
    g->evp_from = backend == GMAC_EVP ? 0 : backend == GMAC_SIZED ? GMAC_EVP_FROM : SIZE_MAX;
    if ((backend != GMAC_EVP && gmac_init_modes(g, key, key_len) < 0) ||
        (backend != GMAC_MODES && gmac_init_evp(g, key, key_len) < 0)) {
        gmac_free(g);
        return -1;
    }
    return 0;
}

/* gmac_init_backend with GMAC_AUTO. */
static inline int gmac_init(Gmac *g, const uint8_t *key, size_t key_len) {
    return gmac_init_backend(g, key, key_len, GMAC_AUTO);
}

static inline void gmac_store_be64(uint8_t *at, uint64_t v) {
    for (int i = 7; i >= 0; i--, v >>= 8)
        at[i] = (uint8_t)v;
}

static inline uint64_t gmac_load_be64(const uint8_t *at) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | at[i];
    return v;
}

/* Bytes the tag covers, in order: one piece of several (a datagram gathered from
 * separate places is tagged where its pieces lie). */
typedef struct {
    const uint8_t *at;
    size_t len;
} GmacPiece;

/* The tag of the covered bytes (the pieces, in order) under the IV of (domain,
 * src, nonce): 0 or -1. The pieces go to GCM as additional data one after the
 * other, which gives the tag of their concatenation. */
static inline int gmac_compute_pieces(Gmac *g, int domain, const uint8_t src[2], uint64_t nonce,
                                      const GmacPiece *pieces, int n_pieces,
                                      uint8_t tag[GMAC_TAG_LEN]) {
    uint8_t iv[GMAC_IV_LEN] = {(uint8_t)domain, 0, src[0], src[1]};
    gmac_store_be64(iv + 4, nonce);
    size_t covered = 0;
    for (int i = 0; i < n_pieces; i++)
        covered += pieces[i].len;
    if (g->evp != NULL && covered >= g->evp_from) { /* (GMAC_EVP: evp_from 0) */
        int out_len;
        uint8_t none[16]; /* (no plaintext: nothing is written) */
        if (EVP_EncryptInit_ex(g->evp, NULL, NULL, NULL, iv) != 1)
            return -1;
        for (int i = 0; i < n_pieces; i++)
            if (pieces[i].len > INT_MAX ||
                (pieces[i].len > 0 && EVP_EncryptUpdate(g->evp, NULL, &out_len, pieces[i].at,
                                                        (int)pieces[i].len) != 1))
                return -1;
        if (EVP_EncryptFinal_ex(g->evp, none, &out_len) != 1 ||
            EVP_CIPHER_CTX_ctrl(g->evp, EVP_CTRL_AEAD_GET_TAG, GMAC_TAG_LEN, tag) != 1)
            return -1;
        return 0;
    }
    CRYPTO_gcm128_setiv(g->gcm, iv, GMAC_IV_LEN);
    for (int i = 0; i < n_pieces; i++)
        if (CRYPTO_gcm128_aad(g->gcm, pieces[i].at, pieces[i].len) != 0)
            return -1;
    CRYPTO_gcm128_tag(g->gcm, tag, GMAC_TAG_LEN);
    return g->block->failed ? -1 : 0;
}

/* The tag of `len` covered bytes in one place: 0 or -1. */
static inline int gmac_compute(Gmac *g, int domain, const uint8_t src[2], uint64_t nonce,
                               const uint8_t *covered, size_t len, uint8_t tag[GMAC_TAG_LEN]) {
    GmacPiece whole = {covered, len};
    return gmac_compute_pieces(g, domain, src, nonce, &whole, 1, tag);
}

/* A data record of `len` bytes (trailer included): writes its nonce and tag. 0 or -1. */
static inline int gmac_seal_data(Gmac *g, uint8_t *record, size_t len, uint64_t nonce) {
    uint8_t *trailer = record + len - GMAC_TRAILER_LEN;
    gmac_store_be64(trailer, nonce);
    return gmac_compute(g, GMAC_DOMAIN_DATA, record + GMAC_DATA_SRC_OFFSET, nonce, record,
                        len - GMAC_TAG_LEN, trailer + GMAC_NONCE_LEN);
}

/* A data datagram that goes out gathered from three places (a lent payload): its
 * GMAC_DATA_HEADER_LEN-byte header, `payload_len` bytes of payload and its trailer.
 * Writes the trailer's nonce and tag, the same bytes gmac_seal_data writes into the
 * datagram laid out in one place. 0 or -1. */
static inline int gmac_seal_gathered(Gmac *g, const uint8_t *header, const uint8_t *payload,
                                     size_t payload_len, uint8_t trailer[GMAC_TRAILER_LEN],
                                     uint64_t nonce) {
    gmac_store_be64(trailer, nonce);
    GmacPiece pieces[3] = {
        {header, GMAC_DATA_HEADER_LEN}, {payload, payload_len}, {trailer, GMAC_NONCE_LEN}};
    return gmac_compute_pieces(g, GMAC_DOMAIN_DATA, header + GMAC_DATA_SRC_OFFSET, nonce, pieces,
                               3, trailer + GMAC_NONCE_LEN);
}

/* 1 when the tag of a `len`-byte datagram of `domain` (trailer included; its source
 * rank at src_offset) is right (compared in constant time), 0 when not, -1 when
 * libcrypto failed. The caller has checked that len holds the header and trailer. */
static inline int gmac_verify(Gmac *g, int domain, size_t src_offset, const uint8_t *record,
                              size_t len) {
    const uint8_t *trailer = record + len - GMAC_TRAILER_LEN;
    uint8_t want[GMAC_TAG_LEN];
    if (gmac_compute(g, domain, record + src_offset, gmac_load_be64(trailer), record,
                     len - GMAC_TAG_LEN, want) < 0)
        return -1;
    return CRYPTO_memcmp(want, trailer + GMAC_NONCE_LEN, GMAC_TAG_LEN) == 0;
}

/* gmac_verify of a data record. */
static inline int gmac_verify_data(Gmac *g, const uint8_t *record, size_t len) {
    return gmac_verify(g, GMAC_DOMAIN_DATA, GMAC_DATA_SRC_OFFSET, record, len);
}

/* gmac_verify of a control datagram (docs/spec.md §5: a 16-byte header, its body,
 * the trailer). */
static inline int gmac_verify_control(Gmac *g, const uint8_t *datagram, size_t len) {
    return gmac_verify(g, GMAC_DOMAIN_CONTROL, GMAC_CONTROL_SRC_OFFSET, datagram, len);
}

/* Reserves n nonces of a counter cell shared by every thread (and Python's
 * NonceCounter): *first is the first. 0, or -1 when the counter would wrap. */
static inline int gmac_take_nonces(uint64_t *cell, uint64_t n, uint64_t *first) {
    uint64_t at = __atomic_load_n(cell, __ATOMIC_RELAXED);
    do {
        if (n == 0 || at > UINT64_MAX - n)
            return -1;
    } while (!__atomic_compare_exchange_n(cell, &at, at + n, 1, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    *first = at;
    return 0;
}

#endif
