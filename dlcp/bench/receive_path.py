"""The receive path's CPU per datagram: the run path in Python against the native one.

    python -m dlcp.bench.receive_path --json

Replays, in one process and without sockets, what a receive buffer holds when
several messages arrive at once: ``--messages`` messages of ``--elems`` float32
each, their datagrams cut into runs of D datagrams (for each D of ``--runs``)
and the messages' runs interleaved round-robin (as datagrams of several senders,
or of several messages of one, alternate on the socket). Each buffer goes through
both receive paths of :mod:`dlcp.io.native_receive`, taking turns, ``--repeats``
times, each on new sessions:

* ``python``: the run path in Python, one ``Session.receive_batch`` per run (as
  the I/O thread's ``deliver`` is called when the native path is off);
* ``native``: the runs staged in a ``MessageTable`` and taken in C, Python
  applying what each message took once per C step (``hand_over``).

The first datagram of each message opens it (the same Python path for both) and
is not timed; every message must complete on both, with the same bytes, or the
run fails. Figures per D: ``python_ns`` and ``native_ns``, CPU time of this
process per datagram (medians over the repeats), and ``ratio`` = native /
python. ``--authenticate``: the datagrams carry AES-GMAC tags (spec §3) under a
fixed key, which both paths verify (the Python run path with one
``verified_prefix`` call per run, the native one in C before it copies; it
needs ``dlcp.io._udpio`` built with libcrypto).

``copy``: what the native path's copy into the message's buffer costs, for one untagged
message of ``--copy-elems`` float32 in runs of 1,024: CPU per datagram of the
native path taking its datagrams (all but the last run: the message stays under
way) when they are new (``new_ns``: checked and copied) and then once more, as
duplicates (``duplicate_ns``: checked, not copied). The last stdout line
(``--json``) is one JSON object.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import numpy as np
import numpy.typing as npt

from dlcp.errors import BenchError, DLCPError
from dlcp.io import native_receive
from dlcp.io.native_receive import MessageRuns, hand_over
from dlcp.proto.config import ProtocolConfig
from dlcp.proto.events import DataBatch, MessageReceived
from dlcp.proto.receive_paths import Taken
from dlcp.proto.session import Session

from . import positive_counts
from .outcome import finish

_JOB, _STEP = 9, 1
_NOW = 1.0
#: runs staged per C step at most (the receive loop's MAX_RUNS is 4096)
_STAGE = 4000


#: the pair key of --authenticate (both ranks: one key for every pair)
_KEY = bytes(range(32))


def _messages(
    count: int, elems: int, key: bytes | None = None
) -> tuple[list[list[bytes]], list[bytes]]:
    """Each message's datagrams in send order (tagged under ``key`` if given), and
    each message's data."""
    tx = Session(
        rank=0,
        job=_JOB,
        config=ProtocolConfig(pacer="unpaced", authenticate=key is not None),
        key=key,
    )
    datas = []
    for msg in range(count):
        data = np.random.default_rng(msg).standard_normal(elems).astype(np.float32)
        # (a step each: of the messages of one step, only the earliest sends)
        tx.send_message(1, data, step=_STEP + msg, msg=msg, now=0.0)
        datas.append(data.tobytes())
    grams: list[list[bytes]] = [[] for _ in range(count)]
    for item in tx.datagrams_to_send(now=0.0, max_batches=1 << 20):
        if isinstance(item, DataBatch):
            raw, seg = bytes(item.data), item.segment_size
            msg = int.from_bytes(raw[8:10], "big")  # (the header's msg field)
            grams[msg] += [raw[i : i + seg] for i in range(0, len(raw), seg)]
    return grams, datas


def _buffer(
    grams: list[list[bytes]], run: int
) -> tuple[npt.NDArray[np.uint8], list[tuple[int, int, int]]]:
    """All but each message's first datagram, in runs of ``run`` interleaved
    round-robin, back to back: the buffer and its runs (start, end, segment size)."""
    per_message = [[g[i : i + run] for i in range(1, len(g), run)] for g in grams]
    order = [r for k in range(max(map(len, per_message))) for rs in per_message
             if k < len(rs) for r in [rs[k]]]  # fmt: skip
    raw = bytearray()
    runs = []
    for r in order:
        start = len(raw)
        raw += b"".join(r)
        runs.append((start, len(raw), len(r[0])))
    return np.frombuffer(bytes(raw), np.uint8).copy(), runs


class _Native:
    """A session fed through the C table (as the I/O thread's TakenRuns)."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def taken(self, taken: list[Taken]) -> None:
        self.session.receive_taken(taken, now=_NOW)

    def rest(self, buf: npt.NDArray[np.uint8], segment_size: int) -> None:
        self.session.receive_rest(buf, segment_size, now=_NOW)


def _session(
    grams: list[list[bytes]], native: bool, key: bytes | None = None
) -> tuple[Session, MessageRuns | None]:
    s = Session(rank=1, job=_JOB, config=ProtocolConfig(authenticate=key is not None), key=key)
    runs = MessageRuns(_JOB) if native else None
    if runs is not None:
        s.take_runs_natively(runs)
    for g in grams:  # (each message's first datagram opens it: not timed)
        s.receive_batch(np.frombuffer(g[0], np.uint8), len(g[0]), now=_NOW)
    return s, runs


def _replay(grams: list[list[bytes]], datas: list[bytes], run: int, native: bool,
            key: bytes | None) -> float:  # fmt: skip
    """CPU seconds to take one buffer of runs of ``run`` datagrams on one path."""
    buf, runs = _buffer(grams, run)
    s, table = _session(grams, native, key)

    def deliver(b: npt.NDArray[np.uint8], seg: int) -> None:
        s.receive_batch(b, seg, now=_NOW)

    t0 = time.process_time()
    if table is None:
        for start, end, seg in runs:
            s.receive_batch(buf[start:end], seg, now=_NOW)
    else:
        sink = _Native(s)
        for at in range(0, len(runs), _STAGE):
            table.table.stage(buf, runs[at : at + _STAGE])
            hand_over(table.table, buf, deliver, sink)
    spent = time.process_time() - t0
    got = {}
    while (event := s.next_event()) is not None:
        if isinstance(event, MessageReceived):
            got[event.msg] = event.data.tobytes()
    if got != dict(enumerate(datas)):
        raise BenchError(f"{'native' if native else 'python'} path, runs of {run}: "
                         f"{len(got)} of {len(datas)} messages arrived exact")  # fmt: skip
    return spent


def _copy_cost(elems: int, repeats: int) -> dict[str, float]:
    """CPU per datagram of the native path over one message's datagrams, new and
    then again as duplicates (see the module docstring)."""
    grams, _ = _messages(1, elems)
    buf, runs = _buffer(grams, 1024)
    body = runs[:-1]  # (the last run would complete it: the second pass must find it open)
    count = sum(-(-(end - start) // seg) for start, end, seg in body)
    if not body:
        raise BenchError(f"--copy-elems={elems}: fewer than two runs of 1024 datagrams")
    new: list[float] = []
    again: list[float] = []

    def deliver(b: npt.NDArray[np.uint8], seg: int) -> None:
        raise BenchError("the native path handed a run of a registered message back")

    for _ in range(repeats):
        s, table = _session(grams, True)
        assert table is not None
        sink = _Native(s)
        for times in (new, again):
            t0 = time.process_time()
            for at in range(0, len(body), _STAGE):
                table.table.stage(buf, body[at : at + _STAGE])
                hand_over(table.table, buf, deliver, sink)
            times.append(time.process_time() - t0)
        r = s._inbox._incoming[(0, _STEP, 0)].reassembler
        if r.duplicates != count:
            raise BenchError(f"copy: {r.duplicates} duplicates counted, {count} sent twice")
    return {"elems": elems, "datagrams": count,
            "new_ns": round(statistics.median(new) / count * 1e9, 1),
            "duplicate_ns": round(statistics.median(again) / count * 1e9, 1)}  # fmt: skip


def measure(messages: int, elems: int, runs: list[int], repeats: int,
            key: bytes | None = None) -> dict[str, Any]:  # fmt: skip
    grams, datas = _messages(messages, elems, key)
    datagrams = sum(len(g) - 1 for g in grams)
    figures: dict[str, Any] = {}
    for run in runs:
        times: dict[bool, list[float]] = {False: [], True: []}
        for k in range(repeats):
            for native in (k % 2 == 0, k % 2 == 1):  # (taking turns: who goes first)
                times[native].append(_replay(grams, datas, run, native, key))
        py = statistics.median(times[False]) / datagrams * 1e9
        nat = statistics.median(times[True]) / datagrams * 1e9
        figures[str(run)] = {"python_ns": round(py, 1), "native_ns": round(nat, 1),
                             "ratio": round(nat / py, 3)}  # fmt: skip
    return {"bench": "receive_path", "authenticated": key is not None, "messages": messages,
            "elems": elems, "datagrams": datagrams, "repeats": repeats,
            "runs": figures}  # fmt: skip


def _table(result: dict[str, Any]) -> str:
    tagged = ", tagged (AES-GMAC)" if result["authenticated"] else ""
    lines = [f"{result['messages']} messages of {result['elems']} float32{tagged}, "
             f"{result['datagrams']} datagrams, CPU per datagram (median of {result['repeats']})",
             f"  {'run':>6}{'python ns':>12}{'native ns':>12}{'ratio':>8}"]  # fmt: skip
    for run, f in result["runs"].items():
        lines.append(f"  {run:>6}{f['python_ns']:>12.1f}{f['native_ns']:>12.1f}{f['ratio']:>8.3f}")
    c = result["copy"]
    lines.append(f"native path, one message of {c['elems']} float32, {c['datagrams']} datagrams: "
                 f"{c['new_ns']:.1f} ns new, {c['duplicate_ns']:.1f} ns as duplicates")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None, prog: str = "python -m dlcp.bench.receive_path") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=4, help="messages at once (default 4)")
    ap.add_argument("--elems", type=int, default=250_000, help="float32 each (default 250000)")
    ap.add_argument("--runs", type=positive_counts, default=[1, 4, 16, 64, 1024],
                    help="datagrams per run, comma-separated (default 1,4,16,64,1024)")  # fmt: skip
    ap.add_argument("--repeats", type=int, default=7, help="replays per path (default 7)")
    ap.add_argument("--copy-elems", type=int, default=6_250_000,
                    help="float32 of the copy figure's message (default 6250000)")  # fmt: skip
    ap.add_argument("--authenticate", action="store_true",
                    help="tagged datagrams, verified on both paths")  # fmt: skip
    ap.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = ap.parse_args(argv)
    if args.messages < 1 or args.elems < 1 or args.repeats < 1 or args.copy_elems < 1:
        ap.error(f"--messages={args.messages} --elems={args.elems} --repeats={args.repeats}: "
                 "each at least 1")  # fmt: skip
    if not native_receive.available():
        print(f"{prog}: the native receive path was not built", file=sys.stderr)
        return 1
    if args.authenticate and not native_receive.verifies_tags():
        print(f"{prog}: --authenticate: the native receive path was built without libcrypto "
              "and verifies no tags", file=sys.stderr)  # fmt: skip
        return 1

    def run(args: argparse.Namespace) -> dict[str, Any]:
        key = _KEY if args.authenticate else None
        result = measure(args.messages, args.elems, args.runs, args.repeats, key)
        result["copy"] = _copy_cost(args.copy_elems, args.repeats)
        return result

    return finish("receive_path", run, _table, args, errors=(BenchError, DLCPError),
                  cleaned_up="nothing was left running")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
