#!/usr/bin/env bash
# Decode evidence on a GPU machine, from the repository root (after the wheels are installed):
#   1. how the copy-bandwidth ceiling depends on the copy's dtype, size and graph capture
#   2. the native kernel's GPU tests (strict element rule, graph replay)
#   3. bench-decode on the config given as $1 (default: --quick on h200-nope)
# Logs and run directories go to $DECODE_OUT (default results/device-decode).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" COLUMNS="${COLUMNS:-200}" PYTHONUNBUFFERED=1
export FLASHINFER_WORKSPACE_BASE="${FLASHINFER_WORKSPACE_BASE:-$PWD/build/flashinfer-jit}"
OUTDIR="${DECODE_OUT:-$PWD/results/device-decode}"
mkdir -p "$OUTDIR"
status=0
python3 - <<'PY' 2>&1 | tee "$OUTDIR/copy_probe.log"
import torch
from nopebench.bench.timing import time_gpu
for gib in (1, 2, 4):
    n = gib << 30
    src = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda"); dst = torch.empty_like(src)
    for label, s, d in (("uint8", src, dst), ("float32", src.view(torch.float32), dst.view(torch.float32))):
        for graph in (True, False):
            t = time_gpu([lambda s=s, d=d: d.copy_(s)], budget_s=0.5, min_samples=10, use_graph=graph)
            print(f"copy {gib} GiB {label:8} graph={graph!s:5} {2 * n / t.median_ms / 1e6:8.0f} GB/s")
    del src, dst
PY
python3 -m pytest -q -p no:cacheprovider tests/test_native_decode.py 2>&1 | tail -n 15 | tee "$OUTDIR/native_tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
python3 -m nopebench bench-decode ${1:---quick} --results-dir "$OUTDIR/runs" 2>&1 | tee "$OUTDIR/bench_decode.log" | tail -n 60
[ "${PIPESTATUS[0]}" -le 1 ] || status=1
exit $status
