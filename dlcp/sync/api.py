"""What every synchronisation scheme shares: the training-loop surface, the
model's flat view, the per-step report, the checks made before any traffic.

A scheme wraps a model and its optimizer, as torch's optimizer wrappers do::

    sync = dlcp.sync.make("ssp", model, optimizer, endpoint=ep, world_size=4, staleness=3)
    for batch in data:
        optimizer.zero_grad()
        loss_fn(model(batch)).backward()
        report = sync.step()      # local update + the scheme's communication
    sync.close()

``step()`` runs the optimizer itself (do not call ``optimizer.step()`` too) and
then does what the scheme prescribes with the result; it returns a
:class:`StepReport`. ``close()`` tells the peers this rank has finished (a
co-located parameter server keeps serving until every worker has).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from ..errors import ConfigError, TransferFailed, UsageError
from ..proto.loss_report import N_CLASSES

__all__ = [
    "FlatModel",
    "StepReport",
    "SyncScheme",
    "WorkerFailed",
    "check_loss_bound",
    "check_world",
]

#: the ``msg`` channel (high 4 bits, as :class:`~dlcp.collectives.Communicator`
#: numbers its channels) that the schemes' own messages use; collectives keep 0..12
SYNC_CHANNEL = 0x0D


def sync_msg(role: int) -> int:
    """The message id of a scheme's message ``role`` (0..0xFFF)."""
    if not 0 <= role <= 0x0FFF:
        raise UsageError(f"role {role} outside 0..4095")
    return (SYNC_CHANNEL << 12) | role


class WorkerFailed(TransferFailed):
    """A rank of the scheme stopped (closed, crashed or went silent): the message
    names it. Raised on every other rank instead of waiting for it."""

    def __init__(self, message: str, rank: int) -> None:
        super().__init__(message)
        self.rank = rank


@dataclass(frozen=True, slots=True)
class StepReport:
    """One ``step()`` as seen by this rank."""

    scheme: str
    #: iterations this rank has completed (its clock), this one included
    clock: int
    #: the version of the parameters this rank now holds (scheme-defined: for a
    #: parameter server, updates applied to them; for group schemes, rounds)
    version: int = 0
    #: for a parameter server: every worker's clock in what this rank read
    clocks: tuple[int, ...] = ()
    #: iterations the parameters read lag behind this rank's clock: its clock minus
    #: the updates applied of the slowest worker still training (one that has
    #: finished holds nobody back and counts no more)
    staleness: int = 0
    #: elements lost by the transport (filled) in messages of this step, this rank's
    #: own pushes included where the scheme learns of them, and elements those
    #: bounded-loss messages carried
    lost_elems: int = 0
    bounded_elems: int = 0
    #: lost and carried chunks per (priority, drop) class, index prio * 2 + drop
    lost_chunks: tuple[int, ...] = (0,) * N_CLASSES
    class_chunks: tuple[int, ...] = (0,) * N_CLASSES
    #: the group this rank averaged with (group schemes), ranks in order
    group: tuple[int, ...] = ()
    #: seconds this step spent communicating or waiting for peers
    wait_seconds: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def lost_fraction(self) -> float:
        return self.lost_elems / self.bounded_elems if self.bounded_elems else 0.0


def check_world(rank: int, world_size: int) -> None:
    if world_size < 1:
        raise ConfigError(f"world_size={world_size} must be >= 1")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is outside the world 0..{world_size - 1}")


def check_loss_bound(name: str, p: float) -> None:
    if not 0.0 <= p < 1.0:
        raise ConfigError(f"{name}={p} outside [0, 1)")


class FlatModel:
    """The float32 parameters of a model as one flat vector: read, written, and cut
    into whole-parameter shards."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ConfigError("the model has no trainable parameters")
        bad = {str(p.dtype) for p in self.params if p.dtype != torch.float32}
        if bad:
            raise ConfigError(f"the schemes carry float32 parameters; the model has {sorted(bad)}")
        if any(p.device.type != "cpu" for p in self.params):
            raise ConfigError("the schemes read and write parameters on the CPU")
        self.sizes = [p.numel() for p in self.params]
        self.offsets = [0, *np.cumsum(self.sizes).tolist()]
        self.numel = int(self.offsets[-1])

    def read(self, out: npt.NDArray[np.float32] | None = None) -> npt.NDArray[np.float32]:
        flat = out if out is not None else np.empty(self.numel, np.float32)
        with torch.no_grad():
            for p, a, b in zip(self.params, self.offsets, self.offsets[1:], strict=False):
                flat[a:b] = p.detach().reshape(-1).numpy()
        return flat

    def write(self, flat: npt.NDArray[np.float32]) -> None:
        with torch.no_grad():
            for p, a, b in zip(self.params, self.offsets, self.offsets[1:], strict=False):
                p.copy_(torch.from_numpy(flat[a:b]).view_as(p))

    def shard_by_parameter(self, parts: int) -> list[list[int]]:
        """Whole parameters per part, largest first onto the lightest part (a
        deterministic greedy balance every rank computes alike)."""
        if parts > len(self.params):
            raise ConfigError(
                f"{parts} servers for {len(self.params)} parameter tensors: sharding by "
                "parameter would leave a server without a shard"
            )
        load = [0] * parts
        owned: list[list[int]] = [[] for _ in range(parts)]
        for i in sorted(range(len(self.params)), key=lambda i: (-self.sizes[i], i)):
            j = min(range(parts), key=lambda j: (load[j], j))
            owned[j].append(i)
            load[j] += self.sizes[i]
        return [sorted(o) for o in owned]

    def gather(self, flat: npt.NDArray[np.float32], params: Sequence[int]) -> npt.NDArray[Any]:
        """The elements of ``params`` (indices) of ``flat``, concatenated."""
        return np.concatenate([flat[self.offsets[i] : self.offsets[i + 1]] for i in params])

    def scatter(
        self, flat: npt.NDArray[np.float32], params: Sequence[int], shard: npt.NDArray[Any]
    ) -> None:
        at = 0
        for i in params:
            n = self.sizes[i]
            flat[self.offsets[i] : self.offsets[i] + n] = shard[at : at + n]
            at += n


class SyncScheme(abc.ABC):
    """The surface every scheme offers (module docstring)."""

    name: str = ""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer
        self.flat = FlatModel(model)
        self.clock = 0
        self.reports: list[StepReport] = []
        self._closed = False

    def local_update(self) -> npt.NDArray[np.float32]:
        """Run the optimizer on this rank's gradients; the change it made (flat)."""
        before = self.flat.read()
        self.optimizer.step()
        return self.flat.read() - before

    @abc.abstractmethod
    def step(self) -> StepReport:
        """The optimizer's step and the scheme's communication for it."""

    @abc.abstractmethod
    def close(self) -> None:
        """Tell the peers this rank has finished; wait where the scheme must."""

    def __enter__(self) -> SyncScheme:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
