"""The job's secret and the authentication keys derived from it (docs/spec.md §3).

The secret reaches the ranks out of band, never through the rendezvous store
(which has no authentication and listens on every interface): ``dlcp launch``
makes one per job and hands it to its ranks in ``DLCP_JOB_SECRET``; a job on
several hosts gets one from its user, in ``DLCP_JOB_SECRET`` (hex) or in a file
named by ``DLCP_JOB_SECRET_FILE`` (as a Kubernetes secret is mounted). The
store carries only a fresh nonce per run of an endpoint group, which is public.

Each ordered pair of ranks of a run has a key of its own::

    K(src, dst) = HKDF-SHA256(secret, salt = nonce,
                              info = "dlcp-v1 pair key" | job | nonce | src | dst)

so a datagram tagged for one destination fails verification at another, and a
datagram of one run fails in the next (the nonce differs): replays across
destinations and runs are rejected as ``auth_failed`` without a field more on
the wire. HKDF is the ``cryptography`` package's.
"""

from __future__ import annotations

import os
import secrets
import struct
from collections.abc import Mapping

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .errors import ConfigError, UsageError

__all__ = [
    "RUN_NONCE_LEN",
    "SECRET_ENV",
    "SECRET_FILE_ENV",
    "KeyRing",
    "job_secret",
    "new_run_nonce",
    "new_secret",
]

SECRET_ENV = "DLCP_JOB_SECRET"
SECRET_FILE_ENV = "DLCP_JOB_SECRET_FILE"
#: bytes of a job secret: at least as many as a key (spec §3), at most what is sane
SECRET_MIN, SECRET_MAX = 16, 1024
#: bytes of a run's nonce, published in the store
RUN_NONCE_LEN = 16
#: bytes of each derived key
PAIR_KEY_LEN = 32
_INFO = b"dlcp-v1 pair key"
_PAIR = struct.Struct(">HH")
_JOB = struct.Struct(">H")


def new_secret() -> str:
    """A fresh job secret, as hex (what ``DLCP_JOB_SECRET`` holds)."""
    return secrets.token_hex(32)


def new_run_nonce() -> bytes:
    """A fresh nonce for one run of an endpoint group (public)."""
    return secrets.token_bytes(RUN_NONCE_LEN)


def job_secret(env: Mapping[str, str] | None = None) -> bytes | None:
    """The job's secret from ``DLCP_JOB_SECRET`` (hex) or the file that
    ``DLCP_JOB_SECRET_FILE`` names (hex text, or else the raw bytes); None when
    neither is set. A bad value is a :class:`ConfigError` naming the variable."""
    env = os.environ if env is None else env
    raw, path = env.get(SECRET_ENV), env.get(SECRET_FILE_ENV)
    if raw is not None and path is not None:
        raise ConfigError(f"both {SECRET_ENV} and {SECRET_FILE_ENV} are set: set one of them")
    if raw is not None:
        try:
            secret = bytes.fromhex(raw.strip())
        except ValueError:
            raise ConfigError(
                f"{SECRET_ENV} is not hex (its value is not shown: it is a secret)"
            ) from None
        where = SECRET_ENV
    elif path is not None:
        try:
            with open(path, "rb") as f:
                content = f.read(SECRET_MAX * 2 + 64)
        except OSError as exc:
            raise ConfigError(f"{SECRET_FILE_ENV}={path!r} cannot be read: {exc}") from None
        secret = _hex_or_raw(content)
        where = f"the file {SECRET_FILE_ENV}={path!r}"
    else:
        return None
    if not SECRET_MIN <= len(secret) <= SECRET_MAX:
        raise ConfigError(
            f"{where} holds a secret of {len(secret)} bytes: a job secret has "
            f"{SECRET_MIN}..{SECRET_MAX} bytes (32 random bytes recommended)"
        )
    return secret


def _hex_or_raw(content: bytes) -> bytes:
    text = content.strip()
    try:
        return bytes.fromhex(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return content


class KeyRing:
    """The keys of one run of a job: ``ring(src, dst)`` is the key of the pair
    (module docstring). Pass it as an endpoint's ``key``; the session keeps the
    keys it looked up."""

    __slots__ = ("_secret", "job", "run_nonce")

    def __init__(self, secret: bytes, *, job: int, run_nonce: bytes) -> None:
        if not SECRET_MIN <= len(secret) <= SECRET_MAX:
            raise UsageError(
                f"a job secret has {SECRET_MIN}..{SECRET_MAX} bytes, got {len(secret)}"
            )
        if len(run_nonce) != RUN_NONCE_LEN:
            raise UsageError(f"a run nonce has {RUN_NONCE_LEN} bytes, got {len(run_nonce)}")
        self._secret = bytes(secret)
        self.job = job
        self.run_nonce = bytes(run_nonce)

    def __call__(self, src: int, dst: int) -> bytes:
        info = _INFO + _JOB.pack(self.job) + self.run_nonce + _PAIR.pack(src, dst)
        hkdf = HKDF(algorithm=hashes.SHA256(), length=PAIR_KEY_LEN, salt=self.run_nonce, info=info)
        return hkdf.derive(self._secret)

    def __repr__(self) -> str:  # never the secret
        return f"KeyRing(job={self.job}, run_nonce={self.run_nonce.hex()})"
