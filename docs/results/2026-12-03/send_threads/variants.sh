#!/bin/bash
# dlcp.bench.transport, short runs, each engine variant in turn, twice; the lossless
# offloads-off figures of each run (DLCP, TCP, the UDP floor GB/s) and the loss medians
cd "$(git rev-parse --show-toplevel)"
OUT=${OUT:-/tmp/ooff}
mkdir -p "$OUT"
for round in ${ROUNDS:-1 2}; do
  for v in ${VARIANTS:-native threads2 copy python}; do
    case $v in
      native) env=(); extra=();;
      threads2) env=(DLCP_ENGINE_THREADS=2); extra=();;
      copy) env=(); extra=(--copy-send);;
      python) env=(DLCP_ENGINE=python); extra=();;
    esac
    env "${env[@]}" timeout 900 .venv/bin/python -m dlcp.bench.transport --json --no-progress \
      --lossless-repetitions 4 --repetitions 6 "${extra[@]}" > $OUT/${v}_$round.json 2> $OUT/${v}_$round.err
    python3 -c "
import json,sys; d=json.loads(open('$OUT/${v}_$round.json').read().splitlines()[-1])
o=d['offloads_off_lossless']
print('$v', $round, d['engine'], d.get('engine_threads'), 'on: dlcp %.3f tcp %.3f' % (d['dlcp_lossless_gbps'], d['tcp_lossless_gbps']), 'off: dlcp %.3f tcp %.3f floor %.3f' % (o['dlcp_gbps'], o['tcp_gbps'], d['udp_floor_offloads_off_gbps']), 'loss median ratio', d.get('ratio_loss_median'), 'p99', d.get('ratio_loss_p99'))
" >> $OUT/summary.txt
  done
done
