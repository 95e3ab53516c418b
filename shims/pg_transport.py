"""How the dlcp process group's operations travel: float SUM/AVG all-reduces
over the ring (or in one round when small and exact), every other all-reduce
as an exact all-gather of the raw bytes folded in rank order, and the byte
messages of broadcast, gather, scatter and all-gather, each call with its
signature (:mod:`.pg_signature`). :mod:`.process_group` runs these on its
transport threads, one at a time."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch._C._distributed_c10d import ReduceOp

from dlcp.collectives import CollectiveReport, Communicator, allreduce
from dlcp.collectives.comm import ReportBuilder, cancel_all
from dlcp.errors import ConfigError
from dlcp.proto.config import FillPolicy

from .pg_options import DLCPOptions
from .pg_signature import Desc, Op, desc, everyone, signed
from .pg_tensors import FOLDS, HostTensor, parts

__all__ = ["Entry", "GroupTransport"]

_Red = ReduceOp  # its members are the RedOpType values that opts.reduceOp.op holds
_RING_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: one byte message of an operation: (peer, index, bytes, the tensor they are)
Entry = tuple[int, int, npt.NDArray[np.uint8], Desc]


class GroupTransport:
    """A process group's collectives over its communicator; ``p`` is the loss
    bound of large float SUM/AVG all-reduces."""

    def __init__(self, comm: Communicator, options: DLCPOptions, p: float) -> None:
        if options.p_gather > p:
            raise ConfigError(
                f"DLCPOptions.p_gather={options.p_gather} exceeds the group's p={p} "
                "(DLCPOptions.p, else DLCP_DEFAULT_P): the all-gather's bound must be the "
                "stricter one"
            )
        self.comm, self.options, self.p = comm, options, p
        self._fill = FillPolicy(options.fill)

    def allreduce(self, tensor: torch.Tensor, red: Any, op: Op) -> CollectiveReport:
        """Reduce ``tensor`` in place across the group with ``red`` (module
        docstring); ``op`` is the operation the user called (its signature)."""
        if red in (_Red.SUM, _Red.AVG) and tensor.dtype in _RING_DTYPES and tensor.numel():
            wire = torch.float16 if tensor.dtype == torch.float16 else torch.float32
            host = HostTensor(tensor, wire)
            p = self.p if host.flat.numel() >= self.options.lossy_min_elems else 0.0
            plan = everyone(self.comm.rank, self.comm.world_size, desc(tensor))
            with signed(self.comm, self.comm.peek_call(), op, plan):
                report = allreduce(  # the ring, or one round for a small exact tensor
                    self.comm,
                    host.numpy(),
                    p=p,
                    p_gather=min(self.options.p_gather, p),  # a small tensor is exact throughout
                    fill=self._fill,
                    average=red == _Red.AVG,
                    direct_max_bytes=self.options.direct_max_bytes,
                )
            host.write_back()
            return report
        return self._allreduce_exact(tensor, red, op)

    def _allreduce_exact(self, tensor: torch.Tensor, red: Any, op: Op) -> CollectiveReport:
        """All-gather the raw bytes, reduce in rank order: bitwise the same everywhere.
        (An empty tensor of any type comes here too: its signatures are all that moves.)"""
        call = self.comm.next_call()
        report = ReportBuilder(f"allreduce_{red.name.lower()}", call, tensor.numel())
        host = HostTensor(tensor)
        rows = torch.empty((self.comm.world_size, host.flat.numel()), dtype=host.flat.dtype)
        rows[self.comm.rank] = host.flat
        row_bytes = rows.view(torch.uint8).numpy()
        mine = row_bytes[self.comm.rank]
        peers = [q for q in range(self.comm.world_size) if q != self.comm.rank]
        d = desc(tensor)
        self.transfer(
            call,
            [(q, 0, mine, d) for q in peers],
            [(q, 0, row_bytes[q], d) for q in peers],
            report,
            op,
        )
        if tensor.numel() == 0:
            return report.build()
        out = functools.reduce(FOLDS[red], rows.unbind(0))
        if red == _Red.AVG:  # float64 / complex: the ring carries float32 and float16
            out = out / self.comm.world_size
        host.flat.copy_(out)
        host.write_back()
        return report.build()

    def transfer(
        self,
        call: int,
        sends: Sequence[Entry],
        recvs: Sequence[Entry],
        report: ReportBuilder,
        op: Op,
    ) -> None:
        """Exact (``p = 0``) byte messages of one operation ``op``: (peer, index,
        bytes, the tensor they are). Each peer named gets the operation's
        signature (see :mod:`.pg_signature`), also when its bytes are empty;
        receives are posted first; empty arrays travel as the signature alone;
        big ones travel in parts."""
        plan: dict[int, tuple[list[tuple[int, Desc]], list[tuple[int, Desc]]]] = {}
        for k, entries in enumerate((sends, recvs)):
            for peer, index, _, d in entries:
                plan.setdefault(peer, ([], []))[k].append((index, d))
        for out, expected in plan.values():
            out.sort()
            expected.sort()
        incoming: list[Future[Any]] = []
        outgoing: list[Future[Any]] = []
        with signed(self.comm, call, op, plan):
            try:
                for peer, index, buf, _ in recvs:
                    for role, part in parts(buf, index):
                        incoming.append(
                            self.comm.recv(
                                part, src=peer, call=call, role=role, p=0.0, fill=FillPolicy.ZERO
                            )
                        )
                for peer, index, buf, _ in sends:
                    for role, part in parts(buf, index):
                        outgoing.append(
                            self.comm.send(
                                part, to=peer, call=call, role=role, segments=None, p=0.0
                            )
                        )
                for fut in incoming:
                    report.received(self.comm.wait(fut), bounded=False)
                for fut in outgoing:
                    report.sent(self.comm.wait(fut), 1)
            except BaseException:
                # the operation failed (posting a later part, too): nothing of it may
                # write into the caller's tensors later, nor stay in the endpoint's tables
                cancel_all((*incoming, *outgoing))
                raise
