"""Pin a dlcp.bench.transport worker to one CPU by its role (diagnostic only):
PIN_SEND_CPU / PIN_RECV_CPU name the CPU of the sending / receiving worker."""

import os

try:
    with open("/proc/self/cmdline", "rb") as f:
        args = f.read().split(b"\0")
    if b"--worker" in args:
        role = args[args.index(b"--worker") + 1].decode()
        cpu = os.environ.get("PIN_" + role.upper() + "_CPU")
        if cpu:
            os.sched_setaffinity(0, {int(cpu)})
except (OSError, IndexError, ValueError):
    pass
