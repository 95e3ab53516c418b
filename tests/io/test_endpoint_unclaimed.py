"""Messages nobody asked for are bounded in bytes, arriving or completed: a
receiver that never posts its receives holds at most ``max_unexpected_bytes``
of them (its resident memory grows by no more than that plus a stated
overhead), refuses the message that would pass the limit and tells its sender
so (ABORT UNCLAIMED_LIMIT: the send fails naming the reason); none is reported
delivered and then dropped. Before, completed messages stopped counting and
were capped at 1,024 by count: 100 x 16 MiB took a receiver from 72 MB to
1.68 GB under a 64 MiB limit, and the 1,025th evicted one whose sender had been
told it was delivered."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.io.endpoint_helpers import plan, recv, send
from tests.io.peers import workers

pytestmark = pytest.mark.integration

N = 2 << 20  # float32 elements: 8 MiB a message
MESSAGES = 12  # 96 MiB sent, nobody asking for it
LIMIT = 32 << 20  # room for three (each is charged 8 MiB + 1 KiB)
#: what the receiver's resident memory may grow by beyond LIMIT: its receive
#: buffers, numpy and Python objects, allocator slack (measured: 30.7 MiB in all,
#: 6.7 MiB beyond the three 8 MiB messages held; without the bound: over 96 MiB)
OVERHEAD = 24 << 20


def test_unclaimed_messages_are_bounded_in_bytes_and_the_refused_sender_is_told(
    tmp_path: Path,
) -> None:
    sends = [send(m, n=N, layers=1) for m in range(MESSAGES)]
    recvs = [recv(m, n=N) for m in range(MESSAGES)]
    tx_plan = plan(0, sends, timeout=20.0)
    rx_plan = plan(1, [{"op": "memory", "label": "start"}, {"op": "wait", "line": "claim"},
                       {"op": "memory", "label": "parked"}, *recvs],
                   timeout=20.0, protocol={"max_unexpected_bytes": LIMIT})  # fmt: skip
    with workers([tx_plan, rx_plan], tmp_path) as (a, b):
        a.say("go"), b.say("go")
        tx = a.results(60)  # every send delivered or refused, nothing claimed yet
        b.say("claim")
        rx = b.results(60)
        assert a.finish() == b.finish() == []
    delivered = [r["ok"] for r in tx["results"]]
    assert sum(delivered) == LIMIT // (N * 4 + 1024) == 3, tx["results"]
    for ok, res in zip(delivered, tx["results"], strict=True):
        if not ok:
            assert "refused the message (unclaimed_limit)" in res["message"], res
            assert "max_unexpected_bytes" in res["message"], res
    # the receiver: the delivered ones, exactly; the refused ones fail, naming why
    for ok, res in zip(delivered, rx["results"], strict=True):
        if ok:
            assert res["ok"] and res["mismatched_outside_lost"] == 0, res
            assert res["report"]["lost_elems"] == 0
        else:
            assert not res["ok"] and "past max_unexpected_bytes" in res["message"], res
    grew = rx["memory"]["parked"]["VmHWM"] - rx["memory"]["start"]["VmRSS"]
    assert grew <= LIMIT + OVERHEAD, (grew / 2**20, rx["memory"])
    assert rx["stats"]["rejected"].get("unexpected_overflow", 0) > 0
