"""Checks of what a caller passes to :class:`~dlcp.io.endpoint.Endpoint`, run in
the calling thread before any lock is taken: a bad argument is a
:class:`~dlcp.errors.ConfigError` (a ``ValueError``) that names what the caller
typed, never a confusing error later (``to="1"`` read as "no rank 1 in this
job") nor a silent reading of it (``to=True`` sent to rank 1, a layer length of
``2.5`` cut to 2)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import ConfigError
from ..proto.chunk_layers import chunk_layers
from ..proto.wire import check_message_key
from .config import EndpointConfig

log = logging.getLogger("dlcp.io")

__all__ = ["check_auth", "check_layers", "check_message", "check_out", "check_rank", "flat_message"]

#: the most elements a message holds (``msg_elems`` is 32 bits, spec §2.1)
MAX_ELEMS = 0xFFFFFFFF


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def check_rank(name: str, value: object) -> int:
    """``value`` as a rank: an integer (a bool or a string is refused)."""
    if type(value) is int:  # (the usual rank, without a call)
        return value
    if isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_):
        return int(value)
    hint = ": give an int"
    if isinstance(value, str) and value.strip().isdigit():
        hint += f" ({name}={int(value)})"
    raise ConfigError(f"{name}={value!r} ({type(value).__name__}) is not a rank{hint}")


def check_message(step: object, msg: object) -> tuple[int, int]:
    """A message key the headers can carry (``step`` 32 bits, ``msg`` 16), as
    Python ints (numpy integers are taken: the session and the C parts key
    messages by ints)."""
    try:
        check_message_key(step, msg)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return int(step), int(msg)  # type: ignore[call-overload]


def flat_message(array: object, what: str) -> npt.NDArray[Any]:
    """``array`` flattened, refused before any copy when a message cannot hold it
    (a huge non-contiguous array would be copied whole by the flattening first)."""
    arr = np.asarray(array)
    if arr.size > MAX_ELEMS:
        raise ConfigError(
            f"{what}: an array of {arr.size} elements (shape {arr.shape}); a message "
            f"holds at most {MAX_ELEMS} (2**32-1): send it in parts"
        )
    return arr.reshape(-1)


def check_out(out: object, what: str) -> npt.NDArray[Any]:
    """``out`` as a receive buffer: a writable, contiguous, 1-D numpy array."""
    if not isinstance(out, np.ndarray):
        kind = f"{type(out).__module__}.{type(out).__qualname__}"
        hint = (
            ": pass tensor.numpy() (a CPU tensor shares its memory with it)"
            if kind.startswith("torch.")
            else ""
        )
        raise ConfigError(f"{what}: out must be a numpy array, got {kind}{hint}")
    if out.ndim != 1 or not out.flags.c_contiguous:
        raise ConfigError(f"{what}: out must be a contiguous 1-D array, got shape {out.shape}")
    if not out.flags.writeable:
        raise ConfigError(f"out for {what} is read-only")
    return out


#: layer lists found good, with their message's length (a training job sends the
#: same few again and again: each is checked once, not at every send)
_GOOD_LAYERS: dict[tuple[int, tuple[tuple[Any, ...], ...]], None] = {}
_GOOD_LAYERS_MAX = 256


def check_layers(layers: object, msg_elems: int, what: str) -> None:
    """``layers`` as ``(offset, length, layer)`` integer triples that tile
    ``[0, msg_elems)`` (the rules of :func:`~dlcp.proto.chunk_layers.chunk_layers`),
    naming the first entry that is not."""
    if layers is None:
        return
    if isinstance(layers, str | bytes | dict) or not isinstance(layers, Sequence | np.ndarray):
        raise ConfigError(
            f"{what}: layers={layers!r} ({type(layers).__name__}) is not a sequence of "
            "(offset, length, layer) triples"
        )
    try:
        key = (msg_elems, tuple(map(tuple, layers)))
    except TypeError:  # an entry that is not a sequence: named below
        key = None
    if key is not None and key in _GOOD_LAYERS:
        return
    for i, seg in enumerate(layers):
        if (
            isinstance(seg, str | bytes)
            or not isinstance(seg, Sequence | np.ndarray)
            or len(seg) != 3
            or not all(_is_int(v) for v in seg)
        ):
            raise ConfigError(
                f"{what}: layers[{i}]={seg!r} is not an (offset, length, layer) triple "
                "of integers"
            )
    try:  # the tiling rules, on one chunk (the packetizer applies them again)
        chunk_layers(layers, 1 if msg_elems else 0, max(msg_elems, 1), msg_elems)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ConfigError(f"{what}: layers: {exc}") from None
    if key is not None:
        if len(_GOOD_LAYERS) >= _GOOD_LAYERS_MAX:
            _GOOD_LAYERS.clear()
        _GOOD_LAYERS[key] = None


def check_auth(config: EndpointConfig, key: object, rank: int) -> None:
    """A key without authentication is refused (it would be ignored); no
    authentication is said in the log with what it exposes (DESIGN: safe by
    default, the default stays off until authentication is measured cheap)."""
    if config.protocol.authenticate:
        if key is None:
            raise ConfigError(
                "authentication is on (protocol.authenticate) but no key was given: pass "
                "key= (or connect through dlcp.rendezvous with the job's secret)"
            )
        return
    if key is not None:
        raise ConfigError(
            "key= was given but authentication is off: a key is only used with "
            "ProtocolConfig(authenticate=True) (DLCP_AUTHENTICATE=1); turn it on or drop the key"
        )
    log.warning(
        "dlcp: rank %d runs without authentication: anyone who can send to its UDP and "
        "TCP ports, or guess the 16-bit job id, can inject data into its messages, forge "
        "control messages that end or stall its transfers, and cut it off from its peers; "
        "on a shared network give the job a secret (DLCP_JOB_SECRET, the same on every "
        "rank; `dlcp launch` makes one): its ranks then authenticate",
        rank,
    )
