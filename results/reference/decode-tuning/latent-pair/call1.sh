#!/usr/bin/env bash
# Device script (on a0897ee with latent-pair.diff applied): the latent-half pair at 128 heads.
# A smoke launch, then tools/tune_native.py at 128 x {8, 64, 128, 512} (NoPE rows, width 2176):
# the planned kernel (this tree: the latent-half pair where the 64-head kernel's pair was
# planned), the 64-head kernel's pair, and the latent-half pair's ring and tile counts and
# overlapped form; then its GPU tests on 528-byte rows. Carry .whl.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 COLUMNS=200
[ -n "${SHA:-}" ] && export NOPEBENCH_GIT_SHA=$SHA
T0=$(date +%s); at() { echo "== $1 at $(( $(date +%s) - T0 )) s"; }
nvidia-smi > $OUT/nvidia-smi.txt 2>&1; date -u >> $OUT/nvidia-smi.txt; echo "${SHA:-unset}" >> $OUT/nvidia-smi.txt
at smoke
timeout 90 python3 results/reference/decode-tuning/latent-pair/smoke.py > $OUT/smoke.log 2>&1
rc=$?; echo "rc $rc"; tail -3 $OUT/smoke.log
[ $rc = 0 ] || exit 1
at tune
V='[{"kernel":"planned"},{"kernel":"hopper_wide","pair":true,"cases":["128x64","128x128","128x512"]},{"kernel":"latent_pair","slots":8},{"kernel":"latent_pair","kv_bufs":2,"slots":8},{"kernel":"latent_pair","overlap":true}]'
OUT=$OUT/tune timeout ${TUNE_S:-300} python3 tools/tune_native.py --hopper --variants "$V" --cases ${CASES:-128x64,128x128,128x512,128x8} --width 2176 --modes nope > $OUT/tune.log 2>&1
echo "rc $?"
python3 - <<'PY'
import os, pandas as pd
d = pd.read_csv(os.environ["OUT"] + "/tune/tune.csv")
cols = [c for c in ("heads", "tokens", "kernel", "pair", "num_stages", "kv_bufs", "splits", "overlap", "passed", "median_ms", "error") if c in d.columns]
print(d[cols].to_string())
PY
at "gpu tests"
timeout ${TEST_S:-100} python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_native_decode.py -k "latent_pairs and 528" > $OUT/gpu_latent.log 2>&1
echo "rc $?"; tail -2 $OUT/gpu_latent.log
at done
