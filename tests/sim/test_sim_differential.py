"""The ns-3 model's receivers against ``dlcp.proto``'s, on the same inputs.

The simulator (``dlcp/sim/cpp/dlcp_transport.h``) is a fourth implementation of
the receiver's rules: when a message is complete (every chunk; or, after FINISH,
every protected chunk and the bound's share of the bytes, once quiet for the
reorder grace), when and what it NACKs (the round, the chunks missing, how many
the bound still needs) and what it reports lost. Here one small incast with
drops runs in ns-3 with its receivers traced (``DLCP_SIM_TRACE_RECEIVER``: every
data packet and FINISH a receiver got, every NACK and completion it decided).
The same inputs, as real datagrams of ``docs/spec.md``, then drive one
``dlcp.proto`` receiving :class:`~dlcp.proto.session.Session` per host at the
same simulated times (each side runs its own timers). Both must take the same
decisions after the same inputs.

Skipped without the ``sim`` extra (ns-3 takes ~12-30 s to import).
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ns3", reason="ns-3 not installed: pip install 'dlcp[sim]'")
pytest.importorskip("cppyy", reason="ns-3 not installed: pip install 'dlcp[sim]'")

from dlcp.proto.context import ALL_ELEMS
from dlcp.proto.control import Finish, Nack, decode_control, encode_control
from dlcp.proto.events import ControlDatagram, MessageReceived
from dlcp.proto.session import Session
from dlcp.proto.wire import DataHeader, DType, Flags, bound_to_wire, encode_data
from dlcp.sim import SimConfig

ROOT = Path(__file__).resolve().parents[2]
JOB = 11
MSG = 1  # every flow is message (src, step = flow id, MSG)
# 14 workers push to 2 servers through buffers of 40 packets: drop-eligible
# chunks are dropped, receivers NACK what the bound still needs, then pull back
SCENARIO = {"hosts": 16, "hosts_per_leaf": 8, "spines": 2, "servers": 2, "iterations": 1,
            "buffer_packets": 40, "workload": "ps-resnet50", "scale": 0.01,
            "transport": "dlcp"}  # fmt: skip


@dataclass
class Flow:
    src: int
    dst: int
    nbytes: int
    p: float
    #: decisions as (kind, inputs of this flow handled before it, details)
    decisions: list[tuple[str, int, tuple[int, ...]]] = field(default_factory=list)
    inputs: int = 0


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> tuple[SimConfig, Path]:
    tmp = tmp_path_factory.mktemp("differential")
    cfg = SimConfig.from_dict(SCENARIO)
    (tmp / "cfg.json").write_text(json.dumps(cfg.to_dict()))
    trace = tmp / "receivers.csv"
    env = {**os.environ, "DLCP_SIM_TRACE_RECEIVER": str(trace)}
    argv = [sys.executable, "-m", "dlcp.sim.engine", str(tmp / "cfg.json"),
            str(tmp / "result.json"), str(tmp / "flows.csv")]  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return cfg, trace


def _read(trace: Path) -> tuple[dict[int, Flow], list[list[str]]]:
    flows: dict[int, Flow] = {}
    events = []
    with trace.open() as f:
        for row in csv.DictReader(f):
            flow = int(row["flow"])
            if row["kind"] == "M":
                flows[flow] = Flow(int(row["a"]), int(row["b"]), int(row["c"]), float(row["p"]))
            else:
                events.append([row["ns"], row["host"], row["flow"], row["kind"],
                               row["a"], row["b"], row["c"]])  # fmt: skip
    return flows, events


def _ns3_decisions(flows: dict[int, Flow], events: list[list[str]]) -> None:
    """What the simulated receivers decided, after how many inputs of their flow."""
    for _, _, flow_s, kind, a, b, c in events:
        f = flows[int(flow_s)]
        if kind in "DF":
            f.inputs += 1
        elif kind == "N":  # round, chunks still needed, chunks missing
            f.decisions.append(("NACK", f.inputs, (int(a), int(b), int(c))))
        elif kind == "S":  # bytes lost
            f.decisions.append(("done", f.inputs, (int(c),)))


def _datagram(f: Flow, flow: int, seq: int, flags: int, payload: int) -> bytes:
    n_chunks = math.ceil(f.nbytes / payload)
    length = min(payload, f.nbytes - seq * payload)
    header = DataHeader(
        job=JOB, step=flow, msg=MSG, seq=seq, offset=seq * payload, msg_elems=f.nbytes,
        payload_len=length, src=f.src, drop=not flags & 1, dtype=DType.UINT8,
        bound=bound_to_wire(f.p),
        flags=(Flags.LAST if seq == n_chunks - 1 else Flags.NONE)
        | (Flags.RETRANSMIT if flags & 2 else Flags.NONE),
    )  # fmt: skip
    return encode_data(header, bytes(length))


def _proto_decisions(
    cfg: SimConfig, flows: dict[int, Flow], events: list[list[str]], payload: int
) -> dict[int, list[tuple[str, int, tuple[int, ...]]]]:
    """The same inputs through dlcp.proto's receivers, one Session per host; its
    NACKs and completions, after how many inputs of their flow."""
    pc = replace(
        cfg.protocol_config(),
        reorder_grace=cfg.reorder_grace_us * 1e-6,
        nack_timeout=cfg.nack_timeout_us * 1e-6,
    )
    sessions: dict[int, Session] = {}
    decided: dict[int, list[tuple[str, int, tuple[int, ...]]]] = defaultdict(list)
    inputs: dict[int, int] = defaultdict(int)
    # a NACK split in parts (more=True) counts once, with its parts' ranges summed
    nack_parts: dict[int, list[Nack]] = defaultdict(list)

    def collect(session: Session, now: float) -> None:
        for item in session.datagrams_to_send(now=now):
            if not isinstance(item, ControlDatagram):
                continue
            m = decode_control(item.data, job=JOB)
            if isinstance(m, Nack):
                parts = nack_parts[m.step]
                parts.append(m)
                if m.more:
                    continue
                missing = sum(count for part in parts for _, count in part.ranges)
                needed_elems = parts[-1].needed_elems  # (every part carries the same)
                f = flows[m.step]
                if needed_elems == ALL_ELEMS:  # no data yet: everything, in chunks
                    needed = math.ceil(f.nbytes / payload)
                else:
                    needed = math.ceil(needed_elems / payload)
                decided[m.step].append(("NACK", inputs[m.step], (m.round, needed, missing)))
                parts.clear()
        while (ev := session.next_event()) is not None:
            if isinstance(ev, MessageReceived):
                decided[ev.step].append(("done", inputs[ev.step], (ev.report.lost_elems,)))

    def run_timers(session: Session, until: float) -> None:
        while (timer := session.get_timer()) is not None and timer <= until + 1e-12:
            session.handle_timer(now=max(timer, 0.0))
            collect(session, timer)

    for ns, host_s, flow_s, kind, a, b, c in events:
        host, flow, now = int(host_s), int(flow_s), int(ns) * 1e-9
        session = sessions.get(host)
        if session is None:
            session = sessions[host] = Session(rank=host, job=JOB, config=pc)
        f = flows[flow]
        run_timers(session, now)
        if kind == "D":
            data = np.frombuffer(_datagram(f, flow, int(a), int(b), payload), np.uint8)
            inputs[flow] += 1
            session.receive_batch(data, len(data), now=now)
        elif kind == "F":
            total, protected = int(c), int(b)
            classes = [0] * 16
            classes[0], classes[1] = protected, total - protected
            finish = Finish(flow, MSG, f.src, round=int(a), total_chunks=total,
                            protected_chunks=protected, class_chunks=tuple(classes))  # fmt: skip
            inputs[flow] += 1
            session.receive_datagram(encode_control(finish, job=JOB), now=now)
        else:
            continue
        collect(session, now)
    return decided


def test_the_simulated_receivers_decide_as_dlcp_proto_does(
    traced: tuple[SimConfig, Path],
) -> None:
    cfg, trace = traced
    payload = cfg.protocol_config().chunk_bytes
    flows, events = _read(trace)
    _ns3_decisions(flows, events)
    nacked = [fl for fl, f in flows.items() if any(k == "NACK" for k, _, _ in f.decisions)]
    lossy = [fl for fl, f in flows.items() if any(k == "done" and d[0] for k, _, d in f.decisions)]
    # the scenario exercises what it is for: NACKs, and completions by the bound
    assert len(nacked) >= 5 and len(lossy) >= 5, (len(nacked), len(lossy))
    proto = _proto_decisions(cfg, flows, events, payload)
    differ = {
        fl: (f.decisions, proto.get(fl, []))
        for fl, f in flows.items()
        if f.decisions != proto.get(fl, [])
    }
    shown = dict(list(differ.items())[:5])
    assert not differ, f"{len(differ)} of {len(flows)} flows decided differently: {shown}"
