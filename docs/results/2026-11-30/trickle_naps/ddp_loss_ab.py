"""ddp_ab.py inside the DDP benchmark's lossy place (a namespace whose loopback has
MTU 1500 and offloads off, nftables dropping LOSS % of its packets), as root:

    LOSS=1 python ddp_loss_ab.py ITERS
"""

import os
import sys
from pathlib import Path

from dlcp.bench.ddp import _tcp_timers_like_dlcp
from dlcp.launch import launch
from testbed.netns import netns_loopback

here = Path(__file__).resolve().parent
with netns_loopback(mtu=1500) as box:
    box.set_offloads(on=False)
    _tcp_timers_like_dlcp(box)
    box.set_loss(float(os.environ.get("LOSS", "1")))
    argv = box.exec_argv(
        [
            "env",
            f"PYTHONPATH={os.environ.get('PYTHONPATH', '')}",
            sys.executable,
            str(here / "ddp_ab.py"),
            sys.argv[1],
        ]
    )
    result = launch(argv, 4, timeout=1800)
    sys.exit(result.returncode)
