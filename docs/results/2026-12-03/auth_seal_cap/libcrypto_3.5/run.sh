#!/usr/bin/env bash
# The same transport benchmark with the system's libcrypto (OpenSSL 3.0.19) and with
# OpenSSL 3.5.8's (LD_LIBRARY_PATH to a libcrypto.so.3 of that version), in turns;
# then the authentication micro-benchmark under each.
set -u
cd /tmp/w/tree
export PYTHONPATH=/tmp/w/tree
LIB35=/tmp/w/ossl/lib
B=".venv/bin/python -m dlcp.bench.transport --json --no-progress --lossless-repetitions 12 --repetitions 1"
for round in 1 2 3 4 5 6; do
  $B > /tmp/w/auth35/ossl30_$round.out 2>&1
  LD_LIBRARY_PATH=$LIB35 $B > /tmp/w/auth35/ossl35_$round.out 2>&1
done
for round in 1 2; do
  .venv/bin/python -m dlcp.bench.auth --json > /tmp/w/auth35/bench_auth_ossl30_$round.json 2>&1
  LD_LIBRARY_PATH=$LIB35 .venv/bin/python -m dlcp.bench.auth --json > /tmp/w/auth35/bench_auth_ossl35_$round.json 2>&1
done
echo done
