"""Runs another record's ring script with halving-doubling in place of the ring:
``dlcp.collectives.ring.ring_allreduce`` is replaced, before the script runs, by a
function of that name that calls ``halving_doubling_allreduce`` (named as the ring's,
so that a script that trims call chains at the ring's frame trims them there). The
script's own arguments follow its path; launched as the script itself is, e.g.

    DLCP_FINISH_TIMEOUT=5 DEPTH=1 MIN=100000 python -c "import sys; from dlcp.launch
        import launch; launch([sys.executable, 'as_halving.py',
        '../ddp_bytecodes/ring_by_phase.py', '4', '6250000', '0.05'], 4, timeout=800)"
"""

import runpy
import sys
from typing import Any

import dlcp.collectives.ring as ring
from dlcp.collectives import halving_doubling_allreduce


def ring_allreduce(*args: Any, **kwargs: Any) -> Any:
    return halving_doubling_allreduce(*args, **kwargs)


ring.ring_allreduce = ring_allreduce  # type: ignore[assignment]
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
