#!/usr/bin/env bash
# check-pagetable on a GPU machine (the H200), from the repository root:
#   1. nopebench check-pagetable --model nopebench/configs/models/glm53-flash.yaml (graph capture included)
#   2. a smoke test of the fa3 adapters (bf16 and fp8; NoPE and the zero-padded shim; H 16, 64)
#      against the reference, printed as a table
#   3. the sparse/pagetable tests, GPU ones included
# Exits non-zero when any step fails; every step runs regardless. When OUT is set, the
# check-pagetable run directory and the full log are copied under "$OUT".
#
# FlashInfer JIT-compiles each kernel with nvcc on first use (~20 s each) into
# $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/<version>/<arch>/cached_ops. It defaults here to
# build/flashinfer-jit (git-ignored, so it survives between calls on a warm machine and can be
# carried to a fresh one).
set -uo pipefail

cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
export COLUMNS="${COLUMNS:-200}"  # rich tables in the log, not wrapped at 80
export FLASHINFER_WORKSPACE_BASE="${FLASHINFER_WORKSPACE_BASE:-$PWD/build/flashinfer-jit}"
mkdir -p "$FLASHINFER_WORKSPACE_BASE"
RESULTS_ROOT="${RESULTS_ROOT:-$PWD/results}"
LOG="$(mktemp -t device_pagetable.XXXXXX.log)"
status=0

step() {  # step NAME CMD...: run, tee into the log, remember a failure
    echo "=== $1" | tee -a "$LOG"
    shift
    "$@" 2>&1 | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    echo "=== exit $rc" | tee -a "$LOG"
    [ "$rc" -eq 0 ] || status=1
}

step "environment" python3 -c '
import torch, flashinfer, os
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
print("flashinfer", flashinfer.__version__, "FLASHINFER_WORKSPACE_BASE", os.environ.get("FLASHINFER_WORKSPACE_BASE"))'

step "check-pagetable" python3 -m nopebench check-pagetable --model nopebench/configs/models/glm53-flash.yaml \
    --results-dir "$RESULTS_ROOT"

step "fa3 adapter smoke test" python3 tools/pagetable_smoke.py flashinfer-fa3-bf16 flashinfer-fa3-fp8

step "tests" python3 -m pytest -q -p no:cacheprovider tests/test_sparse_*.py tests/test_pagetable*.py

if [ -n "${OUT:-}" ]; then
    run_dir="$(ls -td "$RESULTS_ROOT"/check-pagetable/*/ 2>/dev/null | head -1)"
    mkdir -p "$OUT/check-pagetable"
    [ -n "$run_dir" ] && cp -r "$run_dir" "$OUT/check-pagetable/"
    cp "$LOG" "$OUT/device_pagetable.log"
fi
echo "device_pagetable: $([ "$status" -eq 0 ] && echo passed || echo FAILED) (log: $LOG)"
exit "$status"
