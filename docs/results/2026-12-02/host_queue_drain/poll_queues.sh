#!/bin/bash
# While a testbed run is up: every host namespace's tbf backlog (tc -s qdisc), sampled
# in turn for DURATION seconds, one file of byte counts per host in OUT; then the
# median, 90th percentile and most of each. Root. (tc prints large backlogs as "NNNK".)
out=${OUT:-/tmp/queue_polls}; mkdir -p "$out"; rm -f "$out"/*.txt
end=$(( $(date +%s) + ${DURATION:-30} ))
while [ "$(date +%s)" -lt $end ]; do
  for ns in $(ip netns list | awk '{print $1}' | grep -E -- '-0h[0-9]$'); do
    ip netns exec "$ns" tc -s qdisc show 2>/dev/null |
      awk '/^qdisc tbf/ {t=1} t && /backlog/ {b=$2; sub("b$","",b); if (b ~ /K$/) {sub("K$","",b); b*=1000} print b; exit}' \
      >> "$out/${ns##*-}.txt"
  done
done
for f in "$out"/*.txt; do
  sort -n "$f" | awk -v f="$(basename "$f" .txt)" '{a[NR]=$1} END {print f, "n=" NR, "p50", a[int(NR/2)+1], "p90", a[int(NR*0.9)+1], "max", a[NR]}'
done
