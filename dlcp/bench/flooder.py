"""The junk flooder (``dlcp/bench/flooder.c``): built with the C compiler on first use,
run as a process of its own, so that it has a core to itself and none of this
process's GIL.

    with Flooder(("127.0.0.1", port), kind="header", job=7) as flood:
        ...                     # the receiver is flooded meanwhile
    flood.result                # {"sent": ..., "errors": ..., "seconds": ..., "rate": ...}

``kind`` is ``random`` (1-1472 random bytes) or ``header`` (a DLCP data header's
version, type and job id, then random bytes); ``rate`` is datagrams per second,
0 for as fast as one core sends them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

from dlcp.errors import BenchError

__all__ = ["Flooder", "FlooderError", "build"]

SOURCE = Path(__file__).with_name("flooder.c")
KINDS = ("random", "header")


class FlooderError(BenchError):
    """The flooder could not be built or did not run as it should."""


def build() -> Path:
    """The flooder's executable, compiled from :data:`SOURCE` unless a build of
    this exact source is there already (named by the source's hash)."""
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:16]
    exe = Path(tempfile.gettempdir()) / f"dlcp-flooder-{digest}"
    if exe.exists():
        return exe
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise FlooderError("no C compiler (cc, gcc or $CC) to build dlcp/bench/flooder.c")
    partial = exe.with_name(f"{exe.name}.{os.getpid()}")
    done = subprocess.run(
        [cc, "-O2", "-Wall", "-o", str(partial), str(SOURCE)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise FlooderError(f"building dlcp/bench/flooder.c failed: {done.stderr.strip()}")
    partial.replace(exe)  # (atomic: a concurrent build finds one or the other)
    return exe


class Flooder:
    """The flooder process, sending junk to ``address`` while the block runs (at
    most ``seconds``). ``result`` holds its report once the block ends."""

    def __init__(
        self,
        address: tuple[str, int],
        *,
        kind: str = "random",
        job: int = 0,
        seed: int = 1,
        rate: float = 0,
        seconds: float = 600,
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r}: the flooder sends {' or '.join(KINDS)} junk")
        host, port = address
        self._argv = [
            str(build()),
            host,
            str(port),
            str(seconds),
            kind,
            str(job),
            str(seed),
            str(rate),
        ]
        self._proc: subprocess.Popen[str] | None = None
        self.result: dict[str, Any] | None = None

    def __enter__(self) -> Flooder:
        self._proc = proc = subprocess.Popen(
            self._argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()  # once its socket is connected
        if line.strip() != "ready":
            self._stop()
            raise FlooderError(f"the flooder did not start: {line.strip() or 'no output'}")
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop()

    def _stop(self) -> None:
        proc = self._proc
        if proc is None:
            return
        self._proc = None
        if proc.poll() is None:
            proc.terminate()  # it reports what it sent and exits
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise FlooderError(f"the flooder exited with status {proc.returncode}: {err.strip()}")
        lines = out.strip().splitlines()
        if lines and lines[-1].startswith("{"):
            self.result = json.loads(lines[-1])
