"""Run by ``test_endpoint_faults.py`` as ``python -m tests.io.exit_on_receive_worker
'<plan json>'`` (from the repository root; the plan: ``rank``, ``job``, ``n``,
``timeout``): the receiving rank of a two-rank job, an application that leaves the
moment it has its data. Its receive's done-callback ends the process at once
(``os._exit``), with no ``close()``: whatever the endpoint had not sent by then is
never sent. Nothing sleeps for readiness:

==========  =====================================  =====================================
direction   line                                   meaning
==========  =====================================  =====================================
child ->    ``ready <host> <data> <control>``      the endpoint is bound (ephemeral ports)
-> child    ``peer 0 <host> <data> <control>``     the sender's address
child ->    ``posted``                             the receive is posted: send now
==========  =====================================  =====================================

Exit status (from the callback): 0, the receive got ``np.arange(n)`` as float32;
3, it failed; 4, it got other data; 5, the input ended first (the test gave up).
"""

from __future__ import annotations

import json
import os
import sys
from concurrent.futures import Future
from typing import Any

import numpy as np

from dlcp.io import Endpoint, EndpointConfig
from tests.io.peers import LineStore

EXIT_RECEIVED = 0
EXIT_FAILED = 3
EXIT_WRONG_DATA = 4
EXIT_INPUT_ENDED = 5


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    plan = json.loads(argv[0])
    n, sender = plan["n"], 1 - plan["rank"]
    store = LineStore(_say, plan["timeout"])
    ep = Endpoint(plan["rank"], store=store, world_size=2, job=plan["job"],
                  config=EndpointConfig(timeout=plan["timeout"]))
    word, rank, address = sys.stdin.readline().split(" ", 2)
    assert (word, int(rank)) == ("peer", sender), f"expected the sender's address, got {word}"
    store.add(sender, address.strip())
    expected = np.arange(n, dtype=np.float32)

    def leave(fut: Future[Any]) -> None:
        if fut.exception() is not None:
            os._exit(EXIT_FAILED)
        os._exit(EXIT_RECEIVED if np.array_equal(fut.result().data, expected) else EXIT_WRONG_DATA)

    ep.recv(src=sender, msg=1, out=np.empty(n, dtype=np.float32)).add_done_callback(leave)
    _say("posted")
    sys.stdin.read()  # the callback ends the process before this returns
    ep.close()
    return EXIT_INPUT_ENDED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
