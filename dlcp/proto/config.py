"""Protocol configuration: one validated, frozen dataclass for the sans-I/O core.

The I/O layer builds it (with ``DLCP_*`` environment overrides); the core only
reads it. Every field is checked in ``__post_init__`` and a bad value raises
``ValueError`` naming the field, the value and what is allowed.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ..errors import ConfigError
from .classify import available_classifiers
from .wire import AUTH_TRAILER_LEN, DATA_HEADER_LEN, MAX_LOSS_BOUND, TosMap

__all__ = ["IPV4_UDP_OVERHEAD", "MAX_MTU", "MIN_MTU", "FillPolicy", "ProtocolConfig"]

#: IPv4 (20) + UDP (8) header bytes inside the MTU
IPV4_UDP_OVERHEAD: Final = 28
#: the MTUs the protocol accepts: IPv4's minimum datagram size, its largest
MIN_MTU: Final = 576
MAX_MTU: Final = 65535


#: receiver-driven pacing starts at 10 Gbit/s, never goes below 8 Mbit/s, and lets
#: 512 KB go in one burst (a Python driver wakes up every few hundred microseconds)
_PACER_DEFAULTS: Final[dict[str, dict[str, Any]]] = {
    "receiver": {"initial_rate": 1.25e9, "min_rate": 1e6, "burst_bytes": 1 << 19},
}


#: large gradients tolerate far less loss than small ones (papers: ~0.1 % vs >= 1.6 %),
#: so by default only the largest-magnitude fifth of the chunks is protected
_CLASSIFIER_DEFAULTS: Final[dict[str, dict[str, Any]]] = {
    "combined": {"drop_fraction": 0.8},
}


class FillPolicy(enum.Enum):
    """What the receiver writes where gradient data was lost."""

    ZERO = "zero"  # lost values become 0 (gradients)
    PREVIOUS = "previous"  # lost values keep what the output buffer held (parameters)
    RESCALE = "rescale"  # zeros, and received values scaled by total/received (unbiased sum)


#: the longest a protocol timer may be set to (an hour): longer is a typo or ``inf``
MAX_TIMER: Final = 3600.0


@dataclass(frozen=True, slots=True)
class ProtocolConfig:
    """Knobs of the DLCP core. Times are seconds, rates bytes per second."""

    mtu: int = 1500
    #: payload bytes per packet; None = the most that fits the MTU
    payload_bytes: int | None = None
    #: packets the sender takes per pacing decision: one contiguous run of records,
    #: handed out as one data batch with one path, as data batches of
    #: ``spray_packets`` with several (per-batch work in Python is paid once per
    #: ``batch_packets``; 352 = 8 GSO sends of 44, and 352 x 1472 B stays under the
    #: default 512 KiB burst)
    batch_packets: int = 352
    #: packets per path choice when spraying over several paths (one GSO send)
    spray_packets: int = 44
    #: equal-cost paths to spray over (one UDP source port each)
    n_paths: int = 1
    path_weights: tuple[float, ...] | None = None
    #: chunk classifier (see dlcp.proto.classify) and its options; the default
    #: takes priority from the layer and protects the 20 % largest-magnitude chunks
    classifier: str = "combined"
    classifier_options: Mapping[str, Any] = field(default_factory=dict)
    #: values sampled per chunk for its magnitude statistic; 0 = all values
    magnitude_sample: int = 16
    tos: TosMap = field(default_factory=TosMap)
    #: default loss bound for messages that do not set one
    default_p: float = 0.0
    default_fill: FillPolicy = FillPolicy.ZERO
    #: retransmission rounds in a row that bring the receiver no closer (its
    #: NACK needs as many elements and names as many chunks) before the sender
    #: gives up; under incast a round's resent chunks can all be dropped several
    #: times running while the pacers slow down (8 failed a testbed job's
    #: parameter server)
    max_rounds: int = 64
    #: sender: wait this long after FINISH for STOP/NACK before sending FINISH again
    finish_timeout: float = 0.2
    #: sender: FINISH repeats without an answer before the peer is declared dead
    finish_retries: int = 10
    #: receiver: after FINISH, wait this long for data still in flight before NACKing
    reorder_grace: float = 0.002
    #: receiver: the network delivers each path's datagrams in the order they were
    #: sent (ECMP keeps a flow on one route), so a FINISH's tail ends the reorder
    #: grace (docs/spec.md §8); off for a fabric that sprays one flow's packets
    #: over several routes (per-packet adaptive routing)
    ordered_paths: bool = True
    #: receiver: repeat a NACK after this long without progress
    nack_timeout: float = 0.1
    #: receiver: a started message with no packet for this long fails
    recv_idle_timeout: float = 30.0
    #: receiver: a message whose sender's FINISHes come over the control channel
    #: while none of that sender's data datagrams has arrived for this long fails
    #: as a silent data path (UDP blocked or misaddressed), and its sender is told
    #: so, instead of both waiting for their timeouts (long enough to ride out a
    #: route change; a path that is merely lossy delivers something)
    silent_path_timeout: float = 5.0
    #: pacer: "receiver" (receiver-driven feedback) or "unpaced"
    pacer: str = "receiver"
    pacer_options: Mapping[str, Any] = field(default_factory=dict)
    #: receiver: rate measurement / feedback interval while several sources
    #: have messages under way (their shares move a step a window)
    rate_interval: float = 0.005
    #: receiver: the same while at most one source does and its rate holds steady
    #: (``RateMeter``'s ``lone_interval``: each deadline is a turn of its driver)
    lone_rate_interval: float = 0.02
    #: receiver: bytes it buffers for messages nobody asked for yet
    max_unexpected_bytes: int = 1 << 30
    #: receiver: completed message keys remembered (late packets, repeated FINISH)
    completed_memory: int = 4096
    #: authenticate every datagram (key given to the session)
    authenticate: bool = False

    def __post_init__(self) -> None:
        if not MIN_MTU <= self.mtu <= MAX_MTU:
            raise ConfigError(f"mtu={self.mtu} outside {MIN_MTU}..{MAX_MTU}")
        limit = self.max_payload_bytes
        if self.payload_bytes is not None and not 16 <= self.payload_bytes <= limit:
            raise ConfigError(
                f"payload_bytes={self.payload_bytes} outside 16..{limit} "
                f"(mtu {self.mtu}, headers {IPV4_UDP_OVERHEAD + DATA_HEADER_LEN}"
                f"{' + auth tag' if self.authenticate else ''})"
            )
        if self.payload_bytes is not None and self.payload_bytes % 4:
            raise ConfigError(f"payload_bytes={self.payload_bytes} must be a multiple of 4")
        if not 1 <= self.batch_packets <= 1024:
            raise ConfigError(f"batch_packets={self.batch_packets} outside 1..1024")
        if not 1 <= self.spray_packets <= 1024:
            raise ConfigError(f"spray_packets={self.spray_packets} outside 1..1024")
        if not 1 <= self.n_paths <= 256:
            raise ConfigError(f"n_paths={self.n_paths} outside 1..256")
        if self.path_weights is not None and len(self.path_weights) != self.n_paths:
            raise ConfigError(
                f"path_weights has {len(self.path_weights)} entries for n_paths={self.n_paths}"
            )
        if self.magnitude_sample < 0:
            raise ConfigError(f"magnitude_sample={self.magnitude_sample} must be >= 0")
        if not 0.0 <= self.default_p <= MAX_LOSS_BOUND:
            raise ConfigError(f"default_p={self.default_p} outside [0, {MAX_LOSS_BOUND}]")
        if not isinstance(self.default_fill, FillPolicy):
            raise ConfigError(f"default_fill={self.default_fill!r} is not a FillPolicy")
        if not 0 <= self.max_rounds <= 1000:
            raise ConfigError(f"max_rounds={self.max_rounds} outside 0..1000")
        if self.finish_retries < 1:
            raise ConfigError(f"finish_retries={self.finish_retries} must be >= 1")
        for name in (
            "finish_timeout",
            "reorder_grace",
            "nack_timeout",
            "recv_idle_timeout",
            "silent_path_timeout",
            "rate_interval",
            "lone_rate_interval",
        ):
            value = getattr(self, name)
            if not 0 < value <= MAX_TIMER:
                raise ConfigError(f"{name}={value} must be within (0, {MAX_TIMER:g}] seconds")
        if self.lone_rate_interval < self.rate_interval:
            raise ConfigError(
                f"lone_rate_interval={self.lone_rate_interval} must be >= "
                f"rate_interval={self.rate_interval} (a lone source's window is no shorter)"
            )
        if self.classifier not in available_classifiers():
            known = ", ".join(available_classifiers())
            raise ConfigError(f"classifier={self.classifier!r}: known classifiers are {known}")
        if self.pacer not in ("receiver", "unpaced"):
            raise ConfigError(f"pacer={self.pacer!r}: known pacers are 'receiver', 'unpaced'")
        if self.max_unexpected_bytes < 0 or self.completed_memory < 1:
            raise ConfigError("max_unexpected_bytes must be >= 0 and completed_memory >= 1")

    def classifier_kwargs(self) -> dict[str, Any]:
        """Options for :func:`dlcp.proto.classify.make_classifier`: defaults, then ours."""
        return {**_CLASSIFIER_DEFAULTS.get(self.classifier, {}), **self.classifier_options}

    def pacer_kwargs(self) -> dict[str, Any]:
        """Options for :func:`dlcp.proto.pacers.make_pacer`: defaults, then ``pacer_options``."""
        return {**_PACER_DEFAULTS.get(self.pacer, {}), **self.pacer_options}

    @property
    def max_payload_bytes(self) -> int:
        tag = AUTH_TRAILER_LEN if self.authenticate else 0
        raw = self.mtu - IPV4_UDP_OVERHEAD - DATA_HEADER_LEN - tag
        return raw - raw % 4

    @property
    def chunk_bytes(self) -> int:
        """Payload bytes per packet in use (a multiple of 4, so of every itemsize)."""
        return self.payload_bytes if self.payload_bytes is not None else self.max_payload_bytes
