#!/usr/bin/env bash
# Every GPU test, then `bench-decode --quick`, on a GPU machine without a package index, from the
# repository root. Wheels the machine lacks travel in .whl/ (tools: see the README's "GPU
# machines" section); FlashMLA, when carried, in .flashmla/. Logs go to $OUT (default
# results/device-tests), written as each step ends, so a step cut off by a time limit still
# leaves the logs of those before it.
#   bash tools/device_gpu_tests.sh [native|other|quick ...]   (default: all three, in that order)
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR="${OUT:-$PWD/results/device-tests}"
mkdir -p "$OUTDIR"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 2
fi
export PYTHONPATH="$PWD:/tmp/site:$PWD/.flashmla${PYTHONPATH:+:$PYTHONPATH}"
export COLUMNS="${COLUMNS:-200}" PYTHONUNBUFFERED=1
export FLASHINFER_WORKSPACE_BASE="${FLASHINFER_WORKSPACE_BASE:-$PWD/build/flashinfer-jit}"
mkdir -p "$FLASHINFER_WORKSPACE_BASE"
nvidia-smi > "$OUTDIR/nvidia-smi.txt" 2>&1
status=0
run() {  # run NAME CMD...: log to $OUTDIR/NAME.log, remember a failure
    local name=$1; shift
    echo "=== $name: $*"
    "$@" > "$OUTDIR/$name.log" 2>&1
    local rc=$?
    tail -n 4 "$OUTDIR/$name.log"
    echo "=== $name: exit $rc"
    [ "$rc" -eq 0 ] || status=1
}
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(native other quick)
for step in "${steps[@]}"; do
    case $step in
        native) run native_gpu_tests python3 -m pytest -q -p no:cacheprovider -m gpu \
                    tests/test_native_decode.py ;;
        other) run other_gpu_tests python3 -m pytest -q -p no:cacheprovider -m gpu \
                   --ignore=tests/test_native_decode.py tests ;;
        quick) run bench_decode_quick python3 -m nopebench bench-decode --quick \
                   --results-dir "$OUTDIR" ;;
        *) echo "unknown step $step"; exit 2 ;;
    esac
done
exit $status
