/*
 * What one AES-GMAC tag of a datagram costs with libcrypto on this machine: the
 * GCM mode functions over an EVP AES-ECB block that dlcp/proto/gmac.h uses (the
 * engine seals with it, the receive loop verifies with it), against EVP's
 * AES-GCM, and the tag's cost by the bytes it covers. CPU time of one thread.
 *
 *     gcc -O2 -I<repository> -o gmac_cost gmac_cost.c -lcrypto && ./gmac_cost
 */
#include "dlcp/proto/gmac.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A 1,416-byte payload, lent: header, payload and nonce tagged where they lie, over
 * `total` bytes of payloads (64 MiB: streamed from memory; 256 KB: in cache). */
static void per_datagram(size_t total) {
    const size_t payload = 1416;
    size_t n = total / payload;
    uint8_t *buf = malloc(total), key[16] = {1, 2, 3}, header[32] = {0}, trailer[24], evp_tag[24];
    for (size_t i = 0; i < total; i++)
        buf[i] = (uint8_t)(i * 7);
    Gmac g;
    if (gmac_init(&g, key, 16) < 0)
        abort();
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    EVP_EncryptInit_ex(c, EVP_aes_128_gcm(), NULL, key, NULL);
    EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_IVLEN, 12, NULL);
    for (int round = 0; round < 5; round++) {
        double t0 = cpu_now();
        for (size_t i = 0; i < n; i++)
            gmac_seal_gathered(&g, header, buf + i * payload, payload, trailer, i);
        double t1 = cpu_now();
        for (size_t i = 0; i < n; i++) {
            uint8_t iv[12] = {GMAC_DOMAIN_DATA, 0, header[26], header[27]};
            int len;
            gmac_store_be64(iv + 4, i);
            gmac_store_be64(evp_tag, i);
            EVP_EncryptInit_ex(c, NULL, NULL, NULL, iv);
            EVP_EncryptUpdate(c, NULL, &len, header, 32);
            EVP_EncryptUpdate(c, NULL, &len, buf + i * payload, (int)payload);
            EVP_EncryptUpdate(c, NULL, &len, evp_tag, 8);
            EVP_EncryptFinal_ex(c, NULL, &len);
            EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, 16, evp_tag + 8);
        }
        double t2 = cpu_now();
        if (memcmp(trailer, evp_tag, 24) != 0)
            abort(); /* (the last datagram's: the same tag both ways) */
        printf("%zu bytes of payloads: gmac.h %.1f ns a datagram, EVP AES-GCM %.1f\n", total,
               (t1 - t0) / (double)n * 1e9, (t2 - t1) / (double)n * 1e9);
    }
    EVP_CIPHER_CTX_free(c);
    gmac_free(&g);
    free(buf);
}

int main(void) {
    per_datagram(64u << 20);
    per_datagram(256u << 10);
    uint8_t key[16] = {1, 2, 3}, buf[4096] = {0}, tag[16], src[2] = {0, 1};
    Gmac g;
    if (gmac_init(&g, key, 16) < 0)
        abort();
    const size_t lens[] = {0, 16, 256, 1024, 1456, 4096};
    for (int k = 0; k < 6; k++) {
        const size_t n = 200000;
        double t0 = cpu_now();
        for (size_t i = 0; i < n; i++)
            gmac_compute(&g, GMAC_DOMAIN_DATA, src, i, buf, lens[k], tag);
        printf("a tag over %zu bytes (in cache): %.1f ns\n", lens[k],
               (cpu_now() - t0) / (double)n * 1e9);
    }
    gmac_free(&g);
    return 0;
}
