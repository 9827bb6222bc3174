#!/usr/bin/env bash
# One device call: the main job (`nopebench run`) on a GPU machine at the current tree, every GPU
# test outside the native decode file (cache kernels, FlashMLA, the registry's adapters), then
# the native decode GPU tests of the register kernel and the planner's choices in the time left.
# Carries .whl and .flashmla. Everything lands in $OUT: the logs, and the run directory as one
# archive (the device returns at most 8 files, two folders down).
#   NOPEBENCH_GIT_SHA=<commit> bash results/reference/h200-run/at-head/call.sh
set -uo pipefail
cd "$(dirname "$0")/../../../.."
T0=$(date +%s)
export OUT="${OUT:-$PWD/results/device-tests}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH="$PWD:/tmp/site:$PWD/.flashmla" COLUMNS=200 PYTHONUNBUFFERED=1
export FLASHINFER_WORKSPACE_BASE="$PWD/build/flashinfer-jit"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
{
    python3 -m nopebench run --results-dir "$PWD/res"
    echo "nopebench run exit $?"
} > "$OUT/run.log" 2>&1
tail -n 25 "$OUT/run.log"
tar czf "$OUT/run.tar.gz" res
left() { echo $((450 - ($(date +%s) - T0))); }
{
    timeout "$(left)" python3 -m pytest -q -p no:cacheprovider -m gpu \
        --ignore=tests/test_native_decode.py tests
    echo "other gpu tests exit $?"
} > "$OUT/other_gpu_tests.log" 2>&1
tail -n 3 "$OUT/other_gpu_tests.log"
{
    timeout "$(left)" python3 -m pytest -q -p no:cacheprovider -m gpu -k "register or plan" \
        tests/test_native_decode.py
    echo "native gpu tests (register or plan) exit $?"
} > "$OUT/native_gpu_tests.log" 2>&1
tail -n 3 "$OUT/native_gpu_tests.log"
echo "wall $(($(date +%s) - T0)) s"
