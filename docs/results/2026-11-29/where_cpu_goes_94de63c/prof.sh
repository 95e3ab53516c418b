#!/bin/bash
# Profile the whole machine (perf, 8 s at 1,999 Hz) while 4 ranks run a script's
# measured loop: the script prints LOOPSTART once warmed up, and perf starts when
# all 4 have. Run from this folder as root:
#   SCRIPT=ring_mark.py bash prof.sh ring.data      (or floor_mark.py)
#   perf report -i ring.data --sort comm,dso --no-children -g none \
#       -F overhead,sample,comm,dso | grep % > ring.comm_dso.txt
#   python cpu_table.py ring.comm_dso.txt 8.0 SECONDS_PER_CALL
set -e
out=${1:?perf output file}
here=$(cd "$(dirname "$0")" && pwd)
marks=$(mktemp)
(N_CALLS=${N_CALLS:-200} SCRIPT=$here/${SCRIPT:-ring_mark.py} \
    python "$here/../io_turn_e519cb9/launch_prof.py" > "$marks" 2>&1) &
job=$!
until [ "$(grep -c LOOPSTART "$marks")" -ge 4 ]; do
    kill -0 $job 2>/dev/null || { cat "$marks"; exit 1; }
    sleep 0.2
done
perf record -F 1999 -g -a -o "$out" -- sleep "${SECS:-8}"
wait $job
grep -E "wall" "$marks"
rm -f "$marks"
