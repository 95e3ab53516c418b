"""The two ways a session's data leaves, driven side by side with the same
seeded link: a session that paces itself and hands out batches (the Python
engine's) and one that hands out whole rounds (the native engine's), copied or
lent. Through the same loss, reordering and duplication, every message ends the
same way on both: exact bytes where the bound is 0; within the bound, the
sender's bytes where something arrived and zeros where it was lost, otherwise;
the same per-class totals of chunks; retransmissions within a stated tolerance
(the link's random draws fall differently on batches than on rounds); and a
lent round exactly as a copied one.
(The native engine sends a round's datagrams as ``RoundPost.datagram`` says:
``test_engine_send.py``; the link sends whole rounds at once, unpaced.)"""

from __future__ import annotations

import numpy as np
import pytest

from dlcp.linkemu import LossyLink
from dlcp.proto.session import MessageDelivered, MessageReceived, Session
from tests.proto.session_helpers import JOB, config, events, has_event

DRIVERS = ("batches", "rounds", "lent rounds")


def _run(
    driver: str, *, loss: float, reorder: bool, duplicate: float, seed: int, p: float
) -> tuple[MessageReceived, MessageDelivered, np.ndarray]:
    # (a reordering link reorders each path: the receiver cannot trust a FINISH's tail)
    cfg = config(ordered_paths=not reorder)
    sender = Session(rank=0, job=JOB, config=cfg, whole_rounds=driver != "batches")
    receiver = Session(rank=1, job=JOB, config=cfg)
    link = LossyLink(
        [sender, receiver], loss=loss, reorder=reorder, duplicate=duplicate, seed=seed
    )
    data = np.random.default_rng(seed).standard_normal(6000).astype(np.float32)
    segments = [(0, 2000, 0), (2000, 4000, 1)]  # two classes
    receiver.expect_message(0, step=1, msg=0, p=p)
    sender.send_message(
        1, data, step=1, msg=0, now=0.0, p=p, segments=segments,
        borrow=driver == "lent rounds",
    )  # fmt: skip
    link.run(stop_when=has_event(MessageDelivered, 0))
    (got,) = events(link, MessageReceived, 1)
    (sent,) = events(link, MessageDelivered, 0)
    return got, sent, data


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    ("loss", "reorder", "duplicate"), [(0.0, False, 0.0), (0.1, True, 0.0), (0.2, True, 0.1)]
)
@pytest.mark.parametrize("p", [0.0, 0.1])
def test_batches_and_whole_rounds_end_a_message_the_same_way(
    seed: int, loss: float, reorder: bool, duplicate: float, p: float
) -> None:
    runs = {
        d: _run(d, loss=loss, reorder=reorder, duplicate=duplicate, seed=seed, p=p)
        for d in DRIVERS
    }
    for driver, (got, sent, data) in runs.items():
        report = got.report
        assert report.lost_elems <= p * len(data), driver
        arrived = np.ones(len(data), bool)
        for offset, length in report.lost_ranges:
            arrived[offset : offset + length] = False
        assert np.array_equal(got.data[arrived], data[arrived]), driver
        assert not got.data[~arrived].any(), driver  # (zero fill)
        assert report.lost_elems == int((~arrived).sum()), driver
        assert sent.report.msg_elems == len(data), driver
        # every chunk of each class is accounted for, received or lost
        assert np.add(report.received_chunks, report.lost_chunks).tolist() == np.add(
            runs["batches"][0].report.received_chunks, runs["batches"][0].report.lost_chunks
        ).tolist(), driver
    resent = {d: r[1].report.retransmitted_packets for d, r in runs.items()}
    base = resent["batches"]
    for n in resent.values():  # the links' draws differ, not the protocol
        assert abs(n - base) <= max(40, base // 2), resent
    if loss == 0:
        assert all(n == 0 for n in resent.values()), resent
    # lending changes where the bytes come from, nothing else: the same link
    # draws, datagram for datagram, give the very same outcome
    (copied, copied_sent, _), (lent, lent_sent, _) = runs["rounds"], runs["lent rounds"]
    assert lent.report.lost_ranges == copied.report.lost_ranges
    assert lent.data.tobytes() == copied.data.tobytes()
    assert lent_sent.report.retransmitted_packets == copied_sent.report.retransmitted_packets
