"""Datagram authentication: AES-GMAC with an explicit per-datagram nonce (spec §3).

An authenticated datagram ends with a 24-byte trailer: an 8-byte nonce (a
counter, big-endian) and a 16-byte tag. The tag is AES-GCM's over an empty
plaintext, with every byte before the tag (header, payload or body, nonce) as
additional data, under the pair's key ``K(src, dst)`` and the 96-bit IV::

    IV = domain (1 byte) | 0 (1 byte) | src (16 bits) | nonce (64 bits)

``domain`` is :attr:`Domain.DATA` or :attr:`Domain.CONTROL`, ``src`` the rank the
header names. GCM must never see one IV twice under one key: each sender draws
its nonces from a :class:`NonceCounter` per domain that only grows and that
every thread sending under its keys shares (spec §3 gives the argument).

This module is the executable reference and the fast path in one: the batch
functions hand a whole run of records to the C accelerator ``dlcp.proto._gmac``
(OpenSSL's libcrypto, built when its headers are there; :data:`ACCELERATED`) and
otherwise tag record by record with ``cryptography``'s AESGCM, which gives the
same bytes (``tests/proto/test_gmac.py``).
"""

from __future__ import annotations

import enum
import hmac
import struct
from types import ModuleType
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..errors import UsageError

__all__ = [
    "ACCELERATED",
    "AUTH_KEY_LENGTHS",
    "AUTH_NONCE_LEN",
    "AUTH_TAG_LEN",
    "AUTH_TRAILER_LEN",
    "LIBCRYPTO_VERSION",
    "Domain",
    "NonceCounter",
    "check_auth_key",
    "gmac_backend",
    "gmac_iv",
    "gmac_tag",
    "seal_records",
    "use_gmac_backend",
    "verified_prefix",
    "verify_records",
]

try:
    from . import _gmac  # type: ignore[attr-defined]

    _accel: ModuleType | None = _gmac
except ImportError:  # built without OpenSSL's headers: AESGCM record by record
    _accel = None

#: True when the C batch functions (libcrypto) are loaded
ACCELERATED: bool = _accel is not None
#: the version of the libcrypto the C functions and the native engine run on (the one
#: loaded into this process); None without them. A newer one may seal several times
#: faster on the same CPU (:func:`gmac_backend`)
LIBCRYPTO_VERSION: str | None = _accel.LIBCRYPTO_VERSION if _accel is not None else None

AUTH_NONCE_LEN: Final = 8
AUTH_TAG_LEN: Final = 16
#: bytes an authenticated datagram carries after its payload or body
AUTH_TRAILER_LEN: Final = AUTH_NONCE_LEN + AUTH_TAG_LEN
#: AES-128, AES-192 and AES-256 keys
AUTH_KEY_LENGTHS: Final = (16, 24, 32)
_MAX_NONCE: Final = (1 << 64) - 1
_IV: Final = struct.Struct(">BBHQ")
_SRC_OFFSET_DATA: Final = 26  # the data header's src field (spec §2.1)
_DATA_HEADER_LEN: Final = 32

UInt8Array = npt.NDArray[np.uint8]
Int64Array = npt.NDArray[np.int64]


class Domain(enum.IntEnum):
    """The first byte of the IV: what kind of datagram a nonce was drawn for."""

    DATA = 0x44  # "D"
    CONTROL = 0x43  # "C"


def check_auth_key(key: bytes) -> bytes:
    """``key`` as bytes if it is an AES key (16, 24 or 32 bytes), else UsageError."""
    if len(key) not in AUTH_KEY_LENGTHS:
        raise UsageError(
            f"authentication key must be 16, 24 or 32 bytes (an AES key), got {len(key)}"
        )
    return bytes(key)


def gmac_iv(domain: Domain, src: int, nonce: int) -> bytes:
    """The 96-bit GCM IV of a datagram from rank ``src`` carrying ``nonce``."""
    return _IV.pack(int(domain), 0, src, nonce)


_cipher_cache: dict[bytes, AESGCM] = {}


def _cipher(key: bytes) -> AESGCM:
    cipher = _cipher_cache.get(key)
    if cipher is None:
        if len(_cipher_cache) >= 4096:  # keys of past runs: forget them all
            _cipher_cache.clear()
        cipher = _cipher_cache[key] = AESGCM(check_auth_key(key))
    return cipher


def gmac_tag(
    key: bytes, covered: bytes | memoryview, *, domain: Domain, src: int, nonce: int
) -> bytes:
    """The 16-byte tag of a datagram: AES-GMAC under ``key`` over ``covered``
    (every byte before the tag, the nonce field included)."""
    return _cipher(key).encrypt(gmac_iv(domain, src, nonce), b"", bytes(covered))


class NonceCounter:
    """A sender's nonces of one domain: values that only grow, handed out in
    blocks. The next value lives in :attr:`cell`, one uint64 that the C
    accelerator's ``take_nonces`` and the native send engine's thread advance
    with one atomic compare-and-swap per block, so that threads drawing at once
    never get the same value. Without the accelerator (no libcrypto, hence no
    native sealing either) only the session draws, under its driver's lock.

    ``start``: the first nonce. The I/O driver starts at the wall clock in
    nanoseconds (``Session(nonce_start=)``): nonces a later run draws under a key
    that outlives a run (the single-key API) then lie above every nonce an
    earlier run drew, as long as the clock does not go back and a rank sends
    fewer than one datagram per nanosecond."""

    __slots__ = ("cell",)

    def __init__(self, start: int = 0) -> None:
        if not 0 <= start <= _MAX_NONCE:
            raise UsageError(f"a nonce counter starts at 0..2**64-1, got {start}")
        #: the next nonce, in one uint64 that C and Python both update
        self.cell = np.array([start], dtype=np.uint64)

    def take(self, n: int) -> int:
        """Reserve ``n`` consecutive nonces; returns the first. No other call
        gets any of them; OverflowError when the next value would pass 2**64 - 1."""
        if n < 1:
            raise UsageError(f"take({n}): reserve at least one nonce")
        if _accel is not None:
            return int(_accel.take_nonces(self.cell, n))
        first = int(self.cell[0])
        if first + n > _MAX_NONCE:
            raise OverflowError("nonce counter exhausted: derive a new key (a new run)")
        self.cell[0] = first + n
        return first

    @property
    def next(self) -> int:
        """The nonce the next :meth:`take` starts at (for tests and inspection)."""
        return int(self.cell[0])


def seal_records(
    records: UInt8Array,
    lengths: Int64Array,
    start: int,
    stop: int,
    key: bytes,
    nonces: NonceCounter,
    *,
    accelerated: bool | None = None,
) -> None:
    """Write nonce and tag into data records ``[start, stop)`` of ``records``
    (``(n, stride)`` uint8, record ``i`` of ``lengths[i]`` bytes, its AUTH flag
    set and its last :data:`AUTH_TRAILER_LEN` bytes the trailer). The nonces are
    drawn from ``nonces``, one per record, when the call is made."""
    if stop <= start:
        return
    first = nonces.take(stop - start)
    use_c = ACCELERATED if accelerated is None else accelerated
    if use_c and _accel is not None:
        _accel.seal_data(records, lengths, start, stop, check_auth_key(key), first)
        return
    for k, i in enumerate(range(start, stop)):
        row = records[i]
        end = int(lengths[i]) - AUTH_TAG_LEN
        nonce = first + k
        row[end - AUTH_NONCE_LEN : end] = np.frombuffer(nonce.to_bytes(8, "big"), np.uint8)
        src = int.from_bytes(row[_SRC_OFFSET_DATA : _SRC_OFFSET_DATA + 2].tobytes(), "big")
        tag = gmac_tag(key, row[:end].data, domain=Domain.DATA, src=src, nonce=nonce)
        row[end : end + AUTH_TAG_LEN] = np.frombuffer(tag, np.uint8)


def verify_records(
    records: UInt8Array,
    lengths: Int64Array,
    rows: Int64Array,
    key: bytes,
    *,
    accelerated: bool | None = None,
) -> npt.NDArray[np.bool_]:
    """Whether each data record ``rows[i]`` carries the right tag under ``key``
    (its nonce and src as the record says); records as for :func:`seal_records`,
    each at least a data header and a trailer long."""
    use_c = ACCELERATED if accelerated is None else accelerated
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    ok = np.zeros(len(rows), dtype=np.bool_)
    if use_c and _accel is not None:
        _accel.verify_data(records, lengths, rows, check_auth_key(key), ok.view(np.uint8))
        return ok
    for k, i in enumerate(rows.tolist()):
        row = records[i]
        end = int(lengths[i]) - AUTH_TAG_LEN
        nonce = int.from_bytes(row[end - AUTH_NONCE_LEN : end].tobytes(), "big")
        src = int.from_bytes(row[_SRC_OFFSET_DATA : _SRC_OFFSET_DATA + 2].tobytes(), "big")
        want = gmac_tag(key, row[:end].data, domain=Domain.DATA, src=src, nonce=nonce)
        ok[k] = hmac.compare_digest(want, row[end : end + AUTH_TAG_LEN].tobytes())
    return ok


#: the C accelerator's verifiers (a key expanded once), by key: the receive path
#: calls once per receive, too often to expand the key each time (threads sharing
#: one take turns, in C)
_verifiers: dict[bytes, Any] = {}


def _verifier(key: bytes) -> Any:
    verifier = _verifiers.get(key)
    if verifier is None:
        assert _accel is not None
        if len(_verifiers) >= 64:  # keys of past runs: forget them all
            _verifiers.clear()
        verifier = _verifiers[key] = _accel.Verifier(check_auth_key(key))
    return verifier


def verified_prefix(
    buf: UInt8Array, segment_size: int, key: bytes, floor: int = 0
) -> tuple[int, int]:
    """How many leading datagrams of ``buf`` (``segment_size`` apart, the last
    possibly shorter, as one receive hands them over) carry a nonce of at least
    ``floor`` (:mod:`dlcp.proto.replay`) and the right tag under ``key``, and one
    above the highest of their nonces (0: none); a short last one counts only if
    it holds a data header and a trailer. With the C accelerator one call, under
    the key expanded once; else one batch call for the whole ones, one more for a
    short last one."""
    if _accel is not None:
        n, nonce_next = _verifier(key).verified_prefix(buf, segment_size, floor)
        return int(n), int(nonce_next)
    least = _DATA_HEADER_LEN + AUTH_TRAILER_LEN
    n, tail = divmod(len(buf), segment_size) if segment_size >= least else (0, 0)
    sizes = [segment_size] * n + ([tail] if tail >= least else [])
    nonces = [
        int.from_bytes(buf[end - AUTH_TRAILER_LEN : end - AUTH_TAG_LEN], "big")
        for end in (k * segment_size + size for k, size in enumerate(sizes))
    ]
    fresh = next((i for i, nonce in enumerate(nonces) if nonce < floor), len(nonces))
    n = min(n, fresh)
    if n:
        records = buf[: n * segment_size].reshape(n, segment_size)
        lengths = np.full(n, segment_size, dtype=np.int64)
        ok = verify_records(records, lengths, np.arange(n, dtype=np.int64), key)
        if not ok.all():
            n = int(np.argmin(ok))
            fresh = n
    if fresh > n and len(sizes) > n:
        last = buf[n * segment_size :].reshape(1, tail)
        one = np.zeros(1, dtype=np.int64)
        n += int(verify_records(last, np.array([tail], np.int64), one, key)[0])
    return n, min(max(nonces[:n], default=-1) + 1, (1 << 64) - 1)


def gmac_backend() -> str | None:
    """How the C code computes tags now: ``"modes"`` (libcrypto's GCM mode functions),
    ``"evp"`` (EVP's AES-GCM, where the libcrypto and the CPU make it the faster) or
    ``"sized"`` (EVP for datagrams of 4,112 bytes or more, tag included, the mode
    functions below: ``dlcp/proto/gmac.h``); the native engines always choose so.
    None without the C code."""
    return _accel.backend() if _accel is not None else None


def use_gmac_backend(name: str) -> str:
    """How :mod:`dlcp.proto._gmac`'s later keys compute tags: ``"auto"`` (as the
    engines), ``"modes"``, ``"evp"`` or ``"sized"``, the same tags every way (tests,
    benchmarks; the verifiers :func:`verified_prefix` keeps keep their way);
    returns the setting it replaces. A ValueError names a backend
    that does not exist; a UsageError says the C code is not built."""
    if _accel is None:
        raise UsageError("dlcp.proto._gmac is not built (no libcrypto headers): one backend")
    return str(_accel.use_backend(name))
