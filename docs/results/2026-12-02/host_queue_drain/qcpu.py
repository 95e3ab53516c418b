"""Four rounds of tests/io/test_host_queue_limit.py's sender with the endpoint's pacer in
a namespace whose loopback drains at 50 Mbit/s, twice: the most the host's queue held
in each round (as charged), and the sending process's CPU seconds and voluntary
context switches. Root, from the root of the tree whose engine it runs:
    .venv/bin/python docs/results/2026-12-02/host_queue_drain/qcpu.py
(the base tree's test file lacks the sender used here: point TEST at this tree's:
    TEST=/path/to/this/tree/tests/io/test_host_queue_limit.py)"""

import importlib.util
import json
import os
import sys

path = os.environ.get("TEST", "tests/io/test_host_queue_limit.py")
spec = importlib.util.spec_from_file_location("host_queue_limit", path)
assert spec is not None and spec.loader is not None
hq = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hq)
from testbed.netns import netns_loopback  # noqa: E402

src = hq._SENDER.replace(
    'print(json.dumps({"rounds": rounds, "sent": sent}))',
    "import resource; ru = resource.getrusage(resource.RUSAGE_SELF); "
    'print(json.dumps({"rounds": [r["most"] for r in rounds], '
    '"cpu_s": round(ru.ru_utime + ru.ru_stime, 3), "voluntary_switches": ru.ru_nvcsw}))',
)
with netns_loopback() as box:
    hq._shape(box)
    for _ in range(2):
        proc = box.run([sys.executable, "-c", src, "on", json.dumps(hq._ENDPOINT_PACER), "4"],
                       check=False)  # fmt: skip
        print(proc.stdout.strip(), proc.stderr[-300:])
