#!/bin/bash
# Probe: per-block clock stamps of the 64-head kernel's roles (NB_TRACE=1) against the same
# kernels without stamps (NB_TRACE=0), one process each.
export NOPEBENCH_GIT_SHA=$(cat .sha)
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site
W=/tmp/w; mkdir -p $W/off $W/on
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $W/gpu.txt
python3 -c "import json; from nopebench.environment import environment_header as e; print(json.dumps(e(['trace.py']), default=str))" > $W/env.json 2>/dev/null
C='[[64,512,{}],[64,512,{"pv_split":true,"helpers":8}],[128,512,{}]]'
NB_TRACE=1 OUT=$W/on timeout 200 python3 _dev/trace.py "$C" > $W/on.log 2>&1; echo "on rc=$?"
tar czf $OUT/trace.tgz -C $W .
true
cat $W/on.log | tail -8
