"""Transport benchmark: DLCP vs plain TCP between two processes, lossless and under loss.

    python -m dlcp.bench.transport --json        # or: dlcp bench transport --json

Two worker processes (this module with ``--worker send|recv``, code in
``dlcp/bench/transport_worker.py``) move the same float32 tensor (default 64 MiB)
with DLCP (an :class:`~dlcp.io.Endpoint` pair kept for the whole run, a new
(step, msg) per repetition) and with plain TCP (``sendall`` / ``recv_into`` on
one persistent connection).

Where they run (``path``):

* root (default ``--topology line``): sender, router and receiver namespaces
  joined by veth links with MTU 1500 (``netns-router-veth-mtu1500``); the
  router forwards real MTU-sized packets and drops in its forward path, both
  directions, while the hosts keep GRO on receive as a real NIC would;
* root with ``--topology pair``: two namespaces joined by one veth pair
  (``netns-veth-mtu1500``), drops at the hosts' input, so GRO must be off;
* loopback's 64 KB MTU would flatter TCP, so it is only the fallback;
* otherwise (or ``--loopback``): loopback (``loopback``).

What is timed, the same for both transports: on the sender, from the start of
sending to the receiver's acknowledgement that it has the whole message (DLCP:
the send future, completed by the receiver's STOP on the control channel; TCP:
one byte the receiver writes back once ``recv_into`` has every byte). The
receiver checks every lossless transfer bit for bit, and every lossy DLCP
transfer against its report and bound (only reported-lost values may differ).

Phases (DLCP and TCP repetitions alternate, so drift hits both alike):

1. warm-up, one of each (not counted);
2. lossless, veth offloads on (TSO/GSO/GRO, as on a real NIC), DLCP p = 0,
   and in the same rounds DLCP with authentication: ``auth_cost`` = 1 -
   auth/plain throughput;
3. (root) lossless with segmentation offloads off on both veth ends (receive
   offloads too with ``--topology pair``; the line topology keeps GRO on):
   what the loss runs' setting costs each transport before any loss;
4. under loss (default 1 %), DLCP p = 0.05. With root: nftables ``numgen
   random`` drops, by default in both namespaces (``--loss-direction both``:
   data, TCP acks and DLCP control alike, as on a lossy link; ``forward`` drops
   only what arrives at the receiver), offloads still off so that drops hit
   MTU-sized packets of both transports. DLCP keeps UDP GSO on its socket: with
   ``tx-udp-segmentation`` off the kernel segments each batch in software before
   the veth, so drops are per packet, which the output shows (nftables drops
   ~1 % of DLCP's packets, lost runs of ~1 chunk; ``--loss-offloads on`` is the
   control where drops hit whole batches). Without root, DLCP's in-process loss
   emulator drops received datagrams (``loss_method = "emulated"``) and TCP
   cannot be compared: its loss fields are null.

With root, phases 3 and 4 also time the **UDP floor** (``udp_floor_*``): the
same bytes in datagrams of DLCP's size, each sent once through DLCP's own UDP
layer with no protocol above it (no packing, no loss recovery, nothing
acknowledged per message; ``--floor-senders`` threads, a socket each), from the
first send to the receiver's last read that got data (DLCP's and TCP's times
end a little later, at the sender's acknowledgement). DLCP sends the same way,
so its transfers cannot take less time on this path; ``udp_floor_ratio_loss_*``
is the floor over TCP, the lowest ``ratio_loss_*`` a transport that sends every
byte this way could reach in the same run. A floor transfer whose receive socket
overflowed (its receiver fell behind the unpaced sender: a busy machine) is made
again, ``FLOOR_ATTEMPTS`` (3) times at most, and ``udp_floor_overflowed_attempts``
counts those given up; a floor that overflows every time, or a lossy one that
misses more datagrams than the router dropped, fails the run.

The last stdout line (with ``--json``) is one JSON object with every figure.
``DLCP_*`` environment variables tune the endpoints (e.g. ``DLCP_PACER``).
``--instrument`` adds a per-activity breakdown of the DLCP I/O threads' time,
``--profile DIR`` writes cProfile data of those threads.

Parent and workers speak JSON lines: the parent writes one command per line to
a worker's stdin (``{"op": "send", ...}``); the worker answers on its stdout
with one JSON object per line, ``{"ok": true, ...}`` or ``{"ok": false,
"error": ...}``. A worker prints ``{"ok": true, "event": "ready"}`` once its
sockets are bound; the receiver answers ``expect`` twice (``expecting`` once its
receive is posted, then ``received``), and only then is the sender told to
``send``. A worker that exits, answers an error or stays silent past
``--timeout`` stops the run with an error naming it; both workers are then
stopped by their process handles and the namespaces removed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from dlcp.io.udp import datagrams_per_gso_message

from .outcome import finish
from .transport_procs import WorkerError, WorkerProc, collect
from .transport_report import Rep, summary, table
from .transport_worker import KEY_ENV, worker_main

#: tries at one UDP floor transfer while its receive socket overflows (Bench.floor_rep)
FLOOR_ATTEMPTS = 3

# ---------------------------------------------------------------------- driving


class Progress:
    """A one-line ``\\r`` progress bar on stderr (a line per phase when not a terminal)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done, self.enabled = total, 0, enabled
        self.tty = sys.stderr.isatty()
        self.t0 = time.monotonic()
        self.phase = ""

    def step(self, phase: str, what: str, *, advance: int = 1) -> None:
        self.done += advance
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.t0
        if self.tty:
            fill = 30 * self.done // self.total
            sys.stderr.write(
                f"\r[{'#' * fill}{'.' * (30 - fill)}] {self.done}/{self.total} "
                f"{elapsed:5.1f}s {phase + ' ' + what:<26}"
            )
            sys.stderr.flush()
        elif phase != self.phase:
            sys.stderr.write(f"{elapsed:6.1f}s {phase}\n")
        self.phase = phase

    def finish(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\r" + " " * 79 + "\r")
            sys.stderr.flush()


class Bench:
    """Drives the two workers, one command at a time."""

    def __init__(
        self, args: argparse.Namespace, workers: list[WorkerProc], progress: Progress
    ) -> None:
        self.args = args
        self.workers = workers
        self.sender, self.receiver = workers
        self.progress = progress
        self.step = 0
        #: floor transfers made again because their receive socket overflowed
        self.floor_overflows = 0
        #: the packets the network dropped during the floor transfer kept last
        self.floor_dropped = 0

    def both(self, what: str, op: str, **fields: Any) -> dict[str, dict[str, Any]]:
        """The same command to both workers (receiver first); their answers."""
        self.receiver.send(op, **fields)
        self.sender.send(op, **fields)
        got = collect(self.workers, {"send": 1, "recv": 1}, self.args.timeout, what)
        return {n: got[n][0] for n in got}

    def connect(self) -> dict[str, int | None]:
        """Open the TCP baseline's connection; each side's minimum RTO (us)."""
        self.receiver.send("accept")
        self.sender.send("connect")
        got = collect(self.workers, {"send": 1, "recv": 1}, self.args.timeout, "TCP connect")
        return {n: got[n][0].get("tcp_rto_min_us") for n in got}

    def rep(
        self, transport: str, endpoint: str, p: float, phase: str, *, overflow_ok: bool = False
    ) -> Rep:
        """One transfer: the receiver posts its receive, then the sender sends.
        ``overflow_ok``: a floor transfer whose receive socket overflowed is
        returned (for :meth:`floor_rep` to try again) instead of failing the run."""
        self.step += 1
        msg = {"plain": 0, "auth": 1, "emul": 2}[endpoint] if transport == "dlcp" else 0
        what = f"{phase} {transport} transfer (step {self.step})"
        fields = {"transport": transport, "endpoint": endpoint, "step": self.step, "msg": msg}
        self.receiver.send("expect", bound=p, **fields)
        collect(self.workers, {"recv": 1}, self.args.timeout, f"expect for the {what}")
        self.sender.send("send", p=p, **fields)
        got = collect(self.workers, {"send": 1, "recv": 1}, self.args.timeout, f"the {what}")
        tx, rx = got["send"][0], got["recv"][0]
        if transport == "floor":
            if not rx["verified"] and not (overflow_ok and overflowed(rx)):
                raise WorkerError(
                    f"recv worker: the {what} got {rx['bytes']} of {rx['expected_bytes']} "
                    f"bytes without loss (its socket overflowed: {rx['counters']})"
                )
            seconds = rx["last"] - tx["start"]  # both CLOCK_MONOTONIC, one kernel
        elif not rx["verified"]:
            raise WorkerError(
                f"recv worker: the {what} did not verify: {rx['wrong_elems']} "
                f"values differ, report {rx['report']}"
            )
        else:
            seconds = tx["seconds"]
        timers = {"send": tx["timers"], "recv": rx["timers"]} if "timers" in tx else None
        self.progress.step(phase, transport)
        return Rep(seconds, tx, rx, timers)

    def floor_rep(self, p: float, phase: str, dropped: Callable[[], int] | None = None) -> Rep:
        """A UDP floor transfer, made again while its receive socket overflowed
        (the floor's receiver fell behind, on a busy machine: that time is not a
        floor), :data:`FLOOR_ATTEMPTS` times at most; the attempts given up are
        counted in :attr:`floor_overflows`. ``dropped`` (the packets the network
        has dropped so far) is read around each attempt: the one kept, and its
        drops, are in :attr:`floor_dropped`."""

        def attempt(*, last: bool) -> Rep:
            before = dropped() if dropped is not None else 0
            rep = self.rep("floor", "plain", p, phase, overflow_ok=not last)
            self.floor_dropped = dropped() - before if dropped is not None else 0
            return rep

        for _ in range(FLOOR_ATTEMPTS - 1):
            rep = attempt(last=False)
            if not overflowed(rep.receiver):
                return rep
            self.floor_overflows += 1
        return attempt(last=True)


def overflowed(receiver: dict[str, Any]) -> bool:
    """Whether a floor transfer's receive socket dropped datagrams (its kernel
    counter of receive-buffer errors grew during the transfer)."""
    return bool(receiver["counters"]["udp_RcvbufErrors"])


def _check_floor_shortfall(rep: Rep, dropped: int, *, whole_gso: bool) -> None:
    """A lossy floor transfer may miss only what the network dropped (``dropped``
    packets of either direction: at least every datagram it lost; with offloads
    on, ``whole_gso``, a packet is a whole GSO message of datagrams); a socket
    overflow or a receiver that stopped early would pass for loss and make the
    floor look faster than it is."""
    rx = rep.receiver
    overflow = rx["counters"]["udp_RcvbufErrors"]
    missing = (rx["expected_bytes"] - rx["bytes"]) // rx["segment_bytes"]
    per_drop = datagrams_per_gso_message(rx["segment_bytes"]) if whole_gso else 1
    if overflow or missing > dropped * per_drop:
        raise WorkerError(
            f"UDP floor transfer: {missing} datagrams missing, the router dropped {dropped} "
            f"packets (of up to {per_drop} datagrams each) and the receive socket "
            f"overflowed {overflow} times: the floor's receiver did not keep up, so its "
            "time would not be a floor"
        )


def _free_port_bases(requested: int | None) -> tuple[int, int]:
    """Two port bases with 8 free ports each on loopback (checked now; if another
    program takes one before the worker binds it, the worker's error says so)."""
    if requested:
        return requested, requested + 10
    for base in range(21000, 32000, 20):
        try:
            for port in range(base, base + 18):
                for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
                    with socket.socket(socket.AF_INET, kind) as s:
                        s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base, base + 10
    raise WorkerError("no free range of ports for the workers on loopback; use --port-base")


@contextlib.contextmanager
def _placement(args: argparse.Namespace) -> Iterator[tuple[str, Any]]:
    """(path, namespace pair or None): namespaces when root, unless --loopback."""
    from testbed.netns import missing_tools, netns_line, netns_pair

    if args.loopback or missing_tools(loss=True, offloads=True):
        yield "loopback", None
        return
    if args.topology == "line":
        with netns_line(mtu=args.mtu) as line:
            yield f"netns-router-veth-mtu{args.mtu}", line
        return
    with netns_pair(mtu=args.mtu) as pair:
        yield f"netns-veth-mtu{args.mtu}", pair


def _worker_argv(
    args: argparse.Namespace,
    role: str,
    hosts: tuple[str, str],
    bases: tuple[int, int],
    emulated: float,
) -> list[str]:
    me = 0 if role == "send" else 1
    argv = [
        sys.executable,
        "-m",
        "dlcp.bench.transport",
        "--worker",
        role,
        "--host",
        hosts[me],
        "--peer-host",
        hosts[1 - me],
        "--port-base",
        str(bases[me]),
        "--peer-port-base",
        str(bases[1 - me]),
        "--size-bytes",
        str(args.size_bytes),
        "--emulated-loss",
        str(emulated),
        "--dlcp-timeout",
        str(args.dlcp_timeout),
        "--seed",
        str(args.seed),
        "--floor-senders",
        str(args.floor_senders),
    ]
    if args.instrument:
        argv.append("--instrument")
    if args.copy_send:
        argv.append("--copy-send")
    if args.profile:
        argv += ["--profile", os.path.abspath(args.profile)]
    return argv


def run(args: argparse.Namespace) -> dict[str, Any]:
    reps, lossless = args.repetitions, args.lossless_repetitions
    env = {**os.environ, KEY_ENV: os.urandom(32).hex()}  # the auth key, for both workers
    # transfers by phase: lossless, authenticated, offloads off (root), under loss
    res: dict[str, Any] = {
        k: []
        for k in (
            "dlcp",
            "tcp",
            "auth",
            "dlcp_no_offloads",
            "tcp_no_offloads",
            "dlcp_loss",
            "tcp_loss",
            "floor_no_offloads",
            "floor_loss",
        )
    }
    with _placement(args) as (path, pair):
        # DLCP sizes its datagrams from the links' MTU (DLCP_MTU=auto) unless told
        # otherwise; loopback's 64 KiB MTU is not a link: it gets --mtu as it is
        env.setdefault("DLCP_MTU", "auto" if pair is not None else str(args.mtu))
        # warm-ups, lossless, authenticated, loss; then (root) offloads off and the
        # UDP floor with both, or (not root) a skipped offloads-off phase
        if pair is None:
            extra = 2 * lossless
        else:
            extra = (3 * lossless if args.loss_offloads == "off" else 0) + reps + 1
        progress = Progress(3 + 3 * lossless + 2 * reps + extra, not args.no_progress)
        if pair is None:
            hosts, bases = ("127.0.0.1", "127.0.0.1"), _free_port_bases(args.port_base)
        else:  # fresh namespaces: every port is free
            base = args.port_base or 41000
            hosts, bases = (pair.addr_a, pair.addr_b), (base, base + 10)
        emulated = args.loss / 100 if pair is None else 0.0
        workers: list[WorkerProc] = []
        try:
            for role, ns in (("send", "ns_a"), ("recv", "ns_b")):
                argv = _worker_argv(args, role, hosts, bases, emulated)
                if pair is not None:
                    argv = pair.exec_argv(getattr(pair, ns), argv)
                workers.append(WorkerProc.start(role, argv, env))
            ready = collect(workers, {"send": 1, "recv": 1}, 60, "ready")["send"][0]
            progress.step("workers ready", "", advance=0)
            bench = Bench(args, workers, progress)
            res["tcp_rto_min_us"] = bench.connect()
            if pair is not None:
                pair.set_offloads(on=True)
            bench.rep("dlcp", "plain", 0.0, "warm-up")
            bench.rep("tcp", "plain", 0.0, "warm-up")
            bench.rep("dlcp", "auth", 0.0, "warm-up")
            for _ in range(lossless):  # (auth_cost compares plain and auth side by side too)
                res["dlcp"].append(bench.rep("dlcp", "plain", 0.0, "lossless"))
                res["tcp"].append(bench.rep("tcp", "plain", 0.0, "lossless"))
                res["auth"].append(bench.rep("dlcp", "auth", 0.0, "lossless"))
            if pair is None:
                for _ in range(reps):
                    res["dlcp_loss"].append(bench.rep("dlcp", "emul", args.p, "loss"))
                    progress.step("loss", "(no tcp: emulated)")
                progress.step("loss", "done", advance=2 * lossless)  # no offloads-off phase
                stats = bench.both("stats", "stats", endpoint="emul")
                res["emulated_dropped"] = stats["recv"]["stats"]["emulated_loss_dropped"]
            else:
                pair.set_offloads(on=args.loss_offloads == "on")
                bench.floor_rep(0.0, "warm-up floor")
                # the same without loss: what turning offloads off costs each transport
                for _ in range(lossless if args.loss_offloads == "off" else 0):
                    for transport in ("dlcp", "tcp"):
                        res[f"{transport}_no_offloads"].append(
                            bench.rep(transport, "plain", 0.0, "offloads off")
                        )
                    res["floor_no_offloads"].append(bench.floor_rep(0.0, "offloads off"))
                if args.topology == "line":  # the router drops, both directions
                    lossy, counted = [pair.ns_r], pair.ns_r
                else:
                    lossy = [pair.ns_b] + ([pair.ns_a] if args.loss_direction == "both" else [])
                    counted = pair.ns_b
                for ns in lossy:
                    pair.set_loss(ns, args.loss)
                res["nft"] = {"dlcp": 0, "tcp": 0, "floor": 0}
                for _ in range(reps):
                    for transport in ("dlcp", "tcp"):
                        before = pair.dropped(counted)
                        rep = bench.rep(transport, "plain", args.p, "loss")
                        res[f"{transport}_loss"].append(rep)
                        res["nft"][transport] += pair.dropped(counted) - before
                    rep = bench.floor_rep(args.p, "loss", lambda: pair.dropped(counted))
                    _check_floor_shortfall(
                        rep, bench.floor_dropped, whole_gso=args.loss_offloads == "on"
                    )
                    res["floor_loss"].append(rep)
                    res["nft"]["floor"] += bench.floor_dropped
                res["floor_overflows"] = bench.floor_overflows
        finally:
            progress.finish()
            for w in workers:
                w.stop()
    if args.raw:
        with open(args.raw, "w") as f:
            json.dump(
                {
                    k: [dataclasses.asdict(r) for r in v] if isinstance(v, list) else v
                    for k, v in res.items()
                },
                f,
            )
    return summary(args, path, pair is not None, ready, res)


def _parser(prog: str = "python -m dlcp.bench.transport") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=prog,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--size-mib", type=float, default=64, help="tensor size (default 64)")
    ap.add_argument(
        "--repetitions",
        type=int,
        default=20,
        help="transfers of each transport under loss (default 20)",
    )
    ap.add_argument(
        "--lossless-repetitions",
        type=int,
        default=5,
        help="transfers of each transport in each lossless phase (default 5)",
    )
    ap.add_argument("--loss", type=float, default=1.0, help="loss rate in percent (default 1)")
    ap.add_argument(
        "--topology",
        choices=["line", "pair"],
        default="line",
        help="root: sender - router - receiver namespaces, loss in the router's forward path "
        "and GRO on at the hosts (line, default), or two namespaces with loss at the "
        "hosts' input and GRO off (pair)",
    )
    ap.add_argument(
        "--loss-direction",
        choices=["both", "forward"],
        default="both",
        help="with --topology pair: nftables drops in both namespaces (default) or the "
        "receiver's only (the line topology's router drops both ways)",
    )
    ap.add_argument(
        "--loss-offloads",
        choices=["off", "on"],
        default="off",
        help="veth offloads under loss: off (default; drops hit MTU-sized packets) or on "
        "(a control: drops then hit whole GSO/TSO batches)",
    )
    ap.add_argument("--p", type=float, default=0.05, help="DLCP loss bound under loss")
    ap.add_argument(
        "--mtu",
        type=int,
        default=1500,
        help="MTU of the namespaces' links (default 1500; 9000: jumbo frames); DLCP "
        "sizes its datagrams from it (DLCP_MTU=auto) unless DLCP_MTU is set",
    )
    ap.add_argument("--loopback", action="store_true", help="use loopback even as root")
    ap.add_argument("--port-base", type=int, help="first of the ports the workers use")
    ap.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds a worker may take to answer one command (default 120)",
    )
    ap.add_argument(
        "--dlcp-timeout",
        type=float,
        default=60.0,
        help="the endpoints' send/recv timeout (default 60)",
    )
    ap.add_argument("--seed", type=int, default=1, help="seed of the loss emulator")
    ap.add_argument(
        "--floor-senders",
        type=int,
        default=1,
        help="threads (each with a socket of its own) that send the UDP floor's datagrams "
        "(default 1, as DLCP sends)",
    )
    ap.add_argument(
        "--instrument", action="store_true", help="time the DLCP I/O threads by activity"
    )
    ap.add_argument(
        "--profile",
        metavar="DIR",
        help="cProfile the DLCP I/O threads into DIR/{send,recv}.rank*.job*",
    )
    ap.add_argument(
        "--copy-send",
        action="store_true",
        help="DLCP copies the tensor into packets (default: lends it to the native engine, "
        "which reads each datagram's payload from it, as TCP sends from it)",
    )
    ap.add_argument("--raw", metavar="FILE", help="write every transfer's raw answers here")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    # worker mode (internal)
    ap.add_argument("--worker", choices=["send", "recv"], help=argparse.SUPPRESS)
    ap.add_argument("--host", help=argparse.SUPPRESS)
    ap.add_argument("--peer-host", help=argparse.SUPPRESS)
    ap.add_argument("--peer-port-base", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--size-bytes", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--emulated-loss", type=float, default=0.0, help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None, prog: str = "python -m dlcp.bench.transport") -> int:
    args = _parser(prog).parse_args(argv)
    if args.worker:
        return worker_main(args)
    args.size_bytes = int(args.size_mib * 2**20) // 4 * 4
    if args.floor_senders < 1:
        raise SystemExit(f"dlcp bench transport: --floor-senders={args.floor_senders} < 1")
    if args.repetitions < 1 or args.lossless_repetitions < 1 or args.size_bytes < 4:
        raise SystemExit("dlcp bench transport: repetitions and size must be positive")
    if not 0 < args.loss < 100:
        raise SystemExit(
            f"dlcp bench transport: --loss={args.loss} is not a percentage in (0, 100)"
        )
    if args.loss_direction != "both" and args.topology != "pair":
        raise SystemExit(
            f"dlcp bench transport: --loss-direction {args.loss_direction} needs --topology "
            "pair (the line topology's router drops in both directions)"
        )
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)

    return finish(
        "transport",
        run,
        table,
        args,
        errors=WorkerError,
        cleaned_up="workers stopped, namespaces removed",
    )


if __name__ == "__main__":
    sys.exit(main())
