/*
 * The receive pre-filter of dlcp.io._udpio: the header rules of docs/spec.md §6.1
 * that need no key, checked in C on every datagram of a run before Python sees it.
 *
 * A junk datagram costs numpy and Python work per batch when it reaches the
 * session's parser (a flood arrives one datagram per read, so one batch per
 * datagram). Here it costs a few comparisons. A datagram that breaks a rule is
 * dropped and counted under the rule's reason code (the codes of dlcp.proto.wire
 * Reason), the datagrams that pass are moved down over it, so a run keeps its
 * shape: datagrams of one size back to back, the last possibly shorter.
 *
 * The rules and their order are those of §6.1, rows 1-8 (the tag itself, row 9,
 * is checked by the session): a datagram this filter keeps is one the session's
 * parser gives no reason but possibly AUTH_FAILED; one it drops gets the same
 * reason there. tests/io/test_prefilter.py checks that on random datagrams.
 */
#ifndef DLCP_PREFILTER_H
#define DLCP_PREFILTER_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define PF_HEADER_LEN 32
#define PF_VER_TYPE_DATA 0x11 /* version 1, type DATA */
#define PF_FLAG_AUTH 0x04
#define PF_FLAGS_RESERVED 0xF8
#define PF_REASONS 16

enum {
    PF_OK = 0,
    PF_TRUNCATED = 1,
    PF_BAD_VERSION = 2,
    PF_BAD_TYPE = 3,
    PF_WRONG_JOB = 4,
    PF_LENGTH_MISMATCH = 5,
    PF_OUT_OF_BOUNDS = 6,
    PF_BAD_FIELD = 7,
    PF_AUTH_REQUIRED = 8,
};

/* What a receiver accepts: its job, whether it requires a tag, a tag's length. */
typedef struct {
    unsigned job;
    int require_auth;
    size_t tag_len;
} PfRules;

static inline uint32_t pf_be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline unsigned pf_be16(const unsigned char *p) { return ((unsigned)p[0] << 8) | p[1]; }

/* The reason code of the first rule of §6.1 (rows 1-8) datagram d of len bytes
 * breaks, PF_OK if none. */
static inline int pf_check(const unsigned char *d, size_t len, const PfRules *rules) {
    static const unsigned itemsize[PF_REASONS] = {4, 2, 2, 1};
    if (len < PF_HEADER_LEN)
        return PF_TRUNCATED;
    if (d[0] >> 4 != PF_VER_TYPE_DATA >> 4)
        return PF_BAD_VERSION;
    if ((d[0] & 0x0F) != (PF_VER_TYPE_DATA & 0x0F))
        return PF_BAD_TYPE;
    if (pf_be16(d + 2) != rules->job)
        return PF_WRONG_JOB;
    unsigned flags = d[1], code = d[29];
    unsigned size = itemsize[code >> 4];
    if ((flags & PF_FLAGS_RESERVED) || (code & 0x0F) || size == 0)
        return PF_BAD_FIELD;
    size_t payload_len = pf_be16(d + 24);
    size_t tag = flags & PF_FLAG_AUTH ? rules->tag_len : 0;
    if (payload_len % size || len != PF_HEADER_LEN + payload_len + tag)
        return PF_LENGTH_MISMATCH;
    uint64_t offset = pf_be32(d + 16), elems = pf_be32(d + 20);
    if (elems == 0 || payload_len == 0 || offset + payload_len / size > elems)
        return PF_OUT_OF_BOUNDS;
    if (rules->require_auth && !(flags & PF_FLAG_AUTH))
        return PF_AUTH_REQUIRED;
    return PF_OK;
}

/* Filters the run buf[0:len) of datagrams of seg bytes (the last may be shorter)
 * in place: the datagrams that pass are moved down to the start, in order, and
 * counts[reason] grows by one for each one dropped. Returns the bytes kept. */
static inline size_t pf_filter_run(unsigned char *buf, size_t len, size_t seg,
                                   const PfRules *rules, int64_t counts[PF_REASONS]) {
    size_t kept = 0;
    for (size_t at = 0; at < len; at += seg) {
        size_t n = len - at < seg ? len - at : seg;
        int reason = pf_check(buf + at, n, rules);
        if (reason != PF_OK) {
            counts[reason]++;
            continue;
        }
        if (kept != at)
            memmove(buf + kept, buf + at, n);
        kept += n;
    }
    return kept;
}

#endif
