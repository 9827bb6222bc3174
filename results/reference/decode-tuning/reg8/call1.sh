#!/usr/bin/env bash
# Device call 1: the register kernel with 8 warps a CTA (REG_WARPS=8: 64 latent dims a warp,
# 128 registers, 16 warps an SM) against the 4-warp form, 16 heads (and 32 as two head blocks).
# The warp count is a build constant, so each form runs in a process of its own (constants.py
# edited in the device's copy between them), alternating 8 4 8 4; each process also times the
# warp-specialised Gluon kernel at the same shapes as a fixed reference. First the register
# kernel's GPU tests with 8 warps.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > $OUT/pip.log 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 COLUMNS=200
T0=$(date +%s)
nvidia-smi > $OUT/nvidia-smi.txt 2>&1
date -u > $OUT/date.txt; echo "${SHA:-unset}" > $OUT/sha.txt
C=nopebench/impls/native/constants.py
warps() { sed -i "s/^REG_WARPS = [0-9]*/REG_WARPS = $1/" $C; grep "^REG_WARPS" $C; }
warps 8
echo "== gpu tests, 8 warps"
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_native_decode.py -k register > $OUT/gpu_register_w8.log 2>&1
echo "rc $? after $(( $(date +%s) - T0 )) s"; tail -3 $OUT/gpu_register_w8.log
V='[{"kernel":"register"},{"kernel":"hopper_ws"}]'
run() {  # warps width cases tag
  warps $1
  echo "== w$1 width $2 ($4) at $(( $(date +%s) - T0 )) s"
  OUT=/tmp/tune/$4 timeout 150 python3 tools/tune_native.py --hopper --variants "$V" --cases $3 \
    --width $2 --modes nope,shim > /tmp/tune/$4.log 2>&1
  echo "rc $?"; grep -E "Error|error': '" /tmp/tune/$4.log | head -3
}
mkdir -p /tmp/tune
run 8 2176 16x256,16x512,32x512 w8-2176-r1
run 4 2176 16x256,16x512,32x512 w4-2176-r1
run 8 2176 16x256,16x512,32x512 w8-2176-r2
run 4 2176 16x256,16x512,32x512 w4-2176-r2
warps 4
cd /tmp/tune && tar -czf $OUT/tune.tar.gz . && cd - > /dev/null
python3 - <<'PY' | tee $OUT/summary.txt
import glob, os
import pandas as pd
rows = []
for f in sorted(glob.glob("/tmp/tune/*/tune.csv")):
    d = pd.read_csv(f)
    d["run"] = os.path.basename(os.path.dirname(f))
    rows.append(d)
d = pd.concat(rows)
cols = [c for c in ("run", "heads", "tokens", "width", "mode", "kernel", "median_ms", "passed") if c in d]
print(d[cols].to_string(index=False))
PY
echo "total $(( $(date +%s) - T0 )) s"
