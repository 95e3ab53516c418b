"""A store reader learns no key: the rendezvous store (no authentication, every
interface) carries the job id, a public run nonce and the ranks' addresses, not
a key; every rank derives its keys from the job's secret, which reaches it out
of band (``DLCP_JOB_SECRET``). A process with the store's address only reads
everything there and forges with every key it can make of it: all refused."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dlcp import rendezvous

SECRET = bytes(range(100, 132))
READER = Path(__file__).with_name("store_reader.py")


def _env(rank: int, port: int) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            # the awaited receive must outlive the reader (a process that imports
            # torch: tens of seconds on a loaded machine)
            "DLCP_TIMEOUT": "120",
            "TORCHELASTIC_USE_AGENT_STORE": "True",  # the test serves the store
            "DLCP_JOB_SECRET": SECRET.hex()}  # fmt: skip


def test_a_store_reader_cannot_obtain_a_key_that_verifies(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    monkeypatch.setattr(rendezvous, "_calls", {})
    server = TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=10))
    endpoints: list[Any] = []
    try:
        with ThreadPoolExecutor(2) as pool:
            made = [pool.submit(rendezvous.connect, group="sec", authenticate=True,
                                env=_env(r, server.port)) for r in (0, 1)]  # fmt: skip
            endpoints = [f.result(timeout=30)[0] for f in made]
        a, b = endpoints
        got = b.recv(src=0, msg=1, out=np.zeros(100, np.float32))
        reader = subprocess.run(
            [sys.executable, str(READER), "127.0.0.1", str(server.port)],
            capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2],
        )  # fmt: skip
        assert reader.returncode == 0, reader.stderr
        report = json.loads(reader.stdout.splitlines()[-1])
        # what the store holds: no key, and nothing a key can be made of
        assert not any(name.endswith("/key") for name in report["keys"]), report["keys"]
        values = set(report["values"].values())
        assert SECRET.hex() not in values and SECRET.hex().encode().hex() not in values
        # every forgery was refused and counted; the awaited message is untouched
        assert report["candidates"] >= 4, report
        assert report["hellos_refused"] == report["hellos"] == report["candidates"]
        stats = b.stats()
        assert stats["rejected"].get("auth_failed", 0) == report["data_sent"], stats["rejected"]
        assert not got.done() and stats["peers_gone"] == {}
        x = np.arange(100, dtype=np.float32)
        a.send(x, to=1, msg=1).result(timeout=10)
        assert np.array_equal(got.result(timeout=10).data, x)
    finally:
        for e in endpoints:
            e.close()
