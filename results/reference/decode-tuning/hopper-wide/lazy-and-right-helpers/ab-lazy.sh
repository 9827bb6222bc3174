set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -1
export PYTHONPATH="$PWD:/tmp/site" NOPEBENCH_GIT_SHA=$(cat .sha)-dirty
R=$OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
A='{"kernel":"hopper_wide"}'
B='{"kernel":"hopper_wide","lazy":8}'
C='{"kernel":"hopper_wide","overlap":true}'
D='{"kernel":"hopper_wide","lazy":8,"overlap":true}'
for h in ${HS:-64 128}; do
  if [ $h = 64 ]; then V="[$A,$B,$C,$D,$A,$B,$C,$D]"; L=ABCD; cs=64x64,64x128,64x512; else V="[$A,$B,$A,$B]"; L=AB; cs=128x64,128x128,128x512; fi
  for w in 2176 2048; do
    d=$R/h$h-w$w; mkdir -p $d
    OUT=$d timeout 150 python3 tools/tune_native.py --hopper --modes nope --cases $cs --width $w --variants "$V" > $d/log.txt 2>&1
    echo "h$h w$w rc=$?"
    python3 - "$d/tune.csv" $L <<'PY'
import sys, pandas as pd
d = pd.read_csv(sys.argv[1]); L = sys.argv[2]
d["v"] = [L[i % len(L)] for i in range(len(d))]
print("failed:", int((~d.passed.astype(bool)).sum()), "of", len(d))
t = d.pivot_table(index=["tokens"], columns="v", values="median_ms", aggfunc="median")
for c in L[1:]:
    t[c + "/A"] = t[c] / t["A"]
print(t.round(4).to_string())
PY
  done
done
