"""Children that must not outlive the process that started them
(``dlcp.processes.dies_with_this_process``). The parent-death signal is set in the
child after the fork; a parent killed in between sends none, so the child checks
who its parent is once the signal is set and kills itself if that is no longer
the process it was forked from. A fork server whose runner was killed at once
used to load ns-3 for its full 20 s, unseen."""

from __future__ import annotations

import functools
import signal
import subprocess
import sys

from dlcp.processes import die_with_parent, dies_with_this_process

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_child_whose_parent_is_already_another_kills_itself() -> None:
    # (as a child forked from pid 1 would see it: its parent is not pid 1's child
    # here, so the check fails exactly as it does after the real parent died)
    proc = subprocess.Popen(SLEEPER, preexec_fn=functools.partial(die_with_parent, 1))
    assert proc.wait(timeout=30) == -signal.SIGKILL


def test_a_child_of_this_process_lives_until_it_is_stopped() -> None:
    says_up = [sys.executable, "-c", "print('up', flush=True); import time; time.sleep(60)"]
    proc = subprocess.Popen(says_up, preexec_fn=dies_with_this_process(), stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"up\n"  # (past the preexec check and the exec)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
