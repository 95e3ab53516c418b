"""Endpoint configuration: a validated dataclass with ``DLCP_*`` environment overrides."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..proto.config import FillPolicy, ProtocolConfig

__all__ = ["ENV_PREFIX", "MAX_ENGINE_THREADS", "EndpointConfig"]

ENV_PREFIX = "DLCP_"

#: the most send threads the native engine runs (its MAX_SEND_THREADS)
MAX_ENGINE_THREADS = 32


@dataclass(frozen=True, slots=True)
class EndpointConfig:
    """How an :class:`~dlcp.io.endpoint.Endpoint` runs. Times in seconds."""

    protocol: ProtocolConfig = field(default_factory=ProtocolConfig)
    #: address to bind the data (UDP) and control (TCP) sockets to
    host: str = "127.0.0.1"
    #: UDP data port and TCP control port; 0 = any free port
    data_port: int = 0
    control_port: int = 0
    #: how long send/recv may take before they fail with PeerTimeout
    timeout: float = 30.0
    #: minimum TCP retransmission timeout (and delayed-ACK maximum) of the control
    #: connections, where the kernel allows it per socket; 0 = the kernel's (200 ms)
    control_rto_min: float = 0.005
    #: "auto" (use when the kernel has it), "on" (fail without it) or "off"
    gso: str = "auto"
    gro: str = "auto"
    #: drop junk data datagrams in the kernel, before they are queued: a classic
    #: BPF filter on the data socket checks the header rules of spec §6.1 that
    #: need no key (dlcp.io.kernel_filter); off, the receive loop's pre-filter
    #: alone drops them, after reading each
    kernel_filter: bool = True
    #: size datagrams from the MTU of the interface ``host`` is on (at most 9000:
    #: dlcp.io.path_mtu) instead of ``protocol.mtu``; ``DLCP_MTU=auto`` sets it
    mtu_from_interface: bool = False
    #: with several paths (``protocol.n_paths``) and no ``protocol.path_weights``:
    #: find the route each path takes to a peer by TTL probes when first sending
    #: to it, and give every distinct route the same share (dlcp.io.path_probe)
    probe_routes: bool = True
    #: socket buffer sizes (root may exceed net.core.{r,w}mem_max)
    rcvbuf: int = 32 << 20
    sndbuf: int = 4 << 20
    #: what sends the data: "native" (the compiled engine, dlcp.io.engine),
    #: "python", or "auto" (native where it was built)
    engine: str = "auto"
    #: the native engine's send threads (dlcp.io.engine, docs/engine.md#threads):
    #: 1..MAX_ENGINE_THREADS, or 0 (``DLCP_ENGINE_THREADS=auto``): the host's CPUs
    #: shared by its ranks (dlcp.io.engine.send_threads); more than 1 needs the
    #: native engine (engine="python" refuses it; "auto" that runs the Python
    #: engine ignores it, and logs that)
    engine_threads: int = 0
    #: DIAGNOSTIC: the native engine holds its next batch while the host still
    #: holds more than a few bursts of its datagrams (SIOCOUTQ of the data sockets:
    #: docs/engine.md, "The host's queue"), so that a pacer above the host link's
    #: rate cannot build a queue there; off: ``DLCP_HOST_QUEUE_LIMIT=0``
    host_queue_limit: bool = True
    #: DIAGNOSTIC: the receive loop scatters the runs of the messages under way
    #: itself, in C (dlcp.io.native_receive), where it was built; off, the run
    #: path runs in Python once per run of datagrams (``DLCP_NATIVE_RECEIVE=0``)
    native_receive: bool = True
    #: seconds the native receive loop waits in C for the next burst of data
    #: after the socket ran dry, before the I/O thread's Python turn, while
    #: nothing else is ready (dlcp/io/_linger.h); 0: it returns at once. Only
    #: with the native engine and receive path (the Python engine sends from
    #: the I/O thread, which must not wait then)
    receive_linger: float = 1e-3
    #: seconds of each nap the lingering loop takes while data trickles in (less
    #: than 32 KB came after a wait: a slow link, offloads off): it sleeps off
    #: the socket's wait queue and takes what came, turn after turn of naps,
    #: until the I/O thread's next deadline (at most ``dlcp.io.io_loop.
    #: TRICKLE_LINGER``, 20 ms) or another of its files is ready, while the data comes
    #: slower than about 1 Gbit/s (dlcp/io/_linger.h); 0: a trickle ends the
    #: linger, a Python turn for every datagram or two
    receive_nap: float = 200e-6
    #: EMULATION: drop this fraction of received data datagrams in-process
    emulated_loss: float = 0.0
    emulated_loss_seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.protocol, ProtocolConfig):
            raise ConfigError(f"protocol={self.protocol!r} is not a ProtocolConfig")
        for f in dataclasses.fields(self):
            kind, value = str(f.type), getattr(self, f.name)
            if kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"{f.name}={value!r} is not an integer")
            if kind == "float" and (
                isinstance(value, bool) or not isinstance(value, (int, float))
            ):
                raise ConfigError(f"{f.name}={value!r} is not a number")
            if kind == "str" and not isinstance(value, str):
                raise ConfigError(f"{f.name}={value!r} is not a string")
            if kind == "bool" and not isinstance(value, bool):
                raise ConfigError(f"{f.name}={value!r} is not True or False")
        try:
            host = ipaddress.IPv4Address(self.host)
        except ValueError:
            raise ConfigError(
                f"host={self.host!r} is not an IPv4 address (DLCP's sockets are IPv4)"
            ) from None
        if host.is_unspecified:
            raise ConfigError(
                f"host={self.host!r}: the address is published for the peers to reach this "
                "rank at, so it must be one of this host's addresses, not the wildcard"
            )
        for name in ("data_port", "control_port"):
            port = getattr(self, name)
            if not 0 <= port <= 65535:
                raise ConfigError(f"{name}={port} outside 0..65535")
        if not 0 < self.timeout <= threading.TIMEOUT_MAX:
            raise ConfigError(f"timeout={self.timeout} must be a finite number of seconds > 0")
        if not 0 <= self.control_rto_min <= 0.2:
            raise ConfigError(
                f"control_rto_min={self.control_rto_min} outside [0, 0.2] seconds "
                "(0 keeps the kernel's)"
            )
        for name in ("gso", "gro"):
            if getattr(self, name) not in ("auto", "on", "off"):
                raise ConfigError(f"{name}={getattr(self, name)!r}: use 'auto', 'on' or 'off'")
        if self.engine not in ("auto", "native", "python"):
            raise ConfigError(f"engine={self.engine!r}: use 'auto', 'native' or 'python'")
        if not 0 <= self.engine_threads <= MAX_ENGINE_THREADS:
            raise ConfigError(
                f"engine_threads={self.engine_threads} outside 1..{MAX_ENGINE_THREADS} "
                "(0: auto)"
            )
        if self.engine == "python" and self.engine_threads > 1:
            raise ConfigError(
                f"engine_threads={self.engine_threads} with engine='python': send threads "
                "are the native engine's (use engine='native' or 'auto', or 1 thread)"
            )
        for name in ("rcvbuf", "sndbuf"):
            if not 65536 <= getattr(self, name) <= _INT_MAX:
                raise ConfigError(
                    f"{name}={getattr(self, name)} outside 65536..{_INT_MAX} bytes"
                )
        if not 0.0 <= self.receive_linger <= 0.01:
            raise ConfigError(
                f"receive_linger={self.receive_linger} outside [0, 0.01] seconds"
            )
        if not 0.0 <= self.receive_nap <= 0.001:
            raise ConfigError(f"receive_nap={self.receive_nap} outside [0, 0.001] seconds")
        if not 0.0 <= self.emulated_loss < 1.0:
            raise ConfigError(f"emulated_loss={self.emulated_loss} outside [0, 1)")
        if self.emulated_loss_seed < 0:
            raise ConfigError(f"emulated_loss_seed={self.emulated_loss_seed} must be >= 0")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> EndpointConfig:
        """Defaults, then ``DLCP_*`` variables, then ``overrides``.

        Endpoint fields use their upper-case names (``DLCP_TIMEOUT``,
        ``DLCP_EMULATED_LOSS``, ...); protocol fields too (``DLCP_N_PATHS``,
        ``DLCP_DEFAULT_P``, ``DLCP_BATCH_PACKETS``, ``DLCP_DEFAULT_FILL``, ...).
        Unknown ``DLCP_*`` variables are an error, so that a typo is not ignored.
        A :class:`ConfigError` names what the user typed: the variable and its
        value (``DLCP_EMULATED_LOSS=2 outside [0, 1)``) when a variable is at
        fault, the keyword (``emulated_loss=2.0 outside [0, 1)``) when an
        override is.
        """
        env = os.environ if env is None else env
        try:
            return cls._from_env(env, dict(overrides))
        except ConfigError as exc:
            raise ConfigError(cls._blame(env, exc, overrides)) from None

    @classmethod
    def _blame(cls, env: Mapping[str, str], exc: ConfigError, overrides: dict[str, Any]) -> str:
        """``exc`` (which speaks of configuration fields) said of what the user set."""
        # (only configuration variables: never the job's secret, read elsewhere)
        ours = sorted(
            var for var in env
            if var.startswith(ENV_PREFIX) and var[len(ENV_PREFIX) :].lower() not in _NOT_CONFIG
        )  # fmt: skip
        for var in ours:
            try:
                cls._from_env({var: env[var]}, {})
            except ConfigError as alone:
                said = str(alone)
                if var in said:  # (an unknown name, a value that does not parse)
                    return said
                field = _FIELD.match(said)
                if field is None:
                    return f"{var}={env[var]}: {said}"
                return f"{var}={env[var]}{field.group(1)} {said[field.end() :]}"
        if not ours:
            return str(exc)  # (an argument: its message names the keyword)
        try:
            cls._from_env({}, dict(overrides))
        except ConfigError:
            return str(exc)
        # each is fine alone: they disagree with each other
        return f"{exc} (from {', '.join(f'{var}={env[var]}' for var in ours)})"

    @classmethod
    def _from_env(cls, env: Mapping[str, str], overrides: dict[str, Any]) -> EndpointConfig:
        ours = {f.name for f in dataclasses.fields(cls)} - {"protocol"}
        proto_fields = {f.name: f for f in dataclasses.fields(ProtocolConfig)}
        endpoint_kw: dict[str, Any] = {}
        proto_kw: dict[str, Any] = {}
        for var, raw in env.items():
            if not var.startswith(ENV_PREFIX):
                continue
            name = var[len(ENV_PREFIX) :].lower()
            if name in _NOT_CONFIG:
                continue
            if name == "mtu" and raw.strip().lower() == "auto":
                endpoint_kw["mtu_from_interface"] = True
                continue
            if name == "engine_threads" and raw.strip().lower() == "auto":
                endpoint_kw["engine_threads"] = 0
                continue
            if name in ours:
                endpoint_kw[name] = _parse(var, raw, cls.__dataclass_fields__[name].type)
            elif name in proto_fields and name in _PROTO_ENV:
                proto_kw[name] = _parse(var, raw, _PROTO_ENV[name])
            else:
                raise ConfigError(f"unknown configuration variable {var}")
        protocol = overrides.pop("protocol", None)
        try:
            if protocol is None:
                protocol = ProtocolConfig(**proto_kw)
            elif proto_kw:
                protocol = dataclasses.replace(protocol, **proto_kw)
        except ValueError as exc:
            raise ConfigError(f"protocol configuration: {exc}") from None
        return cls(protocol=protocol, **{**endpoint_kw, **overrides})


#: "field=value " (and the protocol's "protocol configuration: " before it) at the
#: start of a configuration error: the variable and what the user typed replace it
_FIELD = re.compile(r"^(?:protocol configuration: )?[a-z_]+=\S+?(:?) ")

#: DLCP_* variables that are read elsewhere (simulator, golden-file tests, the
#: sanitizer builds of the native engine, the receive loop and the kernels:
#: dlcp.builds.alternate_build; the job's secret: dlcp.keyring; the process
#: group's cross-rank checks: shims.pg_signature), not config. (The job id is
#: agreed through the store: a DLCP_JOB or DLCP_KEY would be ignored, so they are
#: errors like any unknown name.)
_NOT_CONFIG = frozenset(
    {"sim_trace_tcp", "regen_golden", "engine_build", "udpio_build", "kernels_build",
     "job_secret", "job_secret_file", "check_collectives", "sim_trace_receiver"}
)

#: setsockopt's int: the largest socket buffer size one can ask for
_INT_MAX = (1 << 31) - 1

_PROTO_ENV: dict[str, str] = {
    "mtu": "int",
    "payload_bytes": "int",
    "batch_packets": "int",
    "spray_packets": "int",
    "n_paths": "int",
    "classifier": "str",
    "magnitude_sample": "int",
    "default_p": "float",
    "default_fill": "fill",
    "max_rounds": "int",
    "finish_timeout": "float",
    "finish_retries": "int",
    "reorder_grace": "float",
    "ordered_paths": "bool",
    "nack_timeout": "float",
    "recv_idle_timeout": "float",
    "silent_path_timeout": "float",
    "pacer": "str",
    "rate_interval": "float",
    "lone_rate_interval": "float",
    "authenticate": "bool",
}


#: what a variable of each kind accepts, for the error that refuses a value
_ACCEPTED: dict[str, str] = {
    "bool": ": use 1, true, yes, on or 0, false, no, off",
    "fill": ": use " + ", ".join(repr(f.value) for f in FillPolicy),
}


def _parse(var: str, raw: str, kind: object) -> Any:
    kind = str(kind)
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind == "bool":
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if kind == "fill":
            return FillPolicy(raw.strip().lower())
    except ValueError:
        raise ConfigError(f"{var}={raw!r} is not a valid {kind}{_ACCEPTED.get(kind, '')}") from None
    return raw
