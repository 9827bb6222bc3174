#!/usr/bin/env bash
# Device script: forms of the register kernel, each a patch on the tree's
# nopebench/impls/native/cuda/ (its name the form's), against the tree's kernel.
#   tools/register_ab.sh path/to/movm.diff path/to/both.diff
# For each form: the register kernel's GPU tests and a compute-sanitizer racecheck of small
# launches (tools/register_racecheck.py). Then each form in a process of its own (the tree's as
# `before`), alternating, ROUNDS times at width 2176 over CASES and ROUNDS_2048 times at 2048 over
# 16 x 512, NoPE and shim, every variant checked before it is timed, the warp-specialised Gluon
# kernel timed in each process as the fixed reference. Under $OUT: nvidia-smi.txt,
# gpu_register_<form>.log, racecheck_<form>.log, tune.tar.gz and <form>_vs_before.csv
# (tools/ab_summary.py; its table also goes to stdout). The tree's kernel is back at the end.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: tools/register_ab.sh FORM.diff..." >&2; exit 2; }
CASES=${CASES:-16x128,16x256,16x512} ROUNDS=${ROUNDS:-3} ROUNDS_2048=${ROUNDS_2048:-2}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 COLUMNS=200
T0=$(date +%s)
at() { echo "== $1 at $(( $(date +%s) - T0 )) s"; }
nvidia-smi > $OUT/nvidia-smi.txt 2>&1; date -u >> $OUT/nvidia-smi.txt; echo "${SHA:-unset}" >> $OUT/nvidia-smi.txt
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
C=nopebench/impls/native/cuda
rm -rf /tmp/ab && mkdir -p /tmp/ab/before && cp $C/* /tmp/ab/before/
FORMS=()
for d in "$@"; do
  v=$(basename "$d" .diff); FORMS+=("$v")
  mkdir -p /tmp/ab/$v && cp /tmp/ab/before/* $C/
  git apply "$d" 2>/dev/null || patch -s -p1 < "$d" || { echo "$d does not apply"; exit 1; }
  cp $C/* /tmp/ab/$v/ && cp /tmp/ab/before/* $C/
done
for v in "${FORMS[@]}"; do
  cp /tmp/ab/$v/* $C/
  at "$v: register gpu tests"
  timeout 110 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_native_decode.py -k register > $OUT/gpu_register_$v.log 2>&1
  echo "rc $?"; tail -1 $OUT/gpu_register_$v.log
  at "$v: racecheck"
  timeout 60 $SAN --tool racecheck --racecheck-report hazard python3 tools/register_racecheck.py > $OUT/racecheck_$v.log 2>&1
  echo "rc $?"; grep -E "RACECHECK SUMMARY" $OUT/racecheck_$v.log
done
V='[{"kernel":"register"},{"kernel":"hopper_ws"}]'
mkdir -p /tmp/ab/tune
run() {  # form width cases tag
  cp /tmp/ab/$1/* $C/
  at "$4"
  OUT=/tmp/ab/tune/$4 timeout 60 python3 tools/tune_native.py --hopper --variants "$V" --cases $3 \
    --width $2 --modes nope,shim > /tmp/ab/tune/$4.log 2>&1
  echo "rc $?"; grep -E "Error|error': '" /tmp/ab/tune/$4.log | head -3
}
for r in $(seq $ROUNDS); do
  for f in before "${FORMS[@]}"; do run $f 2176 $CASES $f-2176-r$r; done
done
for r in $(seq $ROUNDS_2048); do
  for f in before "${FORMS[@]}"; do run $f 2048 16x512 $f-2048-r$r; done
done
cp /tmp/ab/before/* $C/
tar -czf $OUT/tune.tar.gz -C /tmp/ab/tune .
for v in "${FORMS[@]}"; do  # ab_summary compares runs named new-* with before-*
  rm -rf /tmp/ab/pair && mkdir -p /tmp/ab/pair
  cp -r /tmp/ab/tune/before-*-r*/ /tmp/ab/pair/
  for r in /tmp/ab/tune/$v-2*-r*/; do n=$(basename $r); cp -r $r /tmp/ab/pair/new-${n#$v-}; done
  tar -czf /tmp/ab/pair.tar.gz -C /tmp/ab/pair .
  at "$v over before"
  python3 tools/ab_summary.py /tmp/ab/pair.tar.gz $OUT/${v}_vs_before.csv
done
echo "total $(( $(date +%s) - T0 )) s"
