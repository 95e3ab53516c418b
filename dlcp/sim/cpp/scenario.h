// DLCP large-scale simulation: network construction and the workload DAG.
#pragma once
#include "fabric.h"

#include <cstdio>
#include <memory>

namespace dlcpsim
{

// Switch egress queue kinds.
enum QueueKind
{
    QUEUE_FIFO = 0,  // drop-tail FIFO (TCP)
    QUEUE_RED = 1,   // RED with ECN marking, DCTCP-style thresholds (DCTCP)
    QUEUE_DLCP = 2   // strict priority + selective drop (DLCP)
};

struct FabricConfig
{
    uint32_t nLeaves = 9;
    uint32_t nSpines = 4;
    std::vector<uint32_t> hostLeaf;  // leaf index of every host
    double hostGbps = 100;
    double fabricGbps = 100;
    double linkDelayUs = 1.0;
    uint32_t bufferPackets = 300;
    int queueKind = QUEUE_FIFO;
    uint32_t redMinTh = 60;
    uint32_t redMaxTh = 180;
    uint32_t deLimit = 60;
    bool priority = true;
    bool selective = true;
    bool spray = false;
    std::vector<int> classOfDscp;  // 64 entries
    uint8_t ecnDroppable = 0;
    uint64_t seed = 1;
};

class Fabric
{
  public:
    NodeContainer hosts, leaves, spines;
    std::vector<Ipv4Address> hostAddr;
    std::vector<Ptr<QueueDisc>> switchQueues;

    void Build(const FabricConfig& c)
    {
        uint32_t nHosts = c.hostLeaf.size();
        hosts.Create(nHosts);
        leaves.Create(c.nLeaves);
        spines.Create(c.nSpines);
        InternetStackHelper stack;
        stack.Install(hosts);
        stack.Install(leaves);
        stack.Install(spines);

        PointToPointHelper edge, core;
        edge.SetDeviceAttribute("DataRate", DataRateValue(DataRate(c.hostGbps * 1e9)));
        core.SetDeviceAttribute("DataRate", DataRateValue(DataRate(c.fabricGbps * 1e9)));
        for (PointToPointHelper* h : {&edge, &core})
        {
            h->SetChannelAttribute("Delay", TimeValue(NanoSeconds(int64_t(c.linkDelayUs * 1e3))));
            h->SetQueue("ns3::DropTailQueue<Packet>", "MaxSize", StringValue("1p"));
        }

        Ipv4AddressHelper addr("10.0.0.0", "255.255.255.252");
        std::vector<std::pair<uint32_t, uint32_t>> hostLink(nHosts);  // (host iface, leaf iface)
        std::vector<Ipv4Address> leafSideOfHost(nHosts);
        for (uint32_t h = 0; h < nHosts; h++)
        {
            Ptr<Node> leaf = leaves.Get(c.hostLeaf[h]);
            NetDeviceContainer d = edge.Install(hosts.Get(h), leaf);
            InstallQueue(d.Get(0), c, /*host=*/true);
            InstallQueue(d.Get(1), c, false);
            Ipv4InterfaceContainer ifc = addr.Assign(d);
            addr.NewNetwork();
            hostAddr.push_back(ifc.GetAddress(0));
            leafSideOfHost[h] = ifc.GetAddress(1);
        }
        // fabric links: leaf l <-> spine s
        std::vector<std::vector<Ipv4InterfaceContainer>> up(c.nLeaves);
        for (uint32_t l = 0; l < c.nLeaves; l++)
        {
            for (uint32_t s = 0; s < c.nSpines; s++)
            {
                NetDeviceContainer d = core.Install(leaves.Get(l), spines.Get(s));
                InstallQueue(d.Get(0), c, false);
                InstallQueue(d.Get(1), c, false);
                up[l].push_back(addr.Assign(d));
                addr.NewNetwork();
            }
        }

        // routing: our leaf-spine protocol replaces the stack's default on every node
        auto install = [&](Ptr<Node> n, uint64_t salt) {
            Ptr<LeafSpineRouting> r = CreateObject<LeafSpineRouting>();
            Ptr<Ipv4> ip = n->GetObject<Ipv4>();
            ip->SetRoutingProtocol(r);
            r->SetSpray(c.spray, Mix64(c.seed * 1000003ULL + salt));
            return r;
        };
        for (uint32_t h = 0; h < nHosts; h++)
        {
            Ptr<Node> n = hosts.Get(h);
            Ptr<LeafSpineRouting> r = install(n, n->GetId());
            r->AddUplink(1, leafSideOfHost[h]);
        }
        for (uint32_t l = 0; l < c.nLeaves; l++)
        {
            Ptr<Node> n = leaves.Get(l);
            Ptr<Ipv4> ip = n->GetObject<Ipv4>();
            Ptr<LeafSpineRouting> r = install(n, n->GetId());
            for (uint32_t h = 0; h < nHosts; h++)
            {
                if (c.hostLeaf[h] == l)
                {
                    r->AddHostRoute(hostAddr[h], ip->GetInterfaceForAddress(leafSideOfHost[h]),
                                    hostAddr[h]);
                }
            }
            for (uint32_t s = 0; s < c.nSpines; s++)
            {
                r->AddUplink(ip->GetInterfaceForAddress(up[l][s].GetAddress(0)),
                             up[l][s].GetAddress(1));
            }
        }
        for (uint32_t s = 0; s < c.nSpines; s++)
        {
            Ptr<Node> n = spines.Get(s);
            Ptr<Ipv4> ip = n->GetObject<Ipv4>();
            Ptr<LeafSpineRouting> r = install(n, n->GetId());
            for (uint32_t h = 0; h < nHosts; h++)
            {
                Ipv4InterfaceContainer& link = up[c.hostLeaf[h]][s];
                r->AddHostRoute(hostAddr[h], ip->GetInterfaceForAddress(link.GetAddress(1)),
                                link.GetAddress(0));
            }
        }
    }

    uint64_t Drops() const
    {
        uint64_t n = 0;
        for (const auto& q : switchQueues)
        {
            n += q->GetStats().nTotalDroppedPackets;
        }
        return n;
    }

    uint64_t EcnMarks() const
    {
        uint64_t n = 0;
        for (const auto& q : switchQueues)
        {
            n += q->GetStats().GetNMarkedPackets(RedQueueDisc::UNFORCED_MARK) +
                 q->GetStats().GetNMarkedPackets(RedQueueDisc::FORCED_MARK);
        }
        return n;
    }

    uint64_t DlcpDrops(bool dropEligible) const
    {
        uint64_t n = 0;
        for (const auto& q : switchQueues)
        {
            Ptr<DlcpQueueDisc> d = DynamicCast<DlcpQueueDisc>(q);
            if (d)
            {
                n += dropEligible ? d->dropsDropEligible : d->dropsProtected;
            }
        }
        return n;
    }

  private:
    void InstallQueue(Ptr<NetDevice> dev, const FabricConfig& c, bool host)
    {
        TrafficControlHelper tch;
        if (host)
        {  // a NIC: the sending stack blocks rather than drops
            tch.SetRootQueueDisc("ns3::FifoQueueDisc", "MaxSize", StringValue("100000p"));
            tch.Install(dev);
            return;
        }
        QueueSize size(QueueSizeUnit::PACKETS, c.bufferPackets);
        if (c.queueKind == QUEUE_RED)
        {
            Ptr<PointToPointNetDevice> p2p = DynamicCast<PointToPointNetDevice>(dev);
            DataRateValue rate;
            p2p->GetAttribute("DataRate", rate);
            // DCTCP's marking (RFC 8257): every ECT packet that finds the instantaneous
            // queue at K or more is marked (MinTh = MaxTh = K, QW = 1, not gentle);
            // ns-3's RED defaults (LInterm 50, gentle) would mark ~1 % of them
            tch.SetRootQueueDisc("ns3::RedQueueDisc", "UseEcn", BooleanValue(true),
                                 "UseHardDrop", BooleanValue(false), "QW", DoubleValue(1.0),
                                 "Gentle", BooleanValue(false), "Wait", BooleanValue(false),
                                 "LInterm", DoubleValue(1.0),
                                 "MeanPktSize", UintegerValue(1500), "MinTh",
                                 DoubleValue(c.redMinTh), "MaxTh", DoubleValue(c.redMaxTh),
                                 "MaxSize", QueueSizeValue(size), "LinkBandwidth", rate,
                                 "LinkDelay", TimeValue(NanoSeconds(int64_t(c.linkDelayUs * 1e3))));
        }
        else if (c.queueKind == QUEUE_DLCP)
        {
            DlcpQueueDisc::GetTypeId();
            tch.SetRootQueueDisc("dlcpsim::DlcpQueueDisc");
        }
        else
        {
            tch.SetRootQueueDisc("ns3::FifoQueueDisc", "MaxSize", QueueSizeValue(size));
        }
        QueueDiscContainer qs = tch.Install(dev);
        Ptr<DlcpQueueDisc> d = DynamicCast<DlcpQueueDisc>(qs.Get(0));
        if (d)
        {
            d->Configure(c.bufferPackets, c.deLimit, c.priority, c.selective, c.ecnDroppable,
                         c.classOfDscp);
        }
        switchQueues.push_back(qs.Get(0));
    }
};

// One message of the workload: `bytes` from host `src` to host `dst`, started
// when group `after` has completed (or at the beginning if after < 0); its
// completion counts towards group `group`.
struct Flow
{
    uint32_t src = 0, dst = 0;
    uint64_t bytes = 0;
    int cls = 0;       // priority class 0..7 (7 = served first)
    double p = 0;      // loss bound (DLCP)
    int32_t after = -1;
    int32_t group = -1;
    double start = -1, end = -1;
    uint64_t lostBytes = 0;
    uint32_t retransmitted = 0;  // packets
    bool failed = false;
};

class Scenario;

class Transport
{
  public:
    virtual ~Transport() = default;
    virtual void Setup(Scenario* sc) = 0;   // call sc->Begin() when ready
    virtual void StartFlow(uint32_t id) = 0;
};

class Scenario
{
  public:
    Fabric fabric;
    std::vector<Flow> flows;
    uint32_t done = 0;
    double beginAt = -1;
    Transport* transport = nullptr;

    uint32_t AddFlow(uint32_t src, uint32_t dst, uint64_t bytes, int cls, double p,
                     int32_t after, int32_t group)
    {
        Flow f;
        f.src = src;
        f.dst = dst;
        f.bytes = bytes;
        f.cls = cls;
        f.p = p;
        f.after = after;
        f.group = group;
        flows.push_back(f);
        return flows.size() - 1;
    }

    // Build the fabric, hand the flows to `t` and run until every flow is done
    // or `limitS` seconds of simulated time passed. Returns completed flows.
    uint32_t Run(const FabricConfig& c, Transport* t, double limitS)
    {
        fabric.Build(c);
        int32_t nGroups = 0;
        for (const Flow& f : flows)
        {
            nGroups = std::max(nGroups, std::max(f.after, f.group) + 1);
        }
        m_groupLeft.assign(nGroups, 0);
        m_waiting.assign(nGroups, {});
        for (uint32_t i = 0; i < flows.size(); i++)
        {
            if (flows[i].group >= 0)
            {
                m_groupLeft[flows[i].group]++;
            }
            if (flows[i].after >= 0)
            {
                m_waiting[flows[i].after].push_back(i);
            }
        }
        transport = t;
        t->Setup(this);
        Simulator::Stop(Seconds(limitS));
        Simulator::Run();
        return done;
    }

    void Begin()
    {
        beginAt = Simulator::Now().GetSeconds();
        for (uint32_t i = 0; i < flows.size(); i++)
        {
            if (flows[i].after < 0 || m_groupLeft[flows[i].after] == 0)
            {
                StartFlow(i);
            }
        }
    }

    void FlowDone(uint32_t id, uint64_t lostBytes, bool failed)
    {
        Flow& f = flows[id];
        if (f.end >= 0)
        {
            return;
        }
        f.end = Simulator::Now().GetSeconds();
        f.lostBytes = lostBytes;
        f.failed = failed;
        done++;
        if (f.group >= 0 && --m_groupLeft[f.group] == 0)
        {
            for (uint32_t w : m_waiting[f.group])
            {
                StartFlow(w);
            }
        }
        if (done == flows.size())
        {
            Simulator::Stop();
        }
    }

    bool WriteCsv(const std::string& path) const
    {
        FILE* out = std::fopen(path.c_str(), "w");
        if (!out)
        {
            return false;
        }
        std::fprintf(out, "flow,src,dst,bytes,cls,p,group,start,end,lost_bytes,retx_pkts,failed\n");
        for (uint32_t i = 0; i < flows.size(); i++)
        {
            const Flow& f = flows[i];
            std::fprintf(out, "%u,%u,%u,%llu,%d,%.9g,%d,%.9f,%.9f,%llu,%u,%d\n", i, f.src, f.dst,
                         (unsigned long long)f.bytes, f.cls, f.p, f.group, f.start, f.end,
                         (unsigned long long)f.lostBytes, f.retransmitted, int(f.failed));
        }
        std::fclose(out);
        return true;
    }

  private:
    void StartFlow(uint32_t id)
    {
        flows[id].start = Simulator::Now().GetSeconds();
        transport->StartFlow(id);
    }

    std::vector<int32_t> m_groupLeft;
    std::vector<std::vector<uint32_t>> m_waiting;
};

}  // namespace dlcpsim
