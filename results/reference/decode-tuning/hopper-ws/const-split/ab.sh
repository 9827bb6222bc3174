set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -1
export PYTHONPATH="$PWD:/tmp/site" NOPEBENCH_GIT_SHA=$(cat .sha)-dirty
R=$OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for h in 32 16; do
A="{\"kernel\":\"hopper_ws\",\"block_h\":$h,\"role_split\":true}"
B="{\"kernel\":\"hopper_ws\",\"block_h\":$h,\"role_split\":true,\"const_split\":true}"
V="[$A,$B,$A,$B]"
for w in 2176 2048; do
    if [ $h = 32 ]; then cs=32x512,32x256; else cs=16x512; fi
    d=$R/h$h-w$w; mkdir -p $d
    OUT=$d timeout 60 python3 tools/tune_native.py --hopper --modes nope --cases $cs --width $w --variants "$V" > $d/log.txt 2>&1
    echo "h$h w$w rc=$?"
    python3 - "$d/tune.csv" <<'PY'
import sys, pandas as pd
d = pd.read_csv(sys.argv[1])
d["v"] = ["AB"[i % 2] for i in range(len(d))]
print("failed:", int((~d.passed.astype(bool)).sum()))
t = d.pivot_table(index=["tokens"], columns="v", values="median_ms", aggfunc="median")
t["B/A"] = t["B"] / t["A"]
print(t.round(4).to_string())
PY
done
done
tar czf $R/all.tgz -C $R $(cd $R && ls -d h*) 2>/dev/null; rm -rf $R/h*
