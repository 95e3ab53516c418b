"""The process group's exchanges between pairs of ranks: point-to-point
(``send``, ``recv``, a receive from any source: :mod:`.pg_p2p`), the all-to-all
collectives (``all_to_all_single`` with equal or uneven splits, ``all_to_all``)
and the sparse all-reduce of DDP's sparse gradients.

A mixin of :class:`~shims.process_group.DLCPProcessGroup`. The all-to-alls
and the sparse all-reduce are collectives: queued in call order like the
others, their messages exact (``p = 0``) byte messages. A sparse all-reduce
coalesces each rank's tensor, all-gathers the number of entries, then the
indices and values (exactly), and sums the ranks' tensors in rank order on
every rank, so every rank holds the same bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch._C._distributed_c10d import ReduceOp

from dlcp.collectives import CollectiveReport
from dlcp.collectives.comm import ReportBuilder
from dlcp.errors import UsageError

from .pg_mixin import GroupMixin
from .pg_signature import Op, desc
from .pg_tensors import DLCPWork, HostTensor, TensorList, check_tensors

__all__ = ["Exchanges"]

#: element types a sparse all-reduce names (the index of each is its code)
_SPARSE_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
                  torch.int32, torch.int16, torch.int8, torch.uint8, torch.complex64,
                  torch.complex128)  # fmt: skip
#: dimensions a sparse all-reduce compares across ranks (more: the first of them)
_SPARSE_DIMS = 8
#: the signature of a sparse all-reduce's calls
_SPARSE = Op("all_reduce", "SUM", form="sparse")


def _sparse_shape(t: torch.Tensor) -> list[int]:
    """What every rank's sparse tensor must agree on: its type, sparse and dense
    dimensions and size, as integers (-1: not given)."""
    code = _SPARSE_DTYPES.index(t.dtype) if t.dtype in _SPARSE_DTYPES else -1
    dims = list(t.shape[:_SPARSE_DIMS]) + [-1] * (_SPARSE_DIMS - min(t.dim(), _SPARSE_DIMS))
    return [code, t.sparse_dim(), t.dim(), *dims]


def _describe(shape: list[int]) -> str:
    code, sparse_dim, ndim, *dims = shape
    dtype = _SPARSE_DTYPES[code] if 0 <= code < len(_SPARSE_DTYPES) else "another type"
    size = [d for d in dims if d >= 0] + (["..."] if ndim > _SPARSE_DIMS else [])
    return f"a sparse {dtype} tensor of size {size} with {sparse_dim} sparse dimensions"


def _splits(sizes: list[int], rows: int, world: int, what: str) -> list[int]:
    """Rows per rank: the given split sizes, or equal splits when none are given."""
    if not sizes:
        if rows % world:
            raise UsageError(
                f"all_to_all_single: {what} has {rows} rows, not divisible by the world "
                f"size {world} (pass {what}_split_sizes for uneven splits)"
            )
        return [rows // world] * world
    sizes = [int(s) for s in sizes]
    if len(sizes) != world or any(s < 0 for s in sizes) or sum(sizes) != rows:
        raise UsageError(
            f"all_to_all_single: {what}_split_sizes={sizes} must be {world} sizes >= 0 "
            f"adding up to the {rows} rows of {what}"
        )
    return sizes


class Exchanges(GroupMixin):
    """Mixed into DLCPProcessGroup, before torch's ProcessGroup (see the module)."""

    # ------------------------------------------------------------------ point-to-point

    def send(self, tensors: TensorList, dstRank: int, tag: int = 0) -> DLCPWork:
        self._p2p.check("send", tensors, dstRank, tag)
        return self._p2p.send(tensors[0], dstRank, tag)

    def recv(self, tensors: TensorList, srcRank: int, tag: int = 0) -> DLCPWork:
        self._p2p.check("recv", tensors, srcRank, tag)
        return self._p2p.recv(tensors[0], srcRank, tag)

    def recv_anysource(self, tensors: TensorList, tag: int = 0) -> DLCPWork:
        self._p2p.check("recv from any source", tensors, None, tag)
        if self._size < 2:
            raise UsageError("recv from any source: a group of one rank has no other source")
        return self._p2p.recv(tensors[0], None, tag)

    # ------------------------------------------------------------------ all-to-all

    def alltoall_base(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> DLCPWork:
        """``all_to_all_single``: rows ``input_split_sizes[q]`` of input go to rank
        q; rank q's rows land in output's ``output_split_sizes[q]`` rows."""
        with self._checks("all_to_all_single"):
            check_tensors([output, input], "all_to_all_single")
            if output.dtype != input.dtype:
                raise UsageError(
                    f"all_to_all_single: output is {output.dtype}, input {input.dtype}"
                )
            if output.dim() == 0 or input.dim() == 0:
                raise UsageError("all_to_all_single: output and input need a first dimension")
            if output.shape[1:] != input.shape[1:]:
                raise UsageError(
                    f"all_to_all_single: output {list(output.shape)} and input "
                    f"{list(input.shape)} differ beyond the first dimension"
                )
            outs = _splits(list(output_split_sizes), output.shape[0], self._size, "output")
            ins = _splits(list(input_split_sizes), input.shape[0], self._size, "input")

        def run() -> CollectiveReport | None:
            call = self.comm.next_call()
            report = ReportBuilder("all_to_all_single", call, input.numel())
            src, dst = HostTensor(input), HostTensor(output)
            row = (
                input[0].numel() * input.element_size()
                if input.shape[0]
                else (output[0].numel() * output.element_size() if output.shape[0] else 0)
            )
            send_rows = src.bytes().reshape(-1, row) if row else None
            recv_rows = dst.bytes().reshape(-1, row) if row else None
            sends, recvs = [], []
            a = b = 0
            empty = np.zeros(0, np.uint8)
            for q in range(self._size):
                mine = send_rows[a : a + ins[q]].reshape(-1) if send_rows is not None else empty
                into = recv_rows[b : b + outs[q]].reshape(-1) if recv_rows is not None else empty
                a, b = a + ins[q], b + outs[q]
                if q == self._rank:
                    if into.size != mine.size:
                        raise UsageError(
                            f"all_to_all_single: rank {q} keeps {ins[q]} rows of its input "
                            f"but takes {outs[q]} into its output"
                        )
                    into[:] = mine
                else:
                    sends.append((q, 0, mine, desc(input, (ins[q], *input.shape[1:]))))
                    recvs.append((q, 0, into, desc(output, (outs[q], *output.shape[1:]))))
            self._transport.transfer(call, sends, recvs, report, Op("all_to_all_single"))
            dst.write_back()
            return report.build()

        return self._submit("all_to_all_single", run, [output], [output, input])

    #: (the name torch's Python calls; alltoall_base is the one its C++ calls)
    all_to_all_single = alltoall_base

    def alltoall(
        self, output_tensors: TensorList, input_tensors: TensorList, opts: Any = None
    ) -> DLCPWork:
        """``all_to_all``: ``input_tensors[q]`` goes to rank q, rank q's tensor for
        this rank lands in ``output_tensors[q]`` (sizes may differ per rank)."""
        with self._checks("all_to_all"):
            check_tensors([*output_tensors, *input_tensors], "all_to_all")
            if len(output_tensors) != self._size or len(input_tensors) != self._size:
                raise UsageError(
                    f"all_to_all: {len(output_tensors)} outputs and {len(input_tensors)} "
                    f"inputs, world size {self._size} (one of each per rank)"
                )
            mine, keep = input_tensors[self._rank], output_tensors[self._rank]
            if mine.dtype != keep.dtype or mine.numel() != keep.numel():
                raise UsageError(
                    f"all_to_all: rank {self._rank}'s own input {mine.dtype}{list(mine.shape)} "
                    f"does not fit its output {keep.dtype}{list(keep.shape)}"
                )

        def run() -> CollectiveReport | None:
            call = self.comm.next_call()
            report = ReportBuilder("all_to_all", call, sum(t.numel() for t in input_tensors))
            hosts = [HostTensor(t) for t in output_tensors]
            sends, recvs = [], []
            for q in range(self._size):
                data = HostTensor(input_tensors[q]).bytes()
                if q == self._rank:
                    hosts[q].bytes()[:] = data
                else:
                    sends.append((q, 0, data, desc(input_tensors[q])))
                    recvs.append((q, 0, hosts[q].bytes(), desc(output_tensors[q])))
            self._transport.transfer(call, sends, recvs, report, Op("all_to_all"))
            for h in hosts:
                h.write_back()
            return report.build()

        return self._submit(
            "all_to_all", run, list(output_tensors), [*output_tensors, *input_tensors]
        )

    # ------------------------------------------------------------------ sparse all-reduce

    def _sparse_allreduce(self, tensors: TensorList, red: Any) -> DLCPWork:
        """The all-reduce of sparse COO tensors (DDP's sparse gradients): SUM only,
        as Gloo's. The result replaces each tensor's contents (``copy_``: its
        indices change) and is the work's result."""
        for t in tensors:
            if t.layout != torch.sparse_coo:
                raise UsageError(
                    f"allreduce: sparse and dense tensors in one call ({t.layout} beside "
                    "torch.sparse_coo)"
                )
            if t.device.type != "cpu":
                raise UsageError(
                    f"allreduce: dlcp reduces sparse tensors on the cpu, got {t.device}"
                )
        if red != ReduceOp.SUM:
            raise UsageError(f"allreduce: sparse tensors are reduced with SUM only, got {red.name}")
        result = list(tensors)

        def run() -> list[CollectiveReport]:
            reports = []
            for i, t in enumerate(tensors):
                summed, rep = self._sparse_sum(t)
                reports.extend(rep)
                with torch.no_grad():
                    t.copy_(summed)
                result[i] = t
            return reports

        return self._submit("allreduce (sparse)", run, result, [], calls=2 * len(tensors))

    def _sparse_sum(self, t: torch.Tensor) -> tuple[torch.Tensor, list[CollectiveReport]]:
        """Every rank's coalesced ``t`` summed in rank order (two calls: the sizes,
        then the indices and values)."""
        local = t.detach().coalesce()
        indices = local.indices().contiguous()
        values = local.values().contiguous()
        peers = [q for q in range(self._size) if q != self._rank]
        # 1. how many entries each rank holds, and what tensor (refused on every rank
        # where they differ, as Gloo does: summing them would take this rank's shape)
        call = self.comm.next_call()
        sizes = ReportBuilder("allreduce_sparse_sizes", call, self._size)
        shape = _sparse_shape(local)
        table = torch.zeros((self._size, 1 + len(shape)), dtype=torch.int64)
        table[self._rank] = torch.tensor([indices.shape[1], *shape])
        rows = table.view(torch.uint8).numpy()
        row = desc(table[0])
        self._transport.transfer(
            call, [(q, 0, rows[self._rank], row) for q in peers],
            [(q, 0, rows[q], row) for q in peers], sizes, _SPARSE,
        )  # fmt: skip
        for q in peers:
            if table[q, 1:].tolist() != shape:
                raise UsageError(
                    f"allreduce (sparse): rank {q} has {_describe(table[q, 1:].tolist())}, "
                    f"rank {self._rank} has {_describe(shape)}"
                )
        counts = table[:, 0]
        # 2. their indices (role 0) and values (role 1)
        call = self.comm.next_call()
        data = ReportBuilder("allreduce_sparse", call, int(counts.sum()))
        dense_shape = list(values.shape[1:])
        got_i = [
            indices
            if q == self._rank
            else torch.empty((indices.shape[0], int(n)), dtype=torch.int64)
            for q, n in enumerate(counts.tolist())
        ]
        got_v = [
            values if q == self._rank else torch.empty([int(n), *dense_shape], dtype=values.dtype)
            for q, n in enumerate(counts.tolist())
        ]

        def raw(x: torch.Tensor) -> Any:
            return x.reshape(-1).view(torch.uint8).numpy()

        sends = [(q, r, raw(x), desc(x)) for q in peers for r, x in ((0, indices), (1, values))]
        recvs = [(q, r, raw(x[q]), desc(x[q])) for q in peers for r, x in ((0, got_i), (1, got_v))]
        self._transport.transfer(call, sends, recvs, data, _SPARSE)
        total = torch.sparse_coo_tensor(got_i[0], got_v[0], local.shape)
        for q in range(1, self._size):
            total = total + torch.sparse_coo_tensor(got_i[q], got_v[q], local.shape)
        return total.coalesce(), [sizes.build(), data.build()]
