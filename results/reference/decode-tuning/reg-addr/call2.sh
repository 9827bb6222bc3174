#!/usr/bin/env bash
# Device call: the register kernel's loader with one wide multiply-add a row address (the tree
# with addr.diff applied on the device's copy) against the tree's loader, 16 heads: the register
# kernel's GPU tests with the diff, then each form in a process of its own, alternating new,
# before, new, before at width 2176 and new, before at 2048, the warp-specialised Gluon kernel
# timed in each process as a fixed reference. The tree's own kernel is back in place at the end.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 COLUMNS=200
T0=$(date +%s)
mkdir -p $OUT/reg-addr && R=$OUT/reg-addr
nvidia-smi > $R/nvidia-smi.txt 2>&1; date -u >> $R/nvidia-smi.txt; echo "${SHA:-unset}" >> $R/nvidia-smi.txt
C=nopebench/impls/native/cuda
P=results/reference/decode-tuning/reg-addr/addr.diff
mkdir -p /tmp/new /tmp/before && cp $C/* /tmp/before/
{ git apply "$P" 2>/dev/null || patch -p1 < "$P"; } || { echo "addr.diff does not apply"; exit 1; }
cp $C/* /tmp/new/
cmp -s /tmp/new/register_decode.cuh /tmp/before/register_decode.cuh && { echo "no change"; exit 1; }
echo "== register gpu tests with the diff"
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_native_decode.py -k register > $R/gpu_register.log 2>&1
echo "rc $? after $(( $(date +%s) - T0 )) s"; tail -1 $R/gpu_register.log
V='[{"kernel":"register"},{"kernel":"hopper_ws"}]'
mkdir -p /tmp/tune
run() {  # form width cases tag
  cp /tmp/$1/* $C/
  echo "== $4 at $(( $(date +%s) - T0 )) s"
  OUT=/tmp/tune/$4 timeout 60 python3 tools/tune_native.py --hopper --variants "$V" --cases $3 \
    --width $2 --modes nope,shim > /tmp/tune/$4.log 2>&1
  echo "rc $?"; grep -E "Error|error': '" /tmp/tune/$4.log | head -3
}
run new 2176 16x128,16x256,16x512 new-2176-r1
run before 2176 16x128,16x256,16x512 before-2176-r1
run new 2176 16x128,16x256,16x512 new-2176-r2
run before 2176 16x128,16x256,16x512 before-2176-r2
run new 2048 16x512 new-2048-r1
run before 2048 16x512 before-2048-r1
cp /tmp/before/* $C/
cd /tmp/tune && tar -czf $R/tune.tar.gz . && cd - > /dev/null
python3 tools/ab_summary.py $R/tune.tar.gz $R/addr_vs_before.csv | tee $R/summary.txt
echo "total $(( $(date +%s) - T0 )) s"
