"""The worker processes of ``dlcp.bench.transport`` as the parent sees them: each
started with its stdout split into JSON messages, waited on together, stopped
by its process handle (see the line protocol in ``dlcp/bench/transport.py``)."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from typing import IO, Any

from dlcp.errors import DLCPError
from dlcp.processes import dies_with_this_process, end_process

__all__ = ["WorkerError", "WorkerProc", "collect"]


class WorkerError(DLCPError, RuntimeError):
    """A worker crashed, answered an error, or did not answer in time."""


@dataclass
class WorkerProc:
    """A running worker: its process handle, and its stdout split into messages."""

    name: str
    proc: subprocess.Popen[bytes]
    stderr: IO[bytes]
    buf: bytes = b""
    lines: deque[dict[str, Any]] = field(default_factory=deque)

    @classmethod
    def start(cls, name: str, argv: list[str], env: dict[str, str]) -> WorkerProc:
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop())
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
            preexec_fn=dies_with_this_process(),
        )
        return cls(name, proc, stderr)

    def send(self, op: str, **fields: Any) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps({"op": op, **fields}) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise self.crashed() from None

    def feed(self, chunk: bytes) -> None:
        """Take bytes read from the worker's stdout (b"" = it closed)."""
        if not chunk:
            raise self.crashed()
        self.buf += chunk
        *complete, self.buf = self.buf.split(b"\n")
        for raw in complete:
            try:
                msg = json.loads(raw)
            except ValueError:
                raise WorkerError(
                    f"{self.name} worker wrote a non-protocol line: {raw[:200]!r}"
                ) from None
            if not msg.get("ok"):
                raise WorkerError(
                    f"{self.name} worker failed in {msg.get('op')!r}: "
                    f"{msg.get('error')}\n{msg.get('traceback', '')}"
                )
            self.lines.append(msg)

    def stderr_tail(self, n: int = 15) -> str:
        self.stderr.seek(0)
        lines = self.stderr.read().decode(errors="replace").splitlines()
        return "\n".join("    " + s for s in lines[-n:])

    def crashed(self) -> WorkerError:
        try:
            code: int | None = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            how = "closed its stdout"
        elif code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with code {code}"
        tail = self.stderr_tail()
        return WorkerError(
            f"{self.name} worker (pid {self.proc.pid}) {how}; "
            + (f"its stderr ends:\n{tail}" if tail else "it wrote nothing to stderr")
        )

    def stop(self) -> None:
        """Ask it to quit, then terminate, then kill: always by this handle."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError, WorkerError):
                self.send("quit")
            try:
                self.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                end_process(self.proc, 3)
        for f in (self.proc.stdin, self.proc.stdout, self.stderr):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()


def collect(
    workers: list[WorkerProc], want: dict[str, int], timeout: float, what: str
) -> dict[str, list[dict[str, Any]]]:
    """Wait until each worker named in ``want`` has sent that many messages.
    Both workers are watched, so a crash of either surfaces at once."""
    deadline = time.monotonic() + timeout
    by_name = {w.name: w for w in workers}
    with selectors.DefaultSelector() as sel:
        for w in workers:
            assert w.proc.stdout is not None
            sel.register(w.proc.stdout, selectors.EVENT_READ, w)
        while any(len(by_name[n].lines) < k for n, k in want.items()):
            left = deadline - time.monotonic()
            if left <= 0:
                late = [n for n, k in want.items() if len(by_name[n].lines) < k]
                raise WorkerError(
                    f"{' and '.join(late)} worker{'s' * (len(late) > 1)} did not answer {what} "
                    f"within {timeout:g} s"
                )
            for key, _ in sel.select(left):
                key.data.feed(os.read(key.fd, 1 << 16))
    return {n: [by_name[n].lines.popleft() for _ in range(k)] for n, k in want.items()}
