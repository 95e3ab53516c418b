"""The machine a benchmark ran on, and how busy it was: its JSON's ``"machine"``.

Figures from two machines do not compare. On 2026-11-30 ``dlcp.bench.transport``
moved 64 MiB by TCP at 0.99 GB/s on one 2-vCPU AMD EPYC VM and at 2.2-2.7 GB/s on
another (a newer CPU, with AVX-512), and ``dlcp.bench.auth`` sealed at 2.7 and
6.1 GB/s a core; and on either, a neighbour's load moves a single run by a third.
So every result says where and under what load it was measured:

* ``cpu`` (model name, family and model), ``cpu_features`` (those of
  :data:`FEATURES` the CPU has: the copies' and the MAC's instructions),
  ``hypervisor`` (a guest of a VM), ``logical_cpus`` (those this process may
  run on), ``kernel``, ``openssl`` (the library authentication's speed comes
  from: the libcrypto DLCP's C code seals and verifies with, as it reports itself,
  or Python's ``ssl``'s where that code is not built), ``gmac_backend`` (how that
  code computes tags with it on this CPU, ``dlcp/proto/gmac.h``: ``"modes"``,
  ``"evp"`` or ``"sized"``; with OpenSSL 3.5's EVP on an AVX-512 CPU, 1.6-2.1 times
  as fast at 8,972-byte datagrams as the mode functions; None where it is not built);
* over the benchmark's run, from ``/proc/stat``: ``cpu_busy_fraction`` (the
  share of all CPUs' time not idle: the benchmark's own processes and anything
  else's) and ``cpu_steal_fraction`` (the share the hypervisor gave to other
  guests: a run with a high one was slowed by its neighbours).

What cannot be read (no ``/proc``) is ``None``.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

from ..proto.auth import LIBCRYPTO_VERSION, gmac_backend

__all__ = ["FEATURES", "CpuTimes", "cpu_times", "describe"]

#: CPU flags a result reports when present: AES and carry-less multiply (the
#: MAC), AVX2 and AVX-512 (copies, classification), their vector AES forms
FEATURES = ("aes", "pclmulqdq", "avx2", "avx512f", "avx512bw", "vaes", "vpclmulqdq")

#: the aggregate ``cpu`` line of /proc/stat: ticks of user, nice, system, idle,
#: iowait, irq, softirq, steal (guest time is counted in user already)
CpuTimes = tuple[int, int, int, int, int, int, int, int]

_PROC = Path("/proc")


def cpu_times(proc: Path = _PROC) -> CpuTimes | None:
    """All CPUs' ticks so far (``/proc/stat``), or None where it cannot be read."""
    try:
        line = (proc / "stat").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    fields = line.split()
    if fields[0] != "cpu" or len(fields) < 9:
        return None
    t = tuple(int(f) for f in fields[1:9])
    return (t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7])


def _cpu_identity(proc: Path) -> tuple[str | None, list[str], bool]:
    """(model, features, hypervisor) from the first processor of ``cpuinfo``."""
    try:
        text = (proc / "cpuinfo").read_text()
    except OSError:
        return None, [], False
    first: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if first:
                break
            continue
        key, _, value = line.partition(":")
        first.setdefault(key.strip(), value.strip())
    name = first.get("model name")
    if name is not None and "cpu family" in first and "model" in first:
        name = f"{name} (family {first['cpu family']}, model {first['model']})"
    flags = set(first.get("flags", "").split())
    return name, [f for f in FEATURES if f in flags], "hypervisor" in flags


def _openssl() -> str | None:
    if LIBCRYPTO_VERSION is not None:
        return LIBCRYPTO_VERSION
    try:
        import ssl
    except ImportError:  # (a Python built without it)
        return None
    return ssl.OPENSSL_VERSION


def describe(start: CpuTimes | None, end: CpuTimes | None, *, proc: Path = _PROC) -> dict[str, Any]:
    """The ``"machine"`` object of a result whose run began at ``start`` and
    ended at ``end`` (:func:`cpu_times`; None where either is unknown)."""
    model, features, hypervisor = _cpu_identity(proc)
    busy = steal = None
    if start is not None and end is not None:
        delta = [b - a for a, b in zip(start, end, strict=True)]
        total = sum(delta)
        if total > 0:
            idle = delta[3] + delta[4]  # idle and iowait
            busy = round(1 - idle / total, 3)
            steal = round(delta[7] / total, 4)
    return {
        "cpu": model,
        "cpu_features": features,
        "hypervisor": hypervisor,
        "logical_cpus": len(os.sched_getaffinity(0)),
        "kernel": platform.release(),
        "openssl": _openssl(),
        "gmac_backend": gmac_backend(),
        "cpu_busy_fraction": busy,
        "cpu_steal_fraction": steal,
    }
