#!/bin/bash
# second pairs, in the order B A
source <(sed -n "/^run()/,/^}/p" "$(dirname "$0")/ab.sh")
run B clean 200 2; run A clean 200 2
run A loss 50 2; run B loss 50 2
echo done2 >> /tmp/rp/status
