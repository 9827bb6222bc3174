#!/bin/bash
# A/B/C: the scorer's -1 mask by layout conversion (0), direct loads in the score layout (1),
# or one ballot per entry parity (2); NB_MASK is read at import, so one process per form.
export NOPEBENCH_GIT_SHA=$(cat .sha)
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site
O=$OUT; W=/tmp/w; mkdir -p $W
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $W/gpu.txt
V='[{"kernel":"hopper_wide"}]'
run() {  # form width
  NB_MASK=$1 OUT=$W/m$1-w$2 timeout 150 python3 tools/tune_native.py --hopper --modes nope --width $2 \
    --cases 64x128,64x512,128x128,128x512 --variants "$V" > $W/m$1-w$2.log 2>&1
  grep -h "'median_ms'" $W/m$1-w$2.log | python3 -c "
import sys, ast
for l in sys.stdin:
    d = ast.literal_eval(l.strip())
    print('form', $1, 'width', $2, d['heads'], d['tokens'], d['passed'], round(d['median_ms'], 5), d.get('error'))
" | tee -a $W/summary.txt
}
for m in 0 1 2; do run $m 2176; done
for m in 2 1 0; do run $m 2048; done
NB_MASK=2 timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_native_decode.py -k "hopper_wide or 2cta" > $W/gpu-tests-m2.log 2>&1
echo "gpu tests form 2: rc=$?"; tail -2 $W/gpu-tests-m2.log
cat $W/summary.txt
tar czf $O/mask.tgz -C $W .
