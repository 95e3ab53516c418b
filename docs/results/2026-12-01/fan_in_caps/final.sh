# old (A: host queue limit off, equal shares unflagged) against new (B: defaults), ABAB
cd /work/main
export A="DLCP_HOST_QUEUE_LIMIT=0 TRIAL_SHARED=0" B="DLCP_HOST_QUEUE_LIMIT=1"
TAG=f_hd200 COLL=halving-doubling bash /tmp/share/abenv.sh > /tmp/share/f_hd200.txt 2>&1
TAG=f_ring200 COLL=ring bash /tmp/share/abenv.sh > /tmp/share/f_ring200.txt 2>&1
TAG=f_inc200 COLL=ps SCEN=incast bash /tmp/share/abenv.sh > /tmp/share/f_inc200.txt 2>&1
TAG=f_ring50 COLL=ring EXTRA="--link-rate 50" bash /tmp/share/abenv.sh > /tmp/share/f_ring50.txt 2>&1
TAG=f_inc50 COLL=ps SCEN=incast EXTRA="--link-rate 50" bash /tmp/share/abenv.sh > /tmp/share/f_inc50.txt 2>&1
echo done > /tmp/share/final.done
