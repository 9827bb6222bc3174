#!/usr/bin/env bash
# Device call 1: the register kernel's GPU tests (16- and 32-head blocks), then the 32-head
# block timed beside the planned kernel (what `native` runs) and the 16-head block, NoPE and shim,
# at bench-decode's 32-, 64- and 128-head shapes. Few-token shapes take split counts that fill
# one wave (1 CTA an SM at 32 heads).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > $OUT/pip.log 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 COLUMNS=200
nvidia-smi > $OUT/nvidia-smi.txt 2>&1
date -u > $OUT/date.txt; echo "${SHA:-unset}" > $OUT/sha.txt
echo "== build"; timeout 150 python3 -m nopebench build > $OUT/build.log 2>&1; echo "rc $?"
echo "== gpu tests"
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_native_decode.py -k register > $OUT/gpu_register.log 2>&1
echo "rc $?"; tail -3 $OUT/gpu_register.log
V='[{"kernel":"planned"},
    {"kernel":"register","block_h":32,"cases":["32x128","32x512","64x128","64x512","128x512","64x64"]},
    {"kernel":"register","block_h":16,"cases":["32x128","32x512","64x512"]},
    {"kernel":"register","block_h":32,"splits":2,"cases":["32x64"]},
    {"kernel":"register","block_h":32,"splits":16,"cases":["32x8"]},
    {"kernel":"register","block_h":32,"splits":8,"cases":["64x8"]}]'
for W in 2176 2048; do
  CASES=32x8,32x64,32x128,32x512,64x8,64x64,64x128,64x512,128x512
  [ $W = 2048 ] && CASES=32x128,32x512,64x128
  echo "== sweep w$W"
  OUT=$OUT/w$W timeout 220 python3 tools/tune_native.py --hopper --variants "$V" --cases $CASES \
    --width $W --modes nope,shim > $OUT/sweep_w$W.log 2>&1
  echo "rc $?"; grep -c "'passed': True" $OUT/sweep_w$W.log; grep -E "Error|error': '" $OUT/sweep_w$W.log | head -5
done
python3 results/reference/decode-tuning/register32/summarize.py $OUT/w*/tune.csv | tee $OUT/summary.txt
