# ABAB over TRIAL_SHARE values given in $VALS; COLL, SCEN, EXTRA as in fan_in_reports/ab.sh
cd /work/main
for r in 1 2; do for v in ${VALS:-1.0 1.05}; do
  out=/tmp/share/${TAG:-x}_${v}_${r}
  rm -rf $out
  TRIAL_COLLECTIVE=${COLL:-halving-doubling} TRIAL_SHARE=$v .venv/bin/dlcp testbed run --scenario ${SCEN:-clean} --transport dlcp --epochs 3 --hidden 1024 ${EXTRA} --results $out 2>&1 | grep -o "accuracy.*ms/iter" | tr '\n' ' '
  python3 -c "
import json,glob;d=json.load(open(glob.glob('$out/*-dlcp*.json')[0]));print(d['train']['collective'], 'lost', d['lost_fraction'], 'resent', d['retransmissions'], end=' ')"
  echo " share=$v"
done; done
