// DLCP large-scale simulation: the DLCP transport (packetized UDP).
//
// Mirrors dlcp.proto: every data packet carries (message, chunk, total) so it
// can land in any order; its IPv4 TOS byte is DSCP(priority class) plus an ECN
// codepoint saying protected or drop-eligible. Sender: one pump per host sends
// at most at line rate, picks the highest-class message allowed by its pacing
// rate, sends FINISH(round, protected chunks) when a round is out (in the
// message's class, so it queues behind the data) and repeats it on a timeout.
// Receiver (the rules of dlcp.proto.recovery's ReceiverRecovery): completes a
// message once every chunk arrived, or, after FINISH, once all protected chunks
// and at least (1-p) of the bytes arrived and no data came for reorder_grace (so
// data still in flight is not declared lost; at once if it NACKed before); then
// it sends STOP and accounts the missing bytes as zero-filled loss. A FINISH that
// leaves it short arms a NACK reorder_grace later, sent once the message and its
// sender were quiet that long (the sender's wait capped at nack_timeout after
// the FINISH) and repeated every nack_timeout: the missing ranges and how many
// chunks the bound still needs; the sender resends
// the missing protected chunks plus enough drop-eligible ones (as protected
// packets). Other control packets (STOP, NACK, RATE) use the top class.
// Receiver-driven pacing, per (sender, receiver) pair as in dlcp.proto: each
// receiver gives every sender with a message in progress an equal share of
// pacing_target x its downlink (wire bytes) and tells it (RATE) at most once
// per rate interval when the share moved by > 10 %; a sender paces all its
// messages to that receiver together, starting new ones at the pair's rate.
#pragma once
#include <cstdio>
#include <string>
#include "dlcp_sender.h"

namespace dlcpsim
{

class DlcpTransport : public DlcpSender
{
  public:
    void Setup(Scenario* sc) override
    {
        m_sc = sc;
        uint32_t n = sc->fabric.hosts.GetN();
        m_hosts.resize(n);
        m_out.resize(sc->flows.size());
        for (uint32_t h = 0; h < n; h++)
        {
            Ptr<Socket> s = Socket::CreateSocket(sc->fabric.hosts.Get(h),
                                                 UdpSocketFactory::GetTypeId());
            s->Bind(InetSocketAddress(Ipv4Address::GetAny(), port));
            s->SetRecvCallback(MakeCallback(&DlcpTransport::OnRecv, this));
            m_hosts[h].sock = s;
            m_hostOf[PeekPointer(s)] = h;
        }
        Simulator::Schedule(MicroSeconds(1), &Scenario::Begin, sc);
    }

    // The receivers' inputs and decisions, kept when traceReceiver is set, so that
    // dlcp.proto's receiver can be driven through the same inputs at the same times
    // and its decisions compared (tests/sim/test_sim_differential.py; its timers are
    // its own). One row per event:
    //   'D' data arrived:       a = seq, b = header flags (1 protected, 2 RETRANSMIT)
    //   'F' FINISH arrived:     a = round, b = protected chunks, c = total chunks
    //   'N' NACK sent:          a = round, b = chunks still needed, c = chunks missing
    //   'S' completed (STOP):   c = bytes lost
    struct RxEvent
    {
        int64_t ns;
        uint32_t host, flow;
        char kind;
        uint32_t a, b;
        uint64_t c;
    };

    bool traceReceiver = false;
    std::vector<RxEvent> rxTrace;

    // The trace as CSV (with each traced flow's src, dst, bytes and p first, kind 'M');
    // false if the file cannot be written.
    bool WriteReceiverTrace(const std::string& path) const
    {
        FILE* f = std::fopen(path.c_str(), "w");
        if (!f)
        {
            return false;
        }
        std::fprintf(f, "ns,host,flow,kind,a,b,c,p\n");
        for (uint32_t id = 0; id < m_sc->flows.size(); id++)
        {
            const Flow& fl = m_sc->flows[id];
            std::fprintf(f, "0,%u,%u,M,%u,%u,%llu,%.9g\n", fl.dst, id, fl.src, fl.dst,
                         (unsigned long long)fl.bytes, fl.p);
        }
        for (const RxEvent& e : rxTrace)
        {
            std::fprintf(f, "%lld,%u,%u,%c,%u,%u,%llu,\n", (long long)e.ns, e.host, e.flow,
                         e.kind, e.a, e.b, (unsigned long long)e.c);
        }
        return std::fclose(f) == 0;
    }

  private:
    void Trace(uint32_t h, uint32_t id, char kind, uint32_t a = 0, uint32_t b = 0,
               uint64_t c = 0)
    {
        if (traceReceiver)
        {
            rxTrace.push_back({Simulator::Now().GetNanoSeconds(), h, id, kind, a, b, c});
        }
    }

    // ---- receiving -------------------------------------------------------------

    void OnRecv(Ptr<Socket> s)
    {
        uint32_t h = m_hostOf[PeekPointer(s)];
        Ptr<Packet> p;
        static uint8_t buf[65536];
        while ((p = s->Recv()))
        {
            uint32_t n = p->CopyData(buf, std::min<uint32_t>(p->GetSize(), sizeof buf));
            if (n < sizeof(DlcpHdr))
            {
                continue;
            }
            DlcpHdr hd;
            std::memcpy(&hd, buf, sizeof hd);
            if (hd.flow >= m_sc->flows.size())
            {
                continue;
            }
            switch (hd.type)
            {
            case D_DATA:
                OnData(h, hd);
                break;
            case D_FINISH:
                OnFinish(h, hd);
                break;
            case D_NACK:
                OnNack(hd, reinterpret_cast<const uint32_t*>(buf + sizeof hd));
                break;
            case D_STOP:
                if (m_out[hd.flow].state != DONE)
                {
                    Finish(hd.flow);
                }
                break;
            case D_RATE:
            {
                Peer& peer = m_hosts[h].peers[m_sc->flows[hd.flow].dst];
                peer.rate = std::max(prm.minRate, double(hd.rate.kBytesPerS) * 1e3);
                Time sooner = Simulator::Now() + Seconds(1500.0 / peer.rate);
                if (sooner < peer.nextTime)
                {  // a faster rate: the pump may have gone to sleep on the old one
                    peer.nextTime = sooner;
                    Kick(h, sooner);
                }
            }
                break;
            }
        }
    }


    In& Incoming(uint32_t h, uint32_t id)
    {
        Host& host = m_hosts[h];
        auto it = host.in.find(id);
        if (it != host.in.end())
        {
            return it->second;
        }
        In& r = host.in[id];
        const Flow& f = m_sc->flows[id];
        r.npkts = uint32_t((f.bytes + prm.payload - 1) / prm.payload);
        r.requiredBytes = f.bytes - uint64_t(std::floor(f.p * double(f.bytes) + 1e-9));
        r.got.assign(r.npkts, 0);
        host.activeIn.push_back(id);
        host.activeSenders[f.src]++;
        RateChanged(h);
        return r;
    }

    void OnData(uint32_t h, const DlcpHdr& hd)
    {
        Trace(h, hd.flow, 'D', hd.seq, hd.flags);
        m_hosts[h].lastData[m_sc->flows[hd.flow].src] = Simulator::Now();
        In& r = Incoming(h, hd.flow);
        if (r.done || hd.seq >= r.npkts)
        {
            return;
        }
        r.lastActivity = Simulator::Now();
        if (r.got[hd.seq])
        {
            return;
        }
        r.got[hd.seq] = 1;
        r.nGot++;
        r.gotBytes += ChunkBytes(hd.flow, hd.seq);
        if (hd.flags & 1)
        {
            r.nProtGot++;
        }
        CheckComplete(h, hd.flow, r);
    }

    Time Grace() const { return NanoSeconds(int64_t(std::llround(prm.reorderGraceUs * 1e3))); }

    Time NackTimeout() const { return NanoSeconds(int64_t(std::llround(prm.nackTimeoutUs * 1e3))); }

    void OnFinish(uint32_t h, const DlcpHdr& hd)
    {
        Trace(h, hd.flow, 'F', hd.finish.round, hd.finish.protectedChunks, hd.totalChunks);
        In& r = Incoming(h, hd.flow);
        const Flow& f = m_sc->flows[hd.flow];
        if (r.done)
        {
            Control(f.dst, f.src, StopHdr(hd.flow));
            return;
        }
        r.finishSeen = true;
        r.finishProt = hd.finish.protectedChunks;
        r.round = hd.finish.round;
        if (!r.finishWaiting)
        {
            r.finishWaiting = true;
            r.finishAt = Simulator::Now();
        }
        if (CheckComplete(h, hd.flow, r) || r.settleEv.IsPending())
        {
            return;  // (settling: complete by the bound, no NACK)
        }
        bool roundNacked = r.nacked && hd.finish.round <= r.nackRound;
        if (!r.nackEv.IsPending() || !roundNacked)
        {  // the data behind this FINISH gets its grace before the NACK
            r.nackEv.Cancel();
            r.nackEv = Simulator::Schedule(Grace(), &DlcpTransport::OnNackDue, this, h, hd.flow);
        }
        else
        {  // the round's NACK went out: its repeat timer stands
            r.finishWaiting = false;
        }
    }

    // the NACK is due: sent once the message and its sender were quiet for the grace
    // (the sender's wait capped at nack_timeout after the FINISH), then repeated
    // every nack_timeout until the sender answers with a new round
    void OnNackDue(uint32_t h, uint32_t id)
    {
        In& r = m_hosts[h].in[id];
        if (r.done)
        {
            return;
        }
        const Flow& f = m_sc->flows[id];
        auto active = m_hosts[h].lastData.find(f.src);
        Time quiet = r.lastActivity + Grace();
        if (active != m_hosts[h].lastData.end())
        {
            Time sender = active->second + Grace();
            if (r.finishWaiting)
            {
                sender = std::min(sender, r.finishAt + NackTimeout());
            }
            quiet = std::max(quiet, sender);
        }
        if (Simulator::Now() < quiet)
        {
            r.nackEv = Simulator::Schedule(quiet - Simulator::Now(), &DlcpTransport::OnNackDue,
                                           this, h, id);
            return;
        }
        r.nacked = true;
        r.nackRound = r.round;
        r.finishWaiting = false;
        SendNack(h, id);
        if (r.nGot == 0)
        {  // NACKed whole: as dlcp.proto's receiver (orphans.py), which knows nothing
            // of a message it has no data of, it keeps no FINISH and repeats nothing
            // (the sender's next FINISH asks again)
            r.finishSeen = false;
            return;
        }
        r.nackEv = Simulator::Schedule(NackTimeout(), &DlcpTransport::OnNackDue, this, h, id);
    }

    void OnSettled(uint32_t h, uint32_t id)
    {
        In& r = m_hosts[h].in[id];
        if (!r.done)
        {
            CheckComplete(h, id, r);
        }
    }

    // complete: every chunk; or, after FINISH, every protected chunk and the bound's
    // share of the bytes, once no data came for the reorder grace (so that data
    // still in flight lands) unless a NACK was sent (it waited the grace before)
    bool CheckComplete(uint32_t h, uint32_t id, In& r)
    {
        if (r.nGot != r.npkts)
        {
            if (!(r.finishSeen && r.gotBytes >= r.requiredBytes && r.nProtGot >= r.finishProt))
            {
                return false;
            }
            Time quiet = r.lastActivity + Grace();
            if (!r.nacked && Simulator::Now() < quiet)
            {
                r.nackEv.Cancel();  // the bound is met: no NACK while settling
                r.settleEv.Cancel();
                r.settleEv = Simulator::Schedule(quiet - Simulator::Now(),
                                                 &DlcpTransport::OnSettled, this, h, id);
                return false;
            }
        }
        r.done = true;
        r.nackEv.Cancel();
        r.settleEv.Cancel();
        const Flow& f = m_sc->flows[id];
        Control(f.dst, f.src, StopHdr(id));
        uint64_t lost = 0;
        for (uint32_t s = 0; s < r.npkts; s++)
        {
            if (!r.got[s])
            {
                lost += ChunkBytes(id, s);
            }
        }
        auto& act = m_hosts[h].activeIn;
        auto as = m_hosts[h].activeSenders.find(f.src);
        if (as != m_hosts[h].activeSenders.end() && --as->second == 0)
        {
            m_hosts[h].activeSenders.erase(as);
        }
        act.erase(std::remove(act.begin(), act.end(), id), act.end());
        RateChanged(h);
        Trace(h, id, 'S', 0, 0, lost);
        m_sc->FlowDone(id, lost, false);
        std::vector<uint8_t>().swap(r.got);
        return true;
    }

    void SendNack(uint32_t h, uint32_t id)
    {
        In& r = m_hosts[h].in[id];
        if (r.done)
        {
            return;
        }
        const Flow& f = m_sc->flows[id];
        std::vector<uint32_t> ranges;
        for (uint32_t s = 0; s < r.npkts;)
        {
            if (r.got[s])
            {
                s++;
                continue;
            }
            uint32_t e = s;
            while (e < r.npkts && !r.got[e])
            {
                e++;
            }
            ranges.push_back(s);
            ranges.push_back(e - s);
            s = e;
        }
        // chunks still needed for the bound (full-size chunks: conservative); with no
        // data yet, everything (a real receiver knows the message's size only from
        // its data: dlcp.proto's orphan FINISH NACK asks for all of it)
        uint64_t missing = r.requiredBytes > r.gotBytes ? r.requiredBytes - r.gotBytes : 0;
        uint32_t needed = r.nGot == 0 ? r.npkts : uint32_t((missing + prm.payload - 1) / prm.payload);
        uint64_t missingChunks = 0;
        for (uint32_t i = 1; i < ranges.size(); i += 2)
        {
            missingChunks += ranges[i];
        }
        Trace(h, id, 'N', r.round, needed, missingChunks);
        const uint32_t perPart = 170;  // wire.MAX_NACK_RANGES
        uint32_t nRanges = ranges.size() / 2;
        for (uint32_t first = 0; first < nRanges || first == 0; first += perPart)
        {
            uint32_t n = std::min(perPart, nRanges - first);
            uint32_t more = first + n < nRanges ? 1 : 0;
            Control(f.dst, f.src, NackHdr(id, r.npkts, r.round, needed, n, more != 0),
                    ranges.data() + 2 * first, 2 * n);
            if (nRanges == 0)
            {
                break;
            }
        }
    }

    // ---- receiver-driven pacing ---------------------------------------------

    void RateChanged(uint32_t h)
    {
        if (!prm.pacing)
        {
            return;
        }
        Host& host = m_hosts[h];
        if (host.rateEv.IsPending())
        {
            return;
        }
        Time at = std::max(Simulator::Now(),
                           host.lastRateUpdate + NanoSeconds(int64_t(std::llround(prm.rateIntervalUs * 1e3))));
        host.rateEv = Simulator::Schedule(at - Simulator::Now(), &DlcpTransport::RateUpdate,
                                          this, h);
    }

    void RateUpdate(uint32_t h)
    {
        Host& host = m_hosts[h];
        host.lastRateUpdate = Simulator::Now();
        if (host.activeSenders.empty())
        {
            return;
        }
        // rates are wire bytes per second (the sender paces packets with their headers)
        double share = prm.pacingTarget * prm.hostGbps * 1e9 / 8 / host.activeSenders.size();
        for (const auto& [src, n] : host.activeSenders)
        {
            double& last = host.lastRate[src];
            if (last > 0 && std::fabs(share - last) < 0.1 * last)
            {
                continue;
            }
            last = share;
            uint32_t id = 0;  // any message of this sender names the pair
            for (uint32_t m : host.activeIn)
            {
                if (m_sc->flows[m].src == src)
                {
                    id = m;
                    break;
                }
            }
            Control(h, src, RateHdr(id, uint32_t(share / 1e3)));
        }
    }
};

}  // namespace dlcpsim
