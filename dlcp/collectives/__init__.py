"""Collectives over DLCP endpoints: ring all-reduce, halving-doubling all-reduce
(power-of-two worlds), direct all-reduce of small arrays, and parameter server."""

from .comm import CollectiveReport, Communicator
from .direct import DIRECT_MAX_BYTES, allreduce, direct_allreduce
from .halving import halving_doubling_allreduce
from .ps import ps_allreduce, ps_serve
from .ring import ring_allreduce

__all__ = [
    "DIRECT_MAX_BYTES",
    "CollectiveReport",
    "Communicator",
    "allreduce",
    "direct_allreduce",
    "halving_doubling_allreduce",
    "ps_allreduce",
    "ps_serve",
    "ring_allreduce",
]
