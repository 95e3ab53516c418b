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
baseline's network has no DLCP configuration; ``profile`` overrides either),
applies the scenario, and starts one training rank
(``dlcp.examples.train_digits``) per host *inside that host's namespace*, with
torchrun's variables: ``RANK`` = host index, ``WORLD_SIZE`` = 4,
``LOCAL_RANK`` = 0, ``MASTER_ADDR`` = h1's address, ``MASTER_PORT`` =
:data:`MASTER_PORT`; Gloo is pointed at the host's interface
(``GLOO_SOCKET_IFNAME``). The ranks are started and watched by
:func:`dlcp.launch.launch` (their output streamed with a ``[rankN]:`` prefix;
if one fails the others are terminated by their ``Popen`` handles). A progress
line follows every finished epoch. The topology is removed afterwards, so every
run starts from fresh counters.

Scenarios:

``clean``       nothing injected.
``loss``        1 % random loss on leaf1--spine1, both directions.
``background``  a paced UDP flow h2 -> h3 pinned to spine1 at
                :data:`BACKGROUND_SHARE` of the link rate, for the whole run
                (a sender held up catches up on at most 32 missed packets and
                skips the rest, rather than bursting them all into a 100-packet
                queue; the CSV's ``background_mbit`` is the rate it reached; a
                run whose flow failed fails).
                It is not DLCP traffic: the DLCP profile puts it (TOS 0,
                Not-ECT) in class 0's drop-eligible queue, below every class
                DLCP's data uses; on Gloo's FIFO it shares the queue with Gloo.
``spine-down``  leaf1--spine1 goes down mid-run, when rank 0 reports its first
                epoch (routes re-converge around it while the ranks train);
                with ``--epochs 1``, before training.
``incast``      ``--collective ps``: a parameter server on rank 0 = h1, every
                other rank pushes to it at once. DLCP's parameter server
                against the same pattern over TCP: Gloo has no
                parameter-server mode, so the Gloo run pushes and pulls with
                Gloo's point-to-point send/recv (:mod:`dlcp.shims.tcp_ps`).

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
``clean``, ``incast``  as above.

The router counters are the P4 program's, read over P4Runtime: per queue
(``q0``..``q7``, queue = DLCP class; TCP and other unmarked traffic in ``q0``)
packets forwarded and selectively dropped, plus ``loss-injected`` and ``other``
(packets a switch took in and neither forwarded nor counted as dropped: queue
tail drops, and packets with no route such as ARP). BMv2 is a functional model:
its numbers are functional, not performance -- the CSV's ``switch`` column says
``bmv2`` and the printed results say so.

Ablations (DLCP only; ``--ablate`` takes a comma list; default is everything on):

``spray``     on: ``DLCP_N_PATHS=8`` (8 UDP source ports, ECMP spreads them);
              off: ``DLCP_N_PATHS=1``.
``bound``     on: ``--p 0.05``; off: ``--p 0`` (every packet recovered).
``priority``  off: ``DLCP_CLASSIFIER=magnitude`` (one class, drop eligibility
              from magnitude; no layer priority).
``drop``      off: ``DLCP_CLASSIFIER=layer`` (layer priority, nothing
              drop-eligible). ``priority`` and ``drop`` both off:
              ``DLCP_CLASSIFIER=none``.

Results: ``<results>/<scenario>-<transport>[-no-<ablations>][-bmv2].json`` (the
example's per-epoch JSON of rank 0 plus the setup, the router counters per
class -- sent packets and drops summed over every router interface, the
difference between before and after training -- and the wall time), one row
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
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, Any

from dlcp.errors import DLCPError, UsageError
from dlcp.proto.wire import DEFAULT_PORT

from .bmv2_backend import Bmv2Network, bmv2_counters, bmv2_link_down, bmv2_set_loss, build_bmv2
from .impairments import (
    CrossTraffic,
    apply_profile,
    cross_traffic,
    link_down,
    link_dropped,
    link_loss,
    profile_counters,
)
from .results import (
    BATCH_SIZE,
    CSV_FIELDS,
    CSV_NAME,
    FUNCTIONAL_NOTE,
    HIDDEN,
    LINK_RATE_MBIT,
    PNG_NAME,
    append_csv,
    bmv2_class_totals,
    bmv2_link_packets,
    class_totals,
    code_revision,
    default_profile,
    drops_summary,
    per_link_packets,
    plot,
    read_csv,
    settings_label,
    table,
)
from .switch_profile import FifoPolicy, SwitchPolicy
from .topology import Network, Topology, build

__all__ = [
    "ABLATIONS",
    "CSV_NAME",
    "PNG_NAME",
    "SCENARIOS",
    "ablation_label",
    "append_csv",
    "plot",
    "read_csv",
    "run_experiment",
    "suite",
    "switch_policy",
]

SCENARIOS = ("clean", "loss", "background", "spine-down", "incast")
SWITCHES = ("linux", "bmv2")
#: router queueing over Linux: the DLCP commodity-switch profile, or one FIFO
PROFILES = ("dlcp", "fifo")
ABLATIONS = ("priority", "drop", "spray", "bound")
TRANSPORTS = ("dlcp", "gloo")
MASTER_PORT = 29517
BACKGROUND_SHARE = 0.95
LOSS_PERCENT = 1.0
#: the background flow over BMv2 (unshaped links; see the module doc)
BMV2_BACKGROUND_MBIT = 20.0
N_PATHS = 8
P_BOUND = 0.05
class ExperimentError(DLCPError, RuntimeError):
    """A training run on the testbed failed (the message says which rank, how)."""


def ablation_label(ablate: Iterable[str]) -> str:
    """``""`` for none, else ``no-<a>[+<b>...]`` (sorted)."""
    items = sorted(set(ablate))
    return "no-" + "+".join(items) if items else ""


def run_name(
    scenario: str,
    transport: str,
    ablate: Iterable[str] = (),
    switch: str = "linux",
    profile: str | None = None,
    *,
    link_rate_mbit: float = LINK_RATE_MBIT,
    batch_size: int = BATCH_SIZE,
    hidden: int = HIDDEN,
) -> str:
    """``<scenario>-<transport>[-no-<ablations>][-bmv2][-on-<profile>][-<rate>mbit]
    [-batch<n>][-hidden<n>]``: the profile only if not the transport's default, the
    link rate (Linux routers only), batch size and model width only if not the
    defaults."""
    label = ablation_label(ablate)
    odd = profile is not None and switch == "linux" and profile != default_profile(transport)
    rate = link_rate_mbit if switch == "linux" else LINK_RATE_MBIT  # BMv2 links: unshaped
    return (
        f"{scenario}-{transport}"
        + (f"-{label}" if label else "")
        + ("-bmv2" if switch == "bmv2" else "")
        + (f"-on-{profile}" if odd else "")
        + settings_label(rate, batch_size, hidden)
    )


def dlcp_settings(scenario: str, ablate: Iterable[str]) -> tuple[dict[str, str], list[str]]:
    """(``DLCP_*`` environment, extra example flags) of a DLCP run. Data goes to
    the protocol's port (one rank per host), the one the P4 program parses as
    DLCP: on an ephemeral port the BMv2 switches would see plain UDP, classify it
    by DSCP alone and never drop drop-eligible packets first."""
    off = set(ablate)
    env = {
        "DLCP_N_PATHS": "1" if "spray" in off else str(N_PATHS),
        "DLCP_DATA_PORT": str(DEFAULT_PORT),
    }
    if {"priority", "drop"} <= off:
        env["DLCP_CLASSIFIER"] = "none"
    elif "priority" in off:
        env["DLCP_CLASSIFIER"] = "magnitude"
    elif "drop" in off:
        env["DLCP_CLASSIFIER"] = "layer"
    flags = ["--p", "0" if "bound" in off else str(P_BOUND)]
    if scenario == "incast":
        flags += ["--collective", "ps"]
    return env, flags


def switch_policy(t: Topology, link_rate_mbit: float) -> SwitchPolicy:
    """The experiments' switch profile: :meth:`SwitchPolicy.for_link` of the
    topology's queue size, shaped to ``link_rate_mbit``."""
    return SwitchPolicy.for_link(link_rate_mbit, t.buffer_packets)


def _setup(
    net: Network, scenario: str, link_rate_mbit: float, *, link_down_now: bool
) -> CrossTraffic | None:
    if scenario == "loss":
        link_loss(net, "leaf1", "spine1", LOSS_PERCENT)
    elif scenario == "spine-down" and link_down_now:
        link_down(net, "leaf1", "spine1")
    elif scenario == "background":
        # "for the run's duration": a long flow, stopped when training ends
        return cross_traffic(
            net, "h2", "h3", spine="spine1", seconds=24 * 3600,
            mbit=BACKGROUND_SHARE * link_rate_mbit,
        )  # fmt: skip
    return None


def _setup_bmv2(net: Bmv2Network, scenario: str, *, link_down_now: bool) -> CrossTraffic | None:
    if scenario == "loss":
        bmv2_set_loss(net, "spine1", LOSS_PERCENT)
    elif scenario == "spine-down" and link_down_now:
        bmv2_link_down(net, "leaf1", "spine1")
    elif scenario == "background":
        return cross_traffic(
            net, "h2", "h3", spine="spine1", seconds=24 * 3600, mbit=BMV2_BACKGROUND_MBIT
        )
    return None


class _Progress:
    """A text sink that forwards the ranks' output and adds a progress line
    after every epoch rank 0 reports."""

    _EPOCH = re.compile(r"^\[rank0\]: epoch\s+(\d+)/(\d+)")

    def __init__(
        self,
        sink: IO[str],
        label: str,
        start: float,
        on_epoch: Callable[[int], None] | None = None,
    ) -> None:
        self.sink, self.label, self.start = sink, label, start
        #: called with the epoch number after each epoch rank 0 reports (in the
        #: thread that pumps the ranks' output: mid-run impairments)
        self.on_epoch = on_epoch

    def write(self, text: str) -> int:
        self.sink.write(text)
        for line in text.splitlines():
            m = self._EPOCH.match(line)
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


def run_experiment(
    scenario: str,
    transport: str,
    *,
    ablate: Sequence[str] = (),
    epochs: int = 2,
    batch_size: int = BATCH_SIZE,
    hidden: int = HIDDEN,
    results: str | Path = "results",
    link_rate_mbit: float | None = None,
    prefix: str | None = None,
    switch: str = "linux",
    timeout: float | None = None,
    out: IO[str] | None = None,
    plot_after: bool = True,
    profile: str | None = None,
) -> dict[str, Any]:
    """One training run on a fresh testbed; returns (and writes) the result.
    ``switch``: the routers forward with Linux and a tc profile, or are BMv2
    switches running the DLCP P4 program (module doc). ``profile`` (Linux only):
    the DLCP profile or a FIFO, by default :func:`default_profile` of the
    transport. ``link_rate_mbit`` (default :data:`LINK_RATE_MBIT`) shapes the
    Linux routers' egress only."""
    from dlcp.launch import launch

    if scenario not in SCENARIOS:
        raise UsageError(f"unknown scenario {scenario!r} (known: {', '.join(SCENARIOS)})")
    if transport not in TRANSPORTS:
        raise UsageError(f"unknown transport {transport!r} (known: {', '.join(TRANSPORTS)})")
    bad = sorted(set(ablate) - set(ABLATIONS))
    if bad:
        raise UsageError(f"unknown ablation {bad[0]!r} (known: {', '.join(ABLATIONS)})")
    if ablate and transport != "dlcp":
        raise UsageError("ablations apply to --transport dlcp only")
    if switch not in SWITCHES:
        raise UsageError(f"unknown switch {switch!r} (known: {', '.join(SWITCHES)})")
    bmv2 = switch == "bmv2"
    if bmv2 and profile is not None:
        raise UsageError(
            f"profile={profile!r} chooses the Linux routers' queueing; BMv2 runs the P4 program"
        )
    if profile is None and not bmv2:
        profile = default_profile(transport)
    if profile is not None and profile not in PROFILES:
        raise UsageError(f"unknown profile {profile!r} (known: {', '.join(PROFILES)})")
    queues = profile or "p4"  # what the results say the routers ran
    if bmv2 and link_rate_mbit is not None:
        raise UsageError(
            "--link-rate shapes the Linux routers' egress; BMv2 links are not shaped "
            "(BMv2 queues have per-priority rates only)"
        )
    if link_rate_mbit is None:
        link_rate_mbit = LINK_RATE_MBIT
    if epochs < 1 or batch_size < 1 or hidden < 1 or not 0 < link_rate_mbit < float("inf"):
        raise UsageError(
            f"epochs={epochs}, batch_size={batch_size} and hidden={hidden} must be >= 1, "
            f"and link_rate_mbit={link_rate_mbit} a positive number"
        )
    sink = out if out is not None else sys.stdout
    res_dir = Path(results)
    res_dir.mkdir(parents=True, exist_ok=True)
    name = run_name(
        scenario, transport, ablate, switch, profile, link_rate_mbit=link_rate_mbit,
        batch_size=batch_size, hidden=hidden,
    )  # fmt: skip
    train_json = (res_dir / f"{name}.train.json").resolve()
    train_json.unlink(missing_ok=True)
    t = dataclasses.replace(Topology.default(), link_rate_mbit=link_rate_mbit)
    env: dict[str, str] = {}
    flags = ["--transport", transport, "--epochs", str(epochs), "--batch-size", str(batch_size),
             "--hidden", str(hidden)]  # fmt: skip
    if transport == "dlcp":
        denv, dflags = dlcp_settings(scenario, ablate)
        env.update(denv)
        flags += dflags
    elif scenario == "incast":  # the same parameter server, over Gloo's TCP
        flags += ["--collective", "ps"]
    if timeout is None:
        timeout = 300.0 + 240.0 * epochs
    started = time.monotonic()
    builder = (
        build_bmv2(
            t, switch_policy(t, link_rate_mbit), prefix=prefix, loss_injection=scenario == "loss"
        )
        if bmv2
        else build(t, prefix=prefix)
    )
    # spine-down: the link fails mid-run (after the first epoch) unless there is
    # only one epoch, in which case it is down from the start
    mid_run = scenario == "spine-down" and epochs >= 2
    link_event = "before training" if scenario == "spine-down" and not mid_run else None
    with builder as net:
        if isinstance(net, Bmv2Network):
            traffic = _setup_bmv2(net, scenario, link_down_now=not mid_run)
        else:
            apply_profile(
                net,
                switch_policy(t, link_rate_mbit)
                if profile == "dlcp"
                else FifoPolicy(link_rate_mbit=link_rate_mbit, queue_packets=t.buffer_packets),
            )
            traffic = _setup(net, scenario, link_rate_mbit, link_down_now=not mid_run)

        def on_epoch(epoch: int) -> None:
            nonlocal link_event
            if mid_run and epoch == 1 and link_event is None:
                if isinstance(net, Bmv2Network):
                    bmv2_link_down(net, "leaf1", "spine1")
                else:
                    link_down(net, "leaf1", "spine1")
                link_event = f"after epoch 1, {time.monotonic() - started:.1f} s into the run"
                sink.write(f"[testbed] {name}: leaf1--spine1 down {link_event}\n")

        try:
            before: Any = (
                bmv2_counters(net) if isinstance(net, Bmv2Network) else profile_counters(net)
            )
            master = net.host_addr(t.host_names[0])
            world = len(t.host_names)
            cmds: dict[int, list[str]] = {}
            for rank, host in enumerate(t.host_names):
                argv = [
                    "env", f"MASTER_ADDR={master}", f"MASTER_PORT={MASTER_PORT}",
                    f"RANK={rank}", f"WORLD_SIZE={world}", "LOCAL_RANK=0",
                    "LOCAL_WORLD_SIZE=1", f"GROUP_RANK={rank}",
                    f"GLOO_SOCKET_IFNAME={t.leaf_of(host)}",
                    *(f"{k}={v}" for k, v in env.items()),
                    sys.executable, "-m", "dlcp.examples.train_digits", *flags,
                ]  # fmt: skip
                if rank == 0:
                    argv += ["--json", str(train_json)]
                cmds[rank] = net.exec_argv(host, argv)
            links = (
                "BMv2 switches (P4Runtime), links not shaped"
                if bmv2
                else f"links {link_rate_mbit:g} Mbit/s"
            )
            sink.write(
                f"[testbed] {name}: {world} ranks on {', '.join(t.host_names)} "
                f"(master {master}:{MASTER_PORT}), {epochs} epochs, "
                f"{links}" + (f", {profile} profile" if profile else "")
                + (f", {env}" if env else "") + "\n"
            )
            # removed on exit; after a hard crash: dlcp testbed down --prefix <prefix>
            sink.write(f"[testbed] {name}: namespaces {net.prefix}<node>\n")
            sink.flush()
            progress = _Progress(sink, name, started, on_epoch)
            lr = launch(
                cmds[0],
                world,
                rank_cmd=cmds,
                master_port=MASTER_PORT,
                stdout=progress,  # type: ignore[arg-type]
                stderr=progress,  # type: ignore[arg-type]
                timeout=timeout,
            )
            lr.raise_if_interrupted()  # Ctrl-C / SIGTERM: stop here (a suite too)
            if lr.returncode != 0:
                raise ExperimentError(f"{name}: {lr.message}")
            injected: dict[str, int] | None = None
            if isinstance(net, Bmv2Network):
                after: Any = bmv2_counters(net)
                if scenario == "loss":
                    injected = {sw: after[sw]["injected"] - before[sw]["injected"]
                                for sw in after}  # fmt: skip
            else:
                after = profile_counters(net)
                if scenario == "loss":
                    injected = link_dropped(net, "leaf1", "spine1")
        finally:
            if traffic is not None:
                traffic.stop()
    if traffic is not None and traffic.failure:
        raise ExperimentError(f"{name}: the background flow failed ({traffic.failure})")
    wall = time.monotonic() - started
    train = json.loads(train_json.read_text())
    train_json.unlink()
    totals = bmv2_class_totals(before, after) if bmv2 else class_totals(before, after)
    if not bmv2 and injected:  # (BMv2's program counts its own, as loss-injected)
        totals["loss-rule"] = {"packets": 0, "drops": sum(injected.values())}
    ep = train["epochs"]
    dlcp = transport == "dlcp"  # (only DLCP reports lost elements and retransmissions)
    summary = {
        "scenario": scenario,
        "transport": transport,
        "ablation": ablation_label(ablate),
        "epochs": epochs,
        "final_accuracy": train["final_test_accuracy"],
        "median_ms_per_iter": 1e3 * statistics.median(e["iter_s"] for e in ep),
        "lost_fraction": statistics.fmean(e["loss_fraction"] for e in ep) if dlcp else None,
        "retransmissions": sum(e["retransmitted_packets"] for e in ep) if dlcp else None,
        "router_drops": drops_summary(totals),
        # what the cross traffic really sent, in Mbit/s as HTB counts it
        "background_mbit": round(traffic.sent["mbit"], 1) if traffic and traffic.sent else None,
        "wall_s": round(wall, 1),
        "switch": switch,
        "profile": queues,
        "link_rate_mbit": None if bmv2 else link_rate_mbit,
        "batch_size": batch_size,
        "hidden": hidden,
        "finished_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "code_rev": code_revision(),
    }
    result = {
        **summary,
        "setup": {
            "topology": t.name,
            "switch": switch,
            "profile": queues,
            "link_rate_mbit": None if bmv2 else link_rate_mbit,
            "batch_size": batch_size,
            "hidden": hidden,
            "parameters": train.get("parameters"),
            "env": env,
            "flags": flags,
            "loss_rule_drops": injected,
            "link_down": link_event,
            "background": (
                {"sent": traffic.sent, "received": traffic.received, "sport": traffic.sport}
                if traffic is not None
                else None
            ),
        },
        **({"note": FUNCTIONAL_NOTE} if bmv2 else {}),
        "router_classes": totals,
        "router_link_packets": (
            bmv2_link_packets(before, after) if bmv2 else per_link_packets(before, after)
        ),
        "train": train,
    }
    (res_dir / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    append_csv(res_dir, summary)
    sink.write(
        f"[testbed] {name}: accuracy {summary['final_accuracy']:.1f}%, "
        f"{summary['median_ms_per_iter']:.1f} ms/iter, wall {wall:.0f} s; "
        f"router drops {summary['router_drops'] or 'none'}\n"
        + (f"[testbed] {name}: {FUNCTIONAL_NOTE}\n" if bmv2 else "")
    )
    sink.flush()
    if plot_after:
        plot(res_dir)
    return result


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
) -> tuple[int, list[dict[str, Any]]]:
    """Every scenario for Gloo and DLCP, then each single ablation of DLCP on
    each of ``ablation_scenarios``, on ``switch`` (linux or bmv2); Gloo's runs
    over Linux on ``gloo_profile`` (default: a FIFO). ``hidden`` sizes the
    model's hidden layer for every run (1024: a gradient the fabric's links
    feel). Failed runs are reported and skipped. Returns (number of failures,
    summaries)."""
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
    for i, (s, tr, ab) in enumerate(plan, 1):
        prof = gloo_profile if tr == "gloo" else None
        name = run_name(s, tr, ab, switch, prof, hidden=hidden)
        sink.write(f"[testbed] suite {i}/{len(plan)}: {name}\n")
        try:
            r = run_experiment(s, tr, ablate=ab, epochs=epochs, results=results, out=sink,
                               plot_after=False, switch=switch, profile=prof,
                               hidden=hidden)  # fmt: skip
        except Exception as e:  # one failed run must not end the suite
            failures += 1
            sink.write(f"[testbed] suite: {name} FAILED: {e}\n")
            continue
        done.append({k: r[k] for k in CSV_FIELDS})
    plot(results)
    sink.write(table(done) + "\n")
    sink.flush()
    return failures, done
