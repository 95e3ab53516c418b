"""Child processes and the signals that stop them.

Children started with :func:`dies_with_this_process` as their ``preexec_fn`` get
SIGKILL when this process dies. A child that leads its own process group (started
with ``start_new_session``) is stopped with what it started in turn:
:func:`hold_group` keeps a pidfd that names its group even after the child is
reaped, and :func:`stop_groups` terminates the groups, then kills what outlives
a grace period. :func:`end_process` does the same for one process by its handle.

On the signal side, :func:`sigterm_interrupts` turns SIGTERM into
KeyboardInterrupt for a command, :func:`install_stop_handlers` makes SIGTERM and
SIGHUP raise :class:`Interrupted` while children run, and
:func:`signals_ignored` keeps a second Ctrl-C from cutting the stopping short.

:mod:`dlcp.launch` starts and watches ranks with these; the testbed, the
benchmarks and the simulator start their helpers with them.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .errors import DLCPError

__all__ = [
    "Interrupted",
    "die_with_parent",
    "dies_with_this_process",
    "end_process",
    "exited_unreaped",
    "hold_group",
    "install_stop_handlers",
    "signals_ignored",
    "sigterm_interrupts",
    "stop_groups",
]


# ---------------------------------------------------------------- children


def exited_unreaped(pid: int) -> bool:
    """Whether child ``pid`` has exited but is not reaped yet (a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # (reaped meanwhile)
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def die_with_parent(parent: int | None = None) -> None:  # pragma: no cover - in the child
    """In a child: it gets SIGKILL when its parent dies, even by SIGKILL
    (``PR_SET_PDEATHSIG``; it survives the ``execve`` of ``ip netns exec``, which
    runs the command in the same process). Only the child itself: what it starts
    in turn is left behind if the launcher is SIGKILLed (as under torchrun); the
    launcher's own exit stops whole rank groups.

    A parent that died before the signal was set sends none: with ``parent``
    (the pid the child was forked from), a child whose parent is already another
    kills itself. As a ``preexec_fn`` use :func:`dies_with_this_process`."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


def dies_with_this_process() -> Callable[[], None]:
    """A ``preexec_fn`` for children that must not outlive this process:
    :func:`die_with_parent` with this process's pid, so that a child whose parent
    died between the fork and the ``prctl`` (a launcher killed at once) dies too."""
    return functools.partial(die_with_parent, os.getpid())


def stop_groups(procs: Sequence[subprocess.Popen[bytes]], grace: float) -> None:
    """Terminate every rank's process group (the rank and what it started); kill
    what outlives ``grace``. Each group is named by its rank's pid, the id this
    launcher got from starting it."""
    for proc in procs:
        _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
    for proc in procs:  # what a rank started and left behind
        _signal_group(proc, signal.SIGKILL)


def end_process(proc: subprocess.Popen[Any], grace: float) -> None:
    """Terminate ``proc`` (by its handle), and kill it if it outlives ``grace``
    seconds; returns once it is reaped."""
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


#: pidfd_send_signal flag (Linux 6.9+): signal the pidfd's process group
_PIDFD_SIGNAL_PROCESS_GROUP = 4
#: a pidfd per rank, opened right after the start: it names that process (and
#: through it its group) even after the rank is reaped and its pid reused
_GROUP_FDS: weakref.WeakKeyDictionary[subprocess.Popen[bytes], int] = weakref.WeakKeyDictionary()


def hold_group(proc: subprocess.Popen[bytes]) -> None:
    """Keep a pidfd of ``proc``, just started as the leader of its own process
    group, so that :func:`stop_groups` reaches that group after ``proc`` is reaped
    (nothing where the kernel has no pidfds: then by pid)."""
    if not hasattr(os, "pidfd_open"):
        return
    try:
        fd = os.pidfd_open(proc.pid)
    except OSError:
        return  # (pidfds refused: _signal_group falls back to the pid)
    _GROUP_FDS[proc] = fd
    weakref.finalize(proc, os.close, fd)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Signal the rank's process group. Through the rank's pidfd where the
    kernel can (6.9+), which reaches the group the rank led even after the rank
    was reaped, and nothing else; else by pid, while the rank is not reaped or
    its group still has members (a reaped rank's pid with an empty group may
    name someone else's group by now)."""
    fd = _GROUP_FDS.get(proc)
    if fd is not None:
        try:
            signal.pidfd_send_signal(fd, sig, None, _PIDFD_SIGNAL_PROCESS_GROUP)
            return
        except ProcessLookupError:
            return  # the group is empty
        except OSError:
            pass  # (an older kernel: no group flag)
    if proc.returncode is None or _group_has_members(proc.pid):
        # (a pid that is some process's group id is not given to a new process, so
        # while the group has members the pid still names the rank's group)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)


def _group_has_members(pgid: int) -> bool:
    """Whether a process in process group ``pgid`` runs (from /proc)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[0] != b"Z" and int(fields[2]) == pgid:
            return True
    return False


# ---------------------------------------------------------------- signals


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While inside, SIGTERM raises KeyboardInterrupt (in the main thread): a
    command unwinds on it as on Ctrl-C, and its ``finally`` blocks remove what it
    built."""

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class Interrupted(DLCPError):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


#: signals that stop the ranks as Ctrl-C does (a closed terminal: SIGHUP)
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def install_stop_handlers() -> dict[int, Any]:
    """SIGTERM and SIGHUP raise in the main thread, so the children are stopped as
    on Ctrl-C. Returns the handlers replaced (to restore); from another thread,
    where a handler was installed from C, or where the signal is ignored (``nohup``
    ignores SIGHUP so that the job outlives the terminal), it is left alone."""

    def on_term(signum: int, frame: object) -> None:
        raise Interrupted(signum)

    if threading.current_thread() is not threading.main_thread():
        return {}
    previous: dict[int, Any] = {}
    for signum in _STOP_SIGNALS:
        handler = signal.getsignal(signum)
        if handler is None or handler is signal.SIG_IGN:  # from C (not restorable), or nohup
            continue
        previous[signum] = handler
        signal.signal(signum, on_term)
    return previous


@contextlib.contextmanager
def signals_ignored() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP ignored while the block runs (in the main
    thread; elsewhere nothing changes), then their handlers back: a second
    Ctrl-C must not cut the stopping of the ranks short and leave some running."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    changed: dict[int, Any] = {}
    try:
        for s in (signal.SIGINT, *_STOP_SIGNALS):
            handler = signal.getsignal(s)
            if handler is not None:  # (None: installed from C, left alone)
                signal.signal(s, signal.SIG_IGN)
                changed[s] = handler
        yield
    finally:  # every handler changed comes back, also if a signal came in between
        for signum, old in changed.items():
            signal.signal(signum, old)
