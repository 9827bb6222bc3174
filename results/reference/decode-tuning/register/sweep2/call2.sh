#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > $OUT/pip.log 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 COLUMNS=200
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > $OUT/gpu.txt
echo "== same process"; OUT=$OUT/same timeout 240 python3 _dev/call2.py > $OUT/same.log 2>&1; echo "rc $?"; cat $OUT/same.log | grep "^{" 
# SASS of both shim forms
nvcc -O3 -std=c++17 -arch=sm_90a -cubin -DSTAGES=4 -DMINB=2 -DRS -DIDX_SMEM=2208 -DROPE -o /tmp/ps.cubin _dev/reg16.cu 2>/dev/null
nvcc -O3 -std=c++17 -arch=sm_90a -cubin -lineinfo -o /tmp/pr.cubin nopebench/impls/native/cuda/register_decode.cu 2>/dev/null
cuobjdump -sass /tmp/ps.cubin > $OUT/proto_shim.sass; cuobjdump -sass /tmp/pr.cubin > $OUT/product.sass
wc -l $OUT/*.sass
for W in 2176 2048; do
  echo "== sweep w$W"
  OUT=$OUT/s$W timeout 150 python3 tools/tune_native.py --hopper --variants '[{"kernel":"register"},{"kernel":"hopper_ws"}]' \
    --cases 16x200,16x212,16x350,16x360 --width $W --modes nope,shim > $OUT/sweep_w$W.log 2>&1
  echo "rc $?"
  python3 - $OUT/s$W/tune.csv <<'PY'
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
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv >> $OUT/gpu.txt
