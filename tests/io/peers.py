"""Worker processes for the endpoint integration tests, and the parent's handle on them.

A worker is ``python -m tests.io.peers '<plan json>'`` (run from the
repository root). It owns one :class:`dlcp.io.Endpoint` and talks to the test
over a line protocol; nothing in it sleeps for readiness:

==========  =====================================  =====================================
direction   line                                   meaning
==========  =====================================  =====================================
child ->    ``ready <host> <data> <control>``      the endpoint is bound (ephemeral ports)
-> child    ``peer <rank> <host> <data> <ctrl>``   address of another rank (read through
                                                   the endpoint's ``store=``)
-> child    ``go``                                 start the plan's operations
-> child    any other line                         releases a ``{"op": "wait"}``
child ->    ``results <json>``                     every operation finished or failed,
                                                   with the endpoint's ``stats()``
-> child    ``exit`` (or end of input)             close the endpoint
child ->    ``closed <json>``                      dlcp threads still alive after close
==========  =====================================  =====================================

Plan operations (started in order, their futures awaited at the end):

* ``{"op": "send", "to", "msg", "step", "kind", "n", "seed", "p", "layers"}``
* ``{"op": "recv", "src", "msg", "step", "kind", "n", "seed", "out"}``
* ``{"op": "wait", "line": "..."}``: start nothing more until that line arrives
* ``{"op": "await"}``: wait for every operation started so far
* ``{"op": "memory", "label": "..."}``: note this process's resident memory now
  and its peak so far (``VmRSS``, ``VmHWM``, bytes) under ``label``

Data is regenerated from ``(kind, n, seed)`` on both sides (:func:`make_data`), so
the receiver can check every element it got against what was sent.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import queue
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

ROOT = Path(__file__).resolve().parents[2]
#: bytes of a float32 test message (1 Mi elements)
MB4 = 1 << 20


# ----------------------------------------------------------------------------- data


def make_data(kind: str, n: int, seed: int) -> tuple[npt.NDArray[Any], bool]:
    """``n`` elements of ``kind`` (float32, float16, bfloat16 as uint16 words, uint8)
    from ``seed``, with magnitudes spread over several decades (so that the
    magnitude classifier has something to rank) and a few special values, so
    that bit-exactness means something. Returns (array, bfloat16 flag)."""
    rng = np.random.default_rng(seed)
    scale = np.float32(10.0) ** rng.integers(-4, 2, size=n).astype(np.float32)
    x = (rng.standard_normal(n, dtype=np.float32) * scale).astype(np.float32)
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-40, -1e-45], dtype=np.float32)
    where = rng.integers(0, n, size=min(n, len(specials)))
    x[where] = specials[: len(where)]
    if kind == "float32":
        return x, False
    if kind == "float16":
        with np.errstate(over="ignore", under="ignore"):
            return x.astype(np.float16), False
    if kind == "bfloat16":
        return (x.view(np.uint32) >> 16).astype(np.uint16), True
    if kind == "uint8":
        return rng.integers(0, 256, size=n, dtype=np.uint8), False
    raise ValueError(f"unknown data kind {kind!r}")


def digest(array: npt.NDArray[Any]) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).view(np.uint8)).hexdigest()


def layer_segments(n: int, n_layers: int) -> list[tuple[int, int, int]] | None:
    """``n`` elements cut into ``n_layers`` nearly equal layers (offset, length, layer)."""
    if n_layers <= 1:
        return None
    bounds = np.linspace(0, n, n_layers + 1).astype(int)
    return [(int(a), int(b - a), i) for i, (a, b) in enumerate(itertools.pairwise(bounds))]


def check_received(
    data: npt.NDArray[Any], report: Any, kind: str, n: int, seed: int
) -> dict[str, Any]:
    """What a receiver found: digest, loss report, and how its data compares with
    the regenerated original (bit-exact outside the lost ranges, zero inside)."""
    want, _ = make_data(kind, n, seed)
    lost = np.zeros(n, dtype=np.bool_)
    for off, length in report.lost_ranges:
        lost[off : off + length] = True
    got_b = data.view(np.uint8).reshape(n, -1)
    want_b = want.view(np.uint8).reshape(n, -1)
    differs = (got_b != want_b).any(axis=1)
    bad = np.flatnonzero(differs & ~lost)
    return {
        # where wrong elements are and whether they were never written (0x5a fill)
        "mismatch_sample": {"first": bad[:4].tolist(), "last": bad[-4:].tolist(),
                            "unwritten": int((got_b[bad] == 0x5A).all(axis=1).sum())},
        "ok": True,
        "sha256": digest(data),
        "dtype": str(data.dtype),
        "n": int(data.size),
        "report": {
            "msg_elems": report.msg_elems,
            "received_elems": report.received_elems,
            "lost_elems": report.lost_elems,
            "lost_fraction": report.lost_fraction,
            "lost_ranges": [list(r) for r in report.lost_ranges],
            "lost_chunks": list(report.lost_chunks),
            "received_chunks": list(report.received_chunks),
            "retransmitted_chunks": report.retransmitted_chunks,
            "nack_rounds": report.nack_rounds,
            "bound": report.bound,
        },
        "lost_mask_elems": int(lost.sum()),
        "mismatched_outside_lost": int((differs & ~lost).sum()),
        "nonzero_in_lost": int(got_b[lost].any(axis=1).sum()),
    }


# ----------------------------------------------------------------------------- child


class LineStore:
    """The endpoint's ``store=``: ``set`` announces our address on stdout (the
    ``ready`` line), ``get`` waits for the parent's ``peer`` line."""

    def __init__(self, out: Any, timeout: float) -> None:
        self._out = out
        self._timeout = timeout
        self._known: dict[int, bytes] = {}
        self._cond = threading.Condition()

    def set(self, key: str, value: str | bytes) -> None:
        text = value.decode() if isinstance(value, bytes) else value
        self._out(f"ready {text}")

    def add(self, rank: int, address: str) -> None:
        with self._cond:
            self._known[rank] = address.encode()
            self._cond.notify_all()

    def get(self, key: str) -> bytes:
        rank = int(key.rsplit("/", 1)[1])
        with self._cond:
            if not self._cond.wait_for(lambda: rank in self._known, self._timeout):
                raise KeyError(f"no address for rank {rank} (key {key})")
            return self._known[rank]


def _build(plan: dict[str, Any], store: LineStore) -> Any:
    from dlcp.io import Endpoint, EndpointConfig
    from dlcp.proto.config import ProtocolConfig

    protocol = ProtocolConfig(**plan.get("protocol", {}))
    config = EndpointConfig(protocol=protocol, host=plan.get("host", "127.0.0.1"),
                            **plan.get("config", {}))
    key = bytes.fromhex(plan["key"]) if plan.get("key") else None
    return Endpoint(plan["rank"], store=store, world_size=plan.get("world_size", 2),
                    job=plan.get("job", 7), config=config, key=key)


def _failure(exc: BaseException, started: float) -> dict[str, Any]:
    return {
        "ok": False,
        "error": type(exc).__name__,
        "bases": [c.__name__ for c in type(exc).__mro__],
        "message": str(exc),
        "elapsed": time.monotonic() - started,
    }


def _start(ep: Any, op: dict[str, Any]) -> tuple[Future[Any], Any]:
    """Start one send/recv; returns its future and how to turn its result into JSON."""
    kind, n, seed = op.get("kind", "float32"), op["n"], op.get("seed", 0)
    step, msg = op.get("step", 0), op["msg"]
    if op["op"] == "send":
        data, bf16 = make_data(kind, n, seed)
        fut = ep.send(data, to=op["to"], msg=msg, step=step, p=op.get("p"), bfloat16=bf16,
                      layers=layer_segments(n, op.get("layers", 8)))

        def sent(report: Any) -> dict[str, Any]:
            return {"ok": True, "sha256": digest(data), "report": {
                "msg_elems": report.msg_elems, "chunks": report.chunks,
                "sent_packets": report.sent_packets, "rounds": report.rounds,
                "retransmitted_packets": report.retransmitted_packets,
                "acknowledged_elems": report.acknowledged_elems}}

        return fut, sent
    out = None
    if op.get("out", True):
        proto, _ = make_data(kind, 1, 0)
        out = np.empty(n, dtype=proto.dtype)
        out.view(np.uint8)[:] = 0x5A  # lost elements must be overwritten by the fill
    fut = ep.recv(src=op["src"], msg=msg, step=step, out=out)

    def received(r: Any) -> dict[str, Any]:
        if out is not None and r.data is not out:
            raise AssertionError("recv(out=...) did not return out")
        return check_received(r.data, r.report, kind, n, seed)

    return fut, received


def resident_memory() -> dict[str, int]:
    """This process's resident memory now and at its peak (bytes, Linux)."""
    found = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                found[name] = int(value.split()[0]) * 1024  # (kB)
    return found


def child_main(argv: Sequence[str]) -> int:
    plan = json.loads(argv[0])
    lock = threading.Lock()

    def out(line: str) -> None:
        with lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    timeout = float(plan.get("wait_timeout", 30.0))
    store = LineStore(out, timeout)
    lines: queue.Queue[str] = queue.Queue()

    def read_stdin() -> None:
        for raw in sys.stdin:
            line = raw.strip()
            if line.startswith("peer "):
                _, rank, address = line.split(" ", 2)
                store.add(int(rank), address)
            else:
                lines.put(line)
        lines.put("exit")

    threading.Thread(target=read_stdin, name="stdin", daemon=True).start()

    def wait_line(want: str) -> None:
        while (line := lines.get(timeout=timeout)) != want:
            if line == "exit":
                raise SystemExit(3)

    ep = _build(plan, store)
    try:
        wait_line("go")
        started: list[tuple[Future[Any], Any, float]] = []
        results: list[dict[str, Any] | None] = []

        def await_all() -> None:
            for i, (fut, convert, t0) in enumerate(started):
                if results[i] is not None:
                    continue
                try:
                    results[i] = convert(fut.result(timeout=timeout))
                    results[i]["elapsed"] = time.monotonic() - t0  # type: ignore[index]
                except BaseException as exc:
                    results[i] = _failure(exc, t0)

        memory: dict[str, dict[str, int]] = {}
        for op in plan.get("ops", []):
            if op["op"] == "wait":
                wait_line(op["line"])
            elif op["op"] == "memory":
                memory[op["label"]] = resident_memory()
            elif op["op"] == "await":
                await_all()
            else:
                t0 = time.monotonic()
                try:
                    fut, convert = _start(ep, op)
                except BaseException as exc:
                    fut = Future()
                    fut.set_exception(exc)
                    convert = None
                started.append((fut, convert, t0))
                results.append(None)
        await_all()
        out("results " + json.dumps({"results": results, "stats": ep.stats(), "memory": memory},
                                    default=str))  # fmt: skip
        wait_line("exit")
    finally:
        ep.close()
    alive = [t.name for t in threading.enumerate() if t.name.startswith("dlcp")]
    out("closed " + json.dumps(alive))
    return 0


# ----------------------------------------------------------------------------- parent


class PeerError(AssertionError):
    """A worker did not say what it should have, in time."""


class Peer:
    """One worker process, driven over its stdin/stdout: this module's, or
    another ``module`` that takes the plan the same way and prints such lines."""

    def __init__(self, plan: dict[str, Any], log: Path,
                 prefix: Sequence[str] = (), module: str = "tests.io.peers") -> None:
        self.plan = plan
        self.rank: int = plan["rank"]
        self.log = log
        self._stderr = log.open("wb")  # a file, never a pipe nobody drains
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env = {k: v for k, v in env.items() if not k.startswith("DLCP_")}
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", module, json.dumps(plan)],
            cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._stderr, text=True, bufsize=1,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True,
                                        name=f"peer-reader-{self.rank}")
        self._reader.start()
        self.address: str | None = None

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def stderr(self) -> str:
        self._stderr.flush()
        return self.log.read_text(errors="replace")[-4000:]

    def expect(self, word: str, timeout: float) -> str:
        """The rest of the next line starting with ``word``."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self._lines.get(timeout=max(left, 0.0))
            except queue.Empty:
                raise PeerError(f"rank {self.rank}: no {word!r} line within {timeout} s; "
                                f"stderr:\n{self.stderr()}") from None
            if line is None:
                code = self.proc.wait(timeout=5)
                raise PeerError(f"rank {self.rank} exited ({code}) before {word!r}; "
                                f"stderr:\n{self.stderr()}")
            if line.startswith(word + " ") or line == word:
                return line[len(word) + 1 :]

    def say(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def ready(self, timeout: float = 20.0) -> str:
        self.address = self.expect("ready", timeout)
        return self.address

    def results(self, timeout: float) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.expect("results", timeout))
        return out

    def finish(self, timeout: float = 10.0) -> list[str]:
        """Ask the worker to close its endpoint and exit; the dlcp threads it had left."""
        self.say("exit")
        alive: list[str] = json.loads(self.expect("closed", timeout))
        code = self.proc.wait(timeout=timeout)
        if code != 0:
            raise PeerError(f"rank {self.rank} exited with {code}; stderr:\n{self.stderr()}")
        return alive

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)

    def cleanup(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        self.kill()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()


@contextmanager
def workers(plans: Sequence[dict[str, Any]], logdir: Path,
            prefixes: Sequence[Sequence[str]] | None = None,
            extra_peers: dict[int, str] | None = None) -> Iterator[list[Peer]]:
    """Start one worker per plan, give each the others' addresses (and
    ``extra_peers``); kill any still running on exit."""
    peers: list[Peer] = []
    try:
        for i, plan in enumerate(plans):
            prefix = prefixes[i] if prefixes else ()
            peers.append(Peer(plan, logdir / f"rank{plan['rank']}.stderr", prefix))
        book = {p.rank: p.ready() for p in peers}
        book.update(extra_peers or {})
        for p in peers:
            for rank, address in book.items():
                if rank != p.rank:
                    p.say(f"peer {rank} {address}")
        yield peers
    finally:
        for p in peers:
            p.cleanup()


def transfer(plans: Sequence[dict[str, Any]], logdir: Path, *, timeout: float = 30.0,
             prefixes: Sequence[Sequence[str]] | None = None) -> list[dict[str, Any]]:
    """Run the plans to completion: results (with stats and leftover threads) per rank."""
    with workers(plans, logdir, prefixes) as peers:
        for p in peers:
            p.say("go")
        results = [p.results(timeout) for p in peers]
        for p, r in zip(peers, results, strict=True):
            r["threads_after_close"] = p.finish()
        return results


if __name__ == "__main__":
    try:
        sys.exit(child_main(sys.argv[1:]))
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.exit(2)
