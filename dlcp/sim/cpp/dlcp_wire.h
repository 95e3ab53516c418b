// DLCP large-scale simulation: DLCP parameters and the simulated packet header.
#pragma once
#include "scenario.h"

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
    uint32_t maxRounds = 64;
    double dropFraction = 0.8;     // share of chunks classified drop-eligible
    bool senderPriority = true;    // the pump serves higher classes first
    std::vector<int> dscp;         // 8 entries
    uint8_t ecnProtected = 2, ecnDroppable = 0;
    uint64_t seed = 1;
};

enum DlcpType : uint8_t { D_DATA = 1, D_STOP = 2, D_FINISH = 3, D_NACK = 4, D_RATE = 5 };

struct DlcpHdr
{
    uint8_t type, flags;  // flags: 1 = protected chunk, 2 = retransmission
    uint16_t cls;
    uint32_t flow, seq, total, a, b, c, d;
};
static_assert(sizeof(DlcpHdr) == 32, "sim header is 32 bytes like wire.DATA_HEADER_LEN");

}  // namespace dlcpsim
