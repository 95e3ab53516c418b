"""Network namespaces joined by veth pairs: the smallest real network.

Everything created is named with a run prefix (``dlcp<pid><n>``) and removed by
name on exit, on error and on Ctrl-C (the context manager's ``finally``).
Readiness is checked, never slept: after setup a ping must get through.

Needs root and iproute2; loss rules need nftables (``nft``); offload changes
need ``ethtool``. :func:`missing_tools` says what is absent, so tests can skip
with a reason.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import itertools
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from dlcp.errors import DLCPError
from dlcp.processes import signals_ignored

__all__ = [
    "SEGMENTATION_FEATURES",
    "TCP_RTO_MIN_SYSCTL",
    "NetnsError",
    "NetnsLine",
    "NetnsLoopback",
    "NetnsPair",
    "missing_tools",
    "netns_line",
    "netns_loopback",
    "netns_pair",
    "require_segmentation_off",
    "segmentation_left_on",
    "tcp_timers_like_dlcp",
]

_counter = itertools.count()


class NetnsError(DLCPError, RuntimeError):
    """A namespace command failed; the message holds the command and its stderr."""


def missing_tools(*, loss: bool = False, offloads: bool = False) -> list[str]:
    """What is missing to build a namespace pair here (empty: all is there)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root")
    for tool, wanted in (("ip", True), ("sysctl", True), ("nft", loss), ("ethtool", offloads)):
        if wanted and shutil.which(tool) is None:
            missing.append(tool)
    return missing


def _run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise NetnsError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


#: ``ethtool -k`` names of the segmentation offloads that must be off for packets
#: on the wire to be MTU-sized (TCP's TSO, GSO, and UDP's)
SEGMENTATION_FEATURES = (
    "tcp-segmentation-offload",
    "generic-segmentation-offload",
    "tx-udp-segmentation",
)


def segmentation_left_on(ethtool_k: str) -> list[str]:
    """The segmentation offloads that ``ethtool -k`` output shows on (one the
    kernel does not list cannot be on)."""
    on = []
    for line in ethtool_k.splitlines():
        name, _, state = line.strip().partition(":")
        if name in SEGMENTATION_FEATURES and state.strip().startswith("on"):
            on.append(name)
    return on


#: the namespace-wide minimum retransmission timeout of TCP (Linux 6.11+)
TCP_RTO_MIN_SYSCTL = "net.ipv4.tcp_rto_min_us"


def tcp_timers_like_dlcp(run: Callable[[Sequence[str]], Any]) -> int | None:
    """Give every TCP socket of a namespace (``run`` executes an argv there and
    returns its completed process) the minimum retransmission timeout DLCP's
    control connections set on theirs (``EndpointConfig.control_rto_min`` under
    this process's ``DLCP_*`` variables), so that the transports' TCP waits
    alike. Returns it in microseconds, or None where the kernel has no such
    setting or DLCP keeps the kernel's too (TCP then keeps its 200 ms)."""
    from dlcp.io import EndpointConfig

    rto_min = EndpointConfig.from_env().control_rto_min
    if rto_min <= 0:
        return None
    usec = max(1, round(rto_min * 1e6))
    done = run(["sysctl", "-qw", f"{TCP_RTO_MIN_SYSCTL}={usec}"])
    return usec if done.returncode == 0 else None


def require_segmentation_off(run: Callable[[Sequence[str]], Any], dev: str, where: str) -> None:
    """Raise NetnsError if ``dev`` still segments (``run`` executes an argv where
    ``dev`` lives): ``ethtool -K`` may refuse a feature and a run would then
    measure 64 KB packets while claiming MTU-sized ones."""
    out = run(["ethtool", "-k", dev]).stdout
    left = segmentation_left_on(out)
    if left:
        raise NetnsError(
            f"{where}: {dev} still has {', '.join(left)} on after ethtool -K (the packets "
            "on the wire would not be MTU-sized)"
        )


def offload_argv(dev: str, *, on: bool) -> list[str]:
    """``ethtool`` turning the segmentation and receive offloads of ``dev`` on or off."""
    state = "on" if on else "off"
    return [
        "ethtool",
        "-K",
        dev,
        "tso",
        state,
        "gso",
        state,
        "gro",
        state,
        "tx-udp-segmentation",
        state,
    ]


def nft_random_drop(ns: str, table: str, hook: str, percent: float, match: str = "") -> None:
    """In namespace ``ns``, replace nftables table ``table`` by one rule on ``hook``
    that drops ``percent`` % of IPv4 packets (``numgen random``, steps of 0.01 %);
    ``percent <= 0`` only removes the table. ``match`` (nft expressions, e.g.
    ``oifname "spine1"``) restricts the rule to the packets it matches."""
    _run(["ip", "netns", "exec", ns, "nft", "delete", "table", "inet", table], check=False)
    if percent <= 0:
        return
    rules = (
        f"table inet {table} {{\n"
        f"  chain {hook} {{\n"
        f"    type filter hook {hook} priority -100; policy accept;\n"
        f"    meta nfproto ipv4 {match + ' ' if match else ''}"
        f"numgen random mod 10000 < {round(percent * 100)} counter drop\n"
        f"  }}\n"
        f"}}\n"
    )
    proc = subprocess.run(
        ["ip", "netns", "exec", ns, "nft", "-f", "-"],
        input=rules,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise NetnsError(f"nft in {ns} failed: {proc.stderr.strip()}")


def nft_dropped(ns: str, table: str) -> int:
    """Packets the rule of :func:`nft_random_drop` in ``ns`` dropped so far (an
    error if the table or its counter cannot be read: not a count of 0)."""
    out = _run(["ip", "netns", "exec", ns, "nft", "list", "table", "inet", table]).stdout
    for line in out.splitlines():
        if "counter packets" in line:
            words = line.split()
            return int(words[words.index("packets") + 1])
    raise NetnsError(f"nftables table inet {table} in {ns} has no drop counter")


@dataclass
class NetnsPair:
    """Two namespaces ``a`` and ``b`` joined by one veth pair.

    ``a`` has address ``addr_a`` on interface ``if_a``, ``b`` has ``addr_b`` on
    ``if_b``, both in ``subnet`` (a /24 that exists only inside these namespaces).
    """

    prefix: str
    ns_a: str
    ns_b: str
    if_a: str
    if_b: str
    addr_a: str
    addr_b: str
    mtu: int

    def exec_argv(self, ns: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside namespace ``ns`` (``ip netns exec``)."""
        return ["ip", "netns", "exec", ns, *argv]

    def run(
        self, ns: str, argv: Sequence[str], *, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return _run(self.exec_argv(ns, argv), check=check)

    def set_offloads(self, *, on: bool) -> None:
        """Turn segmentation/receive offloads of both veth ends on or off, so that
        packets on the wire are real MTU-sized packets (off) or GSO batches (on)."""
        for ns, dev in ((self.ns_a, self.if_a), (self.ns_b, self.if_b)):
            self.run(ns, offload_argv(dev, on=on), check=False)
            if not on:
                require_segmentation_off(functools.partial(self.run, ns), dev, ns)

    def set_loss(self, ns: str, percent: float) -> None:
        """Drop ``percent`` % of all IPv4 packets arriving in ``ns`` (nftables
        ``numgen random``, in steps of 0.01 %); 0 removes the rule."""
        nft_random_drop(ns, self.prefix, "input", percent)

    def dropped(self, ns: str) -> int:
        """Packets the loss rule in ``ns`` dropped so far."""
        return nft_dropped(ns, self.prefix)


def run_prefix() -> str:
    """A fresh name prefix for what one run creates, ``dlcp<pid>-<n>``: unique
    among running processes (their pids differ; the dash keeps pid 12 run 34
    apart from pid 123 run 4)."""
    return f"dlcp{os.getpid()}-{next(_counter)}"


def _ifname(prefix: str, suffix: str) -> str:
    """An interface name of the run ``prefix``: at most 15 characters (Linux's
    limit) and always ending in ``suffix``, so the names of one run differ."""
    return prefix[: 15 - len(suffix)] + suffix


def require_tools(what: str, **needs: bool) -> None:
    """Raise :class:`NetnsError` naming what ``what`` needs and this host lacks."""
    missing = missing_tools(**needs)
    if missing:
        raise NetnsError(f"{what} needs {', '.join(missing)}")


def _cleanup(names: Sequence[str]) -> None:
    """Delete the namespaces ``names``, and first stop the processes still in
    them (found by namespace with ``ip netns pids``: a crashed run's switches or
    senders would keep its namespace, veths and routes alive after the name)."""
    with signals_ignored():  # a second Ctrl-C must not leave namespaces behind
        for ns in names:
            pids = _run(["ip", "netns", "pids", ns], check=False).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _run(["ip", "netns", "del", ns], check=False)


def _lock_dir() -> str:
    # one directory for every run, whatever its TMPDIR: runs must see each other's locks
    return "/run/lock" if os.access("/run/lock", os.W_OK) else "/tmp"


@contextmanager
def prefix_lock(prefix: str) -> Iterator[None]:
    """Hold ``prefix`` for one live testbed. A build removes what a crashed run
    left under its names first; without this lock it would as well remove a
    running testbed's. The lock (``flock``) ends with the process that held it,
    so a crash leaves the prefix free for the next run."""
    path = os.path.join(_lock_dir(), f"dlcp-testbed-{prefix}.lock")
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise NetnsError(
                f"prefix {prefix!r} is in use by a running testbed (pid {holder}, lock {path}): "
                "stop that run or choose another --prefix"
            ) from None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break  # the lock file at the path, not one its holder removed meanwhile
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        # removed while held, so no run after this one finds it (or locks it)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)


@contextmanager
def netns_pair(*, mtu: int = 1500, subnet: str = "10.213.7") -> Iterator[NetnsPair]:
    """Create two namespaces joined by veth with ``mtu``; remove them on exit."""
    require_tools("a namespace pair")
    prefix = run_prefix()
    pair = NetnsPair(
        prefix,
        f"{prefix}a",
        f"{prefix}b",
        _ifname(prefix, "va"),
        _ifname(prefix, "vb"),
        f"{subnet}.1",
        f"{subnet}.2",
        mtu,
    )
    created: list[str] = []
    try:
        for ns in (pair.ns_a, pair.ns_b):
            _run(["ip", "netns", "add", ns])
            created.append(ns)
        _run(
            [
                "ip",
                "link",
                "add",
                pair.if_a,
                "netns",
                pair.ns_a,
                "mtu",
                str(mtu),
                "type",
                "veth",
                "peer",
                "name",
                pair.if_b,
                "netns",
                pair.ns_b,
                "mtu",
                str(mtu),
            ]
        )
        for ns, dev, addr in (
            (pair.ns_a, pair.if_a, pair.addr_a),
            (pair.ns_b, pair.if_b, pair.addr_b),
        ):
            pair.run(ns, ["ip", "addr", "add", f"{addr}/24", "dev", dev])
            pair.run(ns, ["ip", "link", "set", dev, "up"])
            pair.run(ns, ["ip", "link", "set", "lo", "up"])
        # readiness: a real packet must get through (ping waits for the reply)
        pair.run(pair.ns_a, ["ping", "-c", "1", "-W", "5", pair.addr_b])
        yield pair
    finally:
        _cleanup(created)


@dataclass
class NetnsLine(NetnsPair):
    """Hosts ``a`` and ``b`` with a router namespace ``r`` between them.

    Loss is injected in the router's forward path, where every packet is a real
    MTU-sized packet, so the hosts can keep GRO on their receiving side (as a
    real NIC would) while the network drops individual packets.
    """

    ns_r: str = ""
    if_ra: str = ""
    if_rb: str = ""

    def set_offloads(self, *, on: bool) -> None:
        """``on``: every offload on. Off: the hosts send real MTU-sized packets
        (segmentation off) but keep GRO on receive; the router never coalesces."""
        seg = "on" if on else "off"
        for ns, dev in ((self.ns_a, self.if_a), (self.ns_b, self.if_b)):
            self.run(
                ns,
                [
                    "ethtool",
                    "-K",
                    dev,
                    "tso",
                    seg,
                    "gso",
                    seg,
                    "tx-udp-segmentation",
                    seg,
                    "gro",
                    "on",
                ],
                check=False,
            )
            if not on:
                require_segmentation_off(functools.partial(self.run, ns), dev, ns)
        for dev in (self.if_ra, self.if_rb):
            self.run(self.ns_r, ["ethtool", "-K", dev, "gro", "off"], check=False)

    def set_loss(self, ns: str, percent: float) -> None:
        """In the router (``ns == ns_r``): drop ``percent`` % of forwarded packets in
        both directions; elsewhere as :meth:`NetnsPair.set_loss`."""
        nft_random_drop(ns, self.prefix, "forward" if ns == self.ns_r else "input", percent)


@contextmanager
def netns_line(*, mtu: int = 1500, subnet: str = "10.213") -> Iterator[NetnsLine]:
    """a -- r -- b: two hosts and a forwarding router, veth links of ``mtu``."""
    require_tools("a namespace line")
    prefix = run_prefix()
    line = NetnsLine(
        prefix,
        f"{prefix}a",
        f"{prefix}b",
        _ifname(prefix, "va"),
        _ifname(prefix, "vb"),
        f"{subnet}.8.2",
        f"{subnet}.9.2",
        mtu,
        ns_r=f"{prefix}r",
        if_ra=_ifname(prefix, "ra"),
        if_rb=_ifname(prefix, "rb"),
    )
    created: list[str] = []
    try:
        for ns in (line.ns_a, line.ns_r, line.ns_b):
            _run(["ip", "netns", "add", ns])
            created.append(ns)
        for host_ns, host_if, r_if, net in (
            (line.ns_a, line.if_a, line.if_ra, f"{subnet}.8"),
            (line.ns_b, line.if_b, line.if_rb, f"{subnet}.9"),
        ):
            _run(
                [
                    "ip",
                    "link",
                    "add",
                    host_if,
                    "netns",
                    host_ns,
                    "mtu",
                    str(mtu),
                    "type",
                    "veth",
                    "peer",
                    "name",
                    r_if,
                    "netns",
                    line.ns_r,
                    "mtu",
                    str(mtu),
                ]
            )
            line.run(host_ns, ["ip", "addr", "add", f"{net}.2/24", "dev", host_if])
            line.run(host_ns, ["ip", "link", "set", host_if, "up"])
            line.run(host_ns, ["ip", "link", "set", "lo", "up"])
            line.run(host_ns, ["ip", "route", "add", "default", "via", f"{net}.1"])
            line.run(line.ns_r, ["ip", "addr", "add", f"{net}.1/24", "dev", r_if])
            line.run(line.ns_r, ["ip", "link", "set", r_if, "up"])
        line.run(line.ns_r, ["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        line.run(line.ns_a, ["ping", "-c", "1", "-W", "5", line.addr_b])  # readiness
        yield line
    finally:
        _cleanup(created)


@dataclass
class NetnsLoopback:
    """One namespace with nothing but its loopback: local processes (e.g. the
    ranks of a job on one machine) in a network of their own, where a loss rule
    hits every packet between them (their TCP and UDP alike) and nothing else."""

    prefix: str
    ns: str
    mtu: int

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the namespace (``ip netns exec``)."""
        return ["ip", "netns", "exec", self.ns, *argv]

    def run(self, argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run(self.exec_argv(argv), check=check)

    def set_offloads(self, *, on: bool) -> None:
        """Loopback's segmentation/receive offloads on (64 KB GSO/TSO units travel
        as one packet) or off (every packet is at most ``mtu`` bytes, so a drop
        hits one MTU-sized packet of any transport)."""
        self.run(offload_argv("lo", on=on), check=False)
        if not on:
            require_segmentation_off(self.run, "lo", self.ns)

    def set_loss(self, percent: float) -> None:
        """Drop ``percent`` % of the IPv4 packets delivered on loopback (nftables
        ``numgen random`` at the input hook, steps of 0.01 %); 0 removes the rule."""
        nft_random_drop(self.ns, self.prefix, "input", percent)

    def dropped(self) -> int:
        """Packets the loss rule dropped so far."""
        return nft_dropped(self.ns, self.prefix)


@contextmanager
def netns_loopback(*, mtu: int = 1500) -> Iterator[NetnsLoopback]:
    """A namespace whose loopback is up with ``mtu``; removed on exit."""
    require_tools("a loopback namespace")
    prefix = run_prefix()
    box = NetnsLoopback(prefix, f"{prefix}l", mtu)
    created: list[str] = []
    try:
        _run(["ip", "netns", "add", box.ns])
        created.append(box.ns)
        box.run(["ip", "link", "set", "lo", "mtu", str(mtu), "up"])
        box.run(["ping", "-c", "1", "-W", "5", "127.0.0.1"])  # readiness
        yield box
    finally:
        _cleanup(created)
