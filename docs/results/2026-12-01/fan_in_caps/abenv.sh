# ABAB over environment settings A="$A" B="$B" (e.g. A="DLCP_SNDBUF=4194304"); COLL, SCEN, EXTRA
cd /work/main
for r in 1 2; do for v in A B; do
  out=/tmp/share/${TAG:-x}_${v}_${r}
  rm -rf $out
  env ${!v} TRIAL_COLLECTIVE=${COLL:-halving-doubling} .venv/bin/dlcp testbed run --scenario ${SCEN:-clean} --transport dlcp --epochs 3 --hidden 1024 ${EXTRA} --results $out 2>&1 | grep -o "accuracy.*ms/iter" | tr '\n' ' '
  python3 -c "
import json,glob;d=json.load(open(glob.glob('$out/*-dlcp*.json')[0]));print(d['train']['collective'], 'lost', d['lost_fraction'], 'resent', d['retransmissions'], end=' ')"
  echo " $v: ${!v}"
done; done
