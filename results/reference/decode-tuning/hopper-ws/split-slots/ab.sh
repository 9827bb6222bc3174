set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -1
export PYTHONPATH="$PWD:/tmp/site" NOPEBENCH_GIT_SHA=$(cat .sha)
R=$OUT
for h in 32 16; do
  V="[{\"kernel\":\"hopper_ws\",\"block_h\":$h,\"role_split\":true,\"slots\":2},{\"kernel\":\"hopper_ws\",\"block_h\":$h,\"role_split\":true,\"slots\":3},{\"kernel\":\"hopper_ws\",\"block_h\":$h,\"role_split\":true,\"slots\":2},{\"kernel\":\"hopper_ws\",\"block_h\":$h,\"role_split\":true,\"slots\":3}]"
  mkdir -p $R/h$h
  OUT=$R/h$h timeout 75 python3 tools/tune_native.py --hopper --modes nope --cases ${h}x512 --width 2176 --variants "$V" > $R/h$h/log.txt 2>&1
  echo "h$h rc=$?"
  python3 - "$R/h$h/tune.csv" <<'PY'
import sys, pandas as pd
d = pd.read_csv(sys.argv[1])
print(d[["heads","tokens","num_stages","role_split","passed","median_ms","spread"]].to_string())
PY
done
