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
 * The tag is computed with libcrypto's GCM mode functions (openssl/modes.h,
 * CRYPTO_gcm128_*: the code EVP's AES-GCM runs underneath, with the same
 * carry-less-multiply GHASH), whose one block encryption per datagram (the IV's
 * counter block) is AES-ECB through EVP (AES-NI where the CPU has it). EVP's
 * AES-GCM interface gives the same tags but costs about 260 ns a 1,432-byte
 * datagram against 150 here (one core, CPU time): OpenSSL 3's provider layer
 * looks parameters up by name on every IV set and tag read.
 */
#ifndef DLCP_GMAC_H
#define DLCP_GMAC_H

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/modes.h>
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

/* The block cipher GCM runs on: AES-ECB under the key, and whether a block failed. */
typedef struct {
    EVP_CIPHER_CTX *ecb;
    int failed;
} GmacBlock;

/* One key, expanded once (AES key schedule and GHASH tables): the IV is set per
 * datagram. Not for two threads at once. */
typedef struct {
    GmacBlock *block;
    GCM128_CONTEXT *gcm;
} Gmac;

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
    g->gcm = NULL;
    g->block = NULL;
}

/* 0, or -1 when the key is not 16, 24 or 32 bytes or libcrypto failed. */
static inline int gmac_init(Gmac *g, const uint8_t *key, size_t key_len) {
    const EVP_CIPHER *cipher = key_len == 16   ? EVP_aes_128_ecb()
                               : key_len == 24 ? EVP_aes_192_ecb()
                               : key_len == 32 ? EVP_aes_256_ecb()
                                               : NULL;
    g->gcm = NULL;
    g->block = cipher ? OPENSSL_zalloc(sizeof(GmacBlock)) : NULL;
    if (g->block == NULL)
        return -1;
    g->block->ecb = EVP_CIPHER_CTX_new();
    if (g->block->ecb == NULL || EVP_EncryptInit_ex(g->block->ecb, cipher, NULL, key, NULL) != 1 ||
        EVP_CIPHER_CTX_set_padding(g->block->ecb, 0) != 1 ||
        (g->gcm = CRYPTO_gcm128_new(g->block, gmac_encrypt_block)) == NULL ||
        g->block->failed) {
        gmac_free(g);
        return -1;
    }
    return 0;
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
