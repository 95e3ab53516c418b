"""Which engine sends an endpoint's data, and the native one's Python face.

Two engines run the same protocol (``dlcp.proto`` decides what goes in every
datagram, and when a round, a NACK or a STOP is due):

* ``python``: the session paces and cuts batches itself and the endpoint's
  threads send each batch (``Session.datagrams_to_send`` hands out
  :class:`~dlcp.proto.events.DataBatch` items, about one per burst of the pacer);
* ``native``: the session hands each transmission round out whole
  (:class:`~dlcp.proto.events.RoundPost`) and the compiled engine
  (``dlcp.io._engine``, C) paces and sends it in a thread of its own, without
  the GIL, with pacers that are a port of ``dlcp.proto.pacing``'s; Python hears
  once per round, through an eventfd, or (the round's FINISH written by the
  engine's thread on the control connection it shares with Python: rule 9 of
  ``_engine.c``) at its next turn, without a wake-up.

``EndpointConfig.engine`` (``DLCP_ENGINE``) picks one: ``native``, ``python``, or
``auto`` (the default: native where it was built). A build without a C compiler
has no ``_engine``; ``auto`` then runs the Python engine and says so in the log.
``EndpointConfig.engine_threads`` (``DLCP_ENGINE_THREADS``) is how many send
threads the native engine runs, or ``auto`` (0, the default): :func:`send_threads`
(docs/engine.md, "Threads").
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..proto.config import ProtocolConfig
from ..proto.events import RoundPost
from ..proto.pacers import make_pacer
from ..proto.pacing import Pacer
from .control import frame
from .extensions import BUILD_VARIABLES, load
from .udp import DataSockets, datagrams_per_gso_message

#: a path to another build of ``dlcp.io._engine`` to load instead (``make
#: sanitize``: the same source built with AddressSanitizer and UBSan)
BUILD_VARIABLE = BUILD_VARIABLES["_engine"]
_native = load("_engine")

__all__ = [
    "ENGINES",
    "NativeSender",
    "RoundReport",
    "choose_engine",
    "native_available",
    "native_seals",
    "send_threads",
    "shared_host_threads",
]

log = logging.getLogger("dlcp.io")

#: the values of ``EndpointConfig.engine`` / ``DLCP_ENGINE``
ENGINES = ("auto", "native", "python")
#: the most send threads ``engine_threads="auto"`` runs: 2 is what was measured
#: (docs/engine.md, "Threads")
AUTO_THREADS_MAX = 2

#: the native engine's pacers burst for this long at their rate (unless the
#: configuration's pacer_options set ``burst_time``): its thread wakes when the
#: pacer says, so a slow path gets bursts its switch queues absorb (16 KB at
#: 200 Mbit/s: 11 packets) where the Python engine, waking on epoll's millisecond
#: grid, needs 512 KB ones; at 10 Gbit/s, 250 KB (5,000 wake-ups a second)
NATIVE_BURST_TIME = 200e-6


@dataclass(frozen=True, slots=True)
class RoundReport:
    """A round the native engine sent to ``dst``, or failed to."""

    dst: int
    step: int
    msg: int
    #: (time, bytes sent to ``dst`` before it) of the round's first and last batch
    began: tuple[float, int]
    last: tuple[float, int]
    #: why the send failed (the system's words), None if it did not
    error: str | None
    #: whether the engine wrote the round's FINISH (rule 9), and when the round ended
    finish_sent: bool = False
    ended: float = 0.0


def native_available() -> bool:
    """Whether the native engine was built."""
    return _native is not None


def native_seals() -> bool:
    """Whether the native engine was built with libcrypto, so that it tags an
    authenticating job's datagrams as it sends them (rule 8 of ``_engine.c``)."""
    return _native is not None and bool(getattr(_native, "SEALS", 0))


def send_threads(setting: int, env: Mapping[str, str] | None = None) -> int:
    """The native engine's send threads for an ``engine_threads`` setting: itself,
    or for 0 (``auto``) the CPUs this process may run on shared by the ranks on
    this host (``LOCAL_WORLD_SIZE`` in ``env``, which ``torchrun`` and ``dlcp
    launch`` set), at least 1 and at most :data:`AUTO_THREADS_MAX`; 1 where the
    ranks on the host are not known (``LOCAL_WORLD_SIZE`` unset or not a whole
    number above 0: several endpoints of one process, a hand-made launch)."""
    if setting:
        return setting
    env = os.environ if env is None else env
    try:
        local_ranks = int(env.get("LOCAL_WORLD_SIZE", ""))
    except ValueError:
        return 1
    if local_ranks < 1:
        return 1
    return max(1, min(AUTO_THREADS_MAX, len(os.sched_getaffinity(0)) // local_ranks))


def shared_host_threads(hosts: int, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables that give ranks their share of this machine's CPUs where each
    runs as the one rank of an emulated host (``LOCAL_WORLD_SIZE=1``: the testbed's
    namespaces) and ``hosts`` such hosts share the machine: ``DLCP_ENGINE_THREADS``
    as ``auto`` gives ``hosts`` ranks of one host; nothing where ``env`` (default:
    this process's, which the ranks inherit) sets ``DLCP_ENGINE_THREADS``, or asks
    for the Python engine (``DLCP_ENGINE=python``), which refuses more than one."""
    env = os.environ if env is None else env
    if "DLCP_ENGINE_THREADS" in env or env.get("DLCP_ENGINE", "").strip().lower() == "python":
        return {}
    return {"DLCP_ENGINE_THREADS": str(send_threads(0, {"LOCAL_WORLD_SIZE": str(hosts)}))}


def choose_engine(setting: str, *, authenticate: bool = False) -> str:
    """``native`` or ``python`` for an ``engine`` setting (see the module docstring).

    An authenticating job runs the native engine only where it was built with
    libcrypto: it tags each batch in its own thread just before sending it. A
    build without libcrypto cannot tag: ``auto`` then runs the Python engine (and
    says so in the log) and ``native`` is a :class:`ConfigError`."""
    if setting not in ENGINES:
        raise ConfigError(f"engine={setting!r} (DLCP_ENGINE): use 'auto', 'native' or 'python'")
    if setting == "python":
        return "python"
    if _native is None:
        if setting == "native":
            raise ConfigError(
                "engine='native' (DLCP_ENGINE) but the native engine was not built "
                "(dlcp.io._engine: install with a C compiler)"
            )
        log.info("dlcp: the native engine was not built; the Python engine runs")
        return "python"
    if authenticate and not native_seals():
        if setting == "native":
            raise ConfigError(
                "engine='native' (DLCP_ENGINE) with authentication, but the native engine "
                "was built without OpenSSL's libcrypto and cannot tag: use engine='python' "
                "or rebuild with libcrypto's headers (openssl/evp.h)"
            )
        log.info("dlcp: the native engine cannot tag (built without libcrypto); the Python "
                 "engine runs")  # fmt: skip
        return "python"
    return "native"


class NativeSender:
    """The native send engine of one endpoint, over its data sockets.

    ``pacer_for`` is the session's pacer factory: each destination's pacer lives
    in C, where the engine's thread uses it; the session's calls on it
    (feedback, loss) take the engine's lock. ``post`` hands a round over,
    ``cancel`` takes one back (its memory is free to reuse on return), ``reap``
    returns the rounds that ended; ``fileno`` is readable while there are some.
    ``threads`` send threads pace and send (``dlcp-send-<rank>``, then
    ``dlcp-send-<rank>.1``, ...).
    """

    def __init__(
        self,
        data: DataSockets,
        protocol: ProtocolConfig,
        *,
        rank: int = 0,
        threads: int = 1,
        queue_limit: bool = True,
        control_timeout: float = 2.0,
    ) -> None:
        assert _native is not None
        self._protocol = protocol
        self._gso = data.use_gso
        #: how many send threads the engine runs
        self.threads = threads
        self._engine: Any = _native.Engine(
            [s.fileno() for s in data.send_socks], protocol.batch_packets, f"dlcp-send-{rank}",
            threads=threads, queue_limit=queue_limit, control_timeout=control_timeout,
        )
        self._pacers: dict[int, Any] = {}
        #: told each pacer as it is made, with its destination (dlcp.io.control_in_waits)
        self.pacer_made: Callable[[int, Any], None] | None = None
        self._routed: dict[int, tuple[str, int]] = {}
        #: the rounds handed over with their FINISH and not reaped yet, and when
        #: (in posting order): their reports may come without a wake-up (rule 9)
        self._quiet: dict[tuple[int, int, int], float] = {}
        #: when reap() was last told the time: the rounds it did not return ended later
        self._reaped_at = -math.inf

    def fileno(self) -> int:
        return int(self._engine.fileno())

    def pacer_for(self, dst: int) -> Pacer:
        cfg = self._protocol
        if cfg.pacer == "unpaced":
            pacer = _native_pacer(unpaced=True)
        else:
            options = {"burst_time": NATIVE_BURST_TIME, **cfg.pacer_kwargs()}
            make_pacer(cfg.pacer, **options)  # its checks and errors, word for word
            pacer = _native_pacer(**options)
        self._pacers[dst] = pacer
        if self.pacer_made is not None:
            self.pacer_made(dst, pacer)
        return pacer  # type: ignore[no-any-return]

    def post(self, item: RoundPost, address: tuple[str, int], *, now: float) -> RoundReport | None:
        """Hand a round over at ``now``. A round of one batch that its pacer lets
        go now is sent before this returns, which returns its report (rule 7 of
        the engine); any other round's report comes from ``reap``: with the
        round's FINISH (``item.finish``), perhaps without a wake-up (rule 9:
        :attr:`quiet`)."""
        if self._routed.get(item.dst) != address:
            self._engine.add_peer(item.dst, address[0], address[1], self._pacers[item.dst])
            self._routed[item.dst] = address
        ended = self._engine.post(
            dst=item.dst, step=item.step, msg=item.msg, order=item.order,
            records=item.records, stride=item.stride,
            per_message=datagrams_per_gso_message(item.stride) if self._gso else 1,
            count=item.count, short=item.short,
            short_len=item.short_len, tos=item.tos, path=item.path, prio=item.prio,
            breaks=item.breaks, key=item.key, nonces=item.nonces, payload=item.payload,
            seqs=item.seqs, chunk_bytes=item.chunk_bytes,
            finish=None if item.finish is None else frame(item.finish),
        )  # fmt: skip
        if ended is not None:
            return _report(*ended)
        if item.finish is not None:
            self._quiet[item.dst, item.step, item.msg] = now
        return None

    def cancel(self, dst: int, step: int, msg: int) -> bool:
        self._quiet.pop((dst, step, msg), None)
        return bool(self._engine.cancel(dst, step, msg))

    def reap(self, now: float | None = None) -> list[RoundReport]:
        """The rounds that ended since the last call, which was made at ``now``
        or later (``fileno`` is readable while there are some whose FINISH
        Python writes)."""
        if now is not None:
            self._reaped_at = now
        reports = [_report(*ended) for ended in self._engine.reap()]
        if self._quiet:
            for r in reports:
                self._quiet.pop((r.dst, r.step, r.msg), None)
        return reports

    @property
    def quiet(self) -> bool:
        """Whether a round whose report may come without a wake-up is under way
        (rule 9): a driver reaps at every turn while one is."""
        return bool(self._quiet)

    def quiet_due(self, finish_timeout: float) -> float | None:
        """The earliest time the FINISH timer of a round whose report may come
        without a wake-up can be due (None: there is none): it runs from the
        round's end, after the round was posted and after the last ``reap`` that
        was told the time did not return it."""
        for posted in self._quiet.values():  # (the earliest posted)
            return max(posted, self._reaped_at) + finish_timeout
        return None

    # the control connections shared with the engine's threads (rule 9)

    def adopt_control(self, dst: int, fd: int) -> None:
        """``dst``'s control connection ``fd`` (its hello sent) takes the FINISH
        frames of the rounds to ``dst``; every frame Python writes on it goes
        through :meth:`control_send` from now on."""
        self._engine.adopt_control(dst, fd)

    def release_control(self, dst: int) -> None:
        """No more writes on ``dst``'s connection (before it is closed)."""
        self._engine.release_control(dst)

    def control_send(self, dst: int, data: bytes) -> None:
        """A whole frame onto ``dst``'s adopted connection; OSError as a socket's
        ``sendall`` raises it (the connection's error once a write on it failed)."""
        self._engine.control_send(dst, data)

    def address_of(self, dst: int) -> str:
        """Where this engine sends ``dst``'s data (for messages)."""
        host_port = self._routed.get(dst)
        return f"{host_port[0]}:{host_port[1]}" if host_port else f"rank {dst}"

    def stats(self) -> dict[str, int]:
        return dict(self._engine.stats())

    @property
    def pacer_api(self) -> Any:
        """What the receive loop needs to hand RATE reports to this
        engine's pacers itself (``_engine.PACER_API``; None if this build lacks it)."""
        return getattr(_native, "PACER_API", None)

    def close(self) -> None:
        self._engine.close()


def _report(
    dst: int, step: int, msg: int, failed: int, err: int,
    began_t: float, began_b: int, last_t: float, last_b: int, finish_sent: int, ended: float,
) -> RoundReport:  # fmt: skip
    why = f"[Errno {err}] {os.strerror(err)}" if failed else None
    return RoundReport(
        dst, step, msg, (began_t, began_b), (last_t, last_b), why, bool(finish_sent), ended
    )


def _native_pacer(**options: Any) -> Any:
    assert _native is not None
    return _native.Pacer(**options)
