// DLCP large-scale simulation: the DLCP sender side (per-host pump, pacing per
// receiver, FINISH / NACK / STOP handling) and the per-host state both sides use.
// dlcp_transport.h adds the receiver side; its header comment describes the model.
#pragma once
#include "dlcp_wire.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <unordered_map>

namespace dlcpsim
{

class DlcpSender : public Transport
{
  public:
    DlcpParams prm;
    uint16_t port = 9400;
    uint64_t dataSent = 0, controlSent = 0, failures = 0;
    uint64_t multiPartNacks = 0;  // NACKs acted on after gathering several parts
    uint32_t maxRound = 0;        // the most retransmission rounds a message took

    void StartFlow(uint32_t id) override
    {
        const Flow& f = m_sc->flows[id];
        if (f.bytes == 0)
        {
            m_sc->FlowDone(id, 0, false);
            return;
        }
        Out& m = m_out[id];
        m.npkts = uint32_t((f.bytes + prm.payload - 1) / prm.payload);
        m.prot.assign(m.npkts, 1);
        m.queued.assign(m.npkts, 0);
        m.nProt = m.npkts;
        if (f.p > 0)
        {  // drop eligibility: a stand-in for the magnitude classifier (no values here)
            for (uint32_t s = 0; s < m.npkts; s++)
            {
                double u = double(Mix64(prm.seed * 0x9e37ULL ^ (uint64_t(id) << 24) ^ s) >> 11) /
                           9007199254740992.0;
                if (u < prm.dropFraction)
                {
                    m.prot[s] = 0;
                    m.nProt--;
                }
            }
        }
        m.state = SENDING;
        Host& h = m_hosts[f.src];
        h.peers.emplace(f.dst, Peer{prm.initialRate, Simulator::Now()});
        h.active.push_back(id);
        Kick(f.src, Simulator::Now());
    }

  protected:
    enum State { IDLE, SENDING, AWAITING, DONE };

    struct Out
    {
        uint32_t npkts = 0, nProt = 0, next = 0, round = 0, tries = 0;
        int64_t neededLeft = 0;
        // as dlcp.proto.recovery: what the last NACK still needed and how many
        // chunks it named, and the retransmission rounds in a row that lowered
        // neither
        uint32_t lastNeeded = 0, lastNamed = 0, stalled = 0;
        std::vector<uint8_t> prot, queued;
        std::deque<uint32_t> retx;
        State state = IDLE;
        EventId finishEv;
        // the parts of a NACK split over several packets (more = 1), gathered
        // until its last part as dlcp.proto's outbox does
        std::vector<uint32_t> nackRanges;
        uint32_t nackRound = 0;
    };

    // a message being received; its recovery follows dlcp.proto.recovery's
    // ReceiverRecovery (NACK once the data behind a FINISH had its reorder grace,
    // complete by the bound once quiet for the grace, unless NACKed before)
    struct In
    {
        uint32_t npkts = 0, nGot = 0, nProtGot = 0, finishProt = 0, round = 0;
        uint64_t gotBytes = 0, requiredBytes = 0;  // the bound counts bytes (elements)
        std::vector<uint8_t> got;
        bool finishSeen = false, done = false;
        Time lastActivity;              // its last data packet (duplicates too)
        bool finishWaiting = false;     // a FINISH of a round not NACKed yet came at finishAt
        Time finishAt;
        bool nacked = false;            // some round was NACKed (nackRound, the latest)
        uint32_t nackRound = 0;
        EventId nackEv;                 // the NACK (or its repeat) is due
        EventId settleEv;               // complete by the bound, waiting out the grace
    };

    // pacing state of a (sender, receiver) pair: the receiver's latest rate
    struct Peer
    {
        double rate;
        Time nextTime;
    };

    struct Host
    {
        std::unordered_map<uint32_t, Peer> peers;              // sender side, by receiver
        std::unordered_map<uint32_t, uint32_t> activeSenders;  // receiver side: messages
        std::unordered_map<uint32_t, double> lastRate;         // receiver side: last RATE
        std::unordered_map<uint32_t, Time> lastData;  // receiver side: last data packet, by sender
        Ptr<Socket> sock;
        std::vector<uint32_t> active;  // outgoing messages not DONE
        EventId pumpEv;
        Time busyUntil;
        std::unordered_map<uint32_t, In> in;
        std::vector<uint32_t> activeIn;  // incoming messages not done
        EventId rateEv;
        Time lastRateUpdate = Seconds(-1);
    };

    // ---- sending ---------------------------------------------------------------

    void Kick(uint32_t h, Time at)
    {
        Host& host = m_hosts[h];
        if (at < Simulator::Now())
        {
            at = Simulator::Now();
        }
        if (host.pumpEv.IsPending())
        {
            if (host.pumpEv.GetTs() <= at.GetTimeStep())
            {
                return;
            }
            host.pumpEv.Cancel();
        }
        host.pumpEv = Simulator::Schedule(at - Simulator::Now(), &DlcpSender::Pump, this, h);
    }

    void Pump(uint32_t h)
    {
        Host& host = m_hosts[h];
        Time now = Simulator::Now();
        if (now < host.busyUntil)
        {
            Kick(h, host.busyUntil);
            return;
        }
        int64_t best = -1;
        size_t bestPos = 0;
        Time earliest = Time::Max();
        for (size_t i = 0; i < host.active.size(); i++)
        {
            uint32_t id = host.active[i];
            Out& m = m_out[id];
            if (m.state != SENDING)
            {
                continue;
            }
            const Peer& peer = host.peers[m_sc->flows[id].dst];
            if (peer.nextTime > now)
            {
                earliest = std::min(earliest, peer.nextTime);
                continue;
            }
            if (best < 0 || (prm.senderPriority && m_sc->flows[id].cls > m_sc->flows[best].cls))
            {
                best = id;
                bestPos = i;
            }
        }
        if (best < 0)
        {
            if (earliest != Time::Max())
            {
                Kick(h, earliest);
            }
            return;
        }
        // round robin inside a class: the served message goes to the back
        host.active.erase(host.active.begin() + bestPos);
        host.active.push_back(uint32_t(best));
        uint32_t size = SendChunk(uint32_t(best));
        double wire = (size + prm.wireOverhead) * 8.0 / (prm.hostGbps * 1e9);
        host.busyUntil = now + Seconds(wire);
        Kick(h, host.busyUntil);
    }

    uint32_t SendChunk(uint32_t id)
    {
        Out& m = m_out[id];
        const Flow& f = m_sc->flows[id];
        uint32_t seq;
        bool retx = !m.retx.empty();
        if (retx)
        {
            seq = m.retx.front();
            m.retx.pop_front();
            m.queued[seq] = 0;
            m_sc->flows[id].retransmitted++;
        }
        else
        {
            seq = m.next++;
        }
        uint64_t off = uint64_t(seq) * prm.payload;
        uint32_t payload = uint32_t(std::min<uint64_t>(prm.payload, f.bytes - off));
        DlcpHdr hd = DataHdr(uint8_t((m.prot[seq] ? 1 : 0) | (retx ? 2 : 0)), uint16_t(f.cls), id,
                             seq, m.npkts);
        bool protectedPkt = m.prot[seq] || retx;
        uint8_t tos = uint8_t(prm.dscp[f.cls] << 2) | (protectedPkt ? prm.ecnProtected
                                                                     : prm.ecnDroppable);
        Send(f.src, f.dst, hd, payload + prm.header, tos, nullptr, 0);
        dataSent++;
        Peer& peer = m_hosts[f.src].peers[f.dst];
        double wireBytes = payload + prm.header + prm.wireOverhead;
        peer.nextTime = Simulator::Now() + Seconds(wireBytes / peer.rate);
        if (m.retx.empty() && m.next >= m.npkts)
        {
            m.state = AWAITING;
            m.tries = 0;
            SendFinish(id);
        }
        return payload + prm.header;
    }

    void Send(uint32_t from, uint32_t to, const DlcpHdr& hd, uint32_t size, uint8_t tos,
              const uint32_t* extra, uint32_t nExtra)
    {
        static uint8_t buf[65536];
        std::memcpy(buf, &hd, sizeof hd);
        if (nExtra)
        {
            std::memcpy(buf + sizeof hd, extra, nExtra * 4);
        }
        Ptr<Packet> p = Create<Packet>(buf, std::max<uint32_t>(size, sizeof hd + nExtra * 4));
        SocketIpTosTag tag;
        tag.SetTos(tos);
        p->AddPacketTag(tag);
        m_hosts[from].sock->SendTo(p, 0, InetSocketAddress(m_sc->fabric.hostAddr[to], port));
    }

    uint8_t ControlTos() const { return uint8_t(prm.dscp[7] << 2) | prm.ecnProtected; }

    void Control(uint32_t from, uint32_t to, const DlcpHdr& hd, const uint32_t* extra = nullptr,
                 uint32_t nExtra = 0)
    {
        controlSent++;
        Send(from, to, hd, sizeof hd, ControlTos(), extra, nExtra);
    }

    void SendFinish(uint32_t id)
    {
        Out& m = m_out[id];
        const Flow& f = m_sc->flows[id];
        // FINISH travels in the message's own class, behind its data in the same queues
        controlSent++;
        DlcpHdr fin = FinishHdr(uint16_t(f.cls), id, m.npkts, m.round, m.nProt);
        Send(f.src, f.dst, fin, sizeof fin, uint8_t(prm.dscp[f.cls] << 2) | prm.ecnProtected,
             nullptr, 0);
        m.finishEv = Simulator::Schedule(NanoSeconds(int64_t(std::llround(prm.finishTimeoutUs * 1e3))),
                                         &DlcpSender::OnFinishTimeout, this, id);
    }

    void OnFinishTimeout(uint32_t id)
    {
        Out& m = m_out[id];
        if (m.state != AWAITING)
        {
            return;
        }
        if (++m.tries > prm.finishRetries)
        {
            Fail(id);
            return;
        }
        SendFinish(id);
    }

    void Fail(uint32_t id)
    {
        failures++;
        Finish(id);
        m_sc->FlowDone(id, m_sc->flows[id].bytes, true);
    }

    void Finish(uint32_t id)
    {
        Out& m = m_out[id];
        m.state = DONE;
        m.finishEv.Cancel();
        m.retx.clear();
        std::vector<uint32_t>().swap(m.nackRanges);
        auto& act = m_hosts[m_sc->flows[id].src].active;
        act.erase(std::remove(act.begin(), act.end(), id), act.end());
    }

    void OnNack(const DlcpHdr& hd, const uint32_t* ranges)
    {
        uint32_t id = hd.flow;
        Out& m = m_out[id];
        if (m.state == DONE || m.state == IDLE)
        {
            return;
        }
        uint32_t nRanges = hd.nack.rangeCount;
        if (hd.nack.more || !m.nackRanges.empty())
        {  // one part of several: act on the whole NACK once its last part is in
            if (!m.nackRanges.empty() && m.nackRound != hd.nack.round)
            {
                m.nackRanges.clear();  // parts of an older round
            }
            m.nackRound = hd.nack.round;
            m.nackRanges.insert(m.nackRanges.end(), ranges, ranges + 2 * size_t(hd.nack.rangeCount));
            if (hd.nack.more)
            {
                return;
            }
            ranges = m.nackRanges.data();
            nRanges = uint32_t(m.nackRanges.size() / 2);
            multiPartNacks++;
        }
        ActOnNack(id, m, hd, ranges, nRanges);
        m.nackRanges.clear();
    }

    void ActOnNack(uint32_t id, Out& m, const DlcpHdr& hd, const uint32_t* ranges,
                   uint32_t nRanges)
    {
        if (m.state == AWAITING && hd.nack.round == m.round)
        {
            // only rounds in a row that got the receiver no closer count
            uint32_t named = 0;
            for (uint32_t r = 0; r < nRanges; r++)
            {
                named += ranges[2 * r + 1];
            }
            bool stalled = m.round > 0 && hd.nack.neededChunks >= m.lastNeeded && named >= m.lastNamed;
            m.stalled = stalled ? m.stalled + 1 : 0;
            m.lastNeeded = hd.nack.neededChunks;
            m.lastNamed = named;
            if (m.stalled >= prm.maxRounds || m.round >= 0xFFFF)
            {
                Fail(id);
                return;
            }
            m.round++;
            maxRound = std::max(maxRound, m.round);
            m.state = SENDING;
            m.finishEv.Cancel();
            m.neededLeft = hd.nack.neededChunks;
        }
        else if (!(m.state == SENDING && hd.nack.round + 1 == m.round))
        {
            return;  // stale
        }
        std::vector<uint32_t> droppable;
        for (uint32_t r = 0; r < nRanges; r++)
        {
            for (uint32_t s = ranges[2 * r]; s < ranges[2 * r] + ranges[2 * r + 1] && s < m.npkts;
                 s++)
            {
                if (m.queued[s])
                {
                    continue;
                }
                if (m.prot[s])
                {
                    m.queued[s] = 1;
                    m.retx.push_back(s);
                    m.neededLeft--;
                }
                else
                {
                    droppable.push_back(s);
                }
            }
        }
        for (uint32_t s : droppable)
        {
            if (m.neededLeft <= 0)
            {
                break;
            }
            m.queued[s] = 1;
            m.retx.push_back(s);
            m.neededLeft--;
        }
        if (m.retx.empty())
        {  // nothing to resend: just announce the round
            m.state = AWAITING;
            m.tries = 0;
            SendFinish(id);
            return;
        }
        Kick(m_sc->flows[id].src, Simulator::Now());
    }

    uint32_t ChunkBytes(uint32_t id, uint32_t seq) const
    {
        uint64_t off = uint64_t(seq) * prm.payload;
        return uint32_t(std::min<uint64_t>(prm.payload, m_sc->flows[id].bytes - off));
    }

    Scenario* m_sc = nullptr;
    std::vector<Host> m_hosts;
    std::vector<Out> m_out;
    std::unordered_map<Socket*, uint32_t> m_hostOf;
};

}  // namespace dlcpsim
