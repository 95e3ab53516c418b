"""Counts, per rank process, the messages whose data went first into a buffer of
their own (they came before their receive), into the receive's buffer, and into
a kept buffer: put this folder (ddp_probe/) first on PYTHONPATH and set EARLY_PROBE=1; each
process rewrites /tmp/earlyprobe/out_<pid>.txt at every message. Used with
``python -m dlcp.bench.ddp --json --rounds 1 --no-udp-floor`` at ``c8b20a3``."""

import os

if os.environ.get("EARLY_PROBE"):
    import dlcp.proto.reassembler as ra

    counts = {"own": 0, "posted": 0, "kept": 0}
    orig = ra.Reassembler.__init__

    def init(self, *, out, **kw):
        counts["own" if out is None else "posted"] += 1
        counts["kept"] += kw.get("spare") is not None
        with open(f"/tmp/earlyprobe/out_{os.getpid()}.txt", "w") as f:
            f.write(f"rank {os.environ.get('RANK')} {counts}\n")
        orig(self, out=out, **kw)

    ra.Reassembler.__init__ = init
