#!/bin/bash
# Probe: the planned kernels with (0) and without (1) the producer's gathers after the ring's
# first fill (NB_NOGATHER, read at import: one process per form), A B A B, width 2176.
export NOPEBENCH_GIT_SHA=$(cat .sha)
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site
O=$OUT; W=/tmp/w; mkdir -p $W
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $W/gpu.txt
run() {  # form rep kernel cases
  tag=g$1-$2-$3
  NB_NOGATHER=$1 OUT=$W/$tag timeout 120 python3 tools/tune_native.py --hopper --modes nope \
    --cases $4 --variants "[{\"kernel\":\"$3\"}]" > $W/$tag.log 2>&1
  grep -h "'median_ms'" $W/$tag.log | python3 -c "
import sys, ast
for l in sys.stdin:
    d = ast.literal_eval(l.strip())
    print('form', $1, 'rep', $2, d['kernel'], d['heads'], d['tokens'], d['passed'], round(d['median_ms'], 5), d.get('error'))
" | tee -a $W/summary.txt
}
for r in 1 2; do for f in 0 1; do
  run $f $r hopper_ws 16x128,16x512,32x128,32x512
  run $f $r hopper_wide 64x128,64x512,128x128,128x512
done; done
tar czf $O/ng.tgz -C $W .
