set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -1
export PYTHONPATH="$PWD:/tmp/site" NOPEBENCH_GIT_SHA=$(cat .sha)-dirty
R=$OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
A='{"kernel":"hopper_ws","role_split":true}'
B='{"kernel":"hopper_ws","role_split":true,"static_ring":true}'
C='{"kernel":"hopper_ws","role_split":true,"static_ring":true,"slots":4}'
for w in 2176 2048; do
  for h in 16 32; do
    if [ $h = 16 ]; then V="[$A,$B,$C,$A,$B,$C]"; cs=16x512,16x128,16x64; else V="[$A,$B,$A,$B]"; cs=32x512,32x256; fi
    d=$R/h$h-w$w; mkdir -p $d
    OUT=$d timeout 120 python3 tools/tune_native.py --hopper --modes nope --cases $cs --width $w --variants "$V" > $d/log.txt 2>&1
    echo "h$h w$w rc=$?"
    python3 - "$d/tune.csv" <<'PY'
import sys, pandas as pd
d = pd.read_csv(sys.argv[1])
d["v"] = [("ABC" if d.heads.iloc[0] == 16 else "AB")[i % (3 if d.heads.iloc[0] == 16 else 2)] for i in range(len(d))]
print("failed:", int((~d.passed.astype(bool)).sum()), "errors:", int(d["error"].notna().sum()) if "error" in d else 0)
t = d.pivot_table(index=["tokens"], columns="v", values="median_ms", aggfunc="median")
for c in t.columns[1:]: t[c+"/A"] = t[c] / t["A"]
print(t.round(4).to_string())
PY
  done
done
tar czf $R/all.tgz -C $R $(cd $R && ls -d h*) 2>/dev/null; rm -rf $R/h*
