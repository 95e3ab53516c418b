#!/usr/bin/env bash
# At 82ef9d8: the authentication micro-benchmark (both backends side by side) and the
# transport benchmark, with the system's libcrypto (OpenSSL 3.0.19: the engines take
# the GCM mode functions) and with OpenSSL 3.5.8's (LD_LIBRARY_PATH to a libcrypto.so.3
# of that version: the engines take EVP), in turns.
set -u
cd /tmp/w/tree
export PYTHONPATH=/tmp/w/tree
LIB35=/tmp/w/ossl/lib
OUT=/tmp/w/evp
for round in 1 2; do
  for dg in 1456 8972; do
    .venv/bin/python -m dlcp.bench.auth --json --datagram-bytes $dg > $OUT/bench_auth_${dg}_ossl30_$round.out 2>&1
    LD_LIBRARY_PATH=$LIB35 .venv/bin/python -m dlcp.bench.auth --json --datagram-bytes $dg > $OUT/bench_auth_${dg}_ossl35_$round.out 2>&1
  done
done
B=".venv/bin/python -m dlcp.bench.transport --json --no-progress --lossless-repetitions 12 --repetitions 1"
for round in 1 2 3 4 5 6; do
  $B > $OUT/ossl30_$round.out 2>&1
  LD_LIBRARY_PATH=$LIB35 $B > $OUT/ossl35_$round.out 2>&1
  $B --mtu 9000 > $OUT/mtu9000_ossl30_$round.out 2>&1
  LD_LIBRARY_PATH=$LIB35 $B --mtu 9000 > $OUT/mtu9000_ossl35_$round.out 2>&1
done
echo done
