"""Timeout errors of the dlcp process group, worded as torch's own backends word
theirs: the text says "Timed out", names the operation, the peers that did not
arrive and the timeout (torch's tests and tools match "Timed out")."""

from __future__ import annotations

import re
from collections.abc import Iterable

from dlcp.errors import PeerTimeout

__all__ = ["DLCPTimeout", "peers_named", "timed_out"]

_RANK = re.compile(r"\b(?:from|to) rank (\d+)")


class DLCPTimeout(PeerTimeout, RuntimeError):
    """An operation of the dlcp process group ran past its timeout. A
    :class:`~dlcp.errors.PeerTimeout` (a ``TimeoutError``) and a ``RuntimeError``,
    as the errors of torch's backends are."""


def peers_named(error: BaseException) -> list[int]:
    """The peers an endpoint's timeout message names ("... from rank 2 ...")."""
    return sorted({int(m) for m in _RANK.findall(str(error))})


def timed_out(
    op: str,
    rank: int,
    peers: Iterable[int],
    seconds: float,
    why: str = "",
    *,
    elapsed: float | None = None,
) -> DLCPTimeout:
    """The error of ``op`` on ``rank`` that waited ``seconds`` (its timeout) for
    ``peers``. ``elapsed``: how long the operation ran, when a timer of the
    endpoint's may have ended it sooner (a sender whose receiver stopped
    answering gives up after its FINISH retries): under ``seconds``, the text
    says how long it ran instead of claiming the timeout was reached."""
    missing = sorted(set(peers))
    who = (
        f"rank {missing[0]} did not arrive"
        if len(missing) == 1
        else f"ranks {', '.join(map(str, missing))} did not arrive"
        if missing
        else "the operation did not complete"
    )
    # (" timeout " between spaces: what torch's tests match, with "Timed out")
    when = (
        f"reached its timeout of {seconds:g} s"
        if elapsed is None or elapsed >= seconds
        else f"gave up after {elapsed:.2f} s, before its timeout of {seconds:g} s"
    )
    text = f"Timed out: dlcp {op} on rank {rank} {when}: {who}"
    return DLCPTimeout(f"{text} ({why})" if why else text)
