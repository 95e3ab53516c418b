"""``dlcp launch``: start N local ranks the way ``torchrun`` does, and watch them.

    dlcp launch -n 4 examples/train_digits.py --epochs 3
    dlcp launch -n 4 examples/train_digits.py --transport gloo

Every rank is a child process of this one, started with torchrun's ``env://``
variables: ``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT`` (a free port unless
given), ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE`` (plus
``GROUP_RANK``/``ROLE_RANK``/``ROLE_WORLD_SIZE`` for code that reads them, and
``OMP_NUM_THREADS=1`` unless set, as torchrun does). Their stdout and stderr are
streamed line by line, prefixed with ``[rank<N>]:``.

Nothing here polls or sleeps: one thread per child waits on its ``Popen``
handle and wakes the main loop through a socket pair, and the main loop waits
on that socket and on the children's pipes with a selector. When a rank exits
non-zero (or is killed), the others are terminated by their ``Popen`` handles
(SIGTERM, then SIGKILL after ``grace`` seconds), and the launch fails naming
that rank and its exit code. Ctrl-C (or SIGTERM to the launcher) terminates the
children the same way. Children also get SIGKILL if the launcher itself dies
(Linux ``PR_SET_PDEATHSIG``).

Starting children tied to this process, stopping their process groups and the
signal handling are :mod:`dlcp.processes`; ``die_with_parent``, ``end_process``
and ``sigterm_interrupts`` are also importable from here, as before.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO

from .errors import UsageError
from .keyring import SECRET_ENV, SECRET_FILE_ENV, new_secret
from .ports import free_port
from .processes import (
    Interrupted,
    die_with_parent,
    dies_with_this_process,
    end_process,
    exited_unreaped,
    hold_group,
    install_stop_handlers,
    signals_ignored,
    sigterm_interrupts,
    stop_groups,
)

__all__ = [
    "LaunchResult",
    "die_with_parent",
    "end_process",
    "free_port",
    "launch",
    "rank_env",
    "sigterm_interrupts",
]


@dataclass(frozen=True, slots=True)
class LaunchResult:
    """How a launch ended. ``returncode`` is 0 when every rank exited 0; else the
    exit code of the first rank that failed (128 + signal number if a signal
    killed it), 124 on ``timeout`` and 128 + the signal's number on interruption
    (130 for Ctrl-C, 143 for SIGTERM)."""

    returncode: int
    #: the rank that failed first (None: all succeeded, or timeout/interrupt)
    failed_rank: int | None
    #: each rank's own exit status (negative: killed by that signal), by rank
    exit_codes: tuple[int | None, ...]
    message: str
    #: stopped by Ctrl-C or SIGTERM: a caller running several launches should
    #: stop too (:meth:`raise_if_interrupted`), not go on to the next
    interrupted: bool = False

    def raise_if_interrupted(self) -> None:
        """Pass an interruption on to the caller, as Ctrl-C would have."""
        if self.interrupted:
            raise KeyboardInterrupt(self.message)


def rank_env(
    rank: int, nproc: int, master_port: int, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of local rank ``rank`` of ``nproc`` (torchrun's names)."""
    env = dict(os.environ if base is None else base)
    env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(master_port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        GROUP_RANK="0",
        ROLE_RANK=str(rank),
        WORLD_SIZE=str(nproc),
        LOCAL_WORLD_SIZE=str(nproc),
        ROLE_WORLD_SIZE=str(nproc),
        PYTHONUNBUFFERED="1",
    )
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _exit_status(code: int) -> int:
    """A child's status as a shell would report it (signals as 128 + n)."""
    return 128 - code if code < 0 else code


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


#: a rank's line longer than this (bytes) is written in pieces of this size
MAX_LINE = 64 * 1024


class _Output:
    """Splits one child pipe into lines and writes them, prefixed, to ``sink``. A
    carriage return ends a line too (a progress bar redrawing its line shows each
    redraw), and a line that never ends is written every ``MAX_LINE`` bytes.

    A line that already starts with the prefix's label (``[rank0]:``) is written as
    it is: after ``init_process_group`` torch's excepthook labels every line of a
    traceback that way itself, as its C++ logging does its warnings
    (``[rank0]:[W...]``), and labelling them again showed ``[rank0]: [rank0]:``."""

    def __init__(self, prefix: bytes, sink: IO[str]) -> None:
        self.prefix = prefix
        self.label = prefix.rstrip()
        self.sink = sink
        self.buf = b""

    def feed(self, chunk: bytes) -> None:
        self.buf += chunk
        # (a '\r' that ends the chunk waits: the next chunk may start with its '\n')
        end = len(self.buf) - self.buf.endswith(b"\r")
        whole = self.buf[:end].replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        *lines, rest = whole.split(b"\n")
        self.buf = rest + self.buf[end:]
        while len(self.buf) >= MAX_LINE:
            lines.append(self.buf[:MAX_LINE])
            self.buf = self.buf[MAX_LINE:]
        if lines:
            self._write(lines)

    def close(self) -> None:
        if self.buf:
            self._write([self.buf])
            self.buf = b""

    def _write(self, lines: list[bytes]) -> None:
        text = "".join(
            (line if self.label and line.startswith(self.label) else self.prefix + line).decode(
                errors="replace"
            )
            + "\n"
            for line in lines
        )
        try:
            self.sink.write(text)
            self.sink.flush()
        except BrokenPipeError:
            # the reader went away (``| head``): the ranks run on, unheard
            broken, self.sink = self.sink, open(os.devnull, "w")  # noqa: SIM115 - as long as this
            # (and the interpreter's flush of that stream at exit finds no broken pipe)
            with contextlib.suppress(OSError, ValueError, AttributeError):
                os.dup2(self.sink.fileno(), broken.fileno())


def launch(
    cmd: Sequence[str],
    nproc: int,
    *,
    env: Mapping[str, str] | None = None,
    master_port: int | None = None,
    prefix: bool = True,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
    grace: float = 10.0,
    timeout: float | None = None,
    rank_cmd: Mapping[int, Sequence[str]] | None = None,
    on_start: Callable[[Sequence[int]], None] | None = None,
) -> LaunchResult:
    """Run ``cmd`` as ``nproc`` local ranks and wait for all of them.

    ``env`` replaces ``os.environ`` as the base environment of every rank;
    ``rank_cmd`` gives some ranks a different command. Unless the base
    environment has one already (``DLCP_JOB_SECRET`` or ``DLCP_JOB_SECRET_FILE``),
    the ranks share a fresh job secret in ``DLCP_JOB_SECRET``: authenticated
    endpoints derive their keys from it (:mod:`dlcp.keyring`), and it never goes
    through the rendezvous store. Output goes to
    ``stdout``/``stderr`` (default: this process's). ``timeout`` bounds the
    whole run (the ranks are terminated when it passes). ``on_start`` is called
    with the ranks' process ids, in rank order, once every rank is started and
    before their output is read (a caller that measures the ranks: the testbed's
    CPU accounting).
    """
    if nproc < 1:
        raise UsageError(f"nproc={nproc}: need at least one rank")
    if not cmd:
        raise UsageError("no command to launch")
    out_sink = stdout if stdout is not None else sys.stdout
    err_sink = stderr if stderr is not None else sys.stderr
    port = master_port if master_port is not None else free_port()
    base = dict(os.environ if env is None else env)
    if SECRET_ENV not in base and SECRET_FILE_ENV not in base:
        base[SECRET_ENV] = new_secret()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for rank in range(nproc):
            argv = list((rank_cmd or {}).get(rank, cmd))
            procs.append(
                subprocess.Popen(
                    argv,
                    env=rank_env(rank, nproc, port, base),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    # its own process group, so that stopping a rank stops what it
                    # started too (a wrapper script's python, say)
                    start_new_session=True,
                    preexec_fn=dies_with_this_process() if sys.platform == "linux" else None,
                )
            )
            hold_group(procs[-1])
        if on_start is not None:
            on_start([p.pid for p in procs])
    except BaseException:
        stop_groups(procs, grace)
        raise
    return _Watch(procs, prefix, out_sink, err_sink, grace, timeout).run()


class _Watch:
    def __init__(
        self,
        procs: list[subprocess.Popen[bytes]],
        prefix: bool,
        out_sink: IO[str],
        err_sink: IO[str],
        grace: float,
        timeout: float | None,
    ) -> None:
        self.procs = procs
        self.grace = grace
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = socket.socketpair()
        self.exited: list[int] = []  # ranks, in the order they exited
        self.lock = threading.Lock()
        for rank, proc in enumerate(procs):
            tag = f"[rank{rank}]: ".encode() if prefix else b""
            for pipe, sink in ((proc.stdout, out_sink), (proc.stderr, err_sink)):
                assert pipe is not None
                os.set_blocking(pipe.fileno(), False)
                self.sel.register(pipe, selectors.EVENT_READ, _Output(tag, sink))
        self.sel.register(self.wake_r, selectors.EVENT_READ, None)
        for rank, proc in enumerate(procs):
            threading.Thread(
                target=self._reap, args=(rank, proc), name=f"dlcp-launch-wait-{rank}", daemon=True
            ).start()

    def _reap(self, rank: int, proc: subprocess.Popen[bytes]) -> None:
        proc.wait()
        with self.lock:
            self.exited.append(rank)
        with contextlib.suppress(OSError):
            self.wake_w.send(b"x")

    def run(self) -> LaunchResult:
        previous = install_stop_handlers()
        try:
            return self._loop()
        except (KeyboardInterrupt, Interrupted) as exc:
            signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
            with signals_ignored():  # a second Ctrl-C must not cut the stopping short
                stop_groups(self.procs, self.grace)
                self._drain()
            return self._result(
                128 + signum,
                None,
                f"interrupted ({signal.Signals(signum).name}): ranks terminated",
                interrupted=True,
            )
        finally:
            with signals_ignored():
                stop_groups(self.procs, self.grace)
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self.sel.close()
            self.wake_r.close()
            self.wake_w.close()
            for proc in self.procs:
                for pipe in (proc.stdout, proc.stderr):
                    if pipe is not None:
                        pipe.close()

    def _loop(self) -> LaunchResult:
        seen = 0
        while True:
            with self.lock:
                newly = self.exited[seen:]
            seen += len(newly)
            for rank in newly:
                code = self.procs[rank].returncode
                if code != 0:
                    # let the failing rank's last words (its traceback) through first
                    self._drain(only=rank)
                    others = [r for r in range(len(self.procs)) if self.procs[r].poll() is None]
                    # (one the reaper has not marked yet may have exited by itself)
                    running = [r for r in others if not exited_unreaped(self.procs[r].pid)]
                    stop_groups(self.procs, self.grace)
                    self._drain()
                    return self._result(_exit_status(code), rank, self._ended(rank, running))
            if seen == len(self.procs):
                self._drain()
                return self._result(0, None, f"all {len(self.procs)} ranks exited with code 0")
            wait = None
            if self.deadline is not None:
                wait = self.deadline - time.monotonic()
                if wait <= 0:
                    running = [r for r, p in enumerate(self.procs) if p.poll() is None]
                    stop_groups(self.procs, self.grace)
                    self._drain()
                    return self._result(
                        124, None, f"timed out; terminated ranks {', '.join(map(str, running))}"
                    )
            self._pump(wait)

    def _ended(self, rank: int, running: list[int]) -> str:
        """How a failed launch ended: the first failure, every other rank that
        did not exit 0 with its code, except the ``running`` ones that the
        launcher's signal ended: those are "terminated". (One that exited with a
        code of its own meanwhile, or from a SIGTERM handler, is given its code.)"""
        parts = [f"rank {rank} {_describe(self.procs[rank].returncode)}"]
        stopped = []
        for r, proc in enumerate(self.procs):
            if r in running and proc.returncode in (-signal.SIGTERM, -signal.SIGKILL):
                stopped.append(str(r))
            elif r != rank and proc.returncode not in (0, None):
                parts.append(f"rank {r} {_describe(proc.returncode)}")
        if stopped:
            parts.append(f"terminated rank{'s' if len(stopped) > 1 else ''} {', '.join(stopped)}")
        return "; ".join(parts)

    def _pump(self, wait: float | None) -> None:
        for key, _ in self.sel.select(wait):
            if key.data is None:
                with contextlib.suppress(BlockingIOError):
                    self.wake_r.recv(4096)
                continue
            self._read(key)

    def _read(self, key: selectors.SelectorKey) -> str:
        """Read what one pipe holds now: "data", "empty" (would block) or "eof"."""
        out: _Output = key.data
        try:
            chunk = os.read(key.fd, 65536)
        except BlockingIOError:
            return "empty"
        if chunk:
            out.feed(chunk)
            return "data"
        out.close()
        self.sel.unregister(key.fileobj)
        return "eof"

    def _drain(self, only: int | None = None) -> None:
        """Copy what exited children left in their pipes, without waiting: a pipe
        that a grandchild still holds open is read for what is buffered only."""
        for rank, proc in enumerate(self.procs):
            if only is not None and rank != only:
                continue
            for pipe in (proc.stdout, proc.stderr):
                if pipe is None:
                    continue
                try:
                    key = self.sel.get_key(pipe)
                except (KeyError, ValueError):
                    continue
                while (state := self._read(key)) == "data":
                    pass
                if state == "empty":
                    key.data.close()  # flush a partial last line

    def _result(
        self, code: int, rank: int | None, message: str, *, interrupted: bool = False
    ) -> LaunchResult:
        return LaunchResult(
            code, rank, tuple(p.returncode for p in self.procs), message, interrupted
        )


def _dlcp_settings_error(env: Mapping[str, str]) -> str | None:
    """What is wrong with the ``DLCP_*`` variables the ranks will inherit, if anything
    (checked here only when some are set: the check imports the configuration)."""
    if not any(var.startswith("DLCP_") for var in env):
        return None
    from .settings import check_env

    return check_env(env)


def run_cli(
    nproc: int,
    module: bool,
    target: str,
    args: Sequence[str],
    *,
    no_python: bool = False,
    master_port: int | None = None,
    prefix: bool = True,
    grace: float = 10.0,
) -> int:
    """What ``dlcp launch`` does: launch, then say how it ended on stderr."""
    if no_python and module:
        print("dlcp launch: --no-python and -m exclude each other", file=sys.stderr)
        return 2
    wrong = _dlcp_settings_error(os.environ)
    if wrong is not None:  # one line here, not a traceback from every rank
        print(f"dlcp launch: {wrong}", file=sys.stderr)
        return 2
    if no_python:
        cmd = [target, *args]
    else:
        cmd = [sys.executable, "-u", *(["-m", target] if module else [target]), *args]
    try:
        result = launch(cmd, nproc, master_port=master_port, prefix=prefix, grace=grace)
    except OSError as exc:
        if exc.filename != cmd[0]:  # (a broken pipe to our own stdout, say)
            raise
        # the command cannot be started (no such file, not executable)
        print(f"dlcp launch: cannot start {cmd[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if result.returncode != 0:
        print(f"dlcp launch: {result.message}", file=sys.stderr, flush=True)
    return result.returncode
