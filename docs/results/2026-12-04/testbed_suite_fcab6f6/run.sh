#!/bin/bash
# The testbed suite at 200 Mbit/s (the default), wide model, twice, at the commit named in
# each JSON's code_rev.
cd /work/main
for r in 1 2; do
  .venv/bin/python -m dlcp.cli testbed suite --epochs 3 --hidden 1024 --results /tmp/suite200/round-$r > /tmp/suite200/round-$r.log 2>&1
done
echo done > /tmp/suite200/DONE
