# Alternates TRIAL_JOIN=0 (whole windows) and 1 (early reports) over two rounds, with
# trial_join.diff applied. COLL=halving-doubling SCEN=clean (default) or COLL=ps SCEN=incast.
cd /work/main
for r in 1 2; do for v in 0 1; do
  out=/tmp/tbj/hd_${v}_${r}
  TRIAL_COLLECTIVE=${COLL:-halving-doubling} TRIAL_JOIN=$v .venv/bin/dlcp testbed run --scenario ${SCEN:-clean} --transport dlcp --epochs 3 --hidden 1024 ${EXTRA} --results $out 2>&1 | grep -o "accuracy.*ms/iter\|ranks .*CPU s" | tr '\n' ' '
  python3 -c "
import json,glob;d=json.load(open(glob.glob('$out/*-dlcp*.json')[0]));print(d['train']['collective'], 'lost', d['lost_fraction'], 'resent', d['retransmissions'], end=' ')"
  echo " join=$v"
done; done
