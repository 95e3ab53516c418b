"""An endpoint's timeout says how far its message had got (``Session.progress``),
so that a user can tell a message that never left its sender from one whose
receiver went quiet. The cases the protocol core distinguishes are in
tests/proto/test_progress.py; these check that a real endpoint's PeerTimeout
carries them."""

from __future__ import annotations

import numpy as np
import pytest

from dlcp.errors import PeerTimeout
from dlcp.io import Endpoint, EndpointConfig
from tests.io.endpoint_helpers import JOB, LocalStore

pytestmark = pytest.mark.integration

X = np.arange(1000, dtype=np.float32)


def _pair(timeout: float) -> tuple[Endpoint, Endpoint]:
    store, cfg = LocalStore(), EndpointConfig(timeout=timeout)
    a, b = (Endpoint(r, store=store, world_size=2, job=JOB, config=cfg) for r in range(2))
    return a, b


def test_a_receive_its_sender_never_sent_says_nothing_of_it_came() -> None:
    a, b = _pair(timeout=1.0)
    try:
        got = b.recv(src=0, msg=1)
        a.send(X, to=1, msg=1).result(timeout=10)  # rank 0's data reaches rank 1 ...
        assert np.array_equal(got.result(timeout=10).data, X)
        waiting = b.recv(src=0, msg=2)  # ... but message 2 is never sent
        with pytest.raises(PeerTimeout) as caught:
            waiting.result(timeout=10)
        said = str(caught.value)
        assert said.startswith(
            "rank 1: message (step 0, msg 2) from rank 0 did not complete within 1 s: nothing "
            "of it arrived here, neither data nor its FINISH; data from that rank last arrived"
        ), said
    finally:
        a.close()
        b.close()


def test_a_send_whose_receiver_went_quiet_says_its_finish_was_not_answered() -> None:
    a, b = _pair(timeout=1.0)
    try:
        with b._lock:  # rank 1's I/O thread stalls: it reads nothing, answers nothing
            sent = a.send(X, to=1, msg=1)
            with pytest.raises(PeerTimeout) as caught:
                sent.result(timeout=10)
        said = str(caught.value)
        assert said.startswith(
            "rank 0: message (step 0, msg 1) to rank 1 did not complete within 1 s: all "
        ), said
        assert "went out and its FINISH was sent" in said, said
        assert said.endswith("and neither STOP nor NACK came back"), said
    finally:
        a.close()
        b.close()
