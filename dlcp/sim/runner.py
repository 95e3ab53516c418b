"""Run simulations in child interpreters and collect their results.

Each run is ``python -m dlcp.sim.engine`` in a fresh process (ns-3 keeps
global state; a fresh process also makes a run independent of what ran
before). :func:`run_many` keeps up to ``jobs`` of them going and reports
progress; results and per-flow CSVs land in ``out_dir``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

from ..errors import DLCPError
from ..processes import die_with_parent
from .config import SimConfig, SimConfigError
from .engine import NS3_MISSING
from .results import read_flows, summarize

__all__ = ["SimError", "ns3_available", "require_ns3", "run_many"]


class SimError(DLCPError, RuntimeError):
    """A simulation could not run; the message says why."""


def ns3_available() -> bool:
    return (
        importlib.util.find_spec("ns3") is not None
        and importlib.util.find_spec("cppyy") is not None
    )


def require_ns3() -> None:
    if not ns3_available():
        raise SimError(NS3_MISSING)


@dataclass
class _Job:
    name: str
    cfg: SimConfig
    proc: subprocess.Popen[bytes]
    started: float
    files: tuple[Path, Path, Path, Path]


#: settings a run's name spells out; any other that differs from its default adds
#: a hash of them all, so runs of different settings never share files
_NAMED = frozenset({"workload", "hosts", "transport", "disable", "seed"})


def run_name(cfg: SimConfig) -> str:
    base = f"{cfg.workload}_{cfg.hosts}h_{cfg.label}_s{cfg.seed}"
    rest = {k: v for k, v in cfg.to_dict().items() if k not in _NAMED}
    defaults = {
        f.name: f.default if f.default is not MISSING else f.default_factory()  # type: ignore[operator]
        for f in fields(SimConfig)
        if f.name in rest
    }
    if rest == json.loads(json.dumps(defaults)):
        return base
    digest = hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()[:8]
    return f"{base}_{digest}"


def _start(cfg: SimConfig, out_dir: Path) -> _Job:
    name = run_name(cfg)
    conf, res, flows, log = (out_dir / f"{name}{ext}" for ext in
                             (".config.json", ".result.json", ".flows.csv", ".log"))  # fmt: skip
    conf.write_text(json.dumps(cfg.to_dict()))
    with log.open("wb") as logf:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dlcp.sim.engine", str(conf), str(res), str(flows)],
            stdout=logf,
            stderr=subprocess.STDOUT,
            # a runner stopped by a signal (SIGTERM, SIGKILL: no finally runs) takes
            # its simulations with it: minutes of CPU each on a shared machine
            preexec_fn=die_with_parent,
        )
    return _Job(name, cfg, proc, time.monotonic(), (conf, res, flows, log))


def _finish(job: _Job) -> dict[str, Any]:
    _conf, res, flows, log = job.files
    if job.proc.returncode != 0 or not res.exists():
        lines = log.read_text(errors="replace").splitlines()
        tail = [ln for ln in lines if "materialize" not in ln]  # ns-3 import noise
        raise SimError(
            f"simulation {job.name} failed (exit {job.proc.returncode}); "
            f"last output:\n" + "\n".join(tail[-15:])
        )
    raw = json.loads(res.read_text())
    records = read_flows(flows, raw.pop("kinds"), raw.pop("iterations"))
    summary = summarize(records)
    cfg = job.cfg
    if cfg.transport != "dlcp":  # ns-3's TCP resends inside its socket, uncounted here
        summary["retransmitted_packets"] = None
    row: dict[str, Any] = {
        "name": job.name,
        "label": cfg.label,
        "transport": cfg.transport,
        "workload": cfg.workload,
        "hosts": cfg.hosts,
        "scale": cfg.scale,
        "seed": cfg.seed,
        "process_wall_s": time.monotonic() - job.started,
        **raw,
        **summary,
        "config": cfg.to_dict(),
    }
    # the CDF plot's data: the training messages, as the summary counts them
    fct_us = [r["fct"] * 1e6 for r in records if r["kind"] != "background" and not r["failed"]]
    res.write_text(json.dumps({**row, "fct_us": fct_us}) + "\n")
    return row


def _wait_for_one(jobs: Iterable[_Job]) -> None:
    """Block until one of ``jobs``' processes has exited: their pidfds become
    readable (Linux); elsewhere, until the first one has."""
    procs = [job.proc for job in jobs]
    fds: list[int] = []
    try:
        for proc in procs:
            fds.append(os.pidfd_open(proc.pid))  # (an exited child is a zombie until reaped)
    except (AttributeError, OSError):  # no pidfds here (old kernel, sandbox, not Linux)
        for fd in fds:
            os.close(fd)
        procs[0].wait()
        return
    poller = select.poll()
    try:
        for fd in fds:
            poller.register(fd, select.POLLIN)
        poller.poll()
    finally:
        for fd in fds:
            os.close(fd)


def run_many(
    configs: Sequence[SimConfig],
    out_dir: Path,
    *,
    jobs: int = 1,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every config (``jobs`` at a time); results in the order given."""
    names = [run_name(c) for c in configs]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise SimConfigError(f"the same run is given twice (it would overwrite its files): {twice}")
    require_ns3()
    out_dir.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda _msg: None)
    pending = list(enumerate(configs))
    running: dict[int, _Job] = {}
    results: dict[int, dict[str, Any]] = {}
    total = len(configs)
    try:
        while pending or running:
            while pending and len(running) < max(1, jobs):
                i, cfg = pending.pop(0)
                running[i] = _start(cfg, out_dir)
                say(f"[{len(results) + len(running)}/{total}] started {running[i].name}")
            _wait_for_one(running.values())
            for i, job in list(running.items()):
                if job.proc.poll() is None:
                    continue
                del running[i]
                results[i] = _finish(job)
                r = results[i]
                say(
                    f"[{len(results)}/{total}] done {job.name}: mean FCT "
                    f"{r['fct_mean_us']:.1f} us, p99 {r['fct_p99_us']:.1f} us, iteration "
                    f"{r['iteration_mean_us']:.1f} us, loss {100 * r['loss_fraction']:.2f} % "
                    f"({r['process_wall_s']:.0f} s)"
                )
    finally:
        for job in running.values():
            job.proc.kill()
            job.proc.wait()
    return [results[i] for i in range(total)]
