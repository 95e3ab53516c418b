"""FINISHes of messages none of whose data was seen (yet).

A FINISH may overtake its message's data (it travels by the control channel),
or the data may all have been lost. :class:`OrphanFinishes` keeps such FINISHes
until the data comes (the inbox then applies the FINISH to the message) or it is
time to NACK every chunk: once the reorder grace has passed since the last
FINISH and the sender's other data has paused, for at most ``nack_timeout``
after the first FINISH (:func:`~dlcp.proto.recovery.sender_quiet`).
"""

from __future__ import annotations

from collections.abc import KeysView, Mapping

from .config import ProtocolConfig
from .context import ALL_ELEMS, Key
from .recovery import sender_quiet
from .wire import Finish, Nack

__all__ = ["OrphanFinishes"]

#: FINISHes kept at most (the oldest go first: a peer's flood of FINISHes)
MAX_ORPHAN_FINISH = 1024


class OrphanFinishes:
    """Orphan FINISHes by message key: the FINISH, when to NACK it, and when
    the first FINISH of that message came."""

    def __init__(self, config: ProtocolConfig, rank: int) -> None:
        self.config = config
        self.rank = rank  # the receiver's: the NACKs' src
        self._by_key: dict[Key, tuple[Finish, float, float]] = {}
        #: the round NACKed of each message whose orphan FINISH was NACKed (the
        #: newest MAX_ORPHAN_FINISH): its retransmissions open it as NACKed once
        self._nacked: dict[Key, int] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def keys(self) -> KeysView[Key]:
        return self._by_key.keys()

    def add(self, key: Key, finish: Finish, *, now: float) -> None:
        """A FINISH of message ``key`` with no data seen; a repeat keeps the time
        of the first."""
        first = self._by_key.get(key, (finish, now, now))[2]
        self._by_key[key] = (finish, now + self.config.reorder_grace, first)
        if len(self._by_key) > MAX_ORPHAN_FINISH:
            del self._by_key[next(iter(self._by_key))]

    def pop(self, key: Key) -> Finish | None:
        """The FINISH of ``key``, forgotten here (its data came, or it ended)."""
        return self.claim(key)[0]

    def claim(self, key: Key) -> tuple[Finish | None, int]:
        """What is known of message ``key`` whose data came, forgotten here: its
        FINISH (None: none came) and the round NACKed whole (-1: none)."""
        entry = self._by_key.pop(key, None)
        return (None if entry is None else entry[0]), self._nacked.pop(key, -1)

    def next_deadline(self) -> float | None:
        return min((deadline for _, deadline, _ in self._by_key.values()), default=None)

    def due(self, *, now: float, last_data: Mapping[int, float]) -> list[tuple[int, Nack]]:
        """The NACKs of every chunk due now, as (sender, NACK); those are forgotten.
        ``last_data``: when each sender's data last came."""
        out = []
        for key, (finish, deadline, first) in list(self._by_key.items()):
            quiet = sender_quiet(self.config, last_data.get(key[0], float("-inf")), first)
            if now < quiet:  # this sender's data is still arriving: ours may be behind it
                self._by_key[key] = (finish, quiet, first)
                continue
            if now >= deadline:
                del self._by_key[key]
                self._nacked[key] = finish.round
                if len(self._nacked) > MAX_ORPHAN_FINISH:
                    del self._nacked[next(iter(self._nacked))]
                nack = Nack(
                    key[1],
                    key[2],
                    self.rank,
                    round=finish.round,
                    needed_elems=ALL_ELEMS,
                    ranges=((0, finish.total_chunks),),
                )
                out.append((key[0], nack))
        return out
