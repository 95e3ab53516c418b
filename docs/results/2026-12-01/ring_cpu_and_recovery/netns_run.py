"""A 4-rank dlcp.launch of the script and arguments given, in a namespace whose loopback
has MTU 1500, segmentation offloads off and 1 % nftables loss (the place of
dlcp.bench.ddp's loss phase); the namespace is removed afterwards. As root, from the
repository's root or with it on PYTHONPATH:

    python netns_run.py timeline.py A 20
"""

import subprocess
import sys

from testbed.netns import netns_loopback

with netns_loopback(mtu=1500) as box:
    box.set_offloads(on=False)
    box.set_loss(1.0)
    code = (
        "import sys; from dlcp.launch import launch; "
        "launch([sys.executable, *sys.argv[1:]], 4, timeout=600)"
    )
    r = subprocess.run(box.exec_argv([sys.executable, "-c", code, *sys.argv[1:]]))
    sys.exit(r.returncode)
