#!/usr/bin/env bash
# A/B of where the authenticated path's time goes: the same bench.transport run with the
# receiver's tag check skipped (TRIAL_SKIP_VERIFY), with the sender's seal skipped too
# (TRIAL_SKIP_SEAL), and unchanged; then at MTU 9000. Rounds alternate the conditions.
set -u
cd /work/main
B=".venv/bin/python -m dlcp.bench.transport --json --no-progress --lossless-repetitions 12 --repetitions 1"
for round in 1 2 3 4 5 6; do
  $B > /tmp/w/auth2/base_$round.out 2>&1
  TRIAL_SKIP_VERIFY=1 $B > /tmp/w/auth2/noverify_$round.out 2>&1
  TRIAL_SKIP_VERIFY=1 TRIAL_SKIP_SEAL=1 $B > /tmp/w/auth2/noverify_noseal_$round.out 2>&1
  $B --mtu 9000 > /tmp/w/auth2/mtu9000_$round.out 2>&1
done
echo done
