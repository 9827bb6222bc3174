#!/usr/bin/env bash
# Device call: the register kernel's loader with one wide multiply-add a row address (the tree,
# with addr.diff applied) against the loader before it (addr.diff reversed on the device's copy),
# 16 heads. First the register kernel's GPU tests; then each form in a process of its own,
# alternating new, before, new, before at width 2176 and new, before at 2048, the
# warp-specialised Gluon kernel timed in each process as a fixed reference; last, every native
# GPU test (the shared inputs now keep row 0 poisoned) with what time is left.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 COLUMNS=200
T0=$(date +%s)
nvidia-smi > $OUT/nvidia-smi.txt 2>&1; date -u >> $OUT/nvidia-smi.txt; echo "${SHA:-unset}" >> $OUT/nvidia-smi.txt
C=nopebench/impls/native/cuda
P=results/reference/decode-tuning/reg-addr/addr.diff
mkdir -p /tmp/new /tmp/before && cp $C/* /tmp/new/
{ git apply -R "$P" 2>/dev/null || patch -R -p1 < "$P"; } || { echo "addr.diff does not reverse"; exit 1; }
cp $C/* /tmp/before/ && cp /tmp/new/* $C/
cmp -s /tmp/new/register_decode.cuh /tmp/before/register_decode.cuh && { echo "no change"; exit 1; }
echo "== register gpu tests"
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_native_decode.py -k register > $OUT/gpu_register.log 2>&1
echo "rc $? after $(( $(date +%s) - T0 )) s"; tail -1 $OUT/gpu_register.log
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
cp /tmp/new/* $C/
cd /tmp/tune && tar -czf $OUT/tune.tar.gz . && cd - > /dev/null
python3 - <<'PY' | tee $OUT/summary.txt
import glob, os
import pandas as pd
d = pd.concat(pd.read_csv(f).assign(run=os.path.basename(os.path.dirname(f))) for f in sorted(glob.glob("/tmp/tune/*/tune.csv")))
d["form"] = d.run.str.split("-").str[0]
r = d[d.kernel == "register"].groupby(["heads", "tokens", "width", "mode", "form"]).median_ms.median().unstack("form")
r["new_over_before"] = r["new"] / r["before"]
print(r.round(4).to_string()); print("all passed:", bool(d.passed.all()))
PY
LEFT=$(( 560 - ($(date +%s) - T0) ))
echo "== all native gpu tests, ${LEFT} s left"
timeout $LEFT python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_native_decode.py > $OUT/gpu_native.log 2>&1
echo "rc $?"; tail -2 $OUT/gpu_native.log
echo "total $(( $(date +%s) - T0 )) s"
