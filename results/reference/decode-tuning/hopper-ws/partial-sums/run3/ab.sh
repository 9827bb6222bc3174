set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -1
export PYTHONPATH="$PWD:/tmp/site" NOPEBENCH_GIT_SHA=$(cat .sha)-dirty
R=$OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
A='{"kernel":"hopper_ws","block_h":32}'
B='{"kernel":"hopper_ws","block_h":32,"l_partial":true}'
C='{"kernel":"hopper_ws","block_h":32,"role_split":true,"l_partial":true}'
D='{"kernel":"hopper_ws","block_h":32,"role_split":false,"l_partial":true}'
V="[$A,$B,$C,$D,$A,$B,$C,$D]"
for w in 2176 2048; do
  d=$R/h32-w$w; mkdir -p $d
  OUT=$d timeout 280 python3 tools/tune_native.py --hopper --modes nope,shim --cases 32x512,32x256,32x128,32x64,32x8 --width $w --variants "$V" > $d/log.txt 2>&1
  echo "h32 w$w rc=$?"
  python3 - "$d/tune.csv" <<'PY'
import sys, pandas as pd
d = pd.read_csv(sys.argv[1])
d["v"] = ["ABCD"[i % 4] for i in range(len(d))]
print("failed:", int((~d.passed.astype(bool)).sum()), "errors:", int(d.get("error", pd.Series(dtype=str)).notna().sum()))
t = d.pivot_table(index=["mode","tokens"], columns="v", values="median_ms", aggfunc="min")
for c in "BCD": t[c+"/A"] = t[c] / t["A"]
print(t.round(4).to_string())
PY
done
tar czf $R/all.tgz -C $R $(cd $R && ls -d h*) 2>/dev/null; rm -rf $R/h*
