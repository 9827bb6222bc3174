#!/usr/bin/env bash
# bench-cache evidence on a GPU machine, from the repository root:
#
#   bash tools/device_cache.sh
#
# 1. build the CUDA cache kernels for the local GPU (nopebench build; ptxas resources logged)
# 2. verify-layout --impl cuda --sweep: every sweep case bit-exact (glm53-flash: T in
#    {1, 63, 64, 65, 4096, 65536} x block sizes {64, 16} x rows {656, 528} x both scale formats)
# 3. compute-sanitizer memcheck over the -1 and boundary cases (python -m
#    nopebench.cache_kernels.boundary), full output kept
# 4. bench-cache: write and gather throughput, T = 1K..256K, against the copy bandwidth and torch
# 5. the GPU tests (RoPE sweep cases up to T = 4096, graph capture, argument errors) and the
#    CPU tests of the same modules, with whatever time is left
#
# Everything lands in results/device-cache/<UTC time>/ (logs, run directories); when OUT is
# set, a tar.gz of it and the key files are copied there (8 files at most). Each step has a
# time cap so the whole script stays under ~9.5 minutes; the usual total is about 5-6.
# Exit status: 0 when every step passed, 1 otherwise (summary.txt says which).

set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
export COLUMNS=${COLUMNS:-160}  # rich tables in the logs unwrapped
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
WORK=results/device-cache/$STAMP
RESULTS=$WORK/runs
mkdir -p "$RESULTS"
SUMMARY=$WORK/summary.txt
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-570}
status=0

log() { echo "$*" | tee -a "$SUMMARY"; }

# step NAME CAP_S CMD...: run CMD with its output in $WORK/NAME.log, capped at CAP_S seconds
# and at what is left of the budget.
step() {
  local name=$1 cap=$2
  shift 2
  local left=$((BUDGET_S - ($(date +%s) - T0)))
  ((cap > left)) && cap=$left
  if ((cap < 15)); then
    log "SKIP  $name: out of time budget"
    status=1
    return
  fi
  local start rc
  start=$(date +%s)
  timeout --kill-after=10 "$cap" "$@" >"$WORK/$name.log" 2>&1
  rc=$?
  local took=$(($(date +%s) - start))
  if ((rc == 0)); then
    log "PASS  $name (${took} s)"
  else
    log "FAIL  $name: exit $rc after ${took} s$( ((rc == 124)) && echo ' (time cap)'): see $name.log"
    status=1
  fi
  echo "---- $name (last lines)"
  tail -n 30 "$WORK/$name.log"
}

find_sanitizer() {
  command -v compute-sanitizer && return
  local c
  for c in "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" /usr/local/cuda*/bin/compute-sanitizer \
    /usr/local/cuda*/compute-sanitizer/compute-sanitizer; do
    [ -x "$c" ] && echo "$c" && return
  done
}

log "device_cache.sh $STAMP on $(hostname)"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$PY" -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'
  command -v nvcc && nvcc --version | tail -n 2
  git rev-parse HEAD 2>/dev/null && git status --porcelain --untracked-files=no | head -n 20
} >"$WORK/env.log" 2>&1
cat "$WORK/env.log"

step build 60 "$PY" -m nopebench build
step verify-layout 210 "$PY" -m nopebench verify-layout --impl cuda --sweep --results-dir "$RESULTS"
grep -E "FAIL|results:" "$WORK/verify-layout.log" 2>/dev/null | head -n 5 | sed 's/^/      /' >>"$SUMMARY"

SANITIZER=$(find_sanitizer)
if [ -n "$SANITIZER" ]; then
  step memcheck 120 "$SANITIZER" --tool memcheck --leak-check no --error-exitcode 3 \
    "$PY" -m nopebench.cache_kernels.boundary
  grep -q "ERROR SUMMARY: 0 errors" "$WORK/memcheck.log" && log "      memcheck: ERROR SUMMARY: 0 errors" ||
    log "      memcheck: no clean ERROR SUMMARY line"
  grep -E "^boundary:|^FAIL" "$WORK/memcheck.log" 2>/dev/null | head -n 5 | sed 's/^/      /' >>"$SUMMARY"
else
  log "FAIL  memcheck: compute-sanitizer not found"
  status=1
fi

step bench-cache 180 "$PY" -m nopebench bench-cache --results-dir "$RESULTS"
grep -E "^targets at|copy .* GB/s|results:" "$WORK/bench-cache.log" 2>/dev/null | sed 's/^/      /' >>"$SUMMARY"
step pytest 150 "$PY" -m pytest -q -p no:cacheprovider -m "not slow" tests/test_cache_kernels_gpu.py \
  tests/test_cache_kernels.py tests/test_cache_kernels_bench.py tests/test_build.py

log "total $(($(date +%s) - T0)) s; status $status; files in $WORK"

if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  tar -czf "$OUT/device_cache.tar.gz" -C "$(dirname "$WORK")" "$(basename "$WORK")"
  cp "$SUMMARY" "$OUT/summary.txt"
  for f in memcheck pytest verify-layout; do
    [ -f "$WORK/$f.log" ] && cp "$WORK/$f.log" "$OUT/$f.log"
  done
  bench=$(ls -d "$RESULTS"/bench-cache/*/ 2>/dev/null | tail -n 1)
  if [ -n "$bench" ]; then
    cp "$bench/results.csv" "$OUT/bench-cache-results.csv" 2>/dev/null
    cp "$bench/run.json" "$OUT/bench-cache-run.json" 2>/dev/null
  fi
  verify=$(ls -d "$RESULTS"/verify-layout/*/ 2>/dev/null | tail -n 1)
  [ -n "$verify" ] && cp "$verify/run.json" "$OUT/verify-layout-run.json" 2>/dev/null
fi
exit $status
