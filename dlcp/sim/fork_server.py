"""Simulations in children forked from one process that has loaded ns-3.

Loading ns-3 and compiling DLCP's C++ model takes ~20 s of CPU here, longer
than most runs of a sweep take to simulate. The fork server loads them once;
every run is a child forked from it before anything has been simulated, so it
starts from the same global state (an empty node list, the default attribute
values, unnumbered random streams) that a fresh interpreter has after loading.
ns-3 starts no thread when it loads, and the runner keeps numpy's OpenBLAS from
starting its worker (``OPENBLAS_NUM_THREADS=1``): the server forks with one
thread, its only one, which makes the fork safe. A run's result
is the same as that of ``python -m dlcp.sim.engine`` in a fresh process
(tests/sim/test_sim_ns3.py compares the per-flow CSVs).

The server speaks JSON lines over its stdin and stdout::

    server:  {"ready": true}                            (once loaded)
    runner:  {"id": ID, "config": ..., "result": ..., "flows": ..., "log": ...}   (paths)
    server:  {"started": ID, "pid": PID}
    server:  {"exited": ID, "code": EXIT_CODE}

(runs are named by the runner's ID, not by pid: the server reaps a run before it
says so, and its pid may be given to another by then). A child writes its
output to the run's log (what goes wrong before that, to the server's stderr)
and exits as ``dlcp.sim.engine``'s ``main`` returns. When the server's stdin
closes it kills the runs still going, reaps them and exits; when the server
dies, even by SIGKILL, its runs get SIGKILL. It needs pidfds (Linux 5.3 or
later), as the ns-3 wheels need Linux.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import sys
import traceback
from typing import Any, NoReturn

from ..errors import DependencyMissing
from ..processes import die_with_parent

__all__ = ["serve"]


def _say(channel: int, message: dict[str, Any]) -> None:
    os.write(channel, (json.dumps(message) + "\n").encode())


def _run_child(request: dict[str, Any], inherited: list[int], server: int) -> int:
    """In the forked child (of ``server``): the run's output to its log, then the
    run; its exit code."""
    die_with_parent(server)  # (a server that died before this kills the child too)
    for fd in inherited:  # the server's: stdin, its replies, the other runs' pidfds
        os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    from .engine import main

    return main([request["config"], request["result"], request["flows"]])


def _child(request: dict[str, Any], inherited: list[int], server: int) -> NoReturn:
    """The forked child's whole life: it never returns into the server's loop
    (whose ``finally`` would kill the other runs), whatever happens."""
    code = 1
    try:
        code = _run_child(request, inherited, server)
    except BaseException:
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
            ctypes.CDLL(None).fflush(None)  # C stdio too (ns-3, cling): _exit skips it
        os._exit(code)


def serve() -> int:
    """The server's loop (``python -m dlcp.sim.fork_server``)."""
    from .engine import load_ns3

    # the replies go out on a descriptor of their own; what ns-3, cling or
    # Python print to stdout goes to stderr with the rest
    replies = os.dup(1)
    os.dup2(2, 1)
    try:
        g = load_ns3()
    except DependencyMissing as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    # cling compiles a class's code when the first object of it is made (~3 s for
    # the DLCP transport): once here, not in every run. Made and dropped without
    # a fabric, these touch no ns-3 state.
    for model in (g.dlcpsim.DlcpTransport, g.dlcpsim.TcpTransport, g.dlcpsim.Scenario):
        model()
    _say(replies, {"ready": True})
    server = os.getpid()
    runs: dict[int, tuple[int, Any]] = {}  # pidfd -> (pid, the runner's id)
    poller = select.poll()
    poller.register(0, select.POLLIN)
    pending = b""
    try:
        while True:
            for fd, _events in poller.poll():
                if fd != 0:
                    pid, ident = runs.pop(fd)
                    poller.unregister(fd)
                    os.close(fd)
                    _, status = os.waitpid(pid, 0)
                    _say(replies, {"exited": ident, "code": os.waitstatus_to_exitcode(status)})
                    continue
                data = os.read(0, 1 << 16)
                if not data:
                    return 0
                pending += data
                *lines, pending = pending.split(b"\n")
                for line in filter(None, lines):
                    request = json.loads(line)
                    sys.stdout.flush()
                    sys.stderr.flush()
                    pid = os.fork()
                    if pid == 0:  # pragma: no cover - the child
                        _child(request, [0, replies, *runs], server)
                    pidfd = os.pidfd_open(pid)
                    runs[pidfd] = (pid, request["id"])
                    poller.register(pidfd, select.POLLIN)
                    _say(replies, {"started": request["id"], "pid": pid})
    finally:
        for pidfd, (pid, _ident) in runs.items():
            os.kill(pid, signal.SIGKILL)  # not yet reaped: the pid is still this server's child
            os.waitpid(pid, 0)
            os.close(pidfd)


if __name__ == "__main__":
    sys.exit(serve())
