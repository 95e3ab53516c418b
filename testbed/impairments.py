"""Impairments and traffic on a built leaf-spine :class:`~.topology.Network`.

* :func:`apply_profile` installs one switch policy (or the FIFO baseline) on every
  router egress interface; :func:`profile_counters` reads the per-class counters.
* :func:`link_loss` drops a random share of the packets crossing one link, in
  both directions: an nftables rule (``numgen random``) on the egress towards
  the neighbour (``oifname``), at the forward hook of a router and the output
  hook of a host, so no other link is affected. :func:`link_dropped` counts.
* :func:`link_down` / :func:`link_up` take both veth ends of a link down or up and
  then re-converge routing as a routing protocol would: every router's routes
  are recomputed from the links that are up (a leaf stops using a spine that
  cannot reach the destination's leaf), with ``ip route replace``. Readiness: a
  ping between hosts that are still connected gets through.
* :func:`rate_limit` caps one direction of a link: the HTB root rate of the
  profile if one is installed there, else a single HTB class (FIFO baseline).
* :func:`cross_traffic` sends a paced UDP flow between two hosts pinned to one
  spine: a source port is chosen by probing (a few packets per candidate port,
  then the spines' link counters show which spine the ECMP hash picked). A
  small UDP sink in the destination host counts what arrives. The flow stands
  for another machine's: where the sending host's egress is shaped as a NIC
  (:mod:`.host_egress`), the flow bypasses that shaping, so it neither waits
  behind the host's own traffic nor slows it.

Incast (many senders to one host) is not here yet.
"""

from __future__ import annotations

import json
import random
import re
import selectors
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dlcp.errors import UsageError
from dlcp.processes import dies_with_this_process
from dlcp.switch.policy import on_link

from . import switch_profile
from .host_egress import exempt_source_port
from .netns import NetnsError, _run, nft_dropped, nft_random_drop
from .switch_profile import FifoPolicy, SwitchPolicy
from .topology import LinkSpec, Network

__all__ = [
    "CrossTraffic",
    "apply_profile",
    "cross_traffic",
    "link_down",
    "link_dropped",
    "link_loss",
    "link_policy",
    "link_up",
    "profile_counters",
    "rate_limit",
]


def _routers(net: Network) -> tuple[str, ...]:
    return (*net.topology.leaves, *net.topology.spines)


def _runner(net: Network, node: str) -> Callable[[Sequence[str]], Any]:
    def run(argv: Sequence[str]) -> Any:
        return net.run(node, argv)

    return run


def _iface(net: Network, a: str, b: str) -> str:
    try:
        return net.ifaces[a][b]
    except KeyError:
        raise UsageError(f"no link between {a!r} and {b!r}") from None


# ---- switch profile -----------------------------------------------------------------


def link_policy(
    policy: SwitchPolicy | FifoPolicy, spec: LinkSpec | None
) -> SwitchPolicy | FifoPolicy:
    """``policy`` for one link: the topology's overrides of that link (its rate,
    its buffer; the drop-eligible threshold scaled with the buffer) win."""
    if spec is None:
        return policy
    # (two calls: on_link returns the kind of policy it is given)
    if isinstance(policy, SwitchPolicy):
        return on_link(policy, spec.link_rate_mbit, spec.buffer_packets)
    return on_link(policy, spec.link_rate_mbit, spec.buffer_packets)


def apply_profile(net: Network, policy: SwitchPolicy | FifoPolicy) -> None:
    """Install ``policy`` on every router egress interface (leaves and spines),
    replacing whatever root qdisc was there; a link the topology file gives its
    own rate or buffer (``[[links]]``) gets them. One ``tc -batch`` per router."""
    t = net.topology
    for router in _routers(net):
        lines = []
        for neighbour, dev in net.ifaces[router].items():
            switch_profile.remove(_runner(net, router), dev)
            mine = link_policy(policy, t.link_spec(router, neighbour))
            lines += [" ".join(argv[1:]) for argv in switch_profile.tc_commands(mine, dev)]
        proc = subprocess.run(
            net.exec_argv(router, ["tc", "-batch", "-"]),
            input="\n".join(lines) + "\n",
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise NetnsError(f"tc -batch in {net.ns(router)} failed: {proc.stderr.strip()}")


def remove_profile(net: Network) -> None:
    """Delete the root qdisc of every router interface (kernel default again)."""
    for router in _routers(net):
        for dev in net.ifaces[router].values():
            switch_profile.remove(_runner(net, router), dev)


def profile_counters(net: Network) -> dict[str, dict[str, dict[str, dict[str, int]]]]:
    """``{router: {iface: class_counters}}`` of every router interface."""
    out: dict[str, dict[str, dict[str, dict[str, int]]]] = {}
    for router in _routers(net):
        out[router] = {
            dev: switch_profile.class_counters(_runner(net, router), dev)
            for dev in net.ifaces[router].values()
        }
    return out


# ---- random loss ----------------------------------------------------------------------


def _loss_table(dev: str) -> str:
    """The nftables table of the loss rule on ``dev``: one per device name
    (interface names may hold '-', table names may not; '_' is doubled, so
    ``s-1`` and ``s_1`` get tables of their own)."""
    return "dlcp_loss_" + dev.replace("_", "__").replace("-", "_d")


def link_loss(net: Network, a: str, b: str, percent: float) -> None:
    """Drop ``percent`` % of the packets crossing the link ``a``--``b`` in each
    direction (0 removes the rules)."""
    _iface(net, a, b)
    for src, dst in ((a, b), (b, a)):
        dev = net.ifaces[src][dst]
        hook = "output" if src in net.topology.host_names else "forward"
        nft_random_drop(net.ns(src), _loss_table(dev), hook, percent, match=f'oifname "{dev}"')


def link_dropped(net: Network, a: str, b: str) -> dict[str, int]:
    """Packets the loss rules of :func:`link_loss` dropped so far, per direction
    (``{"a->b": n, "b->a": m}``; 0 where no rule is in place, e.g. after
    ``link_loss(..., 0)`` removed it; an error if a rule's counter cannot be read)."""
    _iface(net, a, b)
    out = {}
    for src, dst in ((a, b), (b, a)):
        table = _loss_table(net.ifaces[src][dst])
        tables = net.run(src, ["nft", "list", "tables"]).stdout.split()
        out[f"{src}->{dst}"] = nft_dropped(net.ns(src), table) if table in tables else 0
    return out


# ---- link down / up and routing -------------------------------------------------------


def _is_up(net: Network, node: str, dev: str) -> bool:
    out = _run(["ip", "-n", net.ns(node), "-j", "link", "show", "dev", dev]).stdout
    info = json.loads(out)
    return "UP" in info[0].get("flags", [])


def _link_up(net: Network, a: str, b: str) -> bool:
    return _is_up(net, a, net.ifaces[a][b]) and _is_up(net, b, net.ifaces[b][a])


def _reconverge(net: Network) -> None:
    """Routes of every router recomputed from the links that are up now."""
    t = net.topology
    links = t.links()
    host_links = {lo: (up, sn) for lo, up, _la, _ua, sn in links[: len(t.hosts)]}
    fabric = {(lo, up): (la, ua) for lo, up, la, ua, _s in links[len(t.hosts) :]}
    up = {key: _link_up(net, *key) for key in fabric}
    for leaf in t.leaves:
        for h in t.hosts:
            if h.leaf == leaf:
                continue  # connected route
            dst = host_links[h.name][1]
            hops = [fabric[(leaf, s)][1] for s in t.spines if up[(leaf, s)] and up[(h.leaf, s)]]
            _set_route(net, leaf, dst, hops)
    for spine in t.spines:
        for h in t.hosts:
            dst = host_links[h.name][1]
            hops = [fabric[(h.leaf, spine)][0]] if up[(h.leaf, spine)] else []
            _set_route(net, spine, dst, hops)


def _set_route(net: Network, node: str, dst: str, hops: list[str]) -> None:
    if not hops:
        net.run(node, ["ip", "route", "del", dst], check=False)
        return
    if len(hops) == 1:
        via = ["via", hops[0]]
    else:
        via = [w for hop in hops for w in ("nexthop", "via", hop)]
    net.run(node, ["ip", "route", "replace", dst, *via])


def _connected(net: Network) -> list[tuple[str, str]]:
    """Host pairs that still have a path (host links up, a common spine up)."""
    t = net.topology
    pairs = []
    for a in t.host_names:
        for b in t.host_names:
            if a == b:
                continue
            la, lb = t.leaf_of(a), t.leaf_of(b)
            if not (_link_up(net, a, la) and _link_up(net, b, lb)):
                continue
            if la == lb or any(_link_up(net, la, s) and _link_up(net, lb, s) for s in t.spines):
                pairs.append((a, b))
    return pairs


def _check_reachable(net: Network) -> None:
    for a, b in _connected(net):
        # -w: keep trying (one probe a second) until a reply or the deadline, so
        # a loss rule elsewhere cannot fail the check by chance
        proc = net.run(a, ["ping", "-c", "1", "-w", "5", "-q", net.host_addr(b)], check=False)
        if proc.returncode != 0:
            raise NetnsError(f"readiness: {a} cannot reach {b} after the link change")


def _set_link(net: Network, a: str, b: str, state: str) -> None:
    _iface(net, a, b)
    for node, peer in ((a, b), (b, a)):
        net.run(node, ["ip", "link", "set", "dev", net.ifaces[node][peer], state])
    _reconverge(net)
    _check_reachable(net)


def link_down(net: Network, a: str, b: str) -> None:
    """Both ends of link ``a``--``b`` down; routing avoids it; hosts that are still
    connected (e.g. over the other spine) reach each other on return."""
    _set_link(net, a, b, "down")


def link_up(net: Network, a: str, b: str) -> None:
    """Both ends of link ``a``--``b`` up again; routes use it again (ECMP)."""
    _set_link(net, a, b, "up")


# ---- rate limit -----------------------------------------------------------------------


def rate_limit(net: Network, a: str, b: str, mbit: float) -> None:
    """Cap the ``a`` -> ``b`` direction of a link at ``mbit``: with a profile
    installed on that egress, its HTB root class (``1:1``) rate becomes ``mbit``
    (at most the profile's own rate: ValueError above it); otherwise a single
    HTB class (:class:`FifoPolicy`) at ``mbit`` is installed."""
    dev = _iface(net, a, b)
    FifoPolicy(link_rate_mbit=mbit)  # the policy's check: 1 kbit/s to 1e9 Mbit/s, finite
    # (``tc -j class show`` prints plain text for HTB classes in this iproute2)
    classes = net.run(a, ["tc", "class", "show", "dev", dev]).stdout
    # the profile's own rate: the ceil of its classes under 1:1 (best-effort, 1:99,
    # is in every profile), which a rate_limit before this one left as it was
    leaf = re.search(r"^class htb 1:99 .*?\bceil (\d+(?:\.\d+)?)([KMG]?)bit", classes, re.MULTILINE)
    if leaf and re.search(r"^class htb 1:1 ", classes, re.MULTILINE):
        installed = float(leaf.group(1)) * {"": 1e-6, "K": 1e-3, "M": 1.0, "G": 1e3}[leaf.group(2)]
        if mbit > installed * (1 + 1e-6):
            # every class under 1:1 has the installed rate as its ceil, and HTB keeps
            # a class under its own ceil: only a new profile can raise the link
            raise UsageError(
                f"rate_limit {a}->{b}: {mbit:g} Mbit/s is above the {installed:g} Mbit/s "
                "of the profile on that egress; install a profile at the higher rate instead"
            )
        rate = f"{round(mbit * 1000)}kbit"
        net.run(a, ["tc", "class", "change", "dev", dev, "parent", "1:", "classid", "1:1",
                    "htb", "rate", rate, "ceil", rate])  # fmt: skip
    else:
        spec = net.topology.link_spec(a, b)
        buffer = spec.buffer_packets if spec and spec.buffer_packets else None
        policy = FifoPolicy(
            link_rate_mbit=mbit, queue_packets=buffer or net.topology.buffer_packets
        )
        switch_profile.apply(_runner(net, a), dev, policy)


# ---- cross traffic --------------------------------------------------------------------

_SINK = r"""
import json, signal, socket, sys, time
stop_at = None
def _stop(*_):
    global stop_at
    if stop_at is None:
        stop_at = time.monotonic()
signal.signal(signal.SIGTERM, _stop)
signal.signal(signal.SIGINT, _stop)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.settimeout(0.1)
print("ready", flush=True)
n = nbytes = 0
first = last = 0.0
# once told to stop, what is still crossing the routers (a busy machine holds
# it in their queues) is received until the socket has been quiet for 0.1 s,
# for 1 s at most
while stop_at is None or time.monotonic() - stop_at < 1.0:
    try:
        data = s.recv(65536)
    except (TimeoutError, socket.timeout):
        if stop_at is not None:
            break
        continue
    if data[:1] == b"\x01":
        continue  # a probe of pin_port, not part of the flow
    last = time.monotonic()
    if not n:
        first = last
    n += 1
    nbytes += len(data)
print(json.dumps({"packets": n, "bytes": nbytes, "seconds": last - first}), flush=True)
"""

_SENDER = r"""
import json, os, signal, socket, sys, time
stop = False
def _stop(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, _stop)  # stop sending, report what was sent
signal.signal(signal.SIGINT, _stop)
dst, sport, dport = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
seconds, mbit, size = float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
count = int(sys.argv[7]) if len(sys.argv) > 7 else 0
fill = int(sys.argv[8]) if len(sys.argv) > 8 else 0  # 1: probe packets, not counted
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", sport))
payload = bytes([fill]) * size
try:  # a flow from another machine keeps its pace: here it must not wait behind the ranks
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
except (AttributeError, OSError):
    pass  # (not root, or no real-time scheduling: best effort)
gap = (size + 42) * 8 / (mbit * 1e6)  # as HTB counts it: + UDP, IPv4, Ethernet headers
n = skipped = 0
start = began = time.monotonic()
while not stop:
    now = time.monotonic()
    if (count and n >= count) or (not count and now - began >= seconds):
        break
    due = start + n * gap
    if due > now:
        time.sleep(min(due - now, 0.01))
        continue
    behind = int((now - due) / gap)  # slots missed while descheduled
    if behind > 32:  # catch up on at most 32 (a burst a queue takes), skip the rest
        skipped += behind - 32
        start += (behind - 32) * gap
    try:
        s.sendto(payload, (dst, dport))
        n += 1
    except OSError:  # ENOBUFS under a full queue: the packet is not sent
        time.sleep(0.0005)
elapsed = time.monotonic() - began
print(json.dumps({"packets": n, "bytes": n * size, "seconds": elapsed, "skipped": skipped,
                  "mbit": n * (size + 42) * 8 / elapsed / 1e6 if elapsed > 0 else 0.0}),
      flush=True)
"""


@dataclass
class CrossTraffic:
    """A running UDP flow ``src_host`` -> ``dst_host`` via ``spine``.

    :meth:`wait` waits for the sender to finish and stops the sink; ``sent`` and
    ``received`` then hold ``{"packets", "bytes", "seconds"}``. :meth:`stop` ends
    both processes (by their handles) early."""

    spine: str
    sport: int
    dport: int
    sender: subprocess.Popen[str]
    sink: subprocess.Popen[str]
    sent: dict[str, Any] = field(default_factory=dict)
    received: dict[str, Any] = field(default_factory=dict)
    #: why the sender failed before it was stopped (None: it did not)
    failure: str | None = None

    def wait(self, timeout: float | None = None) -> int:
        try:
            out, _ = self.sender.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise
        self.sent = _last_json(out)
        self._stop_sink()
        return self.sender.returncode

    def stop(self) -> None:
        """End the flow early: the sender stops and reports what it sent (killed
        if it does not within 5 s), then the sink reports what arrived."""
        if self.sender.returncode is None:  # (not reaped by wait() already)
            ended = self.sender.poll()
            if ended is None:
                self.sender.terminate()
            try:
                out, err = self.sender.communicate(timeout=5)
                self.sent = _last_json(out)
                if ended:  # it failed on its own, before it was stopped
                    why = (err or "").strip().splitlines()[-3:]
                    self.failure = f"exit code {ended}" + (f": {' / '.join(why)}" if why else "")
            except subprocess.TimeoutExpired:
                self.sender.kill()
                self.sender.wait()
        self._stop_sink()

    def _stop_sink(self) -> None:
        if self.sink.poll() is None:
            self.sink.terminate()
        try:
            out, _ = self.sink.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            self.sink.kill()
            self.sink.wait()
            return
        if out:
            self.received = _last_json(out)


def _last_json(out: str | None) -> dict[str, Any]:
    for line in reversed((out or "").splitlines()):
        if line.startswith("{"):
            result: dict[str, Any] = json.loads(line)
            return result
    return {}


def _python(net: Network, host: str, script: str, *args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        net.exec_argv(host, [sys.executable, "-c", script, *map(str, args)]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,  # (a few lines at most: read when it ends)
        text=True,
        preexec_fn=dies_with_this_process(),  # a day-long sender must not outlive a crashed run
    )


def _ready(proc: subprocess.Popen[str], what: str, *, timeout: float = 10.0) -> None:
    """Wait for ``proc``'s "ready" line, at most ``timeout`` seconds; else stop it
    and raise with what it said on stderr."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        line = proc.stdout.readline() if sel.select(timeout) else ""
    if line.strip() != "ready":
        proc.kill()
        _, err = proc.communicate()
        why = (err or "").strip().splitlines()[-3:] or [f"no answer within {timeout:g} s"]
        raise NetnsError(f"{what} did not start: {' / '.join(why)}")


def _spine_tx(net: Network, dst_leaf: str) -> dict[str, int]:
    return {s: net.link_counters(s, net.ifaces[s][dst_leaf])[0] for s in net.topology.spines}


def _send_probe(net: Network, src: str, dst: str, sport: int, dport: int, n: int) -> None:
    args = [net.host_addr(dst), sport, dport, 0, 1000, 64, n, 1]
    proc = net.run(src, [sys.executable, "-c", _SENDER, *map(str, args)], check=False)
    if proc.returncode != 0:
        raise NetnsError(f"probe sender in {src} failed: {proc.stderr.strip()}")


def pin_port(
    net: Network, src_host: str, dst_host: str, spine: str, dport: int, *, tries: int = 64
) -> int:
    """A UDP source port whose flow ``src_host`` -> ``dst_host`` (to ``dport``) the
    ECMP hash sends via ``spine``, found by probing with a few packets per port."""
    t = net.topology
    if spine not in t.spines:
        raise UsageError(f"unknown spine {spine!r} (spines: {', '.join(t.spines)})")
    dst_leaf = t.leaf_of(dst_host)
    if t.leaf_of(src_host) == dst_leaf:
        raise UsageError(f"{src_host} and {dst_host} share leaf {dst_leaf}: no spine on the path")
    n = 20
    rng = random.Random()
    base = rng.randrange(20000, 60000)
    for i in range(tries):
        sport = base + i
        before = _spine_tx(net, dst_leaf)
        _send_probe(net, src_host, dst_host, sport, dport, n)
        after = _spine_tx(net, dst_leaf)
        got = {s: after[s] - before[s] for s in t.spines}
        # half the probes suffice: a loss rule on the path may drop some of them
        if got[spine] >= n // 2 and all(got[s] < n // 2 for s in t.spines if s != spine):
            return sport
    raise NetnsError(f"no source port among {tries} tried sends {src_host}->{dst_host} via {spine}")


def cross_traffic(
    net: Network,
    src_host: str,
    dst_host: str,
    *,
    spine: str,
    seconds: float,
    mbit: float,
    size: int = 1200,
    dport: int = 5201,
) -> CrossTraffic:
    """Start a UDP flow of ``mbit`` for ``seconds`` from ``src_host`` to
    ``dst_host`` pinned to ``spine``; returns a handle (``wait``/``stop``)."""
    sink = _python(net, dst_host, _SINK, dport)
    try:
        _ready(sink, f"UDP sink in {dst_host}")  # readiness: the sink has bound its port
        sport = pin_port(net, src_host, dst_host, spine, dport)
        # another machine's flow in the model: not paced by src_host's NIC
        exempt_source_port(net, src_host, sport)
        sender = _python(
            net, src_host, _SENDER, net.host_addr(dst_host), sport, dport, seconds, mbit, size
        )
    except BaseException:
        if sink.poll() is None:
            sink.kill()
        sink.communicate()
        raise
    return CrossTraffic(spine, sport, dport, sender, sink)
