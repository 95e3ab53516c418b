"""The ns-3 side: load the C++ model with cppyy, build the fabric, run one config.

Importing ns-3 takes ~15 s and its global state (node list, defaults, random
stream counters) is not meant to be reused, so every run happens in a process
of its own: a child of :mod:`dlcp.sim.fork_server`, forked once ns-3 is loaded
(:func:`dlcp.sim.runner.run_many`), or a fresh interpreter:
``python -m dlcp.sim.engine CONFIG.json RESULT.json FLOWS.csv``. Per-packet work is all C++
(``dlcp/sim/cpp/*.h``, compiled by cppyy when loaded): the leaf-spine routing
(per-flow ECMP or per-packet spraying), the DLCP switch queue, the DLCP
endpoints and the TCP message driver. Python only builds the workload table
before the run and reads the per-flow CSV after it.

``DLCP_SIM_TRACE_TCP=1`` in the environment records every TCP sender's state
so that connections left with undelivered data are described in the result
(``tcp_stuck``); it costs time and changes nothing else.
``DLCP_SIM_TRACE_RECEIVER=PATH`` writes every DLCP receiver's inputs (data,
FINISH, the reorder grace's end) and decisions (NACK, completion) to ``PATH``
as CSV (``DlcpTransport::WriteReceiverTrace``): the differential test against
``dlcp.proto`` reads it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import DependencyMissing
from .config import SimConfig, switch_policy
from .topology import host_leaf_indices, leaf_spine, load_topology
from .workloads import build_workload

__all__ = ["NS3_MISSING", "load_ns3", "run_in_process"]

CPP_DIR = Path(__file__).resolve().parent / "cpp"
NS3_MISSING = "the ns-3 simulator is not installed: pip install 'dlcp[sim]'"


def load_ns3() -> Any:
    """Import ns-3 and compile the C++ model; returns ``cppyy.gbl``."""
    try:
        import cppyy  # the ns3 package brings it
        from ns import ns  # noqa: F401  (ns-3's stub exits when ns3 is missing)
    except (ImportError, SystemExit) as e:
        raise DependencyMissing(NS3_MISSING) from e

    cppyy.add_include_path(str(CPP_DIR))
    cppyy.include("tcp_transport.h")
    cppyy.include("dlcp_transport.h")
    return cppyy.gbl


def _vec(g: Any, kind: str, values: list[int]) -> Any:
    return g.std.vector[kind](values)


def _fabric_config(g: Any, cfg: SimConfig) -> Any:
    topo = load_topology(cfg.topology) if cfg.topology else leaf_spine(cfg)
    leaf_of, n_leaves, n_spines = host_leaf_indices(topo)
    policy = switch_policy(cfg)
    c = g.dlcpsim.FabricConfig()
    c.nLeaves, c.nSpines = n_leaves, n_spines
    c.hostLeaf = _vec(g, "unsigned int", leaf_of)
    c.hostGbps, c.fabricGbps, c.linkDelayUs = cfg.link_gbps, cfg.fabric_gbps, cfg.link_delay_us
    c.bufferPackets = policy.queue_packets
    c.deLimit = policy.drop_eligible_packets
    class_of = [0] * 64
    for cls in range(policy.n_classes):
        class_of[policy.tos.dscp[cls]] = cls
    c.classOfDscp = _vec(g, "int", class_of)
    c.ecnDroppable = policy.tos.ecn_droppable
    c.seed = cfg.seed
    if cfg.transport == "dlcp":
        c.queueKind = g.dlcpsim.QUEUE_DLCP
        c.spray = cfg.enabled("spray")
        c.priority = cfg.enabled("priority")
        c.selective = cfg.enabled("selective_drop")
    elif cfg.transport == "dctcp":
        c.queueKind = g.dlcpsim.QUEUE_RED
        k = max(20, round(_bdp_packets(cfg)))  # DCTCP marking threshold K ~ one BDP
        c.redMinTh = c.redMaxTh = min(k, cfg.buffer_packets - 1)  # mark at K and above
    else:
        c.queueKind = g.dlcpsim.QUEUE_FIFO
    return c


def _bdp_packets(cfg: SimConfig) -> float:
    rtt_s = 8 * cfg.link_delay_us * 1e-6  # host-leaf-spine-leaf-host and back
    return cfg.link_gbps * 1e9 * rtt_s / 8 / 1500


def _tcp_defaults(g: Any, cfg: SimConfig) -> None:
    ns3 = g.ns3
    # DCTCP: ns-3's TcpDctcp with Linux's two-segment floor on ssthresh (tcp_transport.h)
    if cfg.transport == "dctcp":
        g.dlcpsim.TcpDctcpFloor.GetTypeId()
    cc = "dlcpsim::TcpDctcpFloor" if cfg.transport == "dctcp" else "ns3::TcpNewReno"
    ns3.Config.SetDefault("ns3::TcpL4Protocol::SocketType",
                          ns3.TypeIdValue(ns3.TypeId.LookupByName(cc)))  # fmt: skip
    pc = cfg.protocol_config()
    mss = pc.mtu - 52  # IPv4 20 + TCP 20 + timestamps 12
    min_rto = ns3.TimeValue(ns3.NanoSeconds(round(cfg.tcp_min_rto_us * 1e3)))  # (not whole us)
    for name, value in (
        ("ns3::TcpSocket::SegmentSize", ns3.UintegerValue(mss)),
        ("ns3::TcpSocket::InitialCwnd", ns3.UintegerValue(10)),
        ("ns3::TcpSocket::DelAckCount", ns3.UintegerValue(1)),
        ("ns3::TcpSocket::SndBufSize", ns3.UintegerValue(1 << 20)),
        ("ns3::TcpSocket::RcvBufSize", ns3.UintegerValue(1 << 20)),
        ("ns3::TcpSocket::ConnTimeout", min_rto),
        ("ns3::TcpSocketBase::MinRto", min_rto),
        ("ns3::TcpSocketBase::ClockGranularity", ns3.TimeValue(ns3.MicroSeconds(1))),
        (
            "ns3::TcpSocketBase::UseEcn",
            ns3.StringValue("On" if cfg.transport == "dctcp" else "Off"),
        ),
    ):
        ns3.Config.SetDefault(name, value)


def _dlcp_params(g: Any, cfg: SimConfig, transport: Any) -> None:
    pc = cfg.protocol_config()
    pacer = pc.pacer_kwargs()
    prm = transport.prm
    prm.payload = pc.chunk_bytes
    prm.hostGbps = cfg.link_gbps
    prm.pacing = pc.pacer == "receiver"
    # unpaced, a pair's rate is never raised by feedback: the host's line rate
    line_rate = cfg.link_gbps * 1e9 / 8
    prm.initialRate = float(pacer.get("initial_rate", 1.25e9)) if prm.pacing else line_rate
    prm.minRate = float(pacer.get("min_rate", 1e6))
    prm.rateIntervalUs = cfg.rate_interval_us
    prm.pacingTarget = cfg.pacing_target
    prm.finishTimeoutUs = cfg.finish_timeout_us
    prm.finishRetries = pc.finish_retries
    prm.reorderGraceUs = cfg.reorder_grace_us
    prm.nackTimeoutUs = cfg.nack_timeout_us
    prm.maxRounds = pc.max_rounds
    prm.dropFraction = float(pc.classifier_kwargs().get("drop_fraction", 0.8))
    prm.senderPriority = cfg.enabled("priority")
    prm.dscp = _vec(g, "int", list(pc.tos.dscp))
    prm.ecnProtected, prm.ecnDroppable = pc.tos.ecn_protected, pc.tos.ecn_droppable
    prm.seed = cfg.seed


def run_in_process(cfg: SimConfig, flows_csv: Path) -> dict[str, Any]:
    """Run ``cfg`` in this interpreter (once per process) and write the per-flow
    CSV; returns counters and timings (the metrics are computed from the CSV)."""
    t0 = time.monotonic()
    g = load_ns3()
    t_load = time.monotonic() - t0
    ns3 = g.ns3
    ns3.RngSeedManager.SetSeed(cfg.seed)
    ns3.RngSeedManager.SetRun(1)
    wl = build_workload(cfg)
    receiver_trace = os.environ.get("DLCP_SIM_TRACE_RECEIVER")
    if cfg.transport == "dlcp":
        transport = g.dlcpsim.DlcpTransport()
        _dlcp_params(g, cfg, transport)
        transport.traceReceiver = bool(receiver_trace)
    else:
        _tcp_defaults(g, cfg)
        transport = g.dlcpsim.TcpTransport()
        # diagnostics: record every sender's TCP state for connections left stuck
        transport.traceState = os.environ.get("DLCP_SIM_TRACE_TCP") == "1"
    if cfg.transport != "dlcp" or not cfg.enabled("bound"):
        wl = _without_bound(wl)
    sc = g.dlcpsim.Scenario()
    for f in wl.flows:
        sc.AddFlow(f.src, f.dst, f.nbytes, f.cls, f.p, f.after, f.group)
    fabric = _fabric_config(g, cfg)
    t1 = time.monotonic()
    done = int(sc.Run(fabric, transport, cfg.time_limit_s))
    wall = time.monotonic() - t1
    sim_time = float(ns3.Simulator.Now().GetSeconds())
    if not sc.WriteCsv(str(flows_csv)):
        raise OSError(f"cannot write {flows_csv}")
    out: dict[str, Any] = {
        "flows": len(wl.flows),
        "completed": done,
        "sim_time_s": sim_time,
        "wall_s": wall,
        "load_s": t_load,
        "switch_drops": int(sc.fabric.Drops()),
        "workers": wl.workers,
        "servers": wl.servers,
        "gradient_bytes_per_worker": wl.gradient_bytes,
        "kinds": [f.kind for f in wl.flows],
        "iterations": [f.iteration for f in wl.flows],
    }
    if cfg.transport == "dlcp":
        if receiver_trace and not transport.WriteReceiverTrace(receiver_trace):
            raise OSError(f"cannot write {receiver_trace}")
        out.update(
            drops_drop_eligible=int(sc.fabric.DlcpDrops(True)),
            drops_protected=int(sc.fabric.DlcpDrops(False)),
            data_packets=int(transport.dataSent),
            control_packets=int(transport.controlSent),
            failed_messages=int(transport.failures),
            multi_part_nacks=int(transport.multiPartNacks),
            max_rounds=int(transport.maxRound),
        )
    else:
        out["tcp_close_errors"] = int(transport.closeErrors)
        out["tcp_stuck"] = str(transport.Stuck()).splitlines()
        if cfg.transport == "dctcp":
            out["ecn_marks"] = int(sc.fabric.EcnMarks())
    ns3.Simulator.Destroy()
    return out


def _without_bound(wl: Any) -> Any:
    from dataclasses import replace

    return replace(wl, flows=[replace(f, p=0.0) for f in wl.flows])


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m dlcp.sim.engine CONFIG.json RESULT.json FLOWS.csv", file=sys.stderr)
        return 2
    cfg = SimConfig.from_dict(json.loads(Path(argv[0]).read_text()))
    try:
        result = run_in_process(cfg, Path(argv[2]))
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    Path(argv[1]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
