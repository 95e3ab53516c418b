"""FINISHes of messages none of whose data was seen (yet).

A FINISH may overtake its message's data (it travels by the control channel),
or the data may all have been lost. :class:`OrphanFinishes` keeps such FINISHes
until the data comes (the inbox then applies the FINISH to the message) or it is
time to NACK every chunk: once the reorder grace has passed since the last
FINISH and the sender's other data has paused, for at most ``nack_timeout``
after the first FINISH (:func:`~dlcp.proto.recovery.sender_quiet`).

It also tells a silent data path from a lossy one. A message whose FINISHes
keep coming (the control channel works) while none of its sender's data
datagrams has arrived since its first FINISH, for ``silent_path_timeout``, has
lost its data to a path that drops everything (UDP blocked by a firewall, a
wrong address): :meth:`OrphanFinishes.silent` names it, once, instead of
NACKing it round after round until both sides time out. Any data datagram from
that sender, of any message, shows the path works.
"""

from __future__ import annotations

from collections.abc import KeysView, Mapping

from .config import ProtocolConfig
from .context import ALL_ELEMS, Key
from .control import Abort, AbortReason, Finish, Nack
from .recovery import sender_quiet

__all__ = ["SILENT_WHY", "OrphanFinishes"]

#: why a message judged silent failed at its receiver ({timeout}: the setting)
SILENT_WHY = (
    "its FINISHes arrive over the control channel but none of its data datagrams "
    "has for {timeout:g} s: the UDP data path from it to this rank drops everything "
    "(a firewall, or a wrong data address or port?)"
)

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
        #: when each message's first FINISH came, while none of its data has (kept
        #: across its rounds, the newest MAX_ORPHAN_FINISH): a silent path's clock
        self._silent_since: dict[Key, float] = {}
        #: the same, kept until its data comes or it ends (not cleared by a NACK or by
        #: other data of its sender, as the clock above is): what a timeout reports
        self._first_heard: dict[Key, float] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def unheard(self, key: Key) -> bool:
        """Whether message ``key``'s FINISHes came while none of its sender's data
        has since the first (the silent-path clock runs for it)."""
        return key in self._silent_since

    def heard(self, key: Key) -> tuple[float | None, int | None]:
        """When message ``key``'s first FINISH came while none of its data had
        (None: none did, or it was forgotten), and the round NACKed whole (None)."""
        return self._first_heard.get(key), self._nacked.get(key)

    def keys(self) -> KeysView[Key]:
        return self._by_key.keys()

    def add(self, key: Key, finish: Finish, *, now: float) -> None:
        """A FINISH of message ``key`` with no data seen; a repeat keeps the time
        of the first."""
        first = self._by_key.get(key, (finish, now, now))[2]
        self._by_key[key] = (finish, now + self.config.reorder_grace, first)
        if len(self._by_key) > MAX_ORPHAN_FINISH:
            del self._by_key[next(iter(self._by_key))]
        self._silent_since.setdefault(key, now)
        if len(self._silent_since) > MAX_ORPHAN_FINISH:
            del self._silent_since[next(iter(self._silent_since))]
        self._first_heard.setdefault(key, now)
        if len(self._first_heard) > MAX_ORPHAN_FINISH:
            del self._first_heard[next(iter(self._first_heard))]

    def pop(self, key: Key) -> Finish | None:
        """The FINISH of ``key``, forgotten here (its data came, or it ended)."""
        return self.claim(key)[0]

    def claim(self, key: Key) -> tuple[Finish | None, int | None]:
        """What is known of message ``key`` whose data came, forgotten here: its
        FINISH (None: none came) and the round NACKed whole (None: none)."""
        entry = self._by_key.pop(key, None)
        self._silent_since.pop(key, None)
        self._first_heard.pop(key, None)
        return (None if entry is None else entry[0]), self._nacked.pop(key, None)

    def next_deadline(self) -> float | None:
        if not self._by_key and not self._silent_since:  # (the usual case, every turn)
            return None
        nack = min((deadline for _, deadline, _ in self._by_key.values()), default=None)
        if not self._silent_since:
            return nack
        # (insertion order: the first entry's clock runs out first)
        silent = next(iter(self._silent_since.values())) + self.config.silent_path_timeout
        return silent if nack is None else min(nack, silent)

    def silent(self, *, now: float, last_data: Mapping[int, float]) -> list[tuple[Key, Abort]]:
        """The messages whose data path turned out silent by ``now`` (see the
        module docstring), each with the ABORT its sender is told; they are
        forgotten here. ``last_data``: when each sender's data last came. A
        message whose sender's data came after its first FINISH waits no longer
        for a verdict. :data:`SILENT_WHY` says why such a message failed."""
        out = []
        while self._silent_since:
            key, since = next(iter(self._silent_since.items()))
            if last_data.get(key[0], float("-inf")) >= since:
                del self._silent_since[key]  # the path works: its data is lost, or late
            elif now >= since + self.config.silent_path_timeout:
                del self._silent_since[key]
                self._by_key.pop(key, None)
                self._nacked.pop(key, None)
                self._first_heard.pop(key, None)
                abort = Abort(key[1], key[2], self.rank, reason=AbortReason.DATA_SILENT,
                              by_receiver=True)  # fmt: skip
                out.append((key, abort))
            else:
                break  # (insertion order: the later ones started later)
        return out

    def due(
        self, *, now: float, last_data: Mapping[int, float], data_pending: bool = False
    ) -> list[tuple[int, Nack]]:
        """The NACKs of every chunk due now, as (sender, NACK); those are forgotten.
        ``last_data``: when each sender's data last came; ``data_pending``: data
        waits unread in the receiver's socket (every sender counts as active now,
        and the wait is longer: :func:`~dlcp.proto.recovery.sender_quiet`)."""
        out = []
        for key, (finish, deadline, first) in list(self._by_key.items()):
            active = now if data_pending else last_data.get(key[0], float("-inf"))
            quiet = sender_quiet(self.config, active, first, data_pending=data_pending)
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
