"""Sessions over the in-memory link, and what tests read off their datagrams:
shared by test_session.py and test_session_wire.py."""

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from dlcp.linkemu import LossyLink
from dlcp.proto.config import ProtocolConfig
from dlcp.proto.session import (
    MessageDelivered,
    MessageReceived,
    Session,
)
from dlcp.proto.wire import (
    Flags,
)

JOB = 7
KEY = bytes(range(32))
CHUNK = 256  # payload bytes per packet: many chunks from small messages


def config(**kw: object) -> ProtocolConfig:
    kw.setdefault("payload_bytes", CHUNK)
    return ProtocolConfig(**kw)  # type: ignore[arg-type]


def sessions(
    n: int = 2, cfg: ProtocolConfig | None = None, key: bytes | None = None
) -> list[Session]:
    cfg = cfg or config()
    return [Session(rank=r, job=JOB, config=cfg, key=key) for r in range(n)]


def events(link: LossyLink, kind: type, rank: int | None = None) -> list:
    return [e for r, e in link.events if isinstance(e, kind) and (rank is None or r == rank)]


def has_event(kind: type, rank: int | None = None) -> Callable[[LossyLink], bool]:
    return lambda link: bool(events(link, kind, rank))


def only_received(link: LossyLink, rank: int = 1) -> MessageReceived:
    got = events(link, MessageReceived, rank)
    assert len(got) == 1, link.events
    return got[0]


def only_delivered(link: LossyLink, rank: int = 0) -> MessageDelivered:
    got = events(link, MessageDelivered, rank)
    assert len(got) == 1, link.events
    return got[0]


def same_bits(a: npt.NDArray[np.generic], b: npt.NDArray[np.generic]) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def runs(mask: npt.NDArray[np.bool_]) -> list[tuple[int, int]]:
    """(offset, length) of each run of True."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    return [(int(s), int(e - s)) for s, e in zip(edges[0::2], edges[1::2], strict=True)]


def seq_of(d: bytes) -> int:
    return int.from_bytes(d[12:16], "big")


def is_data(d: bytes) -> bool:
    return len(d) >= 32 and d[0] == 0x11


def is_retransmit(d: bytes) -> bool:
    return bool(d[1] & Flags.RETRANSMIT)


def is_droppable(d: bytes) -> bool:
    return bool(d[28] & 0x10)


def cls_of(d: bytes) -> int:
    """Class index prio * 2 + drop of a data datagram."""
    return (d[28] >> 5) * 2 + ((d[28] >> 4) & 1)


def gradient(n: int, seed: int, *, layers: int = 1) -> npt.NDArray[np.float32]:
    """Nonzero float32 values whose magnitude varies from chunk to chunk."""
    rng = np.random.default_rng(seed)
    scale = np.repeat(rng.uniform(0.01, 10.0, -(-n // 16)), 16)[:n]
    x = rng.standard_normal(n) * scale
    x[x == 0] = 1.0
    return x.astype(np.float32)


def layer_segments(n: int, layers: int) -> list[tuple[int, int, int]]:
    bounds = np.linspace(0, n, layers + 1).astype(int)
    return [(int(bounds[i]), int(bounds[i + 1] - bounds[i]), i) for i in range(layers)]


def partial_then(link: LossyLink, b: Session, at_least: int = 1) -> float:
    """Run until ``b`` holds part of the message (nothing complete yet): data
    of it, not only its FINISH (which may overtake the data)."""
    now = link.run(
        stop_when=lambda _: b.stats.datagrams_in >= at_least and bool(b._inbox._incoming)
    )
    assert not events(link, MessageReceived)
    return now


def assert_same_messages(f: Any, s: Any, *, times: bool = False) -> None:
    """Inboxes ``f`` and ``s`` hold the same messages under way, in the same state
    (what arrived, counts, ``times``: last activity and recovery phase too), and
    queued the same events."""
    assert f._incoming.keys() == s._incoming.keys()
    counts = ["received_elems", "received_protected", "retransmitted", "duplicates", "bound",
              "allowed_loss", "chunk_elems"]  # fmt: skip
    for key, state in f._incoming.items():
        a, b = state.reassembler, s._incoming[key].reassembler
        assert np.array_equal(a.received, b.received)
        assert np.array_equal(a.received_class, b.received_class)
        for name in counts + (["last_activity", "started"] if times else []):
            assert getattr(a, name) == getattr(b, name), name
        if times:
            assert state.recovery.phase == s._incoming[key].recovery.phase
        # what arrived is the same (unwritten memory of an unexpected message is not)
        for seq in np.flatnonzero(a.received):
            at = slice(seq * a.chunk_elems, (seq + 1) * a.chunk_elems)
            assert a.out[at].tobytes() == b.out[at].tobytes(), seq
    events_f, events_s = list(f._events), list(s._events)
    assert len(events_f) == len(events_s)
    for ef, es in zip(events_f, events_s, strict=True):
        assert type(ef) is type(es)
        if hasattr(ef, "report"):
            assert ef.report == es.report
            assert ef.data.tobytes() == es.data.tobytes()


def received_events(s: Session) -> list[MessageReceived]:
    """The messages ``s`` received since the last call (its other events are dropped)."""
    out = []
    while (e := s.next_event()) is not None:
        if isinstance(e, MessageReceived):
            out.append(e)
    return out
