import os
import sys

from dlcp.launch import launch

script = os.environ.get("SCRIPT", "/work/prompts/ring_prof.py")
r = launch([sys.executable, "-u", script], 4, stdout=sys.stdout, stderr=sys.stderr, timeout=300)
print(r.returncode, r.message)
