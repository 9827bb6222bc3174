#!/usr/bin/env bash
# One device call: a short bench-decode of native and FlashMLA at 16 and 128 heads x 512 tokens
# and its report, printing the kernel each cell ran; then the GPU tests of FlashMLA and the
# registry's adapters. Logs and the run directory go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../../.."
export OUT="${OUT:-$PWD/results/device-tests}"
git rev-parse --short HEAD > "$OUT/tree.txt" 2>/dev/null || echo "no git history on the device" > "$OUT/tree.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH="$PWD:/tmp/site:$PWD/.flashmla" COLUMNS=200 PYTHONUNBUFFERED=1
export FLASHINFER_WORKSPACE_BASE="$PWD/build/flashinfer-jit"
python3 -m nopebench bench-decode --impl native --impl flashmla --heads 16 --heads 128 \
    --tokens 512 --width 2176 --results-dir "$OUT/res" > "$OUT/bench.log" 2>&1
echo "bench-decode exit $?" | tee -a "$OUT/bench.log"
run_dir=$(dirname "$(find "$OUT/res" -name results.csv | head -n 1)")
python3 -m nopebench report "$run_dir" --output "$OUT/rep" > "$OUT/report.log" 2>&1
echo "report exit $?" | tee -a "$OUT/report.log"
mkdir -p "$OUT/run" && cp "$run_dir"/*.csv "$run_dir"/*.json "$OUT/run/"
cp "$OUT/rep/report.md" "$OUT/report.md"
python3 - "$run_dir" <<'PY'
import sys, pathlib, pandas as pd
run = pathlib.Path(sys.argv[1])
rows = pd.read_csv(run / "results.csv")
cols = [c for c in ("impl", "mode", "heads", "query_tokens", "passed", "median_ms", "kernel") if c in rows]
print(rows[cols].to_string(index=False))
PY
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
[ "${SKIP_TESTS:-0}" = 1 ] && exit 0
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_flashmla.py \
    tests/test_impl_registry.py > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests exit $?" | tee -a "$OUT/gpu_tests.log"
tail -n 3 "$OUT/gpu_tests.log"
