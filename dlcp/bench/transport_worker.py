"""Worker side of ``dlcp.bench.transport``: one process, one role (``send`` or ``recv``).

Started by the parent as ``python -m dlcp.bench.transport --worker ROLE ...``;
see ``dlcp/bench/transport.py`` for the line protocol. A worker owns:

* DLCP endpoints, each on its own (data, control) ports from ``--port-base``:
  ``plain`` (lossless and kernel-loss runs), ``auth`` (authenticated), and
  ``emul`` (only without root: the receiver's emulates loss in-process);
* the plain TCP connection (the receiver listens on ``--port-base + 6``);
* the UDP floor's sockets (:class:`~dlcp.io.udp.DataSockets`, DLCP's own UDP
  layer with no protocol above it; the receiver's on ``--port-base + 7``);
* the tensor both sides derive from one seed, so the receiver can verify.

Every answer is one JSON line on the worker's stdout, which nothing else may
write to (``print`` goes to stderr here).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import selectors
import socket
import sys
import threading
import time
import traceback
from typing import IO, Any

import numpy as np

from dlcp.io.control import set_fast_timers
from dlcp.proto.wire import DATA_HEADER_LEN

from .endpoint_probes import Timers, profile_endpoint_threads

__all__ = ["ENDPOINT_PORTS", "FLOOR_PORT", "KEY_ENV", "TCP_PORT", "worker_main"]

#: offsets from a worker's port base: (data, control) of each endpoint, then TCP
ENDPOINT_PORTS = {"plain": 0, "auth": 2, "emul": 4}
TCP_PORT = 6
FLOOR_PORT = 7
#: seconds of silence after the sender's last send that end a floor transfer
FLOOR_QUIET = 0.05
#: environment variable with the authentication key (hex), set by the parent
KEY_ENV = "DLCPBENCH_AUTH_KEY"  # not DLCP_*: EndpointConfig.from_env refuses unknown ones
_SEED = 20240


def tensor(nbytes: int) -> np.ndarray:
    return np.random.default_rng(_SEED).standard_normal(nbytes // 4, dtype=np.float32)


def _snmp() -> dict[str, int]:
    """TCP and UDP counters of this process's network namespace."""
    with open("/proc/net/snmp") as f:
        rows = [line.split() for line in f]
    out = {}
    for proto, wanted in (
        ("Tcp:", ("OutSegs", "RetransSegs")),
        ("Udp:", ("InDatagrams", "RcvbufErrors", "InErrors")),
    ):
        names, values = (r for r in rows if r[0] == proto)
        table = dict(zip(names[1:], values[1:], strict=True))
        out.update({f"{proto[:-1].lower()}_{w}": int(table[w]) for w in wanted})
    return out


def _delta(before: dict[str, int]) -> dict[str, int]:
    after = _snmp()
    return {k: after[k] - before[k] for k in before}


def _report_dict(report: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(report):
        value = getattr(report, f.name)
        if f.name == "lost_ranges":
            out["lost_runs"] = len(value)
        else:
            out[f.name] = value.value if hasattr(value, "value") else value
    return out


def config_dict(cfg: Any) -> dict[str, Any]:
    p = cfg.protocol
    return {
        "batch_packets": p.batch_packets,
        "mtu": p.mtu,
        "payload_bytes": p.chunk_bytes,
        "pacer": p.pacer,
        "n_paths": p.n_paths,
        "classifier": p.classifier,
        "rcvbuf": cfg.rcvbuf,
        "sndbuf": cfg.sndbuf,
    }


# ---------------------------------------------------------------------- worker


class Worker:
    """One side of the benchmark: endpoints, TCP socket, and the command loop."""

    def __init__(self, args: argparse.Namespace, reply: IO[str], timers: Timers | None) -> None:
        from dlcp.io import Endpoint, EndpointConfig

        self.role = args.worker
        self.rank = 0 if self.role == "send" else 1
        self.peer = 1 - self.rank
        self.reply_file = reply
        self.timers = timers
        self.timeout = args.dlcp_timeout
        self.data = tensor(args.size_bytes)
        #: lend the tensor to the engine (nothing writes it while it is sent)
        self.lend = not args.copy_send
        self.out = np.empty_like(self.data) if self.role == "recv" else None
        key = bytes.fromhex(os.environ[KEY_ENV])
        base = EndpointConfig.from_env(timeout=args.dlcp_timeout)
        #: the TCP baseline gets the same per-socket timers as DLCP's control
        #: channel (minimum RTO and delayed-ACK maximum), so a loss costs both
        #: transports the same kernel timers, not 200 ms for one of them
        self.tcp_rto_min = base.control_rto_min
        names = ["plain", "auth"] + (["emul"] if args.emulated_loss else [])
        self.endpoints: dict[str, Any] = {}
        self.floor: Any = None
        self.tcp: socket.socket | None = None
        self.listener: socket.socket | None = None
        try:
            for job, name in enumerate(names, start=1):
                off = ENDPOINT_PORTS[name]
                cfg = EndpointConfig.from_env(
                    protocol=dataclasses.replace(base.protocol, authenticate=name == "auth"),
                    timeout=args.dlcp_timeout,
                    host=args.host,
                    data_port=args.port_base + off,
                    control_port=args.port_base + off + 1,
                    emulated_loss=args.emulated_loss
                    if name == "emul" and self.role == "recv"
                    else 0.0,
                    emulated_loss_seed=args.seed,
                )
                peer = (args.peer_host, args.peer_port_base + off, args.peer_port_base + off + 1)
                where = f"{args.host} UDP {cfg.data_port} / TCP {cfg.control_port}"
                try:
                    self.endpoints[name] = Endpoint(
                        self.rank,
                        {self.peer: peer},
                        job=job,
                        config=cfg,
                        key=key if name == "auth" else None,
                    )
                except OSError as exc:
                    raise OSError(f"{name} endpoint on {where}: {exc}") from exc
            self.floor = _floor_sockets(args, base, self.role)
            if self.role == "recv":
                port = args.port_base + TCP_PORT
                try:
                    self.listener = socket.create_server((args.host, port))
                except OSError as exc:
                    raise OSError(f"TCP listener on {args.host}:{port}: {exc}") from exc
        except BaseException:
            self.close()
            raise
        self.tcp_addr = (args.peer_host, args.peer_port_base + TCP_PORT)
        self.floor_addr = (args.peer_host, args.peer_port_base + FLOOR_PORT)
        # (DLCP's datagram size as its endpoint resolved it: DLCP_MTU=auto reads the
        # interface's MTU)
        payload = self.endpoints["plain"].config.protocol.chunk_bytes
        self.floor_segment = DATA_HEADER_LEN + payload
        self.floor_datagrams = -(-self.data.nbytes // payload)
        self._floor_records: np.ndarray | None = None

    def emit(self, **fields: Any) -> None:
        self.reply_file.write(json.dumps({"ok": True, **fields}) + "\n")
        self.reply_file.flush()

    def close(self) -> None:
        for ep in self.endpoints.values():
            ep.close()
        if self.floor is not None:
            self.floor.close()
        for s in (self.tcp, self.listener):
            if s is not None:
                s.close()

    def serve(self, commands: IO[str]) -> None:
        ep = self.endpoints["plain"]
        stats = ep.stats()
        self.emit(
            event="ready",
            pid=os.getpid(),
            gso=stats["gso"],
            gro=stats["gro"],
            engine=ep.engine,
            engine_threads=stats["engine_threads"],
            config=config_dict(ep.config),
        )
        for line in commands:
            cmd = json.loads(line)
            op = cmd.pop("op")
            if op == "quit":
                return
            try:
                getattr(self, f"op_{op}")(**cmd)
            except Exception as exc:
                self.reply_file.write(
                    json.dumps(
                        {
                            "ok": False,
                            "op": op,
                            "error": f"{type(exc).__name__}: {exc}",
                            "traceback": traceback.format_exc(),
                        }
                    )
                    + "\n"
                )
                self.reply_file.flush()

    # ------------------------------------------------------------------ commands

    def op_connect(self) -> None:
        self.tcp = socket.create_connection(self.tcp_addr, timeout=self.timeout)
        self.tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rto = set_fast_timers(self.tcp, self.tcp_rto_min)
        self.emit(op="connect", tcp_rto_min_us=rto)

    def op_accept(self) -> None:
        assert self.listener is not None
        self.listener.settimeout(self.timeout)
        self.tcp, _ = self.listener.accept()
        self.tcp.settimeout(self.timeout)
        self.tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rto = set_fast_timers(self.tcp, self.tcp_rto_min)
        self.emit(op="accept", tcp_rto_min_us=rto)

    def op_stats(self, endpoint: str) -> None:
        self.emit(op="stats", stats=self.endpoints[endpoint].stats())

    def _take_timers(self, endpoint: str) -> dict[str, Any]:
        if self.timers is None:
            return {}
        thread = self.endpoints[endpoint]._thread.ident
        assert thread is not None
        return {"timers": self.timers.take(thread)}

    def op_send(self, transport: str, endpoint: str, step: int, msg: int, p: float) -> None:
        counters = _snmp()
        if self.timers is not None:
            self.timers.reset()
        extra: dict[str, Any] = {}
        if transport == "floor":
            self._send_floor(counters)
            return
        cpu = time.process_time()  # (this process's CPU, every thread's)
        if transport == "dlcp":
            ep = self.endpoints[endpoint]
            before = ep.stats()["packets_out"]
            t0 = time.perf_counter()
            report = ep.send(self.data, to=self.peer, msg=msg, step=step, p=p, borrow=self.lend)
            report = report.result(timeout=self.timeout)
            seconds = time.perf_counter() - t0
            extra = {
                **self._take_timers(endpoint),
                "report": _report_dict(report),
                "packets_out": ep.stats()["packets_out"] - before,
            }
        else:
            assert self.tcp is not None, "connect first"
            t0 = time.perf_counter()
            self.tcp.sendall(self.data.view(np.uint8).data)
            if self.tcp.recv(1) != b"\x01":
                raise ConnectionError("TCP receiver closed instead of acknowledging")
            seconds = time.perf_counter() - t0
        cpu = time.process_time() - cpu
        self.emit(op="send", seconds=seconds, cpu_seconds=cpu, counters=_delta(counters), **extra)

    def op_expect(self, transport: str, endpoint: str, step: int, msg: int, bound: float) -> None:
        if transport == "floor":
            self._expect_floor(bound)
            return
        out = self.out
        assert out is not None
        out.fill(np.nan)  # nothing of the last repetition can pass for this one
        reported = np.zeros(out.size, dtype=bool)
        counters = _snmp()
        if self.timers is not None:
            self.timers.reset()
        cpu = time.process_time()  # (from the receive's posting: idle until data comes)
        if transport == "dlcp":
            ep = self.endpoints[endpoint]
            before = ep.stats()
            fut = ep.recv(src=self.peer, msg=msg, step=step, out=out)
            self.emit(op="expect", event="expecting")
            loss = fut.result(timeout=self.timeout).report
            report = _report_dict(loss)
            after = ep.stats()
            # how many datagrams the receive's run path took (the rest, the general
            # path: a new message's first, or datagrams it declined), and of those how
            # many the receive loop took itself (the native receive path)
            counted = ("datagrams_in", "datagrams_fast", "datagrams_native")
            extra = {
                **self._take_timers(endpoint),
                **{k: after[k] - before[k] for k in counted},
            }
            for offset, n in loss.lost_ranges:  # where the report says values were lost
                reported[offset : offset + n] = True
        else:
            assert self.tcp is not None, "accept first"
            self.emit(op="expect", event="expecting")
            view = out.view(np.uint8).data
            got, n = 0, len(view)
            while got < n:
                k = self.tcp.recv_into(view[got:], n - got)
                if k == 0:
                    raise ConnectionError(f"TCP sender closed after {got} of {n} bytes")
                got += k
            self.tcp.sendall(b"\x01")
            report = {"lost_elems": 0, "msg_elems": out.size}
            extra = {}
        cpu = time.process_time() - cpu
        counters = _delta(counters)
        differs = out != self.data
        wrong = int(np.count_nonzero(differs))
        lost = report["lost_elems"]
        # lossless: bit-exact; bounded: only the values the report calls lost may
        # differ (by position, not only by count), and no more than the bound
        ok = (
            wrong == 0
            if bound == 0
            else not np.any(differs & ~reported) and lost <= bound * out.size
        )
        self.emit(
            op="expect",
            event="received",
            report=report,
            wrong_elems=wrong,
            verified=ok,
            cpu_seconds=cpu,
            counters=counters,
            **extra,
        )

    # ------------------------------------------------------------------ the UDP floor

    def _records(self) -> np.ndarray:
        """The tensor cut into datagrams of DLCP's size (a zeroed 32-byte header,
        then a chunk of payload), built once: the floor pays no packing."""
        if self._floor_records is None:
            seg, n = self.floor_segment, self.floor_datagrams
            payload = seg - DATA_HEADER_LEN
            flat = np.zeros(n * payload, dtype=np.uint8)
            flat[: self.data.nbytes] = self.data.view(np.uint8)
            records = np.zeros((n, seg), dtype=np.uint8)
            records[:, DATA_HEADER_LEN:] = flat.reshape(n, payload)
            self._floor_records = records.reshape(-1)
        return self._floor_records

    def _send_floor(self, counters: dict[str, int]) -> None:
        """Every datagram once through DLCP's UDP layer (``--floor-senders``
        threads, each its share on a socket of its own: ``send`` releases the
        GIL), then a byte on the TCP connection that says so; timed until the
        receiver's acknowledgement."""
        assert self.tcp is not None, "connect first"
        records = self._records().data
        seg, n = self.floor_segment, self.floor_datagrams
        parts = len(self.floor.send_socks)
        bounds = [n * i // parts for i in range(parts + 1)]
        sent = [0] * parts
        errors: list[BaseException] = []

        def send_part(i: int) -> None:
            a, b = bounds[i], bounds[i + 1]
            try:
                sent[i] = self.floor.send(
                    records[a * seg : b * seg], seg, b - a, path=i, tos=0, addr=self.floor_addr
                )
            except BaseException as exc:  # raised below, in this thread
                errors.append(exc)

        threads = [threading.Thread(target=send_part, args=(i,)) for i in range(1, parts)]
        start = time.monotonic()
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        send_part(0)
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        self.tcp.sendall(b"\x02")
        if self.tcp.recv(1) != b"\x01":
            raise ConnectionError("UDP floor receiver closed instead of acknowledging")
        seconds = time.perf_counter() - t0
        self.emit(
            op="send", seconds=seconds, start=start, datagrams=sum(sent), counters=_delta(counters)
        )

    def _expect_floor(self, bound: float) -> None:
        """Read datagrams (counting them, nothing else) until the sender's byte on
        the TCP connection says it sent them all, and then until the socket has
        been quiet for ``FLOOR_QUIET`` s: that byte may overtake datagrams still
        queued in the router or held by GRO. The time of the last read that got
        data is when the last datagram came; the quiet wait is not in it."""
        assert self.tcp is not None, "accept first"
        sock, floor = self.tcp, self.floor
        while floor.receive(_look_at_nothing):  # a late datagram of an earlier transfer
            pass
        counters = _snmp()
        got, last = 0, None
        self.emit(op="expect", event="expecting")
        with selectors.DefaultSelector() as sel:
            sel.register(floor.recv_sock, selectors.EVENT_READ, "udp")
            sel.register(sock, selectors.EVENT_READ, "tcp")
            sent_all = False
            while True:
                ready = sel.select(FLOOR_QUIET if sent_all else self.timeout)
                if not ready:
                    if sent_all:
                        break  # quiet since the sender finished: nothing more is coming
                    raise TimeoutError(f"UDP floor: nothing for {self.timeout:g} s ({got} bytes)")
                for key, _ in ready:
                    if key.data == "tcp":
                        if sock.recv(1) != b"\x02":
                            raise ConnectionError("UDP floor sender closed the TCP connection")
                        sent_all = True
                        sel.unregister(sock)
                    elif n := floor.receive(_look_at_nothing):
                        got, last = got + n, time.monotonic()
        sock.sendall(b"\x01")
        expected = self.floor_datagrams * self.floor_segment
        self.emit(
            op="expect",
            event="received",
            last=last,
            bytes=got,
            expected_bytes=expected,
            segment_bytes=self.floor_segment,
            # lossless: every datagram; under loss the parent holds the shortfall
            # to the datagrams the network dropped
            verified=got == expected if bound == 0 else last is not None,
            counters=_delta(counters),
        )


def _look_at_nothing(buf: np.ndarray, segment_size: int) -> None:
    """The floor's receive callback: ``receive()`` returns the byte count, and
    that is all the floor looks at."""


def _floor_sockets(args: argparse.Namespace, cfg: Any, role: str) -> Any:
    """DLCP's UDP layer alone, configured like the endpoints' (GSO, GRO, buffers)."""
    from dlcp.io.udp import DataSockets

    port = args.port_base + FLOOR_PORT if role == "recv" else 0
    senders = args.floor_senders if role == "send" else 1
    try:
        return DataSockets(
            args.host, port, senders, gso=cfg.gso, gro=cfg.gro, rcvbuf=cfg.rcvbuf,
            sndbuf=cfg.sndbuf,
        )  # fmt: skip
    except OSError as exc:
        raise OSError(f"UDP floor socket on {args.host}:{port}: {exc}") from exc


def worker_main(args: argparse.Namespace) -> int:
    # the protocol owns fd 1; anything else printed goes to stderr
    reply = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout = sys.stderr
    timers = None
    if args.profile:
        profile_endpoint_threads(f"{args.profile}/{args.worker}")
    if args.instrument:
        timers = Timers()
        timers.install()
    try:
        worker = Worker(args, reply, timers)
    except Exception as exc:
        reply.write(
            json.dumps(
                {
                    "ok": False,
                    "op": "start",
                    "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc(),
                }
            )
            + "\n"
        )
        reply.flush()
        return 1
    try:
        worker.serve(sys.stdin)
    finally:
        worker.close()
    return 0
