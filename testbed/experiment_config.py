"""What one testbed experiment is: its scenario, transport, ablations and setup,
checked when made (:class:`ExperimentConfig`), the name its results are filed
under (:func:`run_name`), and the settings its training ranks get
(:func:`dlcp_settings`, :meth:`ExperimentConfig.example_settings`).

:mod:`.experiments` builds the testbed, applies the scenario, runs the ranks and
writes the results; over BMv2 it makes the same scenarios with the switches' own
means (described there).

Scenarios:

``clean``       nothing injected.
``loss``        1 % random loss on leaf1--spine1, both directions.
``background``  a paced UDP flow h2 -> h3 pinned to spine1 at
                :data:`.experiments.BACKGROUND_SHARE` of the link rate, for the whole run
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
                Gloo's point-to-point send/recv (:mod:`shims.tcp_ps`).

Ablations (DLCP only; ``--ablate`` takes a comma list; default is everything on):

``spray``     on: ``DLCP_N_PATHS=8`` (8 UDP source ports, ECMP spreads them);
              off: ``DLCP_N_PATHS=1``.
``bound``     on: ``--p 0.05``; off: ``--p 0`` (every packet recovered).
``priority``  off: ``DLCP_CLASSIFIER=magnitude`` (one class, drop eligibility
              from magnitude; no layer priority).
``drop``      off: ``DLCP_CLASSIFIER=layer`` (layer priority, nothing
              drop-eligible). ``priority`` and ``drop`` both off:
              ``DLCP_CLASSIFIER=none``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dlcp.errors import UsageError
from dlcp.proto.config import MAX_MTU, MIN_MTU
from dlcp.proto.wire import DEFAULT_PORT

from .host_egress import check_host_egress
from .results import (
    BATCH_SIZE,
    HIDDEN,
    LINK_RATE_MBIT,
    MTU,
    default_host_egress,
    default_profile,
    settings_label,
)

__all__ = [
    "ABLATIONS",
    "BACKENDS",
    "PROFILES",
    "SCENARIOS",
    "SWITCHES",
    "TRANSPORTS",
    "ExperimentConfig",
    "ablation_label",
    "dlcp_settings",
    "run_name",
]

SCENARIOS = ("clean", "loss", "background", "spine-down", "incast")
SWITCHES = ("linux", "bmv2")
#: what builds the Linux routers: plain network namespaces, or Mininet nodes
BACKENDS = ("namespaces", "mininet")
#: router queueing over Linux: the DLCP commodity-switch profile, or one FIFO
PROFILES = ("dlcp", "fifo")
ABLATIONS = ("priority", "drop", "spray", "bound")
TRANSPORTS = ("dlcp", "gloo")
N_PATHS = 8
P_BOUND = 0.05


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
    mtu: int = MTU,
    host_egress: str | None = None,
) -> str:
    """``<scenario>-<transport>[-no-<ablations>][-bmv2][-on-<profile>][-<rate>mbit]
    [-batch<n>][-hidden<n>][-mtu<n>][-hosts-<host egress>]``: the profile only if not
    the transport's default, the link rate (Linux routers only), batch size, model
    width, link MTU and the hosts' egress only if not the defaults."""
    label = ablation_label(ablate)
    odd = profile is not None and switch == "linux" and profile != default_profile(transport)
    rate = link_rate_mbit if switch == "linux" else LINK_RATE_MBIT  # BMv2 links: unshaped
    return (
        f"{scenario}-{transport}"
        + (f"-{label}" if label else "")
        + ("-bmv2" if switch == "bmv2" else "")
        + (f"-on-{profile}" if odd else "")
        + settings_label(rate, batch_size, hidden, mtu)
        + (
            f"-hosts-{host_egress}"
            if host_egress is not None and host_egress != default_host_egress(switch)
            else ""
        )
    )


def dlcp_settings(scenario: str, ablate: Iterable[str]) -> tuple[dict[str, str], list[str]]:
    """(``DLCP_*`` environment, extra example flags) of a DLCP run. Data goes to
    the protocol's port (one rank per host), the one the P4 program parses as
    DLCP: on an ephemeral port the BMv2 switches would see plain UDP, classify it
    by DSCP alone and never drop drop-eligible packets first. Datagrams are as
    large as the hosts' links allow (``DLCP_MTU=auto``: the topology's MTU)."""
    off = set(ablate)
    env = {
        "DLCP_N_PATHS": "1" if "spray" in off else str(N_PATHS),
        "DLCP_DATA_PORT": str(DEFAULT_PORT),
        "DLCP_MTU": "auto",
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


@dataclass(frozen=True)
class ExperimentConfig:
    """One training run on the testbed (module doc). ``switch``: the routers forward
    with Linux and a tc profile, or are BMv2 switches running the DLCP P4 program;
    ``backend`` (Linux routers): plain namespaces or Mininet nodes. ``profile`` (Linux
    only): the DLCP profile or a FIFO, by default :func:`default_profile` of the
    transport. ``link_rate_mbit`` (default :data:`LINK_RATE_MBIT`) shapes the Linux
    routers' egress and, with ``host_egress="shaped"`` (the Linux default;
    :mod:`.host_egress`), the hosts' own. ``timeout`` (seconds for the ranks; default
    from the epochs). Checked when made: a bad value raises ValueError naming it."""

    scenario: str
    transport: str
    ablate: tuple[str, ...] = ()
    epochs: int = 2
    batch_size: int = BATCH_SIZE
    hidden: int = HIDDEN
    #: every link's MTU (bytes); DLCP's datagrams follow it, TCP's segments too
    mtu: int = MTU
    results: str | Path = "results"
    link_rate_mbit: float = LINK_RATE_MBIT
    prefix: str | None = None
    switch: str = "linux"
    backend: str = "namespaces"
    timeout: float | None = None
    plot_after: bool = True
    profile: str | None = None
    #: the hosts' own egress: ``shaped`` at the link rate as a NIC would, or
    #: ``unshaped`` (None: :func:`default_host_egress` of the switch)
    host_egress: str | None = None

    def __post_init__(self) -> None:
        def known(what: str, value: str, choices: Sequence[str]) -> None:
            if value not in choices:
                raise UsageError(f"unknown {what} {value!r} (known: {', '.join(choices)})")

        object.__setattr__(self, "ablate", tuple(self.ablate))
        known("scenario", self.scenario, SCENARIOS)
        known("transport", self.transport, TRANSPORTS)
        for a in sorted(set(self.ablate)):
            known("ablation", a, ABLATIONS)
        if self.ablate and self.transport != "dlcp":
            raise UsageError("ablations apply to --transport dlcp only")
        known("switch", self.switch, SWITCHES)
        known("backend", self.backend, BACKENDS)
        bmv2 = self.switch == "bmv2"
        if bmv2 and self.profile is not None:
            raise UsageError(
                f"profile={self.profile!r} chooses the Linux routers' queueing; "
                "BMv2 runs the P4 program"
            )
        if bmv2 and self.backend != "namespaces":
            raise UsageError(f"--switch bmv2 runs in plain namespaces, not {self.backend}")
        if self.profile is None and not bmv2:
            object.__setattr__(self, "profile", default_profile(self.transport))
        if self.profile is not None:
            known("profile", self.profile, PROFILES)
        if self.host_egress is None:
            object.__setattr__(self, "host_egress", default_host_egress(self.switch))
        assert self.host_egress is not None
        check_host_egress(self.host_egress)
        if bmv2 and self.host_egress != "unshaped":
            raise UsageError(
                f"--host-egress {self.host_egress} shapes the hosts to the Linux routers' link "
                "rate; BMv2 links are not shaped (use --host-egress unshaped)"
            )
        if bmv2 and self.link_rate_mbit != LINK_RATE_MBIT:
            raise UsageError(
                "--link-rate shapes the Linux routers' egress; BMv2 links are not shaped "
                "(BMv2 queues have per-priority rates only)"
            )
        rate = self.link_rate_mbit
        if not MIN_MTU <= self.mtu <= MAX_MTU:  # (DLCP's datagrams must fit)
            raise UsageError(f"mtu={self.mtu} outside {MIN_MTU}..{MAX_MTU} bytes")
        if self.epochs < 1 or self.batch_size < 1 or self.hidden < 1 or not 0 < rate < math.inf:
            raise UsageError(
                f"epochs={self.epochs}, batch_size={self.batch_size} and hidden={self.hidden} "
                f"must be >= 1, and link_rate_mbit={rate} a positive number"
            )

    @property
    def name(self) -> str:
        """The run's name (:func:`run_name`; ``-mininet`` on Mininet nodes)."""
        return run_name(
            self.scenario, self.transport, self.ablate, self.switch, self.profile,
            link_rate_mbit=self.link_rate_mbit, batch_size=self.batch_size,
            hidden=self.hidden, mtu=self.mtu, host_egress=self.host_egress,
        ) + ("-mininet" if self.backend == "mininet" else "")  # fmt: skip

    @property
    def queues(self) -> str:
        """What the results say the routers ran: the profile, or ``p4``."""
        return self.profile or "p4"

    def example_settings(self) -> tuple[dict[str, str], list[str]]:
        """(environment, flags) of the training example's ranks."""
        env: dict[str, str] = {}
        flags = ["--transport", self.transport, "--epochs", str(self.epochs),
                 "--batch-size", str(self.batch_size), "--hidden", str(self.hidden)]  # fmt: skip
        if self.transport == "dlcp":
            denv, dflags = dlcp_settings(self.scenario, self.ablate)
            env.update(denv)
            flags += dflags
        elif self.scenario == "incast":  # the same parameter server, over Gloo's TCP
            flags += ["--collective", "ps"]
        return env, flags
