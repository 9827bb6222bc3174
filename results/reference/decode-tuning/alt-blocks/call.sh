#!/usr/bin/env bash
# One device call for the alternate-blocks form (`alt`, asked for: WIDE_ALT is off): the GPU
# tests of the 64-head kernel, those of early.diff's form, then the tree's form (`late`: the
# partner's tile released after the softmax) and early.diff's, alternating in processes of their
# own. Each process times, side by side, the planned kernel (the scorer form at 64 heads, the
# 2-CTA pair at 128), the alternate form and, at 128 heads, the unpaired alternate form; every
# variant is checked before it is timed.
# Under $OUT: nvidia-smi.txt, gpu_*.log, tune.tar.gz, summary.csv (and its table on stdout).
set -uo pipefail
D=results/reference/decode-tuning/alt-blocks
N=nopebench/impls/native
TEST_S=${TEST_S:-170} TUNE_S=${TUNE_S:-75} ROUNDS=${ROUNDS:-2}
CASES=${CASES:-64x128,64x512,128x128,128x512}
V='[{"kernel":"planned"},{"kernel":"hopper_wide","alt":true},{"kernel":"hopper_wide","pv_split":false,"alt":true}]'
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 COLUMNS=200
[ -n "${SHA:-}" ] && export NOPEBENCH_GIT_SHA=$SHA
T0=$(date +%s)
at() { echo "== $1 at $(( $(date +%s) - T0 )) s"; }
nvidia-smi > $OUT/nvidia-smi.txt 2>&1; date -u >> $OUT/nvidia-smi.txt; echo "${SHA:-unset}" >> $OUT/nvidia-smi.txt
rm -rf /tmp/f /tmp/t && mkdir -p /tmp/f /tmp/t && cp -r $N /tmp/f/late
patch -s -p1 < $D/early.diff || { echo "early.diff does not apply"; exit 1; }
cp -r $N /tmp/f/early
put() { rm -rf $N && cp -r /tmp/f/$1 $N; }
put late
at "late: gpu tests"
timeout $TEST_S python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_native_decode.py \
  -k "hopper_wide and not smem_q and not helpers or alternate or 2cta" > $OUT/gpu_late.log 2>&1
echo "rc $?"; tail -1 $OUT/gpu_late.log
put early
at "early: gpu tests"
timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_native_decode.py \
  -k "alternate or hopper_wide_alt and minus_one" > $OUT/gpu_early.log 2>&1
echo "rc $?"; tail -1 $OUT/gpu_early.log
for r in $(seq $ROUNDS); do
  for f in late early; do
    put $f; at "$f-r$r"
    OUT=/tmp/t/$f-r$r timeout $TUNE_S python3 tools/tune_native.py --hopper --variants "$V" \
      --cases $CASES --width 2176 --modes nope > /tmp/t/$f-r$r.log 2>&1
    echo "rc $?"; grep -E "Error|error': '" /tmp/t/$f-r$r.log | head -3
  done
done
put late
tar -czf $OUT/tune.tar.gz -C /tmp/t .
python3 - "$OUT" <<'PY'
import csv, glob, os, statistics, sys
from collections import defaultdict
ms = defaultdict(list)
for path in sorted(glob.glob("/tmp/t/*/tune.csv")):
    run = os.path.basename(os.path.dirname(path))
    for row in csv.DictReader(open(path)):
        if row["passed"] != "True":
            print("FAILED CHECK", run, row["heads"], row["tokens"], row.get("error"))
            continue
        form = "alt" if row["alt"] == "True" else "pair" if row["pair"] == "True" else "scorer"
        ms[(int(row["heads"]), int(row["tokens"]), form, run.split("-")[0])].append(float(row["median_ms"]))
out = [("heads", "tokens", "form", "build", "median_ms", "runs")]
for k in sorted(ms):
    out.append((*k, f"{statistics.median(ms[k]):.4f}", " ".join(f"{v:.4f}" for v in ms[k])))
with open(os.path.join(sys.argv[1], "summary.csv"), "w", newline="") as fh:
    csv.writer(fh).writerows(out)
for row in out:
    print(*row, sep="\t")
PY
echo "total $(( $(date +%s) - T0 )) s"
