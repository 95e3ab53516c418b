"""What the mixins of :class:`~shims.process_group.DLCPProcessGroup` use of the group.

The group's operations live in mixins (:mod:`.pg_bytes`, :mod:`.pg_exchange`,
:mod:`.pg_barriers`, :mod:`.pg_coalesced`), each a base class of the group.
:class:`GroupMixin` is their common base: it declares, for the type checker only,
the state the group's ``__init__`` sets and the methods the group defines that
the mixins call. At run time it is an empty class.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from .pg_tensors import DLCPWork, TensorList

if TYPE_CHECKING:
    from dlcp.collectives import Communicator
    from dlcp.io.endpoint import Endpoint

    from .pg_p2p import PointToPoint
    from .pg_transport import GroupTransport

__all__ = ["GroupMixin"]


class GroupMixin:
    """The base of the process group's mixins (see the module)."""

    if TYPE_CHECKING:
        _rank: int
        _size: int
        comm: Communicator
        endpoint: Endpoint
        _transport: GroupTransport
        _p2p: PointToPoint

        def _submit(
            self, name: str, run: Any, result: TensorList, touched: TensorList, *,
            calls: int = 1,
        ) -> DLCPWork: ...  # fmt: skip

        def _checks(self, name: str) -> contextlib.AbstractContextManager[None]: ...
