#!/bin/bash
# Probe (wrong by design): the 64-head kernel's score product reads its A operand from the block's
# own tile (NB_QTILE=1), so q takes no shared memory and a third tile fits. Same work a block;
# two tiles against three measures what one more tile in flight is worth.
export NOPEBENCH_GIT_SHA=$(cat .sha)
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site
W=/tmp/w; mkdir -p $W
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $W/gpu.txt
T0=$(date +%s)
run() {  # tag rep cases variants env...
  tag=$1-r$2; cases=$3; v=$4; shift 4
  env "$@" OUT=$W/$tag timeout 150 python3 tools/tune_native.py --hopper --modes nope \
    --cases $cases --variants "$v" > $W/$tag.log 2>&1
  echo "$tag rc=$? t=$(( $(date +%s) - T0 ))s" >> $W/progress.txt
}
V64='[{"kernel":"hopper_wide","q_regs":0,"slots":3},{"kernel":"hopper_wide","q_regs":0,"kv_bufs":3},{"kernel":"hopper_wide","q_regs":0,"slots":3,"pv_split":true,"helpers":8},{"kernel":"hopper_wide","q_regs":0,"kv_bufs":3,"pv_split":true,"helpers":8}]'
V128='[{"kernel":"hopper_wide","q_regs":0},{"kernel":"hopper_wide","q_regs":0,"kv_bufs":3}]'
for r in 1 2; do
  run plan $r 64x128,64x512,128x128,128x512 '[{"kernel":"hopper_wide"}]' X=0
  run qtile64 $r 64x128,64x512 "$V64" NB_QTILE=1
  run qtile128 $r 128x128,128x512 "$V128" NB_QTILE=1
  [ $(( $(date +%s) - T0 )) -gt 330 ] && break
done
tar czf $OUT/qtile.tgz -C $W .
cat $W/progress.txt
for f in $W/*/tune.csv; do echo "== $f"; cut -d, -f1-30 $f | head -20; done 2>/dev/null | head -80
