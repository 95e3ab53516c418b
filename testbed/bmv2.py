"""BMv2 software switches (``simple_switch`` / ``simple_switch_grpc``) running the
DLCP P4 program, for the BMv2 tests and the ``--switch bmv2`` testbed.

:func:`bmv2_switch` starts one switch process, optionally inside a network
namespace, on the given ``port -> interface`` map, waits until it really
serves (its thrift port, and its gRPC address if any, accept a connection:
probed from inside the namespace, never slept on), and terminates exactly that
process on exit. :meth:`Bmv2Switch.cli` drives the thrift ``simple_switch_CLI``
(table entries, counters, registers, queue rates); the P4Runtime controller in
:mod:`dlcp.switch` is the other way to configure a ``simple_switch_grpc``.

The switch always runs with ``--priority-queues 8``: the program puts every
packet in queue ``standard_metadata.priority`` and BMv2 drops priorities at or
above the number of queues.

Needs the p4lang binaries on ``PATH`` (built from source, not packaged):
:func:`missing_bmv2` says what is absent so that callers skip or fail with a reason.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypeVar

from dlcp.errors import DLCPError
from dlcp.processes import dies_with_this_process, end_process

__all__ = [
    "CLI",
    "P4_BUILD",
    "SWITCH",
    "SWITCH_GRPC",
    "Bmv2Error",
    "Bmv2Switch",
    "bmv2_switch",
    "cli_command",
    "in_netns",
    "missing_bmv2",
    "program_paths",
]

SWITCH = "simple_switch"
SWITCH_GRPC = "simple_switch_grpc"
CLI = "simple_switch_CLI"

#: the committed compiler output of p4/bmv2/dlcp.p4 (in a source checkout)
P4_BUILD = Path(__file__).resolve().parents[1] / "p4" / "bmv2" / "build"

T = TypeVar("T")

_CLONE_NEWNET = 0x40000000
_PROMPT = "RuntimeCmd: "
_CLI_ERROR = re.compile(
    r"^(Invalid |Error|\*\*\* |Traceback|[A-Za-z.]*(Exception|Error):)", re.MULTILINE
)
_COUNTER = re.compile(r"\[(\d+)\]=\s*\((\d+) bytes, (\d+) packets\)")
_REGISTER = re.compile(r"\[(\d+)\]=\s*(\d+)")


class Bmv2Error(DLCPError, RuntimeError):
    """A BMv2 switch failed to start, died, or refused a command (message says which)."""


def _shebang_python(path: str) -> str | None:
    with open(path, "rb") as f:
        first = f.readline().decode(errors="replace").strip()
    if not first.startswith("#!"):
        return None
    words = first[2:].split()
    if words and os.path.basename(words[0]) == "env" and len(words) > 1:
        return shutil.which(words[1])
    return words[0] if words else None


@functools.cache
def cli_command() -> tuple[str, ...] | None:
    """``(python, simple_switch_CLI)``: the CLI script run by the first interpreter that
    can import what it needs (thrift and BMv2's runtime_CLI / sswitch_runtime), trying
    the script's own ``#!`` interpreter, then Debian's ``/usr/bin/python3`` (where
    ``python3-thrift`` and a BMv2 built with ``PYTHON=/usr/bin/python3`` put them)."""
    path = shutil.which(CLI)
    if path is None:
        return None
    candidates = [_shebang_python(path), "/usr/bin/python3", sys.executable]
    for python in dict.fromkeys(c for c in candidates if c and os.path.exists(c)):
        probe = [python, "-c", "import thrift, runtime_CLI, sswitch_runtime"]
        if subprocess.run(probe, capture_output=True, check=False).returncode == 0:
            return (python, path)
    return None


def missing_bmv2(*, grpc: bool = False) -> list[str]:
    """What is missing to run a BMv2 switch here (empty: all is there)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root")
    for tool in (SWITCH_GRPC if grpc else SWITCH, CLI, "ip", "ethtool"):
        if shutil.which(tool) is None:
            missing.append(tool)
    if shutil.which(CLI) is not None and cli_command() is None:
        missing.append(f"a Python that runs {CLI} (imports thrift, runtime_CLI, sswitch_runtime)")
    return missing


def program_paths(*, loss_injection: bool = False) -> tuple[Path, Path]:
    """``(bmv2_json, p4info_txtpb)`` of the compiled DLCP program."""
    stem = "dlcp_loss" if loss_injection else "dlcp"
    paths = (P4_BUILD / f"{stem}.json", P4_BUILD / f"{stem}.p4info.txtpb")
    for p in paths:
        if not p.is_file():
            raise Bmv2Error(f"{p}: compiled P4 program missing (run `make -C p4`)")
    return paths


def in_netns(ns: str | None, fn: Callable[[], T]) -> T:
    """``fn()`` run in a thread that joined network namespace ``ns`` (``None``: this
    one). setns(2) changes only the calling thread, so the caller's namespace is
    untouched; sockets ``fn`` creates stay in ``ns``. Exceptions propagate."""
    result: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            if ns is not None:
                libc = ctypes.CDLL(None, use_errno=True)
                fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
                try:
                    if libc.setns(fd, _CLONE_NEWNET) != 0:
                        err = ctypes.get_errno()
                        raise OSError(err, f"setns into {ns}: {os.strerror(err)}")
                finally:
                    os.close(fd)
            result.append(fn())
        except BaseException as e:  # handed to the caller's thread
            error.append(e)

    t = threading.Thread(target=target, name=f"in-netns-{ns}")
    t.start()
    t.join()
    if error:
        raise error[0]
    return result[0]


def _tcp_accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _grpc_accepts(addr: str) -> bool:
    try:
        if addr.startswith("unix:"):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(0.5)
                s.connect(addr[len("unix:") :].removeprefix("//"))
            return True
        host, _, port = addr.rpartition(":")
        host = "127.0.0.1" if host in ("0.0.0.0", "") else host.strip("[]")
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except (OSError, ValueError):
        return False


@dataclass
class Bmv2Switch:
    """One running BMv2 process (see :func:`bmv2_switch`)."""

    name: str
    ns: str | None
    ports: dict[int, str]
    thrift_port: int
    grpc_addr: str | None
    device_id: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def _argv(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *argv] if self.ns else list(argv)

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise Bmv2Error(
                f"BMv2 switch {self.name} exited with status {self.proc.returncode}; "
                f"log {self.log_path}:\n{self.log_tail()}"
            )

    def cli(self, *commands: str, timeout: float = 60.0) -> list[str]:
        """Run ``commands`` in one ``simple_switch_CLI`` session; their outputs, in
        order. Raises :class:`Bmv2Error` naming the first command the CLI refused."""
        self.check_alive()
        command = cli_command()
        if command is None:
            raise Bmv2Error(f"no Python here runs {CLI} (needs thrift, runtime_CLI)")
        argv = self._argv([*command, "--thrift-port", str(self.thrift_port)])
        proc = subprocess.run(
            argv,
            input="\n".join(commands) + "\n",
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0 or _PROMPT not in proc.stdout:
            raise Bmv2Error(
                f"{CLI} on switch {self.name} failed ({proc.returncode}): "
                f"{(proc.stderr or proc.stdout).strip()[-2000:]}"
            )
        outputs = [o.strip() for o in proc.stdout.split(_PROMPT)[1:]]
        for sent, out in zip(commands, outputs, strict=False):
            if _CLI_ERROR.search(out):
                raise Bmv2Error(f"switch {self.name}: `{sent}` failed: {out}")
        if len(outputs) < len(commands):
            raise Bmv2Error(
                f"switch {self.name}: {CLI} answered {len(outputs)} of {len(commands)} "
                f"commands: {proc.stdout.strip()[-2000:]}"
            )
        return outputs[: len(commands)]

    def counter(self, name: str, index: int) -> tuple[int, int]:
        """``(packets, bytes)`` of indirect counter ``name[index]``."""
        (out,) = self.cli(f"counter_read {name} {index}")
        m = _COUNTER.search(out)
        if m is None or int(m.group(1)) != index:
            raise Bmv2Error(f"switch {self.name}: cannot read counter {name}[{index}]: {out}")
        return int(m.group(3)), int(m.group(2))

    def counters(self, name: str, indices: Sequence[int]) -> dict[int, tuple[int, int]]:
        """``{index: (packets, bytes)}`` of several cells of counter ``name``, one session."""
        outs = self.cli(*(f"counter_read {name} {i}" for i in indices))
        result = {}
        for i, out in zip(indices, outs, strict=True):
            m = _COUNTER.search(out)
            if m is None:
                raise Bmv2Error(f"switch {self.name}: cannot read counter {name}[{i}]: {out}")
            result[i] = (int(m.group(3)), int(m.group(2)))
        return result

    def register(self, name: str, index: int) -> int:
        (out,) = self.cli(f"register_read {name} {index}")
        m = _REGISTER.search(out)
        if m is None:
            raise Bmv2Error(f"switch {self.name}: cannot read register {name}[{index}]: {out}")
        return int(m.group(2))


def _wait_ready(sw: Bmv2Switch, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    # (what, namespace to probe from, probe): a unix socket is reachable from any namespace
    probes: list[tuple[str, str | None, Callable[[], bool]]] = [
        (f"thrift port {sw.thrift_port}", sw.ns, lambda: _tcp_accepts(sw.thrift_port))
    ]
    if sw.grpc_addr is not None:
        addr = sw.grpc_addr
        where = None if addr.startswith("unix:") else sw.ns
        probes.append((f"gRPC address {addr}", where, lambda: _grpc_accepts(addr)))
    for what, where, probe in probes:
        while not in_netns(where, probe):
            sw.check_alive()
            if time.monotonic() > deadline:
                raise Bmv2Error(
                    f"BMv2 switch {sw.name}: {what} not accepting connections after "
                    f"{timeout:.0f} s; log {sw.log_path}:\n{sw.log_tail()}"
                )
            time.sleep(0.05)  # poll interval between connection attempts


def _capture_offloads_off(sw: Bmv2Switch, iface: str) -> None:
    """Segmentation/receive offloads off on a switch port. BMv2 reads ports with
    libpcap, which sizes its capture ring's slots for 64 KB frames when any of them is
    on -- about 32 slots in the default 2 MB ring, so bursts beyond that were lost
    before the switch saw them. Off, slots are MTU-sized. Features this kernel does not
    expose (one call each) stay as they are."""
    for feature in ("tso", "gso", "gro", "lro", "tx-udp-segmentation"):
        subprocess.run(
            sw._argv(["ethtool", "-K", iface, feature, "off"]), capture_output=True, check=False
        )
    out = subprocess.run(
        sw._argv(["ethtool", "-k", iface]), capture_output=True, text=True, check=False
    ).stdout
    still_on = [
        f
        for f in ("tcp-segmentation-offload", "generic-segmentation-offload",
                  "generic-receive-offload")
        if f"{f}: on" in out
    ]  # fmt: skip
    if still_on:
        raise Bmv2Error(f"switch {sw.name}: cannot turn off {', '.join(still_on)} on {iface}")


@contextmanager
def bmv2_switch(
    ports: Mapping[int, str],
    *,
    log_dir: str | os.PathLike[str],
    name: str = "bmv2",
    ns: str | None = None,
    json_path: str | os.PathLike[str] | None = None,
    grpc_addr: str | None = None,
    thrift_port: int = 9090,
    device_id: int = 0,
    priority_queues: int = 8,
    log_level: str | None = None,
    timeout: float = 60.0,
) -> Iterator[Bmv2Switch]:
    """Start a BMv2 switch on ``ports`` (``{port number: interface}``) inside
    namespace ``ns`` (``None``: this one) and stop it on exit.

    With ``grpc_addr`` it is ``simple_switch_grpc`` serving P4Runtime there
    (``unix:/path`` reaches across namespaces; ``host:port`` is inside ``ns``) and,
    without ``json_path``, it starts with no program (``--no-p4``) until the
    controller pushes one. Without ``grpc_addr`` it is ``simple_switch`` and
    ``json_path`` is required. Its output goes to ``<log_dir>/<name>.log``; with
    ``log_level`` (``trace``, ``debug``, ``info``, ...) that includes BMv2's log."""
    binary = SWITCH_GRPC if grpc_addr is not None else SWITCH
    missing = missing_bmv2(grpc=grpc_addr is not None)
    if missing:
        raise Bmv2Error(f"BMv2 switch {name} needs {', '.join(missing)}")
    if json_path is None and grpc_addr is None:
        raise Bmv2Error(f"BMv2 switch {name}: simple_switch needs a program (json_path)")
    if json_path is not None and not Path(json_path).is_file():
        raise Bmv2Error(f"BMv2 switch {name}: no program at {json_path} (run `make -C p4`)")
    log_path = Path(log_dir) / f"{name}.log"
    sw = Bmv2Switch(name, ns, dict(ports), thrift_port, grpc_addr, device_id, log_path)
    argv = [binary, "--device-id", str(device_id), "--thrift-port", str(thrift_port)]
    # BMv2's nanomsg notification socket defaults to /tmp/bmv2-<device id>-...: one per
    # device id on the whole machine; ours lives beside the log
    argv += ["--notifications-addr", f"ipc://{Path(log_dir).resolve() / f'{name}.notify.ipc'}"]
    for port, iface in sorted(ports.items()):
        argv += ["-i", f"{port}@{iface}"]
    if log_level is not None:
        argv += ["--log-console", "-L", log_level]
    argv += [str(json_path)] if json_path is not None else ["--no-p4"]
    argv += ["--", "--priority-queues", str(priority_queues)]
    if grpc_addr is not None:
        argv += ["--grpc-server-addr", grpc_addr]
        if grpc_addr.startswith("unix:"):
            sock = Path(grpc_addr[len("unix:") :].removeprefix("//"))
            with contextlib.suppress(FileNotFoundError):
                sock.unlink()  # a stale socket of a crashed run at our own path
    for iface in ports.values():
        _capture_offloads_off(sw, iface)
    log: IO[bytes] = open(log_path, "wb")  # noqa: SIM115 -- closed in finally
    try:
        sw.proc = subprocess.Popen(
            sw._argv(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            # a crashed run must not leave its switches running
            preexec_fn=dies_with_this_process(),
        )
        try:
            _wait_ready(sw, timeout)
            yield sw
        finally:
            end_process(sw.proc, 10)
    finally:
        log.close()
