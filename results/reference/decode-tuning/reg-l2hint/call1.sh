#!/usr/bin/env bash
# Device call: the register kernel's 16-byte row copies with an L2 prefetch-size hint
# (cp.async ... .L2::128B and .L2::256B, set by sed on the device's copy of register_decode.cu)
# against the tree's copies without one, 16 heads. First the register kernel's GPU tests with each
# hint; then each form in a process of its own, alternating before, 128B, 256B twice at width
# 2176 and once at 2048, the warp-specialised Gluon kernel timed in each process as a fixed
# reference. The tree's own kernel is back in place at the end.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 COLUMNS=200
T0=$(date +%s)
nvidia-smi > $OUT/nvidia-smi.txt 2>&1; date -u >> $OUT/nvidia-smi.txt; echo "${SHA:-unset}" >> $OUT/nvidia-smi.txt
C=nopebench/impls/native/cuda
mkdir -p /tmp/before && cp $C/* /tmp/before/
for h in 128B 256B; do
  mkdir -p /tmp/l2_$h && cp /tmp/before/* /tmp/l2_$h/
  sed -i "s/cp.async.cg.shared.global \[%0\]/cp.async.cg.shared.global.L2::$h [%0]/" /tmp/l2_$h/register_decode.cu
  grep -q "L2::$h" /tmp/l2_$h/register_decode.cu || { echo "the hint did not go in"; exit 1; }
  cp /tmp/l2_$h/* $C/
  echo "== register gpu tests with L2::$h"
  timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_native_decode.py -k register > $OUT/gpu_register_$h.log 2>&1
  echo "rc $? after $(( $(date +%s) - T0 )) s"; tail -1 $OUT/gpu_register_$h.log
done
V='[{"kernel":"register"},{"kernel":"hopper_ws"}]'
mkdir -p /tmp/tune
run() {  # form width cases tag
  cp /tmp/$1/* $C/
  echo "== $4 at $(( $(date +%s) - T0 )) s"
  OUT=/tmp/tune/$4 timeout 60 python3 tools/tune_native.py --hopper --variants "$V" --cases $3 \
    --width $2 --modes nope,shim > /tmp/tune/$4.log 2>&1
  echo "rc $?"; grep -E "Error|error': '" /tmp/tune/$4.log | head -3
}
for r in 1 2; do
  run before 2176 16x128,16x256,16x512 before-2176-r$r
  run l2_128B 2176 16x128,16x256,16x512 l2_128B-2176-r$r
  run l2_256B 2176 16x128,16x256,16x512 l2_256B-2176-r$r
done
run before 2048 16x512 before-2048-r1
run l2_128B 2048 16x512 l2_128B-2048-r1
run l2_256B 2048 16x512 l2_256B-2048-r1
cp /tmp/before/* $C/
cd /tmp/tune && tar -czf $OUT/tune.tar.gz . && cd - > /dev/null
# tools/ab_summary.py compares a `new` form with `before`: one tarball a hint
for h in 128B 256B; do
  rm -rf /tmp/ab_$h && mkdir -p /tmp/ab_$h
  for d in /tmp/tune/before-*/ /tmp/tune/l2_$h-*/; do
    n=$(basename $d); cp -r $d /tmp/ab_$h/${n/l2_$h/new}
  done
  tar -czf /tmp/ab_$h.tar.gz -C /tmp/ab_$h .
  echo "== L2::$h new over before"
  python3 tools/ab_summary.py /tmp/ab_$h.tar.gz $OUT/l2_${h}_vs_before.csv | tee $OUT/summary_$h.txt
done
echo "total $(( $(date +%s) - T0 )) s"
