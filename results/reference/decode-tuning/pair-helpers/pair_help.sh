#!/bin/bash
# A/B: the 2-CTA pair with 16 local helper rows per output warpgroup; unpaired 16-row helpers.
export NOPEBENCH_GIT_SHA=$(cat .sha)
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
O=$OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $O/gpu.txt
V128='[{"kernel":"hopper_wide"},{"kernel":"hopper_wide","pair":true,"helpers":16,"q_regs":0},{"kernel":"hopper_wide","pair":true,"q_regs":0}]'
V64='[{"kernel":"hopper_wide"},{"kernel":"hopper_wide","pv_split":true,"helpers":16,"q_regs":0},{"kernel":"hopper_wide","pv_split":true,"helpers":8}]'
for p in 1 2; do
  for w in 2176 2048; do
    OUT=$O/h128-w$w-p$p timeout 200 python3 tools/tune_native.py --hopper --modes nope --width $w \
      --cases 128x64,128x128,128x512 --variants "$V128" > $O/h128-w$w-p$p.log 2>&1
    OUT=$O/h64-w$w-p$p timeout 200 python3 tools/tune_native.py --hopper --modes nope --width $w \
      --cases 64x128,64x512 --variants "$V64" > $O/h64-w$w-p$p.log 2>&1
    grep -h "'median_ms'" $O/h*-w$w-p$p.log | python3 -c "
import sys, ast
for l in sys.stdin:
    d = ast.literal_eval(l.strip())
    print($w, $p, d['heads'], d['tokens'], 'pv', d['pv_split'], 'h', d['helpers'], 'q', d['q_regs'], 'pair', d['pair'], d['passed'], d['median_ms'], d.get('error'))
" | tee -a $O/summary.txt
  done
done
