"""Run simulations in child processes and collect their results.

Each run is a child forked from a process that has loaded ns-3 and nothing
else (:mod:`dlcp.sim.fork_server`): ns-3 keeps global state, so no run may
follow another in one process, and a fresh interpreter would spend ~20 s
loading ns-3 again. :func:`run_many` keeps up to ``jobs`` runs going and reports
progress; results and per-flow CSVs land in ``out_dir``, the server's output in
``out_dir/fork-server.log``. A run's ``process_wall_s`` counts from its fork,
without the server's load.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

from ..errors import DLCPError
from ..processes import dies_with_this_process
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
    pid: int  # the fork server's child
    started: float
    files: tuple[Path, Path, Path, Path]
    returncode: int | None = None


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


#: the fork server's output, in a run_many's out_dir
SERVER_LOG = "fork-server.log"


def _tail(log: Path) -> str:
    """The last lines of a run's or the server's output, without ns-3's import noise."""
    lines = log.read_text(errors="replace").splitlines()
    return "\n".join([ln for ln in lines if "materialize" not in ln][-15:])


class _ForkServer:
    """The runner's end of :mod:`dlcp.sim.fork_server`: one process that loads
    ns-3 once and forks a child per run."""

    def __init__(self, log: Path) -> None:
        self.log = log
        with log.open("wb") as logf:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dlcp.sim.fork_server"],
                # numpy's OpenBLAS would start a worker thread when imported: the
                # server forks, so it keeps to its one thread (a run needs no BLAS)
                env={**os.environ, "OPENBLAS_NUM_THREADS": "1"},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=logf,
                # a runner stopped by a signal (SIGTERM, SIGKILL: no finally runs) takes
                # the server with it, and the server its runs: minutes of CPU each
                preexec_fn=dies_with_this_process(),
            )
        self.exits: dict[int, int] = {}  # run id -> exit code, read but not yet taken
        if self._reply() != {"ready": True}:
            raise SimError(self._failure("the ns-3 fork server did not start"))

    def _reply(self) -> dict[str, int]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SimError(self._failure("the ns-3 fork server stopped"))
        reply: dict[str, int] = json.loads(line)
        if "exited" in reply:
            self.exits[reply["exited"]] = reply["code"]
        return reply

    def _failure(self, what: str) -> str:
        return f"{what} (exit {self.proc.wait()}); last output:\n{_tail(self.log)}"

    def start(self, ident: int, files: tuple[Path, Path, Path, Path]) -> int:
        """Fork run ``ident`` of the config in ``files``; its pid."""
        conf, res, flows, log = (str(f) for f in files)
        request = {"id": ident, "config": conf, "result": res, "flows": flows, "log": log}
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise SimError(self._failure("the ns-3 fork server stopped")) from None
        while (reply := self._reply()).get("started") != ident:
            pass
        return reply["pid"]

    def next_exit(self) -> tuple[int, int]:
        """(run id, exit code) of a run that has ended, once one has."""
        while not self.exits:
            self._reply()
        ident = next(iter(self.exits))
        return ident, self.exits.pop(ident)

    def close(self) -> None:
        """The server kills the runs still going and exits when its stdin closes."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with contextlib.suppress(BrokenPipeError):  # (a server that died first)
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


def _start(server: _ForkServer, ident: int, cfg: SimConfig, out_dir: Path) -> _Job:
    name = run_name(cfg)
    files = tuple(out_dir / f"{name}{ext}" for ext in
                  (".config.json", ".result.json", ".flows.csv", ".log"))  # fmt: skip
    files[0].write_text(json.dumps(cfg.to_dict()))
    started = time.monotonic()
    return _Job(name, cfg, server.start(ident, files), started, files)  # type: ignore[arg-type]


def _finish(job: _Job) -> dict[str, Any]:
    _conf, res, flows, log = job.files
    if job.returncode != 0 or not res.exists():
        # (a run that failed before it opened its log said why in the server's)
        said = log if log.exists() else log.parent / SERVER_LOG
        raise SimError(
            f"simulation {job.name} failed (exit {job.returncode}); last output:\n{_tail(said)}"
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
    running: dict[int, _Job] = {}  # by index in configs, the runs' ids
    results: dict[int, dict[str, Any]] = {}
    total = len(configs)
    if not total:
        return []
    say(f"loading ns-3 ({total} run{'s' if total > 1 else ''} to fork from it)")
    server = _ForkServer(out_dir / SERVER_LOG)
    try:
        while pending or running:
            while pending and len(running) < max(1, jobs):
                i, cfg = pending.pop(0)
                running[i] = job = _start(server, i, cfg, out_dir)
                say(f"[{len(results) + len(running)}/{total}] started {job.name}")
            i, code = server.next_exit()
            job = running.pop(i)
            job.returncode = code
            results[i] = _finish(job)
            r = results[i]
            say(
                f"[{len(results)}/{total}] done {job.name}: mean FCT "
                f"{r['fct_mean_us']:.1f} us, p99 {r['fct_p99_us']:.1f} us, iteration "
                f"{r['iteration_mean_us']:.1f} us, loss {100 * r['loss_fraction']:.2f} % "
                f"({r['process_wall_s']:.0f} s)"
            )
    finally:
        server.close()
    return [results[i] for i in range(total)]
