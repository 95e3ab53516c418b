"""The process group's coalesced operations and torch's group bookkeeping.

A mixin of :class:`~shims.process_group.DLCPProcessGroup`: the coalesced
forms of its operations queue one operation per tensor and return one work for
all of them; ``dist._coalescing_manager`` and the functional collectives (which
find a group by its name) work on top of that.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.distributed_c10d import GroupName

from dlcp.errors import UsageError, UsageStateError

from .pg_mixin import GroupMixin
from .pg_tensors import DLCPWork, TensorList

__all__ = ["CoalescingAndNames"]


class CoalescingAndNames(GroupMixin):
    """Mixed into DLCPProcessGroup, before torch's ProcessGroup (see the module)."""

    if TYPE_CHECKING:

        def all_gather_single(
            self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
        ) -> DLCPWork: ...

        def reduce_scatter_single(
            self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
        ) -> DLCPWork: ...

    def _set_group_name(self, name: GroupName) -> None:
        """torch names each group it makes. A pure-Python group has no device
        backend to keep the name in, so torch's setter kept nothing, and
        ``group_name`` (read by destroy_process_group(group) and the functional
        collectives) raised "ProcessGroup name not set"."""
        self._group_name = name
        super()._set_group_name(name)  # type: ignore[misc]

    @property
    def group_name(self) -> GroupName:
        name: GroupName | None = getattr(self, "_group_name", None)
        if name is None:
            raise UsageStateError("dlcp process group: torch has not named this group yet")
        return name

    #: the works queued since ``_start_coalescing`` (None: not coalescing)
    _coalescing: list[DLCPWork] | None = None

    def _start_coalescing(self, device: torch.device) -> None:
        """``dist._coalescing_manager``: operations run one after another in call
        order anyway; torch hands the fast-path ones (all_reduce) over at the end
        as one allreduce_coalesced. What is queued from here on is collected for
        :meth:`_end_coalescing`. (torch's own method raised, and left the group in
        coalescing state: later all_reduces did nothing.)"""
        self._coalescing = []

    def _end_coalescing(self, device: torch.device) -> DLCPWork:
        """Done when every operation queued since the start is, failed with the
        first one's error: torch waits on this work alone."""
        works, self._coalescing = self._coalescing or [], None
        return self._coalesced("coalesced operations", works, [])

    def all_gather_single_coalesced(
        self, outputs: TensorList, inputs: TensorList, opts: Any = None
    ) -> DLCPWork:
        """all_gather_into_tensor of each (output, input) pair, as one work."""
        return self._each_pair(
            "all_gather_into_tensor_coalesced", self.all_gather_single, outputs, inputs, opts
        )

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter_single_coalesced(
        self, outputs: TensorList, inputs: TensorList, opts: Any = None
    ) -> DLCPWork:
        """reduce_scatter_tensor of each (output, input) pair, as one work."""
        return self._each_pair(
            "reduce_scatter_tensor_coalesced", self.reduce_scatter_single, outputs, inputs, opts
        )

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def _each_pair(
        self,
        name: str,
        op: Callable[[torch.Tensor, torch.Tensor, Any], DLCPWork],
        outputs: TensorList,
        inputs: TensorList,
        opts: Any,
    ) -> DLCPWork:
        if len(outputs) != len(inputs):
            raise UsageError(f"{name}: {len(outputs)} outputs, {len(inputs)} inputs")
        works = [op(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return self._coalesced(name, works, outputs)

    def _coalesced(self, name: str, works: list[DLCPWork], result: TensorList) -> DLCPWork:
        """One work for operations queued one by one: done after the last of them
        (queue order), failed with the first one's error."""

        def run() -> None:
            for work in works:
                work.wait()  # (settled: they ran before this)

        return self._submit(name, run, result, [], calls=0)
