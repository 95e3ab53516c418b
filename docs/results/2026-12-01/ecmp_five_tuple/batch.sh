#!/bin/bash
# The testbed with the routers' ECMP hash on the 5-tuple (policy 3), both transports.
# Run as root from the repository's root; each run writes its JSON under /tmp/eh/.
run() { # transport scenario link_rate round
  .venv/bin/dlcp testbed run --scenario "$2" --transport "$1" --epochs 3 --hidden 1024 \
    --link-rate "$3" --results "/tmp/eh/$2$3_$1_$4" > "/tmp/eh/$2$3_$1_$4.log" 2>&1
  echo "$2$3_$1_$4 rc=$?" >> /tmp/eh/status
}
run gloo loss 50 1; run dlcp loss 50 1; run gloo loss 50 2; run dlcp loss 50 2
run gloo loss 50 3; run dlcp loss 50 3
run gloo clean 50 1; run dlcp clean 50 1
run gloo loss 200 1; run dlcp loss 200 1; run gloo loss 200 2; run dlcp loss 200 2
echo done >> /tmp/eh/status
