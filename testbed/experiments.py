"""Training experiments on the leaf-spine testbed: DLCP vs Gloo under impairments.

    dlcp testbed run --scenario loss --transport dlcp --epochs 2
    dlcp testbed run --scenario clean --transport dlcp --ablate spray,bound
    dlcp testbed suite --scenarios clean,loss,background --epochs 2
    dlcp testbed run --scenario loss --transport dlcp --epochs 1 --switch bmv2
    dlcp testbed plot --results results

Every run builds the default leaf-spine topology (4 hosts, 2 leaves, 2 spines)
with queueing on every router egress shaped to ``link_rate_mbit`` (default
:data:`LINK_RATE_MBIT` = 200 Mbit/s, so that background traffic matters): the
DLCP switch profile for DLCP, one FIFO of the same buffer for Gloo (the
baseline's network has no DLCP configuration; ``profile`` overrides either);
over Linux routers every host's own egress is serialised at the same rate, as a
NIC would (:mod:`.host_egress`; ``--host-egress unshaped`` leaves it at memory
speed, for both transports alike), applies the scenario, and starts one training rank
(``examples/train_digits.py``) per host *inside that host's namespace*, with
torchrun's variables: ``RANK`` = host index, ``WORLD_SIZE`` = 4,
``LOCAL_RANK`` = 0, ``MASTER_ADDR`` = h1's address, ``MASTER_PORT`` =
:data:`MASTER_PORT`; Gloo is pointed at the host's interface
(``GLOO_SOCKET_IFNAME``). The ranks are started and watched by
:func:`dlcp.launch.launch` (their output streamed with a ``[rankN]:`` prefix;
if one fails the others are terminated by their ``Popen`` handles). A progress
line follows every finished epoch. The topology is removed afterwards, so every
run starts from fresh counters.

The scenarios and ablations, and the checks of a run's settings:
:mod:`.experiment_config`.

Over BMv2 (``--switch bmv2``): the routers are ``simple_switch_grpc`` running the
DLCP P4 program, configured over P4Runtime (:mod:`.bmv2_backend`); the same
scenarios, made with the switches' own means where the kernel's do not apply
(BMv2 forwards, not the kernel):

``loss``        the loss-injection build of the program on every switch, 1 % set
                on spine1 (probability 0 elsewhere): every packet crossing
                leaf1--spine1 crosses spine1 once, so this is the Linux scenario's
                1 % per direction; counted by the program's ``injected`` counter.
``spine-down``  leaf1--spine1 down mid-run, as over Linux; the controller routes
                every switch around it (the dead member leaves the leaves' ECMP groups,
                spine1 withdraws leaf1's hosts), as a fabric's control plane would.
``background``  the same paced UDP flow, at :data:`BMV2_BACKGROUND_MBIT`: links
                are not shaped (BMv2's queues have per-priority rates only, no
                port rate), the software switch's own forwarding rate (about
                30 Mbit/s of 1200-byte UDP per path, measured on the development
                machine) is the bottleneck.
``clean``, ``incast``  as over Linux.

The router counters are the P4 program's, read over P4Runtime: per queue
(``q0``..``q7``, queue = DLCP class; TCP and other unmarked traffic in ``q0``)
packets forwarded and selectively dropped, plus ``loss-injected`` and ``other``
(packets a switch took in and neither forwarded nor counted as dropped: queue
tail drops, and packets with no route such as ARP). BMv2 is a functional model:
its numbers are functional, not performance -- the CSV's ``switch`` column says
``bmv2`` and the printed results say so.

Results: ``<results>/<scenario>-<transport>[-no-<ablations>][-bmv2].json`` (the
example's per-epoch JSON of rank 0 plus the setup, the router counters per
class -- sent packets and drops summed over every router interface, the
difference between before and after training -- the wall time, and how busy
the CPUs were over the training, read when rank 0 says its training starts and
when it reports its last epoch: :mod:`.cpu_usage`), one row
appended to ``<results>/testbed.csv`` and a bar plot ``<results>/testbed.png``
(ms/iter and accuracy per scenario and transport, the newest row of each).
:mod:`.results` writes and reads these. ``median ms/iter`` is the median over
epochs of the example's per-epoch mean time per iteration; the JSON also holds
every iteration's time (its slowest rank's), per epoch (``iteration_s``).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from dlcp.errors import DLCPError, UsageError
from dlcp.io.engine import shared_host_threads
from dlcp.train_demo import example_script

from .backend import RouterTraffic, TestbedBackend, backend_class
from .cpu_usage import TrainingCpu
from .experiment_config import (
    ABLATIONS,
    BACKENDS,
    SCENARIOS,
    ExperimentConfig,
    ablation_label,
    run_name,
)
from .host_egress import HOST_BURST_FRAMES, HOST_QUEUE_BYTES
from .impairments import CrossTraffic, cross_traffic
from .results import (
    BATCH_SIZE,
    CSV_FIELDS,
    CSV_NAME,
    FUNCTIONAL_NOTE,
    HIDDEN,
    LINK_RATE_MBIT,
    MTU,
    PNG_NAME,
    append_csv,
    bmv2_class_totals,
    bmv2_link_packets,
    class_totals,
    code_revision,
    cpu_fields,
    cpu_line,
    default_profile,
    drops_summary,
    per_link_drops,
    per_link_packets,
    plot,
    read_csv,
    table,
)
from .switch_profile import FifoPolicy, SwitchPolicy
from .topology import Network, Topology

__all__ = [
    "ABLATIONS",
    "BACKENDS",
    "BATCH_SIZE",
    "CSV_FIELDS",
    "CSV_NAME",
    "FUNCTIONAL_NOTE",
    "HIDDEN",
    "LINK_RATE_MBIT",
    "MTU",
    "PNG_NAME",
    "SCENARIOS",
    "ExperimentConfig",
    "ExperimentError",
    "ablation_label",
    "append_csv",
    "backend_for",
    "bmv2_class_totals",
    "bmv2_link_packets",
    "class_totals",
    "default_profile",
    "drops_summary",
    "per_link_drops",
    "per_link_packets",
    "plot",
    "read_csv",
    "run_experiment",
    "run_name",
    "suite",
    "switch_policy",
    "table",
]

MASTER_PORT = 29517
BACKGROUND_SHARE = 0.95
LOSS_PERCENT = 1.0
#: the background flow over BMv2 (unshaped links; see the module doc)
BMV2_BACKGROUND_MBIT = 20.0
class ExperimentError(DLCPError, RuntimeError):
    """A training run on the testbed failed (the message says which rank, how)."""


def switch_policy(t: Topology, link_rate_mbit: float) -> SwitchPolicy:
    """The experiments' switch profile: :meth:`SwitchPolicy.for_link` of the
    topology's queue size, shaped to ``link_rate_mbit``."""
    return SwitchPolicy.for_link(link_rate_mbit, t.buffer_packets)


def backend_for(config: ExperimentConfig, topology: Topology) -> TestbedBackend:
    """The backend ``config`` runs on (``switch`` and ``backend``), with its queueing:
    the DLCP switch profile (BMv2: in the P4 program) or one FIFO."""
    policy: SwitchPolicy | FifoPolicy = (
        switch_policy(topology, config.link_rate_mbit)
        if config.profile in ("dlcp", None)
        else FifoPolicy(link_rate_mbit=config.link_rate_mbit, queue_packets=topology.buffer_packets)
    )
    kind = backend_class(config.switch, config.backend)
    return kind(
        topology,
        policy,
        prefix=config.prefix,
        loss_injection=config.scenario == "loss",
        host_egress=config.host_egress,
    )


class _Progress:
    """A text sink that forwards the ranks' output and adds a progress line
    after every epoch rank 0 reports."""

    _EPOCH = re.compile(r"^\[rank0\]: epoch\s+(\d+)/(\d+)")
    #: the example's rank 0 says what it trains right before its first iteration
    _TRAINING = re.compile(r"^\[rank0\]: digits CNN \(")

    def __init__(
        self,
        sink: IO[str],
        label: str,
        start: float,
        on_epoch: Callable[[int], None] | None = None,
        on_training: tuple[Callable[[], None], Callable[[], None]] | None = None,
    ) -> None:
        self.sink, self.label, self.start = sink, label, start
        #: called with the epoch number after each epoch rank 0 reports (in the
        #: thread that pumps the ranks' output: mid-run impairments)
        self.on_epoch = on_epoch
        #: (called when rank 0's training starts, called when it reports its last
        #: epoch), in the same thread: the run's CPU readings
        self.on_training = on_training

    def write(self, text: str) -> int:
        self.sink.write(text)
        for line in text.splitlines():
            if self.on_training is not None and self._TRAINING.match(line):
                self.on_training[0]()
            m = self._EPOCH.match(line)
            if m and self.on_training is not None and m[1] == m[2]:
                self.on_training[1]()
            if m:
                self.sink.write(
                    f"[testbed] {self.label}: epoch {m[1]}/{m[2]} done, "
                    f"{time.monotonic() - self.start:.0f} s\n"
                )
                if self.on_epoch is not None:
                    self.on_epoch(int(m[1]))
        return len(text)

    def flush(self) -> None:
        self.sink.flush()


#: the link the loss and spine-down scenarios act on
IMPAIRED_LINK = ("leaf1", "spine1")


def _impair(backend: TestbedBackend, scenario: str, *, link_down_now: bool) -> None:
    """The scenario's impairment at the start of the run (cross traffic aside)."""
    if scenario == "loss":
        backend.inject_loss(*IMPAIRED_LINK, LOSS_PERCENT)
    elif scenario == "spine-down" and link_down_now:
        backend.take_link_down(*IMPAIRED_LINK)


def _cross_traffic(
    backend: TestbedBackend, scenario: str, link_rate_mbit: float
) -> CrossTraffic | None:
    """The background scenario's flow, "for the run's duration": a long flow,
    stopped when training ends; on unshaped links, at :data:`BMV2_BACKGROUND_MBIT`."""
    if scenario != "background":
        return None
    mbit = BACKGROUND_SHARE * link_rate_mbit if backend.links_shaped else BMV2_BACKGROUND_MBIT
    return cross_traffic(backend.net, "h2", "h3", spine="spine1", seconds=24 * 3600, mbit=mbit)


def _rank_commands(
    net: Network, config: ExperimentConfig, env: dict[str, str], flags: list[str], out: Path
) -> dict[int, list[str]]:
    """Each rank's command, run in its host's namespace; rank 0 writes ``out``."""
    t = net.topology
    master = net.host_addr(t.host_names[0])
    # each host's rank is alone on its host (LOCAL_WORLD_SIZE=1), but the hosts share
    # this machine's CPUs: DLCP's "auto" send threads get their share
    env = {**env, **shared_host_threads(len(t.host_names), {**os.environ, **env})}
    cmds: dict[int, list[str]] = {}
    for rank, host in enumerate(t.host_names):
        argv = [
            "env", f"MASTER_ADDR={master}", f"MASTER_PORT={MASTER_PORT}",
            f"RANK={rank}", f"WORLD_SIZE={len(t.host_names)}", "LOCAL_RANK=0",
            "LOCAL_WORLD_SIZE=1", f"GROUP_RANK={rank}",
            f"GLOO_SOCKET_IFNAME={t.leaf_of(host)}",
            *(f"{k}={v}" for k, v in env.items()),
            sys.executable, str(example_script("train_digits.py")), *flags,
        ]  # fmt: skip
        if rank == 0:
            argv += ["--json", str(out)]
        cmds[rank] = net.exec_argv(host, argv)
    return cmds


def run_experiment(config: ExperimentConfig, *, out: IO[str] | None = None) -> dict[str, Any]:
    """One training run on a fresh testbed; returns (and writes) the result.
    ``out``: where the ranks' output and the progress lines go (stdout)."""
    from dlcp.launch import launch

    sink = out if out is not None else sys.stdout
    res_dir = Path(config.results)
    res_dir.mkdir(parents=True, exist_ok=True)
    name = config.name
    train_json = (res_dir / f"{name}.train.json").resolve()
    train_json.unlink(missing_ok=True)
    t = dataclasses.replace(
        Topology.default(), link_rate_mbit=config.link_rate_mbit, mtu=config.mtu
    )
    env, flags = config.example_settings()
    timeout = config.timeout if config.timeout is not None else 300.0 + 240.0 * config.epochs
    backend = backend_for(config, t)
    started = time.monotonic()
    scenario = config.scenario
    # spine-down: the link fails mid-run (after the first epoch) unless there is
    # only one epoch, in which case it is down from the start
    mid_run = scenario == "spine-down" and config.epochs >= 2
    link_event = "before training" if scenario == "spine-down" and not mid_run else None
    lossy_link = IMPAIRED_LINK if scenario == "loss" else None
    cpu = TrainingCpu()
    with backend.build() as net:
        _impair(backend, scenario, link_down_now=not mid_run)
        traffic = _cross_traffic(backend, scenario, config.link_rate_mbit)
        if traffic is not None:
            cpu.track("background-sender", traffic.sender.pid)
            cpu.track("background-sink", traffic.sink.pid)

        def track_ranks(pids: Sequence[int]) -> None:
            for rank, pid in enumerate(pids):
                cpu.track(f"rank{rank}", pid)

        def on_epoch(epoch: int) -> None:
            nonlocal link_event
            if mid_run and epoch == 1 and link_event is None:
                backend.take_link_down(*IMPAIRED_LINK)
                link_event = f"after epoch 1, {time.monotonic() - started:.1f} s into the run"
                sink.write(f"[testbed] {name}: leaf1--spine1 down {link_event}\n")

        try:
            before = backend.counters()
            hosts_before = backend.host_counters()
            cmds = _rank_commands(net, config, env, flags, train_json)
            world = len(cmds)
            sink.write(
                f"[testbed] {name}: {world} ranks on {', '.join(t.host_names)} "
                f"(master {net.host_addr(t.host_names[0])}:{MASTER_PORT}), "
                f"{config.epochs} epochs, {backend.describe_links(config.link_rate_mbit)}"
                + (f", {config.profile} profile" if config.profile else "")
                + (f", {env}" if env else "")
                + "\n"
            )
            # removed on exit; after a hard crash: dlcp testbed down --prefix <prefix>
            sink.write(f"[testbed] {name}: namespaces {net.prefix}<node>\n")
            sink.flush()
            progress = _Progress(sink, name, started, on_epoch, (cpu.start, cpu.stop))
            lr = launch(
                cmds[0],
                world,
                rank_cmd=cmds,
                master_port=MASTER_PORT,
                stdout=progress,  # type: ignore[arg-type]
                stderr=progress,  # type: ignore[arg-type]
                timeout=timeout,
                on_start=track_ranks,
            )
            lr.raise_if_interrupted()  # Ctrl-C / SIGTERM: stop here (a suite too)
            if lr.returncode != 0:
                raise ExperimentError(f"{name}: {lr.message}")
            routers = backend.traffic(before, backend.counters(), lossy_link=lossy_link)
            hosts = _host_queue_traffic(hosts_before, backend.host_counters())
        finally:
            if traffic is not None:
                traffic.stop()
    if traffic is not None and traffic.failure:
        raise ExperimentError(f"{name}: the background flow failed ({traffic.failure})")
    wall = time.monotonic() - started
    train = json.loads(train_json.read_text())
    train_json.unlink()
    result = _result(
        config, backend, t, env, flags, train, routers, hosts, traffic, link_event, wall,
        cpu.summary(),
    )
    (res_dir / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    summary = {k: result[k] for k in CSV_FIELDS}
    append_csv(res_dir, summary)
    sink.write(
        f"[testbed] {name}: accuracy {summary['final_accuracy']:.1f}%, "
        f"{summary['median_ms_per_iter']:.1f} ms/iter, wall {wall:.0f} s; "
        f"router drops {summary['router_drops'] or 'none'}"
        + (f"; host queue drops {sum(h['drops'] for h in hosts.values())}" if hosts else "")
        + "\n"
        f"[testbed] {name}: {cpu_line(result['cpu'], cpu.failure)}\n"
        + (f"[testbed] {name}: {backend.note}\n" if backend.note else "")
    )
    sink.flush()
    if config.plot_after:
        plot(res_dir)
    return result


def _host_queue_traffic(
    before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]
) -> dict[str, dict[str, int]]:
    """Per shaped host: what its egress queue sent (``packets``: as the qdisc
    counts them, a GSO batch as its segments; ``bytes``) and dropped during the
    run, and what it held at the end (``backlog``)."""
    return {
        host: {
            "packets": c["packets"] - before.get(host, {}).get("packets", 0),
            "bytes": c["bytes"] - before.get(host, {}).get("bytes", 0),
            "drops": c["drops"] - before.get(host, {}).get("drops", 0),
            "backlog": c["backlog"],
        }
        for host, c in after.items()
    }


def _result(
    config: ExperimentConfig,
    backend: TestbedBackend,
    t: Topology,
    env: dict[str, str],
    flags: list[str],
    train: dict[str, Any],
    routers: RouterTraffic,
    hosts: dict[str, dict[str, int]],
    traffic: CrossTraffic | None,
    link_event: str | None,
    wall: float,
    cpu: dict[str, Any] | None,
) -> dict[str, Any]:
    """A run's result: the CSV's fields, then the setup, counters and training."""
    ep = train["epochs"]
    dlcp = config.transport == "dlcp"  # (only DLCP reports lost elements and retransmissions)
    rate = config.link_rate_mbit if backend.links_shaped else None
    summary = {
        "scenario": config.scenario,
        "transport": config.transport,
        "ablation": ablation_label(config.ablate),
        "epochs": config.epochs,
        "final_accuracy": train["final_test_accuracy"],
        "median_ms_per_iter": 1e3 * statistics.median(e["iter_s"] for e in ep),
        "lost_fraction": statistics.fmean(e["loss_fraction"] for e in ep) if dlcp else None,
        "retransmissions": sum(e["retransmitted_packets"] for e in ep) if dlcp else None,
        # datagrams of messages that had ended where they arrived (DLCP's ranks, all)
        "late_packets": (
            sum(c["late_packets"] for c in train["endpoint_counters"])
            if "endpoint_counters" in train
            else None
        ),
        "router_drops": drops_summary(routers.classes),
        # what the cross traffic really sent, in Mbit/s as HTB counts it
        "background_mbit": round(traffic.sent["mbit"], 1) if traffic and traffic.sent else None,
        "wall_s": round(wall, 1),
        **cpu_fields(cpu),
        "switch": backend.switch,
        "profile": config.queues,
        "link_rate_mbit": rate,
        "batch_size": config.batch_size,
        "hidden": config.hidden,
        "mtu": config.mtu,
        "host_egress": config.host_egress,
        "finished_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "code_rev": code_revision(),
    }
    return {
        **summary,
        "setup": {
            "topology": t.name,
            "switch": backend.switch,
            "backend": config.backend,
            "profile": config.queues,
            "link_rate_mbit": rate,
            "batch_size": config.batch_size,
            "hidden": config.hidden,
            "mtu": config.mtu,
            "host_egress": config.host_egress,
            "host_queue": (
                {"qdisc": "tbf", "burst_frames": HOST_BURST_FRAMES, "limit_bytes": HOST_QUEUE_BYTES}
                if config.host_egress == "shaped"
                else None
            ),
            "parameters": train.get("parameters"),
            "env": env,
            "flags": flags,
            "loss_rule_drops": routers.loss_drops,
            "link_down": link_event,
            "background": (
                {"sent": traffic.sent, "received": traffic.received, "sport": traffic.sport}
                if traffic is not None
                else None
            ),
        },
        **({"note": backend.note} if backend.note else {}),
        "cpu": cpu,
        "router_classes": routers.classes,
        "router_link_packets": routers.links,
        "router_link_drops": routers.link_drops,
        "host_queues": hosts,
        "train": train,
    }


def suite(
    scenarios: Sequence[str] = SCENARIOS,
    *,
    epochs: int = 2,
    results: str | Path = "results",
    ablation_scenarios: Sequence[str] = (),
    out: IO[str] | None = None,
    switch: str = "linux",
    gloo_profile: str | None = None,
    hidden: int = HIDDEN,
    backend: str = "namespaces",
    mtu: int = MTU,
    host_egress: str | None = None,
    link_rate_mbit: float = LINK_RATE_MBIT,
) -> tuple[int, list[dict[str, Any]]]:
    """Every scenario for Gloo and DLCP, then each single ablation of DLCP on
    each of ``ablation_scenarios``, on ``switch`` (linux or bmv2); Gloo's runs
    over Linux on ``gloo_profile`` (default: a FIFO). ``hidden`` sizes the
    model's hidden layer for every run (1024: a gradient the fabric's links
    feel), ``mtu`` every link's MTU, ``link_rate_mbit`` every Linux router's
    egress shaping, ``host_egress`` the hosts' own egress (None: the switch's
    default). Failed runs are reported and skipped.
    Returns (number of failures, summaries)."""
    if switch == "bmv2" and gloo_profile is not None:
        raise UsageError(
            f"gloo_profile={gloo_profile!r} chooses the Linux routers' queueing; "
            "BMv2 runs the P4 program"
        )
    sink = out if out is not None else sys.stdout
    plan: list[tuple[str, str, tuple[str, ...]]] = [
        (s, tr, ()) for s in scenarios for tr in ("gloo", "dlcp")
    ]
    for scenario in ablation_scenarios:
        plan += [(scenario, "dlcp", (a,)) for a in ABLATIONS]
    done: list[dict[str, Any]] = []
    failures = 0
    # every run's settings checked before the first starts
    configs = [
        ExperimentConfig(
            s,
            tr,
            ablate=ab,
            epochs=epochs,
            results=results,
            plot_after=False,
            switch=switch,
            backend=backend,
            profile=gloo_profile if tr == "gloo" else None,
            hidden=hidden,
            mtu=mtu,
            host_egress=host_egress,
            link_rate_mbit=link_rate_mbit,
        )
        for s, tr, ab in plan
    ]
    for i, config in enumerate(configs, 1):
        name = config.name
        sink.write(f"[testbed] suite {i}/{len(configs)}: {name}\n")
        try:
            r = run_experiment(config, out=sink)
        except Exception as e:  # one failed run must not end the suite
            failures += 1
            sink.write(f"[testbed] suite: {name} FAILED: {e}\n")
            continue
        done.append({k: r[k] for k in CSV_FIELDS})
    plot(results)
    sink.write(table(done) + "\n")
    sink.flush()
    return failures, done
