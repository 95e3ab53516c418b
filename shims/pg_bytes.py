"""The process group's collectives that move tensors' raw bytes: ``broadcast``,
``all_gather`` (and its coalesced and ``all_gather_into_tensor`` forms),
``gather`` and ``scatter``.

A mixin of :class:`~shims.process_group.DLCPProcessGroup`. Each is a collective,
queued in call order like the others; its messages are the tensors' bytes as
exact (``p = 0``) uint8 messages, so any dtype arrives bitwise equal. The
reductions (``all_reduce``, ``reduce``, ``reduce_scatter``) stay with the group
itself, on top of the ring all-reduce.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from dlcp.collectives import CollectiveReport
from dlcp.collectives.comm import ReportBuilder
from dlcp.errors import UsageError

from .pg_checks import check_gather_list, root_rank
from .pg_mixin import GroupMixin
from .pg_signature import Op, desc
from .pg_tensors import ROLE_STRIDE, DLCPWork, HostTensor, TensorList, check_tensors

__all__ = ["ByteCollectives"]


def _output_label(j: int, r: int) -> str:
    """How all_gather_coalesced names output ``j`` of rank ``r``."""
    return f"output_lists[{r}][{j}]"


class ByteCollectives(GroupMixin):
    """Mixed into DLCPProcessGroup, before torch's ProcessGroup (see the module)."""

    def broadcast(self, tensors: TensorList, opts: Any = None) -> DLCPWork:
        root = root_rank(opts, "broadcast", self._size)
        check_tensors(tensors, "broadcast")
        if len(tensors) >= ROLE_STRIDE:
            raise UsageError(f"broadcast takes at most {ROLE_STRIDE - 1} tensors per call")

        def run() -> CollectiveReport | None:
            call = self.comm.next_call()
            report = ReportBuilder("broadcast", call, sum(t.numel() for t in tensors))
            hosts = [HostTensor(t) for t in tensors]
            op = Op("broadcast", root=root)
            if self._rank == root:
                sends = [
                    (peer, i, h.bytes(), desc(t))
                    for i, (h, t) in enumerate(zip(hosts, tensors, strict=True))
                    for peer in range(self._size)
                    if peer != root
                ]
                self._transport.transfer(call, sends, [], report, op)
            else:
                recvs = [
                    (root, i, h.bytes(), desc(t))
                    for i, (h, t) in enumerate(zip(hosts, tensors, strict=True))
                ]
                self._transport.transfer(call, [], recvs, report, op)
                for h in hosts:
                    h.write_back()
            return report.build()

        return self._submit("broadcast", run, tensors, tensors)

    def allgather(
        self, output_tensors: list[TensorList], input_tensors: TensorList, opts: Any = None
    ) -> DLCPWork:
        return self._allgather(output_tensors, input_tensors, "all_gather")

    def _allgather(
        self, output_tensors: list[TensorList], input_tensors: TensorList, name: str
    ) -> DLCPWork:
        """``allgather`` (``name``: the operation the user called, for its signature)."""
        check_tensors(input_tensors, "allgather")
        if len(output_tensors) != len(input_tensors):
            raise UsageError(
                f"allgather: {len(output_tensors)} output lists for {len(input_tensors)} inputs"
            )
        if len(input_tensors) >= ROLE_STRIDE:
            raise UsageError(f"allgather takes at most {ROLE_STRIDE - 1} tensors per call")
        for outs, inp in zip(output_tensors, input_tensors, strict=True):
            check_gather_list(outs, inp, "allgather", self._size)

        def run() -> CollectiveReport | None:
            call = self.comm.next_call()
            report = ReportBuilder("allgather", call, sum(t.numel() for t in input_tensors))
            sends, recvs, outs_host = [], [], []
            for i, (outs, inp) in enumerate(zip(output_tensors, input_tensors, strict=True)):
                mine = HostTensor(inp).bytes()
                hosts = [HostTensor(o) for o in outs]
                outs_host.extend(hosts)
                for peer in range(self._size):
                    if peer == self._rank:
                        hosts[peer].bytes()[:] = mine
                    else:
                        sends.append((peer, i, mine, desc(inp)))
                        recvs.append((peer, i, hosts[peer].bytes(), desc(outs[peer])))
            self._transport.transfer(call, sends, recvs, report, Op(name))
            for h in outs_host:
                h.write_back()
            return report.build()

        flat_out = [t for outs in output_tensors for t in outs]
        return self._submit("allgather", run, flat_out, [*flat_out, *input_tensors])

    def allgather_coalesced(
        self, output_lists: list[TensorList], input_list: TensorList, opts: Any = None
    ) -> DLCPWork:
        """``all_gather_coalesced``: ``output_lists[r][j]`` receives rank r's input j
        (rank first, unlike ``allgather``'s ``output_tensors[j][r]``)."""
        if len(output_lists) != self._size:
            raise UsageError(
                f"all_gather_coalesced: {len(output_lists)} output lists for "
                f"{self._size} ranks (it takes one list per rank)"
            )
        check_tensors(input_list, "all_gather_coalesced")
        for r, outs in enumerate(output_lists):
            if len(outs) != len(input_list):
                raise UsageError(
                    f"all_gather_coalesced: the output list of rank {r} holds "
                    f"{len(outs)} tensors for {len(input_list)} inputs"
                )
        by_input = [[outs[j] for outs in output_lists] for j in range(len(input_list))]
        for j, (outs_j, like) in enumerate(zip(by_input, input_list, strict=True)):
            check_gather_list(outs_j, like, "all_gather_coalesced", self._size,
                              label=functools.partial(_output_label, j))  # fmt: skip
        return self._allgather(by_input, input_list, "all_gather_coalesced")

    def all_gather_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> DLCPWork:
        """``all_gather_into_tensor``: rank r's input lands in the r-th slice of output."""
        check_tensors([output, input], "all_gather_into_tensor")
        if output.dtype != input.dtype or output.numel() != input.numel() * self._size:
            raise UsageError(
                f"all_gather_into_tensor: output {output.dtype}{list(output.shape)} must hold "
                f"{self._size} x input {input.dtype}{list(input.shape)}"
            )

        def run() -> CollectiveReport | None:
            call = self.comm.next_call()
            report = ReportBuilder("all_gather_into_tensor", call, input.numel())
            mine = HostTensor(input).bytes()
            out = HostTensor(output)
            rows = out.bytes().reshape(self._size, -1)
            rows[self._rank] = mine
            peers = [q for q in range(self._size) if q != self._rank]
            d = desc(input)
            self._transport.transfer(
                call, [(q, 0, mine, d) for q in peers], [(q, 0, rows[q], d) for q in peers],
                report, Op("all_gather_into_tensor"),
            )  # fmt: skip
            out.write_back()
            return report.build()

        return self._submit("all_gather_into_tensor", run, [output], [output, input])

    def _allgather_base(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> DLCPWork:
        return self.all_gather_single(output, input, opts)

    def gather(
        self, output_tensors: list[TensorList], input_tensors: TensorList, opts: Any = None
    ) -> DLCPWork:
        root = root_rank(opts, "gather", self._size)
        with self._checks("gather"):
            self._check_rooted("gather", root, input_tensors, "input", output_tensors, "output")
        inp = input_tensors[0]

        def run() -> CollectiveReport | None:
            call = self.comm.next_call()
            report = ReportBuilder("gather", call, inp.numel())
            mine = HostTensor(inp).bytes()
            op = Op("gather", root=root)
            if self._rank != root:
                self._transport.transfer(call, [(root, 0, mine, desc(inp))], [], report, op)
                return report.build()
            outs = output_tensors[0]
            hosts = [HostTensor(o) for o in outs]
            hosts[root].bytes()[:] = mine
            peers = [q for q in range(self._size) if q != root]
            recvs = [(q, 0, hosts[q].bytes(), desc(outs[q])) for q in peers]
            self._transport.transfer(call, [], recvs, report, op)
            for h in hosts:
                h.write_back()
            return report.build()

        outs = output_tensors[0] if output_tensors else []
        return self._submit("gather", run, list(outs), [*outs, inp])

    def scatter(
        self, output_tensors: TensorList, input_tensors: list[TensorList], opts: Any = None
    ) -> DLCPWork:
        root = root_rank(opts, "scatter", self._size)
        with self._checks("scatter"):
            self._check_rooted("scatter", root, output_tensors, "output", input_tensors, "input")
        out = output_tensors[0]

        def run() -> CollectiveReport | None:
            call = self.comm.next_call()
            report = ReportBuilder("scatter", call, out.numel())
            host = HostTensor(out)
            op = Op("scatter", root=root)
            if self._rank == root:
                ins = input_tensors[0]
                pieces = [HostTensor(t).bytes() for t in ins]
                host.bytes()[:] = pieces[root]
                sends = [(q, 0, pieces[q], desc(ins[q])) for q in range(self._size) if q != root]
                self._transport.transfer(call, sends, [], report, op)
            else:
                self._transport.transfer(call, [], [(root, 0, host.bytes(), desc(out))], report, op)
            host.write_back()
            return report.build()

        ins = input_tensors[0] if input_tensors else []
        return self._submit("scatter", run, [out], [out, *ins])

    def _check_rooted(
        self, op: str, root: int, own: TensorList, own_word: str, lists: list[TensorList],
        list_word: str,
    ) -> None:  # fmt: skip
        """The checks of ``gather`` and ``scatter``: every rank passes one tensor of its
        own (``own``: gather's input, scatter's output); the root alone passes one list
        (``lists``) of a tensor like it per rank, the others none."""
        check_tensors(own, op)
        if len(own) != 1:
            raise UsageError(f"{op} takes one {own_word} tensor, got {len(own)}")
        if self._rank == root:
            if len(lists) != 1:
                raise UsageError(f"{op}: the root needs one {list_word} list")
            check_gather_list(lists[0], own[0], op, self._size)
        elif lists and lists[0]:
            raise UsageError(f"{op}: only the root (rank {root}) passes {list_word} tensors")
