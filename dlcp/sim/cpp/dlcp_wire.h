// DLCP large-scale simulation: DLCP parameters and the simulated packet header.
#pragma once
#include "scenario.h"

#include <cstring>

namespace dlcpsim
{

struct DlcpParams
{
    uint32_t payload = 1440;       // chunk bytes (ProtocolConfig.chunk_bytes)
    uint32_t header = 32;          // data header bytes (wire.DATA_HEADER_LEN)
    uint32_t wireOverhead = 30;    // IPv4 + UDP + point-to-point framing per packet
    double hostGbps = 100;
    double initialRate = 1.25e9;   // bytes/s before the first RATE
    double minRate = 1e6;          // bytes/s
    bool pacing = true;
    double pacingTarget = 0.95;    // share of the downlink (wire bytes) the receiver hands out
    double rateIntervalUs = 20;
    double finishTimeoutUs = 500;
    uint32_t finishRetries = 10;
    double reorderGraceUs = 20;
    double nackTimeoutUs = 500;    // NACK repeat; caps a NACK's wait for a streaming sender
    uint32_t maxRounds = 64;
    double dropFraction = 0.8;     // share of chunks classified drop-eligible
    bool senderPriority = true;    // the pump serves higher classes first
    std::vector<int> dscp;         // 8 entries
    uint8_t ecnProtected = 2, ecnDroppable = 0;
    uint64_t seed = 1;
};

enum DlcpType : uint8_t { D_DATA = 1, D_STOP = 2, D_FINISH = 3, D_NACK = 4, D_RATE = 5 };

// The simulated header: a model of the spec's data and control headers
// (docs/spec.md §2 and §5) in the 32 bytes of wire.DATA_HEADER_LEN, not their byte
// layout. It carries the fields the simulation acts on, named as the spec names
// them; `flow` stands for the message key (src, step, msg). The last four words
// mean what the packet type says, one struct per type.
struct DlcpHdr
{
    uint8_t type;          // packet type (the spec's ver_type, type nibble)
    uint8_t flags;         // DATA: 1 = protected chunk (not drop-eligible), 2 = RETRANSMIT
    uint16_t cls;          // priority class (the spec's tclass prio)
    uint32_t flow;         // the message (the spec's src, step, msg)
    uint32_t seq;          // DATA: the chunk (the spec's seq)
    uint32_t totalChunks;  // DATA, FINISH, NACK: chunks in the message (FINISH.total_chunks)
    union
    {
        struct
        {
            uint32_t round;            // FINISH.round
            uint32_t protectedChunks;  // FINISH.protected_chunks
            uint32_t unused[2];
        } finish;
        struct
        {
            uint32_t round;         // NACK.round
            uint32_t neededChunks;  // NACK.needed_elems, counted here in full chunks
            uint32_t rangeCount;    // NACK.count; the (first, count) ranges follow the header
            uint32_t more;          // NACK.flags MORE: more parts of this round follow
        } nack;
        struct
        {
            uint32_t kBytesPerS;  // RATE.bytes_per_s / 1000
            uint32_t unused[3];
        } rate;
        uint32_t unused[4];  // DATA, STOP
    };
};
static_assert(sizeof(DlcpHdr) == 32, "sim header is 32 bytes like wire.DATA_HEADER_LEN");

// One constructor per packet type: every byte set (the header goes on the
// simulated wire by memcpy), each field by its name.
inline DlcpHdr BlankHdr(DlcpType type, uint32_t flow)
{
    DlcpHdr h;
    std::memset(&h, 0, sizeof h);
    h.type = type;
    h.flow = flow;
    return h;
}

inline DlcpHdr DataHdr(uint8_t flags, uint16_t cls, uint32_t flow, uint32_t seq,
                       uint32_t totalChunks)
{
    DlcpHdr h = BlankHdr(D_DATA, flow);
    h.flags = flags;
    h.cls = cls;
    h.seq = seq;
    h.totalChunks = totalChunks;
    return h;
}

inline DlcpHdr StopHdr(uint32_t flow) { return BlankHdr(D_STOP, flow); }

inline DlcpHdr FinishHdr(uint16_t cls, uint32_t flow, uint32_t totalChunks, uint32_t round,
                         uint32_t protectedChunks)
{
    DlcpHdr h = BlankHdr(D_FINISH, flow);
    h.cls = cls;
    h.totalChunks = totalChunks;
    h.finish.round = round;
    h.finish.protectedChunks = protectedChunks;
    return h;
}

inline DlcpHdr NackHdr(uint32_t flow, uint32_t totalChunks, uint32_t round,
                       uint32_t neededChunks, uint32_t rangeCount, bool more)
{
    DlcpHdr h = BlankHdr(D_NACK, flow);
    h.totalChunks = totalChunks;
    h.nack.round = round;
    h.nack.neededChunks = neededChunks;
    h.nack.rangeCount = rangeCount;
    h.nack.more = more ? 1 : 0;
    return h;
}

inline DlcpHdr RateHdr(uint32_t flow, uint32_t kBytesPerS)
{
    DlcpHdr h = BlankHdr(D_RATE, flow);
    h.rate.kBytesPerS = kBytesPerS;
    return h;
}

}  // namespace dlcpsim
