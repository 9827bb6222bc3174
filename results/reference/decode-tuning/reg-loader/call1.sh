#!/usr/bin/env bash
# Device call: the register kernel with each lane bringing chunks of one row (loader.diff, applied
# to the device's copy) against the tree's loader (one row per warp instruction, each row's
# address computed and shuffled in every lane), 16 heads. The register kernel's GPU tests with
# loader.diff first, then each form in a process of its own (the source swapped in the copy),
# alternating new, before, new, before at width 2176 and new, before at 2048; each process also
# times the warp-specialised Gluon kernel at the same shapes as a fixed reference.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 COLUMNS=200
T0=$(date +%s)
nvidia-smi > $OUT/nvidia-smi.txt 2>&1; date -u >> $OUT/nvidia-smi.txt; echo "${SHA:-unset}" >> $OUT/nvidia-smi.txt
K=nopebench/impls/native/cuda/register_decode.cuh
cp $K /tmp/before.cuh
P=results/reference/decode-tuning/reg-loader/loader.diff  # git apply, or patch where git is absent
{ git apply "$P" 2>/dev/null || patch -p1 < "$P"; } || { echo "loader.diff does not apply"; exit 1; }
cmp -s $K /tmp/before.cuh && { echo "loader.diff changed nothing"; exit 1; }
cp $K /tmp/new.cuh
echo "== gpu tests"
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_native_decode.py -k register > $OUT/gpu_register.log 2>&1
echo "rc $? after $(( $(date +%s) - T0 )) s"; tail -2 $OUT/gpu_register.log
V='[{"kernel":"register"},{"kernel":"hopper_ws"}]'
mkdir -p /tmp/tune
run() {  # form width cases tag
  if [ $1 = new ]; then cp /tmp/new.cuh $K; else cp /tmp/before.cuh $K; fi
  echo "== $4 at $(( $(date +%s) - T0 )) s"
  OUT=/tmp/tune/$4 timeout 60 python3 tools/tune_native.py --hopper --variants "$V" --cases $3 \
    --width $2 --modes nope,shim > /tmp/tune/$4.log 2>&1
  echo "rc $?"; grep -E "Error|error': '" /tmp/tune/$4.log | head -3
}
run new 2176 16x256,16x512 new-2176-r1
run before 2176 16x256,16x512 before-2176-r1
run new 2176 16x256,16x512 new-2176-r2
run before 2176 16x256,16x512 before-2176-r2
run new 2048 16x512 new-2048-r1
run before 2048 16x512 before-2048-r1
cp /tmp/before.cuh $K
cd /tmp/tune && tar -czf $OUT/tune.tar.gz . && cd - > /dev/null
python3 - <<'PY' | tee $OUT/summary.txt
import glob, os
import pandas as pd
d = pd.concat(pd.read_csv(f).assign(run=os.path.basename(os.path.dirname(f))) for f in sorted(glob.glob("/tmp/tune/*/tune.csv")))
print(d[["run", "heads", "tokens", "width", "mode", "kernel", "median_ms", "passed"]].to_string(index=False))
PY
echo "total $(( $(date +%s) - T0 )) s"
