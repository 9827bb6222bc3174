#!/bin/bash
# Probes on the planned kernels' producer (wrong by design): NB_NOGATHER=1 issues the ring's
# first gathers only; NB_NOCONVERT=1 stores each byte widened to 16 bits, no scale and no e4m3
# conversion. Both are read at import (one process per form); width 2176, NoPE.
export NOPEBENCH_GIT_SHA=$(cat .sha)
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site
O=$OUT; W=/tmp/w; mkdir -p $W
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $W/gpu.txt
run() {  # gather-off convert-off rep kernel cases
  tag=g$1c$2-r$3-$4
  NB_NOGATHER=$1 NB_NOCONVERT=$2 OUT=$W/$tag timeout 120 python3 tools/tune_native.py --hopper \
    --modes nope --cases $5 --variants "[{\"kernel\":\"$4\"}]" > $W/$tag.log 2>&1
}
both() { run $1 $2 $3 hopper_ws 16x128,16x512,32x128,32x512; run $1 $2 $3 hopper_wide 64x128,64x512,128x128,128x512; }
both 0 0 1; both 1 0 1; both 0 1 1; both 1 1 1
both 1 1 2; both 0 1 2; both 1 0 2; both 0 0 2
tar czf $O/probes.tgz -C $W .
