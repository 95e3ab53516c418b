// DLCP large-scale simulation: the TCP / DCTCP baseline transport.
//
// One persistent TCP connection per ordered host pair that carries traffic,
// opened before the workload starts (as training frameworks keep theirs).
// Messages of a pair are written to its stream one after another, highest
// priority class first (FIFO within a class); a message completes when the
// receiver has read its last byte. The congestion control (NewReno or DCTCP)
// is chosen globally through ns3::TcpL4Protocol::SocketType before Setup.
#pragma once
#include "scenario.h"

#include <deque>
#include <map>

namespace dlcpsim
{

// ns-3's TcpDctcp computes ssthresh = cwnd * (1 - alpha / 2) with no floor, so
// an ECN echo on a connection whose window is about one segment leaves cwnd
// below one segment with nothing in flight: the sender never sends again (seen
// at 144 hosts). Linux floors the DCTCP ssthresh at two segments; so does this.
class TcpDctcpFloor : public TcpDctcp
{
  public:
    static TypeId GetTypeId()
    {
        static TypeId tid = TypeId("dlcpsim::TcpDctcpFloor")
                                .SetParent<TcpDctcp>()
                                .SetGroupName("Internet")
                                .AddConstructor<TcpDctcpFloor>();
        return tid;
    }

    TcpDctcpFloor() = default;

    TcpDctcpFloor(const TcpDctcpFloor& other)
        : TcpDctcp(other)
    {
    }

    std::string GetName() const override { return "TcpDctcpFloor"; }

    uint32_t GetSsThresh(Ptr<const TcpSocketState> tcb, uint32_t bytesInFlight) override
    {
        return std::max(TcpDctcp::GetSsThresh(tcb, bytesInFlight), 2 * tcb->m_segmentSize);
    }

    Ptr<TcpCongestionOps> Fork() override { return CopyObject<TcpDctcpFloor>(this); }
};

class TcpTransport : public Transport
{
  public:
    uint16_t port = 5001;
    bool traceState = false;  // diagnostics: keep each sender's last TCP state for Stuck()

    void Setup(Scenario* sc) override
    {
        m_sc = sc;
        for (uint32_t i = 0; i < sc->flows.size(); i++)
        {
            const Flow& f = sc->flows[i];
            uint64_t key = (uint64_t(f.src) << 32) | f.dst;
            if (m_connOf.find(key) == m_connOf.end())
            {
                m_connOf[key] = m_conns.size();
                m_conns.emplace_back();
                m_conns.back().src = f.src;
                m_conns.back().dst = f.dst;
            }
        }
        uint32_t nHosts = sc->fabric.hosts.GetN();
        for (uint32_t h = 0; h < nHosts; h++)
        {
            Ptr<Socket> s = Socket::CreateSocket(sc->fabric.hosts.Get(h),
                                                 TcpSocketFactory::GetTypeId());
            s->Bind(InetSocketAddress(Ipv4Address::GetAny(), port));
            s->Listen();
            s->SetAcceptCallback(MakeNullCallback<bool, Ptr<Socket>, const Address&>(),
                                 MakeCallback(&TcpTransport::OnAccept, this));
            m_listeners.push_back(s);
        }
        for (uint32_t c = 0; c < m_conns.size(); c++)
        {
            Conn& k = m_conns[c];
            k.tx = Socket::CreateSocket(sc->fabric.hosts.Get(k.src), TcpSocketFactory::GetTypeId());
            k.tx->Bind();
            Address local;
            k.tx->GetSockName(local);
            uint16_t lport = InetSocketAddress::ConvertFrom(local).GetPort();
            m_connByPeer[(uint64_t(sc->fabric.hostAddr[k.src].Get()) << 16) | lport] = c;
            k.tx->SetConnectCallback(MakeCallback(&TcpTransport::OnConnected, this),
                                     MakeCallback(&TcpTransport::OnConnectFailed, this));
            k.tx->SetSendCallback(MakeCallback(&TcpTransport::OnSendSpace, this));
            k.tx->SetCloseCallbacks(MakeCallback(&TcpTransport::OnClosed, this),
                                    MakeCallback(&TcpTransport::OnCloseError, this));
            m_connOfSocket[PeekPointer(k.tx)] = c;
            if (traceState)
            {
                TraceSender(c);
            }
        }
        // connect once the simulation runs (queue discs initialise at start)
        Simulator::ScheduleNow(&TcpTransport::ConnectAll, this);
        if (m_conns.empty())
        {
            sc->Begin();
        }
    }

    void StartFlow(uint32_t id) override
    {
        const Flow& f = m_sc->flows[id];
        Conn& k = m_conns[m_connOf[(uint64_t(f.src) << 32) | f.dst]];
        if (f.bytes == 0)
        {
            m_sc->FlowDone(id, 0, false);
            return;
        }
        k.pending[7 - f.cls].push_back(id);
        TrySend(k);
    }

    uint32_t connected = 0;
    uint32_t connectFailures = 0;
    uint32_t closed = 0, closeErrors = 0;

    // Connections with messages not delivered at the end: "src->dst errno=E
    // unsent=U sent=S received=R" per line (empty when everything arrived).
    std::string Stuck() const
    {
        std::string out;
        for (const Conn& k : m_conns)
        {
            if (k.inStream.empty() && k.curLeft == 0)
            {
                continue;
            }
            Ptr<TcpSocketBase> t = DynamicCast<TcpSocketBase>(k.tx);
            out += std::to_string(k.src) + "->" + std::to_string(k.dst) +
                   " errno=" + std::to_string(int(k.tx->GetErrno())) +
                   " txbuffer=" + std::to_string(t ? t->GetTxBuffer()->Size() : 0) +
                   " sent=" + std::to_string(k.txOffset) +
                   " received=" + std::to_string(k.rxBytes) + " state=" + std::to_string(k.st) +
                   " congstate=" + std::to_string(k.cong) + " cwnd=" + std::to_string(k.cwnd) +
                   " inflight=" + std::to_string(k.inflight) +
                   " rto_us=" + std::to_string(k.rtoUs) + "\n";
        }
        return out;
    }

  private:
    void ConnectAll()
    {
        for (Conn& k : m_conns)
        {
            k.tx->Connect(InetSocketAddress(m_sc->fabric.hostAddr[k.dst], port));
        }
    }

    struct Conn
    {
        uint32_t src = 0, dst = 0;
        Ptr<Socket> tx, rx;
        std::deque<uint32_t> pending[8];  // by band (0 = class 7)
        int64_t cur = -1;                  // message being written
        uint64_t curLeft = 0;
        uint64_t txOffset = 0, rxBytes = 0;
        std::deque<std::pair<uint64_t, uint32_t>> inStream;  // (end offset, flow)
        int st = -1, cong = -1;
        uint32_t cwnd = 0, inflight = 0;
        int64_t rtoUs = -1;
    };

    void OnConnected(Ptr<Socket> s)
    {
        connected++;
        if (connected == m_conns.size())
        {
            // all connections are up: the workload starts one microsecond later
            Simulator::Schedule(MicroSeconds(1), &Scenario::Begin, m_sc);
        }
    }

    void TraceSender(uint32_t c)
    {
        Ptr<Socket> s = m_conns[c].tx;
        s->TraceConnectWithoutContext(
            "State", Callback<void, TcpSocket::TcpStates_t, TcpSocket::TcpStates_t>(
                         [this, c](TcpSocket::TcpStates_t, TcpSocket::TcpStates_t v) {
                             m_conns[c].st = int(v);
                         }));
        s->TraceConnectWithoutContext(
            "CongState",
            Callback<void, TcpSocketState::TcpCongState_t, TcpSocketState::TcpCongState_t>(
                [this, c](TcpSocketState::TcpCongState_t, TcpSocketState::TcpCongState_t v) {
                    m_conns[c].cong = int(v);
                }));
        s->TraceConnectWithoutContext(
            "CongestionWindow", Callback<void, uint32_t, uint32_t>(
                                    [this, c](uint32_t, uint32_t v) { m_conns[c].cwnd = v; }));
        s->TraceConnectWithoutContext(
            "BytesInFlight", Callback<void, uint32_t, uint32_t>(
                                 [this, c](uint32_t, uint32_t v) { m_conns[c].inflight = v; }));
        s->TraceConnectWithoutContext(
            "RTO", Callback<void, Time, Time>(
                       [this, c](Time, Time v) { m_conns[c].rtoUs = v.GetMicroSeconds(); }));
    }

    void OnConnectFailed(Ptr<Socket> s) { connectFailures++; }

    void OnClosed(Ptr<Socket> s) { closed++; }

    void OnCloseError(Ptr<Socket> s) { closeErrors++; }

    void OnAccept(Ptr<Socket> s, const Address& from)
    {
        InetSocketAddress a = InetSocketAddress::ConvertFrom(from);
        auto it = m_connByPeer.find((uint64_t(a.GetIpv4().Get()) << 16) | a.GetPort());
        if (it == m_connByPeer.end())
        {
            return;
        }
        m_conns[it->second].rx = s;
        m_connOfSocket[PeekPointer(s)] = it->second;
        s->SetRecvCallback(MakeCallback(&TcpTransport::OnRecv, this));
    }

    void OnSendSpace(Ptr<Socket> s, uint32_t)
    {
        auto it = m_connOfSocket.find(PeekPointer(s));
        if (it != m_connOfSocket.end())
        {
            TrySend(m_conns[it->second]);
        }
    }

    void TrySend(Conn& k)
    {
        while (true)
        {
            if (k.curLeft == 0)
            {
                int64_t next = -1;
                for (auto& q : k.pending)
                {
                    if (!q.empty())
                    {
                        next = q.front();
                        q.pop_front();
                        break;
                    }
                }
                if (next < 0)
                {
                    return;
                }
                k.cur = next;
                k.curLeft = m_sc->flows[next].bytes;
                k.inStream.emplace_back(k.txOffset + k.curLeft, uint32_t(next));
            }
            uint32_t room = k.tx->GetTxAvailable();
            if (room == 0)
            {
                return;
            }
            uint32_t n = uint32_t(std::min<uint64_t>({k.curLeft, room, 65536}));
            int sent = k.tx->Send(Create<Packet>(n));
            if (sent <= 0)
            {
                return;
            }
            k.curLeft -= sent;
            k.txOffset += sent;
        }
    }

    void OnRecv(Ptr<Socket> s)
    {
        Conn& k = m_conns[m_connOfSocket[PeekPointer(s)]];
        Ptr<Packet> p;
        while ((p = s->Recv()))
        {
            k.rxBytes += p->GetSize();
        }
        while (!k.inStream.empty() && k.rxBytes >= k.inStream.front().first)
        {
            uint32_t id = k.inStream.front().second;
            k.inStream.pop_front();
            m_sc->FlowDone(id, 0, false);
        }
    }

    Scenario* m_sc = nullptr;
    std::vector<Conn> m_conns;
    std::vector<Ptr<Socket>> m_listeners;
    std::map<uint64_t, uint32_t> m_connOf;      // (src << 32 | dst) -> conn
    std::map<uint64_t, uint32_t> m_connByPeer;  // (src ip << 16 | src port) -> conn
    std::map<Socket*, uint32_t> m_connOfSocket;
};

}  // namespace dlcpsim
