set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -1
export PYTHONPATH="$PWD:/tmp/site" NOPEBENCH_GIT_SHA=$(cat .sha)-dirty
R=$OUT
A='{"kernel":"hopper_wide"}'
B='{"kernel":"hopper_wide","helpers":16,"pv_split":false,"right_regs":168}'
C='{"kernel":"hopper_wide","helpers":16,"pv_split":false}'
V="[$A,$B,$C,$A,$B,$C]"; L=ABC
for w in 2176 2048; do
    d=$R/h64-w$w; mkdir -p $d
    OUT=$d timeout 200 python3 tools/tune_native.py --hopper --modes nope --cases 64x64,64x128,64x512 --width $w --variants "$V" > $d/log.txt 2>&1
    echo "h64 w$w rc=$?"
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
