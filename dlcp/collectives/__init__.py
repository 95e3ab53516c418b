"""Collectives over DLCP endpoints: ring all-reduce and parameter server."""

from .comm import CollectiveReport, Communicator
from .ps import ps_allreduce, ps_serve
from .ring import ring_allreduce

__all__ = ["CollectiveReport", "Communicator", "ps_allreduce", "ps_serve", "ring_allreduce"]
