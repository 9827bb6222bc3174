#!/bin/bash
# Probe: clock stamps of the warp-specialised kernel's roles at 16 and 32 heads (role split).
export NOPEBENCH_GIT_SHA=$(cat .sha)
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site
W=/tmp/w; mkdir -p $W/on
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $W/gpu.txt
python3 -c "import json; from nopebench.environment import environment_header as e; print(json.dumps(e(['trace_ws.py']), default=str))" > $W/env.json 2>/dev/null
C='[[16,512,2048],[16,512,2176],[32,512,2048],[32,512,2176],[16,128,2176]]'
NB_TRACE=0 OUT=$W/on timeout 200 python3 _dev/trace_ws.py "$C" > $W/off.log 2>&1; echo "off rc=$?"
NB_TRACE=1 OUT=$W/on timeout 200 python3 _dev/trace_ws.py "$C" > $W/on.log 2>&1; echo "on rc=$?"
tar czf $OUT/trace.tgz -C $W .
grep -h '^{' $W/off.log | cut -c1-200
cat $W/on.log | tail -6
