#!/usr/bin/env bash
# Device script (on a0897ee with latent-pair.diff and probe.diff applied): where the
# latent-half pair's time goes. tools/tune_native.py at 128 x {128, 512} (NoPE rows, width 2176)
# in two processes, each timing the 64-head kernel's pair and the
# latent-half pair: as built, then as a timing probe without the partial scores' exchange
# (LATENT_PAIR_PROBE=1: each warpgroup adds zeros read from its own buffer; the output is wrong,
# so its check fails, and it is timed all the same). Carry .whl.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 COLUMNS=200
[ -n "${SHA:-}" ] && export NOPEBENCH_GIT_SHA=$SHA
nvidia-smi > $OUT/nvidia-smi.txt 2>&1; date -u >> $OUT/nvidia-smi.txt; echo "${SHA:-unset}" >> $OUT/nvidia-smi.txt
V='[{"kernel":"hopper_wide","pair":true},{"kernel":"latent_pair"}]'
for probe in 0 1; do
  LATENT_PAIR_PROBE=$probe OUT=$OUT/probe$probe timeout 150 python3 tools/tune_native.py --hopper \
    --variants "$V" --cases 128x128,128x512 --width 2176 --modes nope > $OUT/probe$probe.log 2>&1
  echo "probe $probe: rc $?"
done
python3 - <<'PY'
import os, pandas as pd
for probe in (0, 1):
    d = pd.read_csv(f"{os.environ['OUT']}/probe{probe}/tune.csv")
    print(f"probe {probe}")
    print(d[["tokens", "kernel", "passed", "median_ms"]].to_string())
PY
