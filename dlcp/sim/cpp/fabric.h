// DLCP large-scale simulation: the fabric (routing, switch queues, leaf-spine builder).
// Loaded at run time with cppyy (dlcp/sim/engine.py); everything per packet is C++.
#pragma once
#include "ns3/core-module.h"
#include "ns3/internet-module.h"
#include "ns3/network-module.h"
#include "ns3/point-to-point-module.h"
#include "ns3/traffic-control-module.h"

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace dlcpsim
{
using namespace ns3;

inline uint64_t Mix64(uint64_t x)
{  // splitmix64 finaliser: a fast, well-spread hash
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

// Two-tier leaf-spine routing. Hosts send everything to their leaf; a leaf
// delivers to its own hosts and sends the rest up to a spine chosen per flow
// (hash of the 5-tuple: ECMP) or per packet (uniform random: spraying); a
// spine sends to the destination host's leaf.
class LeafSpineRouting : public Ipv4RoutingProtocol
{
  public:
    static TypeId GetTypeId()
    {
        static TypeId tid = TypeId("dlcpsim::LeafSpineRouting")
                                .SetParent<Ipv4RoutingProtocol>()
                                .SetGroupName("Internet");
        return tid;
    }

    void AddHostRoute(Ipv4Address dst, uint32_t iface, Ipv4Address nextHop)
    {
        m_down[dst.Get()] = Hop{iface, nextHop};
    }

    void AddUplink(uint32_t iface, Ipv4Address nextHop) { m_up.push_back(Hop{iface, nextHop}); }

    void SetSpray(bool spray, uint64_t salt)
    {
        m_spray = spray;
        m_salt = salt;
        m_rng = Mix64(salt ^ 0x5eed);
    }

    Ptr<Ipv4Route> RouteOutput(Ptr<Packet> p,
                               const Ipv4Header& h,
                               Ptr<NetDevice> oif,
                               Socket::SocketErrno& err) override
    {
        Ptr<Ipv4Route> r = Lookup(p, h);
        err = r ? Socket::ERROR_NOTERROR : Socket::ERROR_NOROUTETOHOST;
        return r;
    }

    bool RouteInput(Ptr<const Packet> p,
                    const Ipv4Header& h,
                    Ptr<const NetDevice> idev,
                    const UnicastForwardCallback& ucb,
                    const MulticastForwardCallback& mcb,
                    const LocalDeliverCallback& lcb,
                    const ErrorCallback& ecb) override
    {
        uint32_t iif = m_ipv4->GetInterfaceForDevice(idev);
        if (m_ipv4->IsDestinationAddress(h.GetDestination(), iif))
        {
            if (lcb.IsNull())
            {
                return false;
            }
            lcb(p, h, iif);
            return true;
        }
        Ptr<Ipv4Route> r = Lookup(p, h);
        if (!r)
        {
            return false;
        }
        ucb(r, p, h);
        return true;
    }

    void NotifyInterfaceUp(uint32_t) override {}
    void NotifyInterfaceDown(uint32_t) override {}
    void NotifyAddAddress(uint32_t, Ipv4InterfaceAddress) override {}
    void NotifyRemoveAddress(uint32_t, Ipv4InterfaceAddress) override {}
    void SetIpv4(Ptr<Ipv4> ipv4) override { m_ipv4 = ipv4; }
    void PrintRoutingTable(Ptr<OutputStreamWrapper> stream, Time::Unit) const override
    {
        *stream->GetStream() << "LeafSpineRouting: " << m_down.size() << " host routes, "
                             << m_up.size() << " uplinks\n";
    }

  private:
    struct Hop
    {
        uint32_t iface;
        Ipv4Address nextHop;
    };

    Ptr<Ipv4Route> Make(const Hop& hop, const Ipv4Header& h) const
    {
        Ptr<Ipv4Route> r = Create<Ipv4Route>();
        r->SetDestination(h.GetDestination());
        r->SetGateway(hop.nextHop);
        r->SetOutputDevice(m_ipv4->GetNetDevice(hop.iface));
        r->SetSource(m_ipv4->GetAddress(hop.iface, 0).GetLocal());
        return r;
    }

    Ptr<Ipv4Route> Lookup(Ptr<const Packet> p, const Ipv4Header& h)
    {
        auto it = m_down.find(h.GetDestination().Get());
        if (it != m_down.end())
        {
            return Make(it->second, h);
        }
        if (m_up.empty())
        {
            return nullptr;
        }
        if (m_up.size() == 1)
        {
            return Make(m_up[0], h);
        }
        uint64_t pick;
        if (m_spray)
        {
            m_rng = Mix64(m_rng);
            pick = m_rng;
        }
        else
        {
            uint8_t ports[4] = {0, 0, 0, 0};
            if (p && p->GetSize() >= 4)
            {
                p->CopyData(ports, 4);  // TCP and UDP both start with the two ports
            }
            uint64_t key = (uint64_t(h.GetSource().Get()) << 32) | h.GetDestination().Get();
            uint64_t l4 = (uint64_t(h.GetProtocol()) << 32) | (uint64_t(ports[0]) << 24) |
                          (uint64_t(ports[1]) << 16) | (uint64_t(ports[2]) << 8) | ports[3];
            pick = Mix64(Mix64(key ^ m_salt) ^ l4);
        }
        return Make(m_up[pick % m_up.size()], h);
    }

    Ptr<Ipv4> m_ipv4;
    std::unordered_map<uint32_t, Hop> m_down;
    std::vector<Hop> m_up;
    bool m_spray = false;
    uint64_t m_salt = 0;
    uint64_t m_rng = 1;
};

// A switch egress port of the DLCP profile: up to 8 strict-priority bands
// (class from the DSCP), one shared buffer of `limit` packets, and drop-eligible
// packets (ECN codepoint `ecnDroppable`, Not-ECT by default) refused once their
// band holds `deLimit` packets -- WRED-by-colour with a low threshold.
// With priority off everything shares one band; with selective drop off every
// packet is treated as protected (same threshold for all).
class DlcpQueueDisc : public QueueDisc
{
  public:
    static TypeId GetTypeId()
    {
        static TypeId tid = TypeId("dlcpsim::DlcpQueueDisc")
                                .SetParent<QueueDisc>()
                                .SetGroupName("TrafficControl")
                                .AddConstructor<DlcpQueueDisc>();
        return tid;
    }

    DlcpQueueDisc()
        : QueueDisc(QueueDiscSizePolicy::MULTIPLE_QUEUES, QueueSizeUnit::PACKETS)
    {
    }

    void Configure(uint32_t limit,
                   uint32_t deLimit,
                   bool priority,
                   bool selective,
                   uint8_t ecnDroppable,
                   const std::vector<int>& classOfDscp)
    {
        m_limit = limit;
        m_deLimit = deLimit;
        m_priority = priority;
        m_selective = selective;
        m_ecnDroppable = ecnDroppable;
        m_classOfDscp = classOfDscp;
    }

    uint64_t dropsDropEligible = 0;
    uint64_t dropsProtected = 0;

  private:
    bool DoEnqueue(Ptr<QueueDiscItem> item) override
    {
        uint8_t tos = 0;
        item->GetUint8Value(QueueItem::IP_DSFIELD, tos);
        uint32_t band = 0;
        if (m_priority)
        {
            int cls = m_classOfDscp.size() == 64 ? m_classOfDscp[tos >> 2] : 0;
            band = 7 - uint32_t(cls < 0 ? 0 : cls);  // band 0 is served first
        }
        bool droppable = m_selective && (tos & 3) == m_ecnDroppable;
        Ptr<InternalQueue> q = GetInternalQueue(band);
        if (GetNPackets() >= m_limit)
        {
            (droppable ? dropsDropEligible : dropsProtected)++;
            DropBeforeEnqueue(item, "buffer full");
            return false;
        }
        if (droppable && q->GetNPackets() >= m_deLimit)
        {
            dropsDropEligible++;
            DropBeforeEnqueue(item, "drop-eligible over threshold");
            return false;
        }
        return q->Enqueue(item);
    }

    Ptr<QueueDiscItem> DoDequeue() override
    {
        for (std::size_t i = 0; i < GetNInternalQueues(); i++)
        {
            Ptr<QueueDiscItem> item = GetInternalQueue(i)->Dequeue();
            if (item)
            {
                return item;
            }
        }
        return nullptr;
    }

    Ptr<const QueueDiscItem> DoPeek() override
    {
        for (std::size_t i = 0; i < GetNInternalQueues(); i++)
        {
            Ptr<const QueueDiscItem> item = GetInternalQueue(i)->Peek();
            if (item)
            {
                return item;
            }
        }
        return nullptr;
    }

    bool CheckConfig() override
    {
        if (GetNInternalQueues() == 0)
        {
            for (int i = 0; i < 8; i++)
            {
                AddInternalQueue(CreateObjectWithAttributes<DropTailQueue<QueueDiscItem>>(
                    "MaxSize",
                    QueueSizeValue(QueueSize(QueueSizeUnit::PACKETS, m_limit + 1))));
            }
        }
        return m_limit > 0;
    }

    void InitializeParams() override {}

    uint32_t m_limit = 100;
    uint32_t m_deLimit = 20;
    bool m_priority = true;
    bool m_selective = true;
    uint8_t m_ecnDroppable = 0;
    std::vector<int> m_classOfDscp;
};

}  // namespace dlcpsim
