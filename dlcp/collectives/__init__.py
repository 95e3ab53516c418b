"""Collectives over DLCP endpoints: ring all-reduce, direct all-reduce of small
arrays, and parameter server."""

from .comm import CollectiveReport, Communicator
from .direct import DIRECT_MAX_BYTES, allreduce, direct_allreduce
from .ps import ps_allreduce, ps_serve
from .ring import ring_allreduce

__all__ = [
    "DIRECT_MAX_BYTES",
    "CollectiveReport",
    "Communicator",
    "allreduce",
    "direct_allreduce",
    "ps_allreduce",
    "ps_serve",
    "ring_allreduce",
]
