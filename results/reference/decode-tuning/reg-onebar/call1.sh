#!/usr/bin/env bash
# Device call: the register kernel with fewer barriers a block, against the tree's kernel, 16 heads.
#   twobar.diff: the next block's rows waited for before the partial-score barrier, so the
#                barrier at the top of each block goes (two a block instead of three);
#   onebar.diff: every warp sums all 32 keys' partial scores (double-buffered), so the softmax
#                needs no exchange and P stays in registers: one barrier a block.
# First each form's GPU tests (the register kernel's) and a compute-sanitizer racecheck of small
# launches; then each form in a process of its own, alternating before, twobar, onebar three
# times at width 2176 and twice at 2048, the warp-specialised Gluon kernel in each process as the fixed
# reference. The tree's own kernel is back in place at the end.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 COLUMNS=200
R=results/reference/decode-tuning/reg-onebar
T0=$(date +%s)
nvidia-smi > $OUT/nvidia-smi.txt 2>&1; date -u >> $OUT/nvidia-smi.txt; echo "${SHA:-unset}" >> $OUT/nvidia-smi.txt
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
C=nopebench/impls/native/cuda
mkdir -p /tmp/before && cp $C/* /tmp/before/
for v in twobar onebar; do
  mkdir -p /tmp/$v && cp /tmp/before/* $C/
  git apply $R/$v.diff 2>/dev/null || patch -s -p1 < $R/$v.diff
  cp $C/* /tmp/$v/ && cp /tmp/before/* $C/
  cmp -s /tmp/$v/register_decode.cuh /tmp/before/register_decode.cuh && { echo "$v did not apply"; exit 1; }
done
for v in twobar onebar; do
  cp /tmp/$v/* $C/
  echo "== $v: register gpu tests at $(( $(date +%s) - T0 )) s"
  timeout 110 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_native_decode.py -k register > $OUT/gpu_register_$v.log 2>&1
  echo "rc $?"; tail -1 $OUT/gpu_register_$v.log
  echo "== $v: racecheck at $(( $(date +%s) - T0 )) s"
  timeout 60 $SAN --tool racecheck --racecheck-report hazard python3 tools/register_racecheck.py > $OUT/racecheck_$v.log 2>&1
  echo "rc $?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|matches" $OUT/racecheck_$v.log | tail -3
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
for r in 1 2 3; do
  for f in before twobar onebar; do run $f 2176 16x128,16x256,16x512,32x512 $f-2176-r$r; done
done
for r in 1 2; do
  for f in before twobar onebar; do run $f 2048 16x512 $f-2048-r$r; done
done
cp /tmp/before/* $C/
cd /tmp/tune && tar -czf $OUT/tune.tar.gz . && cd - > /dev/null
for v in twobar onebar; do
  rm -rf /tmp/ab_$v && mkdir -p /tmp/ab_$v
  for d in /tmp/tune/before-*/ /tmp/tune/$v-*/; do n=$(basename $d); cp -r $d /tmp/ab_$v/${n/$v/new}; done
  tar -czf /tmp/ab_$v.tar.gz -C /tmp/ab_$v .
  echo "== $v new over before"
  python3 tools/ab_summary.py /tmp/ab_$v.tar.gz $OUT/${v}_vs_before.csv | tee $OUT/summary_$v.txt
done
echo "total $(( $(date +%s) - T0 )) s"
