#!/usr/bin/env bash
# Every GPU test of the native kernels, in parts that fit the device's per-call limit: collects
# the test ids in the order pytest runs them, then runs them from the first id that no earlier
# part's log (carried back into this directory as part*.log) reports as finished, verbosely, for
# at most LIMIT seconds. From the repository root, with .whl (pydantic) carried:
#   bash results/reference/h100-gpu-tests/native-rowzero/run_part.sh PART LIMIT
set -uo pipefail
PART=$1 LIMIT=$2
HERE=results/reference/h100-gpu-tests/native-rowzero
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 COLUMNS=200
nvidia-smi > "$OUT/nvidia-smi-part$PART.txt" 2>&1; date -u >> "$OUT/nvidia-smi-part$PART.txt"
python3 -m pytest --collect-only -q -p no:cacheprovider -m gpu tests/test_native_decode.py \
  | grep '::' > "$OUT/collected-ids.txt"
cat $HERE/part*.log 2>/dev/null | grep -oE '^tests/[^ ]+ (PASSED|SKIPPED|FAILED|ERROR)' \
  | cut -d' ' -f1 | sort -u > /tmp/done.txt
grep -vxFf /tmp/done.txt "$OUT/collected-ids.txt" > /tmp/todo.txt
echo "part $PART: $(wc -l < "$OUT/collected-ids.txt") collected, $(wc -l < /tmp/todo.txt) to run"
timeout "$LIMIT" python3 -m pytest -v -p no:cacheprovider -m gpu $(cat /tmp/todo.txt) \
  > "$OUT/part$PART.log" 2>&1
echo "rc $?"
grep -cE ' PASSED' "$OUT/part$PART.log"; grep -E ' (FAILED|ERROR)' "$OUT/part$PART.log" | head
tail -1 "$OUT/part$PART.log"
