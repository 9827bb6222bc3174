#!/bin/bash
# The scorer dequantizing 16 rows of every block (scorer_rows) against the planned 64-head
# kernel and the split-off form with output helper rows; GPU tests of the new form first.
export NOPEBENCH_GIT_SHA=$(cat .sha)
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site
O=$OUT; W=/tmp/w; mkdir -p $W
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $W/gpu.txt
timeout 230 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_native_decode.py \
  -k "scorer_rows or hopper_wide_helpers" > $W/gpu-tests.log 2>&1
echo "gpu tests rc=$?"; tail -3 $W/gpu-tests.log
V='[{"kernel":"hopper_wide"},{"kernel":"hopper_wide","pv_split":true,"helpers":8},{"kernel":"hopper_wide","pv_split":true,"helpers":8,"scorer_rows":16},{"kernel":"hopper_wide","pv_split":true,"helpers":0,"scorer_rows":16}]'
run() {  # tag width
  OUT=$W/$1 timeout 170 python3 tools/tune_native.py --hopper --modes nope --width $2 \
    --cases 64x64,64x128,64x512,128x128,128x512 --variants "$V" > $W/$1.log 2>&1
  grep -h "'median_ms'" $W/$1.log | python3 -c "
import sys, ast
for l in sys.stdin:
    d = ast.literal_eval(l.strip())
    print('$1', d['heads'], d['tokens'], 'pv', d['pv_split'], 'h', d['helpers'], 's', d['scorer_rows'], 'pair', d['pair'], d['passed'], round(d['median_ms'], 5), d.get('error'))
" | tee -a $W/summary.txt
}
run r1-w2176 2176
run r2-w2048 2048
run r3-w2176 2176
cat $W/summary.txt
tar czf $O/sr.tgz -C $W .
