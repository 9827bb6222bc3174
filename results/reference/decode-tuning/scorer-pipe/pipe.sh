#!/bin/bash
# The 64-head kernel's scorer (left half of the output) issuing block i + 1's scores before block
# i's softmax (NB_PIPE=1), in 64-row blocks and in 32-row blocks with 3-4 tiles (NB_BN32=1),
# against the plan; each checked against the reference (strict rule) and timed.
export NOPEBENCH_GIT_SHA=$(cat .sha)
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site
W=/tmp/w; mkdir -p $W
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $W/gpu.txt
T0=$(date +%s)
run() {  # tag rep width variants env...
  tag=$1-w$3-r$2; wd=$3; v=$4; shift 4
  env "$@" OUT=$W/$tag timeout 150 python3 tools/tune_native.py --hopper --modes nope \
    --cases 64x64,64x128,64x512 --width $wd --variants "$v" > $W/$tag.log 2>&1
  echo "$tag rc=$? t=$(( $(date +%s) - T0 ))s" >> $W/progress.txt
}
forms() {
  run plan $1 $2 '[{"kernel":"hopper_wide"}]' X=0
  run pipe64 $1 $2 '[{"kernel":"hopper_wide","q_regs":0}]' NB_PIPE=1
  run bn32 $1 $2 '[{"kernel":"hopper_wide","kv_bufs":4}]' NB_BN32=1
  run pipe32 $1 $2 '[{"kernel":"hopper_wide","kv_bufs":4},{"kernel":"hopper_wide","kv_bufs":4,"q_regs":0},{"kernel":"hopper_wide","kv_bufs":3}]' NB_BN32=1 NB_PIPE=1
}
forms 1 2176; forms 2 2176
[ $(( $(date +%s) - T0 )) -lt 330 ] && forms 1 2048
tar czf $OUT/pipe.tgz -C $W .
cat $W/progress.txt
for f in $W/*/tune.csv; do echo "== $f"; python3 -c "
import csv,sys
for r in csv.DictReader(open('$f')): print(r['heads'],r['tokens'],r['width'],'bn',r['block_n'],'kv',r['kv_bufs'],'st',r['num_stages'],'q',r['q_regs'],r['passed'],r['max_abs_err'],r.get('median_ms'),r.get('error','')[:80])
"; done
