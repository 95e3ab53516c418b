"""The operating system's name for DLCP's threads.

Python 3.11 names its threads only for Python: ``top -H``, ``ps -L``, ``perf``
and ``/proc/<pid>/task/*/comm`` show every thread of a training process as
``python``. DLCP's threads name themselves when they start (``dlcp-io-<rank>``,
``dlcp-ddp-hook``, ``dlcp-pg-<rank>``), so that where a process's CPU goes can
be read per thread: the I/O thread, the transport thread, the training loop.
"""

from __future__ import annotations

import ctypes
import sys

__all__ = ["OS_NAME_MAX", "name_os_thread"]

#: bytes Linux keeps of a thread's name (16 with the terminating NUL)
OS_NAME_MAX = 15
_PR_SET_NAME = 15


def name_os_thread(name: str) -> bool:
    """Give the calling thread ``name`` (cut to :data:`OS_NAME_MAX` bytes) in
    the kernel's view. False where that is not available (not Linux, no C
    library), which changes nothing else."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        raw = name.encode("utf-8", "replace")[:OS_NAME_MAX]
        return int(libc.prctl(_PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False
