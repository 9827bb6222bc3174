#!/bin/bash
# Probes on the planned warp-specialised kernel at 16-32 heads (role split) (wrong by design), switches read at import (one process
# per form): consumer math removed piece by piece, the producer's gathers and conversion removed.
export NOPEBENCH_GIT_SHA=$(cat .sha)
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site
O=$OUT; W=/tmp/w; mkdir -p $W
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $W/gpu.txt
run() {  # tag rep env...
  tag=$1-r$2; shift 2
  env "$@" OUT=$W/$tag timeout 60 python3 tools/tune_native.py --hopper --modes nope \
    --cases 16x128,16x512,32x512 --variants '[{"kernel":"hopper_ws"}]' > $W/$tag.log 2>&1
}
forms() {
  run plan $1 X=0
  run noscores $1 NB_NOSCORES=1
  run nosoftmax $1 NB_NOSOFTMAX=1
  run nopv $1 NB_NOPV=1
  run nomath $1 NB_NOSCORES=1 NB_NOSOFTMAX=1 NB_NOPV=1
  run noproducer $1 NB_NOGATHER=1 NB_NOCONVERT=1
  run nothing $1 NB_NOSCORES=1 NB_NOSOFTMAX=1 NB_NOPV=1 NB_NOGATHER=1 NB_NOCONVERT=1
}
forms 1; tar czf $O/chain.tgz -C $W .; forms 2
tar czf $O/chain.tgz -C $W .
