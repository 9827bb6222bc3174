set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -1
export PYTHONPATH="$PWD:/tmp/site" NOPEBENCH_GIT_SHA=$(cat .sha)-dirty
R=$OUT
A='{"kernel":"hopper_ws"}'
B='{"kernel":"hopper_ws","tail_skip":true}'
V="[$A,$B,$A,$B]"; L=AB
for h in 16 32; do
  if [ $h = 16 ]; then cs=16x64,16x128,16x512; else cs=32x64,32x128,32x256,32x512; fi
  for w in 2176 2048; do
    d=$R/h$h-w$w; mkdir -p $d
    OUT=$d timeout 135 python3 tools/tune_native.py --hopper --modes nope,shim --cases $cs --width $w --variants "$V" > $d/log.txt 2>&1
    echo "h$h w$w rc=$?"
    python3 - "$d/tune.csv" $L <<'PY'
import sys, pandas as pd
d = pd.read_csv(sys.argv[1]); L = sys.argv[2]
d["v"] = [L[i % len(L)] for i in range(len(d))]
print("failed:", int((~d.passed.astype(bool)).sum()), "of", len(d))
t = d.pivot_table(index=["mode", "tokens"], columns="v", values="median_ms", aggfunc="median")
t["B/A"] = t["B"] / t["A"]
print(t.round(4).to_string())
PY
  done
done
cd $R && tar czf all.tgz h* && rm -rf h*
