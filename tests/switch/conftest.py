"""Fixtures of the switch control-plane tests: a small P4Info with the names of
docs/switch.md, and an in-process fake P4Runtime device (a real grpcio server on
port 0 serving the ``p4.v1.P4Runtime`` service) that records what it is sent."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMITTED_P4INFO = ROOT / "p4" / "bmv2" / "build" / "dlcp.p4info.txtpb"
COMMITTED_JSON = ROOT / "p4" / "bmv2" / "build" / "dlcp.json"

# (name, [(match field, kind, bitwidth)], [actions]) as docs/switch.md lists them
TABLES = [
    ("DlcpIngress.routing.ipv4_lpm", [("hdr.ipv4.dst_addr", "LPM", 32)],
     ["DlcpIngress.routing.set_next_hop", "DlcpIngress.routing.set_ecmp_group",
      "DlcpIngress.routing.drop"]),
    ("DlcpIngress.ecmp.ecmp_member",
     [("meta.ecmp_group_id", "EXACT", 16), ("meta.ecmp_member", "EXACT", 16)],
     ["DlcpIngress.ecmp.set_member_next_hop", "DlcpIngress.ecmp.drop"]),
    ("DlcpIngress.queueing.dlcp_class_to_queue", [("meta.dlcp_prio", "EXACT", 3)],
     ["DlcpIngress.queueing.set_queue"]),
    ("DlcpIngress.queueing.dscp_to_queue", [("hdr.ipv4.dscp", "EXACT", 6)],
     ["DlcpIngress.queueing.set_queue"]),
    ("DlcpEgress.selective_drop.drop_threshold", [("meta.queue", "EXACT", 3)],
     ["DlcpEgress.selective_drop.set_threshold", "NoAction"]),
]  # fmt: skip
ACTIONS = [
    ("DlcpIngress.routing.set_next_hop", [("port", 9), ("smac", 48), ("dmac", 48)]),
    ("DlcpIngress.routing.set_ecmp_group", [("group_id", 16), ("size", 16)]),
    ("DlcpIngress.routing.drop", []),
    ("DlcpIngress.ecmp.set_member_next_hop", [("port", 9), ("smac", 48), ("dmac", 48)]),
    ("DlcpIngress.ecmp.drop", []),
    ("DlcpIngress.queueing.set_queue", [("queue", 3)]),
    ("DlcpEgress.selective_drop.set_threshold", [("depth", 19)]),
    ("NoAction", []),
]
COUNTERS = [
    ("DlcpEgress.selective_drop.forwarded", 8),
    ("DlcpEgress.selective_drop.dropped_selective", 8),
    ("DlcpEgress.port_counters.egress_port", 512),
    ("DlcpIngress.port_counters.ingress_port", 512),
]


def protos() -> Any:
    pytest.importorskip("grpc", reason="the switch extra (grpcio) is not installed")
    pytest.importorskip("p4", reason="the switch extra (p4runtime) is not installed")
    from dlcp.switch.p4proto import load

    return load()


def build_p4info() -> Any:
    """A P4Info in the shape p4c writes (ids with the P4Runtime type prefixes:
    0x01 actions, 0x02 tables, 0x12 counters)."""
    pr = protos()
    info = pr.p4info["P4Info"]()
    action_ids: dict[str, int] = {}
    for i, (name, params) in enumerate(ACTIONS):
        a = info.actions.add()
        a.preamble.id = 0x01000000 | (0x1000 + i * 17)
        a.preamble.name = name
        a.preamble.alias = name.rsplit(".", 1)[-1]
        action_ids[name] = a.preamble.id
        for j, (pname, width) in enumerate(params):
            a.params.add(id=j + 1, name=pname, bitwidth=width)
    mf_kind = pr.p4info["MatchField"]
    for i, (name, fields, acts) in enumerate(TABLES):
        t = info.tables.add()
        t.preamble.id = 0x02000000 | (0x2000 + i * 31)
        t.preamble.name = name
        t.preamble.alias = name.rsplit(".", 1)[-1]
        for j, (fname, kind, width) in enumerate(fields):
            t.match_fields.add(id=j + 1, name=fname, bitwidth=width,
                               match_type=getattr(mf_kind, kind))  # fmt: skip
        for act in acts:
            t.action_refs.add(id=action_ids[act])
        t.size = 1024
    for i, (name, size) in enumerate(COUNTERS):
        c = info.counters.add()
        c.preamble.id = 0x12000000 | (0x3000 + i * 7)
        c.preamble.name = name
        c.spec.unit = pr.p4info["CounterSpec"].BOTH
        c.size = size
    # the loss-injection build's probability register (bit<16>, one cell)
    r = info.registers.add()
    r.preamble.id = 0x10000000 | 0x4000
    r.preamble.name = "DlcpIngress.loss.drop_per_65536"
    r.type_spec.bitstring.bit.bitwidth = 16
    r.size = 1
    return info


@pytest.fixture
def p4info_file(tmp_path: Path) -> Path:
    pr = protos()
    path = tmp_path / "dlcp_test.p4info.txtpb"
    path.write_text(pr.text_format.MessageToString(build_p4info()))
    return path


# ---- the fake device -----------------------------------------------------------------


@dataclass
class FakeDevice:
    """Behaviour knobs and the record of every request."""

    arbitration_code: int = 0  # google.rpc.Code of the arbitration answer
    answer_arbitration: bool = True
    write_delay: float = 0.0
    fail_updates: dict[int, tuple[int, str]] = field(default_factory=dict)
    counters: dict[int, dict[int, tuple[int, int]]] = field(default_factory=dict)
    arbitrations: list[Any] = field(default_factory=list)
    pipelines: list[Any] = field(default_factory=list)
    writes: list[Any] = field(default_factory=list)
    reads: list[Any] = field(default_factory=list)
    stream_closed: threading.Event = field(default_factory=threading.Event)


class FakeServer:
    def __init__(self, device: FakeDevice) -> None:
        import grpc

        self.grpc = grpc
        self.pr = protos()
        self.device = device
        pr = self.pr

        def h(kind: str, fn: Any, req: Any, resp: Any) -> Any:
            make = getattr(grpc, f"{kind}_rpc_method_handler")
            return make(fn, request_deserializer=req.FromString,
                        response_serializer=resp.SerializeToString)  # fmt: skip

        handlers = {
            "StreamChannel": h("stream_stream", self._stream, pr.StreamMessageRequest,
                               pr.StreamMessageResponse),
            "SetForwardingPipelineConfig": h("unary_unary", self._pipeline,
                                             pr.SetForwardingPipelineConfigRequest,
                                             pr.SetForwardingPipelineConfigResponse),
            "Write": h("unary_unary", self._write, pr.WriteRequest, pr.WriteResponse),
            "Read": h("unary_stream", self._read, pr.ReadRequest, pr.ReadResponse),
        }  # fmt: skip
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("p4.v1.P4Runtime", handlers),)
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=None)

    def _stream(self, requests: Iterator[Any], context: Any) -> Iterator[Any]:
        for req in requests:
            if req.WhichOneof("update") == "arbitration":
                self.device.arbitrations.append(req)
                if not self.device.answer_arbitration:
                    continue
                resp = self.pr.StreamMessageResponse()
                resp.arbitration.CopyFrom(req.arbitration)
                resp.arbitration.status.code = self.device.arbitration_code
                yield resp
        self.device.stream_closed.set()

    def _pipeline(self, req: Any, context: Any) -> Any:
        self.device.pipelines.append(req)
        return self.pr.SetForwardingPipelineConfigResponse()

    def _write(self, req: Any, context: Any) -> Any:
        self.device.writes.append(req)
        if self.device.write_delay:
            time.sleep(self.device.write_delay)
        if self.device.fail_updates:
            status = self.pr.Status(code=2, message="Write failure.")
            for i in range(len(req.updates)):
                code, msg = self.device.fail_updates.get(i, (0, ""))
                status.details.add().Pack(self.pr.Error(canonical_code=code, message=msg))
            context.set_trailing_metadata(
                (("grpc-status-details-bin", status.SerializeToString()),)
            )
            context.abort(self.grpc.StatusCode.UNKNOWN, "Write failure.")
        return self.pr.WriteResponse()

    def _read(self, req: Any, context: Any) -> Iterator[Any]:
        self.device.reads.append(req)
        resp = self.pr.ReadResponse()
        for ent in req.entities:
            ce = ent.counter_entry
            values = self.device.counters.get(ce.counter_id, {})
            wanted = [ce.index.index] if ce.HasField("index") else sorted(values)
            for idx in wanted:
                pkts, byts = values.get(idx, (0, 0))
                out = resp.entities.add()
                out.counter_entry.counter_id = ce.counter_id
                out.counter_entry.index.index = idx
                out.counter_entry.data.packet_count = pkts
                out.counter_entry.data.byte_count = byts
        yield resp


@pytest.fixture
def device() -> FakeDevice:
    return FakeDevice()


@pytest.fixture
def fake_server(device: FakeDevice) -> Iterator[FakeServer]:
    srv = FakeServer(device)
    try:
        yield srv
    finally:
        srv.stop()
