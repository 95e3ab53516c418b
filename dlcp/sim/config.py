"""What one simulation run is: :class:`SimConfig`, validated on construction.

Protocol parameters mirror :class:`dlcp.proto.config.ProtocolConfig` (chunk size,
drop-eligible share of the classifier, pacer start and floor rates, retransmission
rounds, FINISH retries); the switch thresholds come from the testbed's
:class:`SwitchPolicy` (8 classes, drop-eligible threshold a fifth of the queue by
default). Timers are the only protocol values set for the fabric rather than
copied: the defaults in ``ProtocolConfig`` are sized for a Python endpoint (a
FINISH timeout of 200 ms), a 100 Gbit/s fabric has a round trip of ~10 us.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Final

from dlcp.proto.config import ProtocolConfig
from dlcp.switch.policy import SwitchPolicy

from ..errors import ConfigError

__all__ = ["ABLATIONS", "TRANSPORTS", "WORKLOADS", "SimConfig", "SimConfigError", "switch_policy"]

TRANSPORTS = ("dlcp", "tcp", "dctcp")
#: DLCP mechanisms an ablation can turn off
ABLATIONS = ("spray", "priority", "selective_drop", "bound")
WORKLOADS = tuple(
    f"{kind}-{model}" for kind in ("ps", "ring") for model in ("resnet50", "vgg16", "bert")
)


#: the ProtocolConfig fields the simulated endpoints read (dlcp/sim/engine.py); the
#: fabric's timers have fields of their own (rate_interval_us, ...)
_SIMULATED_PROTOCOL: Final = frozenset(
    {"mtu", "payload_bytes", "tos", "pacer", "pacer_options", "finish_retries", "max_rounds",
     "classifier", "classifier_options"}
)  # fmt: skip
_SIMULATED_PACER_OPTIONS: Final = frozenset({"initial_rate", "min_rate"})


class SimConfigError(ConfigError):
    """A simulation parameter is invalid; the message names it."""


@dataclass(frozen=True)
class SimConfig:
    """One run. Sizes in bytes, rates in Gbit/s, times in microseconds."""

    hosts: int = 144
    #: a testbed topology TOML (testbed.topology format); None = the regular
    #: leaf-spine of hosts / hosts_per_leaf / spines
    topology: str | None = None
    hosts_per_leaf: int = 16
    spines: int = 4
    link_gbps: float = 100.0
    #: host-facing : spine-facing capacity of a leaf; None = spine links at link_gbps
    oversubscription: float | None = None
    link_delay_us: float = 1.0
    buffer_packets: int = 300
    #: drop-eligible threshold per band; None = the SwitchPolicy ratio (1/5)
    drop_eligible_packets: int | None = None
    workload: str = "ps-resnet50"
    servers: int = 16
    iterations: int = 2
    #: gradient bytes are multiplied by this (documented in results)
    scale: float = 0.01
    partition_bytes: int = 4 << 20  # PS: tensors larger than this are split (BytePS default)
    bucket_bytes: int = 25 << 20  # ring: gradient buckets (PyTorch DDP default)
    background_flows: int = 0  # per host, reliable, lowest class, random peer
    background_bytes: int = 1 << 20
    front_layers_first: bool = True  # priority: front layers in higher classes
    transport: str = "dlcp"
    disable: tuple[str, ...] = ()
    p: float = 0.1  # loss bound of gradients (push / reduce-scatter)
    p_pull: float = 0.0  # loss bound of parameters (pull / all-gather)
    tcp_min_rto_us: float = 1000.0
    rate_interval_us: float = 20.0
    #: receiver-driven pacing hands out this share of the downlink (wire bytes)
    pacing_target: float = 0.95
    finish_timeout_us: float = 500.0
    reorder_grace_us: float = 20.0
    #: a receiver repeats an unanswered NACK after this long (ProtocolConfig.nack_timeout
    #: at the simulation's time scale); it also caps how long a NACK waits for a
    #: sender that keeps streaming
    nack_timeout_us: float = 500.0
    seed: int = 1
    time_limit_s: float = 10.0
    protocol: dict[str, Any] = field(default_factory=dict)  # ProtocolConfig overrides

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> SimConfigError:
            return SimConfigError(f"{name}={getattr(self, name)!r}: {why}")

        for name in ("hosts", "hosts_per_leaf", "spines", "buffer_packets", "iterations"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise bad(name, "must be a positive integer")
        if self.hosts < 2:
            raise bad("hosts", "need at least 2 hosts")
        if self.hosts % self.hosts_per_leaf:
            raise bad(
                "hosts",
                f"not a multiple of hosts_per_leaf={self.hosts_per_leaf} "
                f"(a leaf-spine of full leaves; e.g. {self.hosts_per_leaf * 9})",
            )
        if self.workload not in WORKLOADS:
            raise bad("workload", f"unknown (known: {', '.join(WORKLOADS)})")
        if self.transport not in TRANSPORTS:
            raise bad("transport", f"unknown (known: {', '.join(TRANSPORTS)})")
        unknown = sorted(set(self.disable) - set(ABLATIONS))
        if unknown:
            raise SimConfigError(
                f"disable: unknown mechanism {unknown[0]!r} (known: {', '.join(ABLATIONS)})"
            )
        if self.disable and self.transport != "dlcp":
            raise bad("disable", "ablations apply to the dlcp transport only")
        if (
            not isinstance(self.seed, int)
            or isinstance(self.seed, bool)
            or not 1 <= self.seed < 4294944443
        ):
            raise bad("seed", "must be an integer in 1..4294944442 (ns-3's random streams)")
        if not isinstance(self.servers, int) or isinstance(self.servers, bool):
            raise bad("servers", "must be an integer")
        if self.buffer_packets < 2:
            raise bad("buffer_packets", "a port needs at least 2 packets of buffer")
        if self.workload.startswith("ps-") and not 1 <= self.servers < self.hosts:
            raise bad("servers", f"a parameter server needs 1..{self.hosts - 1} servers")
        for name in ("link_gbps", "link_delay_us", "scale", "time_limit_s", "tcp_min_rto_us",
                     "rate_interval_us", "finish_timeout_us", "reorder_grace_us",
                     "nack_timeout_us"):  # fmt: skip
            if not getattr(self, name) > 0:
                raise bad(name, "must be > 0")
        if not 0 < self.pacing_target <= 1:
            raise bad("pacing_target", "must be in (0, 1]")
        if self.oversubscription is not None and not self.oversubscription > 0:
            raise bad("oversubscription", "must be > 0")
        for name in ("p", "p_pull"):
            if not 0.0 <= getattr(self, name) <= 0.255:
                raise bad(name, "a loss bound must be in [0, 0.255] (the wire's limit)")
        if self.drop_eligible_packets is not None and not (
            0 < self.drop_eligible_packets < self.buffer_packets
        ):
            raise bad("drop_eligible_packets", f"must be in 1..{self.buffer_packets - 1}")
        if self.background_flows < 0 or self.background_bytes < 1:
            raise SimConfigError("background_flows must be >= 0 and background_bytes >= 1")
        self.protocol_config()  # validates the overrides
        if self.topology is not None:
            self._check_topology(self.topology)

    def _check_topology(self, path: str) -> None:
        # the topology format is the testbed's: imported only when a topology file is given
        from testbed.topology import Topology, TopologyError

        try:
            topo = Topology.load(path)
        except TopologyError as e:
            raise SimConfigError(f"topology: {e}") from e
        if len(topo.hosts) != self.hosts:
            raise SimConfigError(
                f"topology {self.topology} has {len(topo.hosts)} hosts but hosts={self.hosts}"
            )
        if len(topo.spines) != self.spines:
            raise SimConfigError(
                f"topology {self.topology} has {len(topo.spines)} spines but spines={self.spines}"
            )
        if topo.link_specs:
            raise SimConfigError(
                f"topology {self.topology}: per-link [[links]] settings are not simulated "
                "(every link runs at --link-gbps with --buffer-packets); remove them"
            )
        per_leaf = {leaf: sum(h.leaf == leaf for h in topo.hosts) for leaf in topo.leaves}
        if set(per_leaf.values()) != {self.hosts_per_leaf}:
            raise SimConfigError(
                f"topology {self.topology}: hosts per leaf {per_leaf} differ from "
                f"hosts_per_leaf={self.hosts_per_leaf}"
            )
        # the workloads place servers and ring neighbours by host index (host h on
        # leaf h // hosts_per_leaf): the file must list its hosts leaf by leaf
        for i, h in enumerate(topo.hosts):
            want = topo.leaves[i // self.hosts_per_leaf]
            if h.leaf != want:
                raise SimConfigError(
                    f"topology {self.topology}: host {h.name} (the {i + 1}th listed) is on "
                    f"{h.leaf}, but the simulation takes hosts leaf by leaf in the leaves' "
                    f"order: list {want}'s hosts there"
                )

    # ---- derived values ---------------------------------------------------------

    @property
    def leaves(self) -> int:
        return self.hosts // self.hosts_per_leaf

    @property
    def fabric_gbps(self) -> float:
        if self.oversubscription is None:
            return self.link_gbps
        return self.hosts_per_leaf * self.link_gbps / (self.spines * self.oversubscription)

    @property
    def effective_oversubscription(self) -> float:
        return self.hosts_per_leaf * self.link_gbps / (self.spines * self.fabric_gbps)

    def enabled(self, mechanism: str) -> bool:
        return self.transport == "dlcp" and mechanism not in self.disable

    @property
    def label(self) -> str:
        if self.transport != "dlcp" or not self.disable:
            return self.transport
        return "dlcp-no-" + "-".join(sorted(self.disable))

    def protocol_config(self) -> ProtocolConfig:
        """The protocol settings the simulated endpoints take; an override the
        simulation does not model is refused by name (it would run as if unset)."""
        ignored = sorted(set(self.protocol) - _SIMULATED_PROTOCOL)
        for name, allowed in (("pacer_options", _SIMULATED_PACER_OPTIONS),
                              ("classifier_options", {"drop_fraction"})):  # fmt: skip
            extra = sorted(set(self.protocol.get(name, {})) - allowed)
            ignored += [f"{name}[{k!r}]" for k in extra]
        if self.protocol.get("classifier", "combined") != "combined":
            ignored.append(f"classifier={self.protocol['classifier']!r} (only 'combined')")
        if ignored:
            raise SimConfigError(
                f"protocol: {', '.join(ignored)} not simulated (the simulated endpoints take "
                f"{', '.join(sorted(_SIMULATED_PROTOCOL))}; pacer_options "
                f"{', '.join(sorted(_SIMULATED_PACER_OPTIONS))}; classifier_options "
                "drop_fraction)"
            )
        try:
            return ProtocolConfig(**self.protocol)
        except (TypeError, ValueError) as e:
            raise SimConfigError(f"protocol: {e}") from e

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["disable"] = list(self.disable)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SimConfig:
        known = {f.name for f in fields(cls)}
        extra = sorted(set(data) - known)
        if extra:
            raise SimConfigError(f"{extra[0]}: unknown simulation parameter")
        d = dict(data)
        if "disable" in d:
            d["disable"] = tuple(d["disable"])
        return cls(**d)


def switch_policy(cfg: SimConfig) -> SwitchPolicy:
    """The :class:`SwitchPolicy` for this fabric (classes, TOS map, per-class
    thresholds), as the testbed applies it; the simulated switch reads its
    thresholds from it."""
    default = SwitchPolicy()
    de = cfg.drop_eligible_packets
    if de is None:
        ratio = default.drop_eligible_packets / default.queue_packets
        de = max(1, min(cfg.buffer_packets - 1, round(cfg.buffer_packets * ratio)))
    return SwitchPolicy(
        n_classes=8,
        tos=cfg.protocol_config().tos,
        link_rate_mbit=cfg.link_gbps * 1000,
        queue_packets=cfg.buffer_packets,
        drop_eligible_packets=de,
    )
