"""Run ``dlcp.bench.core`` with ``perf record`` sampling only inside its timed sections.

    mkfifo ctl ack
    perf record -F 10000 -D -1 --control fifo:ctl,ack -o timed.data \\
        python profile_timed.py ctl ack --repeat 40
    perf report -i timed.data --no-children --sort dso
    perf report -i timed.data --no-children --sort dso,symbol

``one_transfer`` reads the clock in pairs around each piece of session work it
times; here the first clock read of a pair enables perf's sampling and the second
disables it (``perf record -D -1`` starts with sampling off), so the harness that
carries datagrams between the sessions, the warm-up transfer and the numpy copy
stay out of the profile. The fifo handshake of each toggle is in the profile's
kernel part.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import dlcp.bench.core as core


class ToggledClock:
    """``time`` as ``dlcp.bench.core`` sees it, with a ``perf_counter`` that turns
    perf's sampling on at the first read of each pair and off at the second while
    ``active``."""

    def __init__(self, control: Any, ack: Any) -> None:
        self.control, self.ack = control, ack
        self.active = False
        self.sampling = False

    def _tell(self, command: str) -> None:
        self.control.write(command + "\n")
        self.control.flush()
        self.ack.readline()

    def perf_counter(self) -> float:
        if not self.active:
            return time.perf_counter()
        if not self.sampling:
            self._tell("enable")
            self.sampling = True
            return time.perf_counter()
        now = time.perf_counter()
        self._tell("disable")
        self.sampling = False
        return now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def main() -> int:
    control_path, ack_path, *bench_args = sys.argv[1:]
    with open(control_path, "w") as control, open(ack_path) as ack:
        clock = ToggledClock(control, ack)
        core.time = clock  # type: ignore[assignment]
        transfer = core.one_transfer
        transfers = 0

        def profiled_transfer(*args: Any, **kwargs: Any) -> float:
            nonlocal transfers
            transfers += 1
            clock.active = transfers > 1  # not the warm-up
            try:
                return transfer(*args, **kwargs)
            finally:
                clock.active = False

        core.one_transfer = profiled_transfer  # type: ignore[assignment]
        return core.main(bench_args)


if __name__ == "__main__":
    sys.exit(main())
