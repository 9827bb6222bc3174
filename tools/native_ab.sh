#!/usr/bin/env bash
# Device script: forms of a native decode kernel, each a patch on the tree's
# nopebench/impls/native/ (its name the form's), against the tree's kernels.
#   tools/native_ab.sh path/to/movm.diff path/to/both.diff          (the register kernel)
#   FAMILY=gluon tools/native_ab.sh path/to/softmax.diff           (the SM90 Gluon kernels)
# For each form: the family's GPU tests (and, for the register kernel, a compute-sanitizer
# racecheck of small launches: tools/register_racecheck.py). Then each form in a process of its
# own (the tree's as `before`), alternating, ROUNDS times at width 2176 over CASES and ROUNDS_2048
# times at 2048 over CASES_2048, NoPE and shim, every variant checked before it is timed, and a
# kernel the patches leave alone (REFERENCE) timed in each process as the fixed reference: its
# spread across processes is the run-to-run noise. V (a JSON list for tune_native.py --variants)
# replaces the family's variants. Under $OUT: nvidia-smi.txt,
# gpu_<form>.log, racecheck_<form>.log, tune.tar.gz and <form>_vs_before.csv
# (tools/ab_summary.py; its table also goes to stdout). The tree's kernels are back at the end.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: [FAMILY=register|gluon] tools/native_ab.sh FORM.diff..." >&2; exit 2; }
FAMILY=${FAMILY:-register}
case $FAMILY in
  register)  # the register kernel against the warp-specialised Gluon kernel
    TESTS=${TESTS:-register} TEST_S=${TEST_S:-110} RACECHECK=1 KERNEL=register REFERENCE=hopper_ws
    V=${V:-'[{"kernel":"register"},{"kernel":"hopper_ws"}]'}
    CASES=${CASES:-16x128,16x256,16x512} CASES_2048=${CASES_2048:-16x512}
    ROUNDS=${ROUNDS:-3} ROUNDS_2048=${ROUNDS_2048:-2} ;;
  gluon)  # what native plans on SM90 at 32-128 heads, against the register kernel (CUDA C++)
    TESTS=${TESTS:-"hopper_wide and not smem_q and not helpers or hopper_ws_split32 or 2cta or minus_one or small_and_unit"}
    TEST_S=${TEST_S:-300} RACECHECK=0 KERNEL=hopper_ws,hopper_wide REFERENCE=register  # 201 tests
    V=${V:-'[{"kernel":"planned"},{"kernel":"register"}]'}
    CASES=${CASES:-32x128,32x512,64x128,64x512,128x128,128x512} CASES_2048=${CASES_2048:-64x128,64x512}
    ROUNDS=${ROUNDS:-2} ROUNDS_2048=${ROUNDS_2048:-1} ;;  # with the tests, one 600-second call
  *) echo "FAMILY is register or gluon, not $FAMILY" >&2; exit 2 ;;
esac
TUNE_S=${TUNE_S:-90}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 COLUMNS=200
# The commit the rows name: the .git carried with the tree may be stale.
[ -n "${SHA:-}" ] && export NOPEBENCH_GIT_SHA=$SHA
T0=$(date +%s)
at() { echo "== $1 at $(( $(date +%s) - T0 )) s"; }
nvidia-smi > $OUT/nvidia-smi.txt 2>&1; date -u >> $OUT/nvidia-smi.txt; echo "${SHA:-unset}" >> $OUT/nvidia-smi.txt
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
N=nopebench/impls/native
put() { rm -rf $N && cp -r /tmp/ab/$1 $N; }  # one form's sources into the tree
rm -rf /tmp/ab && mkdir -p /tmp/ab && cp -r $N /tmp/ab/before
FORMS=()
for d in "$@"; do
  v=$(basename "$d" .diff); FORMS+=("$v")
  put before
  git apply "$d" 2>/dev/null || patch -s -p1 < "$d" || { echo "$d does not apply"; exit 1; }
  cp -r $N /tmp/ab/$v
done
for v in "${FORMS[@]}"; do
  put $v
  at "$v: $FAMILY gpu tests"
  timeout $TEST_S python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_native_decode.py -k "$TESTS" > $OUT/gpu_$v.log 2>&1
  echo "rc $?"; tail -1 $OUT/gpu_$v.log
  if [ $RACECHECK = 1 ]; then
    at "$v: racecheck"
    timeout 60 $SAN --tool racecheck --racecheck-report hazard python3 tools/register_racecheck.py > $OUT/racecheck_$v.log 2>&1
    echo "rc $?"; grep -E "RACECHECK SUMMARY" $OUT/racecheck_$v.log
  fi
done
mkdir -p /tmp/ab/tune
run() {  # form width cases tag
  put $1
  at "$4"
  OUT=/tmp/ab/tune/$4 timeout $TUNE_S python3 tools/tune_native.py --hopper --variants "$V" --cases $3 \
    --width $2 --modes nope,shim > /tmp/ab/tune/$4.log 2>&1
  echo "rc $?"; grep -E "Error|error': '" /tmp/ab/tune/$4.log | head -3
}
for r in $(seq $ROUNDS); do
  for f in before "${FORMS[@]}"; do run $f 2176 $CASES $f-2176-r$r; done
done
for r in $(seq $ROUNDS_2048); do
  for f in before "${FORMS[@]}"; do run $f 2048 $CASES_2048 $f-2048-r$r; done
done
put before
tar -czf $OUT/tune.tar.gz -C /tmp/ab/tune .
for v in "${FORMS[@]}"; do  # ab_summary compares runs named new-* with before-*
  rm -rf /tmp/ab/pair && mkdir -p /tmp/ab/pair
  cp -r /tmp/ab/tune/before-*-r*/ /tmp/ab/pair/
  for r in /tmp/ab/tune/$v-2*-r*/; do n=$(basename $r); cp -r $r /tmp/ab/pair/new-${n#$v-}; done
  tar -czf /tmp/ab/pair.tar.gz -C /tmp/ab/pair .
  at "$v over before"
  python3 tools/ab_summary.py /tmp/ab/pair.tar.gz $OUT/${v}_vs_before.csv --kernel $KERNEL --reference $REFERENCE
done
echo "total $(( $(date +%s) - T0 )) s"
