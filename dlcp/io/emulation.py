"""The endpoint's in-process loss emulator: for users without root, who cannot
make a kernel drop packets. It is emulation, not a network, and says so: the
endpoint logs a warning when it is on, and its stats report what it dropped as
``emulated_loss_dropped``."""

from __future__ import annotations

import logging

import numpy as np
import numpy.typing as npt

__all__ = ["LossEmulator"]

log = logging.getLogger("dlcp.io")


class LossEmulator:
    """Drops a fraction ``loss`` of the data datagrams an endpoint receives,
    each independently, from a seeded generator."""

    def __init__(self, loss: float, seed: int | None, *, rank: int) -> None:
        self.loss = loss
        self.dropped = 0
        self._rng = np.random.default_rng(seed)
        log.warning(
            "dlcp rank %d: EMULATED loss: dropping %.2f%% of received data datagrams in-process",
            rank,
            100 * loss,
        )

    def filter(self, buf: npt.NDArray[np.uint8], seg: int) -> npt.NDArray[np.uint8]:
        """What is left of ``buf`` (datagrams of ``seg`` bytes back to back, the
        last possibly shorter) once the dropped ones are taken out."""
        n = -(-len(buf) // seg)
        keep = self._rng.random(n) >= self.loss
        dropped = n - int(keep.sum())
        if not dropped:
            return buf
        self.dropped += dropped
        n_full = len(buf) // seg
        rows = buf[: n_full * seg].reshape(n_full, seg)[keep[:n_full]].reshape(-1)
        if n_full < n and keep[-1]:
            rows = np.concatenate((rows, buf[n_full * seg :]))
        return rows
