"""How busy the machine's CPUs were while a testbed run trained, and how much of
that CPU time the run's own processes took.

A reading (:func:`read_cpu`) takes the machine-wide counters of ``/proc/stat``
(its aggregate ``cpu`` line: clock ticks spent in each state, summed over every
CPU), the load averages of ``/proc/loadavg`` and, for each of the run's
processes, the user and system ticks of ``/proc/<pid>/stat`` (all of the
process's threads). :mod:`.experiments` takes one reading when rank 0 says its
training starts and one when it reports its last epoch; :func:`cpu_summary` turns
the two into shares of the machine's CPU time over that window.

What the figures cannot say: the routers forward in the kernel, and the hosts'
packet handling runs there too, in softirq context, which the kernel counts per
CPU, not per process. That work shows in the machine-wide ``softirq_pct``
(together with every other job's network handling), not in any process's
seconds. Other jobs on the machine show only as less idle time.

The parsing and the arithmetic are pure functions of the files' text (tested on
fixed text); only :func:`read_cpu` touches ``/proc``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

__all__ = [
    "NOT_ATTRIBUTED",
    "CpuReading",
    "MachineTimes",
    "TrainingCpu",
    "cpu_summary",
    "machine_shares",
    "parse_loadavg",
    "parse_proc_stat",
    "parse_process_ticks",
    "read_cpu",
]

#: what a reader is told about the CPU time no process is charged with
NOT_ATTRIBUTED = (
    "the routers' forwarding and the hosts' packet handling run in the kernel's softirq "
    "context, counted per CPU and not per process: they are in softirq_pct (machine-wide, "
    "every job's), not in any process's CPU seconds"
)


@dataclass(frozen=True)
class MachineTimes:
    """The aggregate ``cpu`` line of ``/proc/stat``: clock ticks (``USER_HZ``) in
    each state since boot, summed over ``cpus`` CPUs. ``guest`` time is already
    inside ``user`` and ``nice``, so it is not kept."""

    user: int
    nice: int
    system: int
    idle: int
    iowait: int
    irq: int
    softirq: int
    steal: int
    cpus: int

    @property
    def total(self) -> int:
        return (
            self.user + self.nice + self.system + self.idle + self.iowait
            + self.irq + self.softirq + self.steal
        )  # fmt: skip


def parse_proc_stat(text: str) -> MachineTimes:
    """The aggregate ``cpu`` line of ``/proc/stat``'s text, and how many ``cpuN``
    lines follow it. ValueError naming what is missing if the text is not that."""
    aggregate: list[int] | None = None
    cpus = 0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if name == "cpu":
            aggregate = [int(v) for v in rest.split()]
        elif name.startswith("cpu") and name[3:].isdigit():
            cpus += 1
    if aggregate is None:
        raise ValueError("/proc/stat has no aggregate 'cpu' line")
    if len(aggregate) < 8:  # (kernels since 2.6.11 have steal, the 8th)
        raise ValueError(f"/proc/stat's 'cpu' line has {len(aggregate)} counters, expected 8+")
    if cpus == 0:
        raise ValueError("/proc/stat has no per-CPU 'cpuN' lines")
    user, nice, system, idle, iowait, irq, softirq, steal = aggregate[:8]
    return MachineTimes(user, nice, system, idle, iowait, irq, softirq, steal, cpus)


def parse_process_ticks(text: str) -> int:
    """User + system clock ticks of a process, all its threads, from the text of
    ``/proc/<pid>/stat`` (fields 14 and 15; the command name in parentheses may
    hold spaces and parentheses, so the fields are counted after its last ``)``)."""
    _, paren, rest = text.rpartition(")")
    after = rest.split()
    if not paren or len(after) < 13:
        raise ValueError(f"not a /proc/<pid>/stat line: {text[:80]!r}")
    # after[0] is field 3 (state): utime is field 14, stime field 15
    return int(after[11]) + int(after[12])


def parse_loadavg(text: str) -> tuple[float, float, float]:
    """The 1-, 5- and 15-minute load averages from ``/proc/loadavg``'s text."""
    parts = text.split()
    if len(parts) < 3:
        raise ValueError(f"not /proc/loadavg: {text[:80]!r}")
    return float(parts[0]), float(parts[1]), float(parts[2])


def machine_shares(before: MachineTimes, after: MachineTimes) -> dict[str, float]:
    """Percent of the machine's CPU time (all CPUs) between two readings spent in
    each state; ``idle`` counts ``iowait`` too (a CPU waiting for I/O runs
    nothing), and ``iowait`` is also given on its own. A counter that went
    backwards (iowait can, on some kernels) counts as 0. ValueError if no tick
    passed between the readings."""
    if after.cpus != before.cpus:
        raise ValueError(f"the CPU count changed between readings ({before.cpus} -> {after.cpus})")
    delta: dict[str, int] = {
        f.name: max(0, int(getattr(after, f.name)) - int(getattr(before, f.name)))
        for f in fields(MachineTimes)
        if f.name != "cpus"
    }
    total = sum(delta.values())
    if total <= 0:
        raise ValueError("no CPU time passed between the two /proc/stat readings")

    def pct(ticks: int) -> float:
        return round(100.0 * ticks / total, 2)

    return {
        "idle_pct": pct(delta["idle"] + delta["iowait"]),
        "iowait_pct": pct(delta["iowait"]),
        "user_pct": pct(delta["user"] + delta["nice"]),
        "system_pct": pct(delta["system"]),
        "irq_pct": pct(delta["irq"]),
        "softirq_pct": pct(delta["softirq"]),
        "steal_pct": pct(delta["steal"]),
    }


@dataclass(frozen=True)
class CpuReading:
    """One reading: when (``time.monotonic()``), the machine's counters, the load
    averages, and each named process's user + system ticks (None: the process was
    gone)."""

    at: float
    machine: MachineTimes
    load: tuple[float, float, float]
    processes: dict[str, int | None]


def read_cpu(processes: Mapping[str, int], proc: Path = Path("/proc")) -> CpuReading:
    """A reading of ``/proc`` now, for the processes ``{name: pid}``."""
    ticks: dict[str, int | None] = {}
    for name, pid in processes.items():
        try:
            ticks[name] = parse_process_ticks((proc / str(pid) / "stat").read_text())
        except (OSError, ValueError):  # exited and reaped already
            ticks[name] = None
    return CpuReading(
        at=time.monotonic(),
        machine=parse_proc_stat((proc / "stat").read_text()),
        load=parse_loadavg((proc / "loadavg").read_text()),
        processes=ticks,
    )


def cpu_summary(
    start: CpuReading, end: CpuReading, ticks_per_second: int | None = None
) -> dict[str, Any]:
    """The window between two readings: its length, the load averages at its start
    and end, :func:`machine_shares`, each process's CPU seconds in it, the ranks'
    (processes named ``rank<N>``) together in seconds and as a percent of the
    machine's CPU time (None where a process was unreadable at either end), and
    :data:`NOT_ATTRIBUTED`."""
    hz = ticks_per_second or os.sysconf("SC_CLK_TCK")
    window = end.at - start.at
    seconds: dict[str, float | None] = {}
    for name, first in start.processes.items():
        last = end.processes.get(name)
        seconds[name] = None if first is None or last is None else round((last - first) / hz, 2)
    ranks = [v for k, v in seconds.items() if k.startswith("rank")]
    ranks_s = (
        None if not ranks or None in ranks else round(sum(v for v in ranks if v is not None), 2)
    )
    machine_s = window * end.machine.cpus
    return {
        "window_s": round(window, 2),
        "cpus": end.machine.cpus,
        "load_avg_start": list(start.load),
        "load_avg_end": list(end.load),
        **machine_shares(start.machine, end.machine),
        "ranks_cpu_s": ranks_s,
        "ranks_cpu_pct": (
            round(100.0 * ranks_s / machine_s, 2) if ranks_s is not None and machine_s > 0 else None
        ),
        "process_cpu_s": seconds,
        "not_attributed": NOT_ATTRIBUTED,
    }


class TrainingCpu:
    """A run's two readings: :meth:`track` names the processes to account for (by
    pid; ranks as ``rank<N>``), :meth:`start` takes the first reading (once),
    :meth:`stop` the second (once, after a first). :meth:`summary` is
    :func:`cpu_summary` of the two, or None if either is missing. A reading that
    fails, or two that cannot be compared, leave the summary None and say why in
    ``failure``: the accounting never fails the run it watches."""

    def __init__(self) -> None:
        self.pids: dict[str, int] = {}
        self.first: CpuReading | None = None
        self.last: CpuReading | None = None
        self.failure: str | None = None

    def track(self, name: str, pid: int) -> None:
        self.pids[name] = pid

    def _read(self) -> CpuReading | None:
        try:
            return read_cpu(self.pids)
        except (OSError, ValueError) as e:
            self.failure = f"reading /proc failed: {e}"
            return None

    def start(self) -> None:
        if self.first is None and self.failure is None:
            self.first = self._read()

    def stop(self) -> None:
        if self.first is not None and self.last is None:
            self.last = self._read()

    def summary(self) -> dict[str, Any] | None:
        if self.first is None or self.last is None:
            return None
        try:
            return cpu_summary(self.first, self.last)
        except ValueError as e:
            self.failure = str(e)
            return None
