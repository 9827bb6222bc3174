#!/usr/bin/env bash
# Device call 1: build both libraries, the register kernel's GPU tests, then a token sweep at
# 16 heads: the register kernel beside the planned warp-specialised kernel, NoPE and shim.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > $OUT/pip.log 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 COLUMNS=200
nvidia-smi > $OUT/nvidia-smi.txt 2>&1
echo "== build"; timeout 200 python3 -m nopebench build > $OUT/build.log 2>&1; echo "rc $?"; tail -12 $OUT/build.log
echo "== gpu tests"; timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_native_decode.py -k register -x > $OUT/gpu_register.log 2>&1; echo "rc $?"; tail -5 $OUT/gpu_register.log
for W in 2176 2048; do
  echo "== sweep w$W"
  OUT=$OUT/w$W timeout 200 python3 tools/tune_native.py --hopper --variants '[{"kernel":"register"},{"kernel":"hopper_ws"}]' \
    --cases 16x128,16x256,16x264,16x300,16x400,16x512,16x528,16x700,16x1024 --width $W --modes nope,shim > $OUT/sweep_w$W.log 2>&1
  echo "rc $?"
  python3 - $OUT/w$W/tune.csv <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
t = {}
for r in rows:
    if r.get("median_ms"):
        t[(r["mode"], int(r["tokens"]), r["kernel"])] = (float(r["median_ms"]), r["passed"])
for (m, tk, k), (ms, ok) in sorted(t.items()):
    if k == "register":
        ws = t.get((m, tk, "hopper_ws"), (float("nan"), ""))
        print(f"{m} 16x{tk}: register {ms:.4f} ({ok}) ws {ws[0]:.4f} ({ws[1]}) ws/register {ws[0]/ms:.3f}")
PY
done
