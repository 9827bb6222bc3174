#!/bin/bash
# The scorer-left form of the 64-head kernel with the output split one tile (scorer) to three
# (right warpgroup, 224 registers) instead of two and two (NB_SPLIT13=1), against the plan.
export NOPEBENCH_GIT_SHA=$(cat .sha)
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site
W=/tmp/w; mkdir -p $W
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $W/gpu.txt
T0=$(date +%s)
run() {  # tag rep width env...
  tag=$1-w$3-r$2; wd=$3; shift 3
  env "$@" OUT=$W/$tag timeout 170 python3 tools/tune_native.py --hopper --modes nope,shim \
    --cases 64x8,64x64,64x128,64x512,128x8,128x512 --width $wd --variants '[{"kernel":"hopper_wide"}]' > $W/$tag.log 2>&1
  echo "$tag rc=$? t=$(( $(date +%s) - T0 ))s" >> $W/progress.txt
}
run plan 1 2176 X=0; run split13 1 2176 NB_SPLIT13=1
run plan 2 2176 X=0; run split13 2 2176 NB_SPLIT13=1
[ $(( $(date +%s) - T0 )) -lt 300 ] && { run plan 1 2048 X=0; run split13 1 2048 NB_SPLIT13=1; }
tar czf $OUT/split13.tgz -C $W .
cat $W/progress.txt
python3 - <<'PY'
import csv, glob, collections
t = collections.defaultdict(list)
for f in sorted(glob.glob('/tmp/w/*/tune.csv')):
    form = f.split('/')[3].split('-')[0]
    for r in csv.DictReader(open(f)):
        t[(r['width'], r['mode'], int(r['heads']), int(r['tokens']), form)].append((float(r['median_ms'] or 'nan'), r['passed']))
for k in sorted(t):
    if k[4] != 'plan': continue
    a = t[k]; b = t.get(k[:4] + ('split13',), [])
    print(k[:4], 'plan', [round(x, 4) for x, _ in a], 'split13', [round(x, 4) for x, _ in b], [p for _, p in b])
PY
