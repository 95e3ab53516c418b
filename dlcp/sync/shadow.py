"""ShadowSync: model replicas synchronised in the background; training never waits.

``step()`` only runs the local optimizer (under a lock it shares with the
synchroniser). A background thread per worker synchronises the replica with
the others over and over, one *round* at a time, with one of three algorithms:

* ``ma`` (S-MA, model averaging): all-reduce (DLCP ring, bound ``p``) the
  average of the replicas as they were at the round's start, ``x0``; then
  ``x <- avg + (x - x0)``: the local progress made meanwhile is kept. What the
  ring sums is each replica's difference from the last round's average, which
  every rank holds alike (the first round sums the replicas exactly): a lost
  element then stands for "no change since", not for a parameter of 0.
* ``bmuf`` (S-BMUF, block-wise model-update filtering): the same average, then
  the block update ``g = avg - x_global``, block momentum
  ``delta <- momentum * delta + block_lr * g``, ``x_global <- x_global + delta``
  and ``x <- x_global + (x - x0)`` (``nesterov``: ``x_global + momentum * delta``
  as the point the replica restarts from).
* ``easgd`` (S-EASGD, elastic averaging): a central copy lives on a parameter
  server (sharded, asynchronous: :mod:`dlcp.sync.ps` with scale 1); a round reads
  the centre ``c``, computes ``d = alpha * (x0 - c)``, moves the replica
  ``x <- x - d`` and pushes ``d`` (the centre adds it: ``c <- c + d``).

Rounds of ``ma`` and ``bmuf`` are collective: every rank's thread makes the same
all-reduces in the same order. Each carries one extra element, the count of
ranks that want to stop; the first ``close()`` ends the rounds of every rank
after the round that carries it (each rank trains on alone, if it goes on).
``interval`` seconds between rounds limit the rate (0: back to back).

The background thread never writes the parameters (autograd must not see them
change between a forward pass and its backward): a round leaves its change as
a pending correction, and the next ``step()`` adds it after the optimizer's
step, without waiting for anything. The replica a round starts from is the
parameters plus what is pending.
``rounds`` counts this rank's completed rounds; ``trace`` holds each round's
(start, end) ``perf_counter`` times; each ``step()`` reports the rounds so far
(``version``) and the loss of the latest round's messages.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch

from ..collectives import Communicator, ring_allreduce
from ..errors import ConfigError, UsageStateError
from ..io.endpoint import Endpoint
from ..proto.loss_report import N_CLASSES
from .api import StepReport, SyncScheme, check_loss_bound, check_world
from .clocks import ClockTable
from .ps import ParameterServerSync
from .psserver import UpdateRule

__all__ = ["ALGORITHMS", "ShadowSync"]

ALGORITHMS = ("easgd", "ma", "bmuf")
#: the Communicator channel of the background all-reduces
SHADOW_CHANNEL = 0x0E


class _AddAll(UpdateRule):
    """EASGD's centre adds every elastic difference as it is."""

    def scale(
        self,
        worker: int,
        clock: int,
        base: tuple[int, npt.NDArray[np.float32] | None],
        table: ClockTable,
        shard: npt.NDArray[np.float32],
        update: npt.NDArray[np.float32],
    ) -> float:
        return 1.0


class _Centre(ParameterServerSync):
    """The EASGD centre: an asynchronous PS whose 'model' is the centre's replica."""

    def update_rule(self, n_workers: int) -> UpdateRule:
        return _AddAll(n_workers)


class ShadowSync(SyncScheme):
    """One rank of ShadowSync (module docstring)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        endpoint: Endpoint,
        world_size: int,
        algorithm: str = "ma",
        interval: float = 0.0,
        p: float = 0.0,
        alpha: float = 0.2,
        block_lr: float = 1.0,
        momentum: float = 0.5,
        nesterov: bool = False,
        servers: Sequence[int] | None = None,
    ) -> None:
        if algorithm not in ALGORITHMS:
            raise ConfigError(f"algorithm={algorithm!r}: one of {', '.join(ALGORITHMS)}")
        check_world(endpoint.rank, world_size)
        check_loss_bound("p", p)
        if not 0 <= interval < 3600:
            raise ConfigError(f"interval={interval} must be in [0, 3600) seconds")
        if not 0 < alpha <= 1:
            raise ConfigError(f"alpha={alpha} must be in (0, 1]")
        if not 0 <= momentum < 1 or block_lr <= 0:
            raise ConfigError(f"momentum={momentum} must be in [0, 1), block_lr={block_lr} > 0")
        if algorithm != "easgd" and servers is not None:
            raise ConfigError("servers= applies to algorithm 'easgd' only")
        super().__init__(model, optimizer)
        self.name = f"shadow-{algorithm}"
        self.algorithm = algorithm
        self.endpoint, self.world_size, self.rank = endpoint, world_size, endpoint.rank
        self.interval, self.p, self.alpha = interval, p, alpha
        self.block_lr, self.momentum, self.nesterov = block_lr, momentum, nesterov
        self.lock = threading.Lock()  # the replica: training steps vs. the synchroniser
        self.rounds = 0
        self.trace: list[tuple[float, float]] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._pending: npt.NDArray[np.float32] | None = None
        self._last_loss = (0, 0, (0,) * N_CLASSES, (0,) * N_CLASSES)
        #: the last round's average, the same on every rank (None before the first)
        self._reference: npt.NDArray[np.float32] | None = None
        self._comm: Communicator | None = None
        self._centre: _Centre | None = None
        if algorithm == "easgd":
            centre_model = copy.deepcopy(model)
            self._centre = _Centre(
                centre_model, torch.optim.SGD(centre_model.parameters(), lr=0.0),
                endpoint=endpoint, world_size=world_size, mode="asp", servers=servers,
                workers=list(range(world_size)), p=p, name="shadow-easgd-centre",
            )  # fmt: skip
        else:
            self._comm = Communicator(endpoint, world_size, channel=SHADOW_CHANNEL)
            self._global = self.flat.read()
            self._delta = np.zeros(self.flat.numel, np.float32)
        self._thread = threading.Thread(target=self._run, name=f"dlcp-shadow-{self.rank}",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    # ----------------------------------------------------------------- training loop

    def step(self) -> StepReport:
        if self._closed:
            raise UsageStateError(f"rank {self.rank}: step() after close()")
        if self.error is not None:
            raise self.error
        with self.lock:
            self.optimizer.step()
            self._apply_pending()
        self.clock += 1
        lost, bounded, lost_chunks, class_chunks = self._last_loss
        report = StepReport(scheme=self.name, clock=self.clock, version=self.rounds,
                            lost_elems=lost, bounded_elems=bounded, lost_chunks=lost_chunks,
                            class_chunks=class_chunks)  # fmt: skip
        self.reports.append(report)
        return report

    def close(self) -> None:
        """End the background rounds (every rank's, see the module docstring) and
        wait for this rank's thread; raise what it failed with."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._thread.join(self.endpoint.config.timeout * 3)
        with self.lock:
            self._apply_pending()
        try:
            if self._thread.is_alive():
                raise TimeoutError(f"rank {self.rank}: the ShadowSync thread did not end")
            if self.error is not None:
                raise self.error
        finally:
            if self._centre is not None:
                self._centre.close()
            if self._comm is not None:
                self._comm.close()

    # ----------------------------------------------------------------- background

    def _apply_pending(self) -> None:
        """(under the lock) Add the rounds' pending correction to the parameters."""
        if self._pending is not None:
            self.flat.write(self.flat.read() + self._pending)
            self._pending = None

    def _replica(self) -> npt.NDArray[np.float32]:
        """(under the lock) The parameters with the pending correction."""
        x = self.flat.read()
        return x + self._pending if self._pending is not None else x

    def _correct(self, change: npt.NDArray[np.float32]) -> None:
        """(under the lock) Leave ``change`` for the next step to add."""
        self._pending = change if self._pending is None else self._pending + change

    def _run(self) -> None:
        try:
            one_round = self._easgd_round if self.algorithm == "easgd" else self._average_round
            while True:
                started = time.perf_counter()
                go_on = one_round()
                self.trace.append((started, time.perf_counter()))
                self.rounds += 1
                if not go_on:
                    return
                if self.interval > 0:
                    self._stop.wait(self.interval)
        except BaseException as exc:
            self.error = exc

    def _average_round(self) -> bool:
        assert self._comm is not None
        with self.lock:
            x0 = self._replica()
        ref = self._reference
        buf = np.empty(self.flat.numel + 1, np.float32)
        buf[:-1] = x0 if ref is None else x0 - ref
        buf[-1] = 1.0 if self._stop.is_set() else 0.0
        # (the sum; averaged below; exact in the first round, which has no reference)
        rep = ring_allreduce(self._comm, buf, p=self.p if ref is not None else 0.0)
        self._last_loss = (rep.lost_elems, rep.bounded_elems, rep.lost_chunks,
                           rep.class_chunks)  # fmt: skip
        avg = buf[:-1] / np.float32(self.world_size)
        if ref is not None:
            avg += ref
        self._reference = avg
        if self.algorithm == "ma":
            restart = avg
        else:  # block momentum on the block's update
            self._delta = self.momentum * self._delta + self.block_lr * (avg - self._global)
            self._global = self._global + self._delta
            restart = self._global + self.momentum * self._delta if self.nesterov else self._global
        with self.lock:  # x <- restart + (x - x0)
            self._correct((restart - x0).astype(np.float32))
        return bool(buf[-1] == 0.0)  # every rank sees the same sum: all stop together

    def _easgd_round(self) -> bool:
        centre = self._centre
        assert centre is not None
        if self._stop.is_set():
            return False
        c = centre.flat.read()  # (the centre as last read)
        with self.lock:
            d = self.alpha * (self._replica() - c)
            self._correct(-d)
        centre._push(d.astype(np.float32))
        report = centre._read(centre.clock)
        self._last_loss = (report.lost_elems, report.bounded_elems, report.lost_chunks,
                           report.class_chunks)  # fmt: skip
        return True
