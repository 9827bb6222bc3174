set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -1
export PYTHONPATH="$PWD:/tmp/site" NOPEBENCH_GIT_SHA=$(cat .sha)-dirty
R=$OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
v() { echo "{\"kernel\":\"hopper_ws\",\"role_split\":true,\"l_partial\":$1,\"score_ahead\":$2}"; }
V="[$(v false false),$(v true false),$(v false true),$(v true true),$(v false false),$(v true false),$(v false true),$(v true true)]"
for w in 2176 2048; do
  for h in 32 16; do
    d=$R/h$h-w$w; mkdir -p $d
    OUT=$d timeout 140 python3 tools/tune_native.py --hopper --modes nope --cases ${h}x512,${h}x128 --width $w --variants "$V" > $d/log.txt 2>&1
    echo "h$h w$w rc=$?"
    python3 - "$d/tune.csv" <<'PY'
import sys, pandas as pd
d = pd.read_csv(sys.argv[1])
cols=[c for c in ["heads","tokens","width","l_partial","score_ahead","passed","max_abs_err","median_ms","spread","error"] if c in d]
print(d[cols].to_string())
PY
  done
done
tar czf $R/all.tgz -C $R $(cd $R && ls -d h*) 2>/dev/null; rm -rf $R/h*
