set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -1
export PYTHONPATH="$PWD:/tmp/site" NOPEBENCH_GIT_SHA=$(cat .sha)-dirty
R=$OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
L=ABC
run() {  # name width cases timeout kernel
  A="{\"kernel\":\"$5\"}"; B="{\"kernel\":\"$5\",\"no_pfence\":true}"; C="{\"kernel\":\"$5\",\"light_pfence\":true}"; V="[$A,$B,$C,$A,$B,$C]"

  d=$R/$1; mkdir -p $d
  OUT=$d timeout $4 python3 tools/tune_native.py --hopper --modes nope --cases $3 --width $2 --variants "$V" > $d/log.txt 2>&1
  echo "$1 rc=$?"
  python3 - "$d/tune.csv" $L <<'PY'
import sys, pandas as pd
d = pd.read_csv(sys.argv[1]); L = sys.argv[2]
d["v"] = [L[i % len(L)] for i in range(len(d))]
print("failed:", int((~d.passed.astype(bool)).sum()), "of", len(d))
t = d.pivot_table(index=["mode", "heads", "tokens"], columns="v", values="median_ms", aggfunc="median")
t["B/A"] = t["B"] / t["A"]
t["C/A"] = t["C"] / t["A"]
for v in L: print(v, "passed", int(d[d.v == v].passed.astype(str).eq("True").sum()), "of", int((d.v == v).sum()))
print(t.round(4).to_string())
PY
}
run h16-w2176 2176 16x128,16x512 90 hopper_ws
run h32-w2176 2176 32x128,32x512 90 hopper_ws
run h64-w2176 2176 64x128,64x512 100 hopper_wide
run h64-w2048 2048 64x128,64x512 100 hopper_wide
run h128-w2176 2176 128x128,128x512 100 hopper_wide
cd $R && tar czf all.tgz h* && rm -rf h*
