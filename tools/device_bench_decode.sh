#!/usr/bin/env bash
# bench-decode against the decode kernels serving engines run, on an H200, from the repository
# root of a copy that carries .whl/ (../shared/tools/device-wheels) and .flashmla/
# (../shared/tools/device-flashmla):
#
#   NOPEBENCH_GIT_SHA=<commit> bash tools/device_bench_decode.sh
#
# The copy, the FlashInfer wheel and FlashMLA's build must fit the device's 64 MiB transfer. The
# recorded grids under results/reference/*-bench-decode-full are most of the tree and nothing
# here reads them, so leave them out of the working tree for the call and back in after it:
#   git sparse-checkout set --no-cone '/*' '!/results/reference/h200-bench-decode-full/' \
#     '!/results/reference/h100-bench-decode-full/'
#   git sparse-checkout disable
#
# 1. install the carried wheels into /tmp/site; put .flashmla (FlashMLA from vLLM's build) on
#    PYTHONPATH
# 2. the flashmla GPU tests (every layout and head padding against the reference, graph replay)
# 3. the full bench-decode grid (nopebench/configs/bench/h200-nope.yaml) with native, flashmla,
#    flashinfer-fa3-bf16 and flashinfer-fa3-fp8 in one run
# 4. a short table: NoPE against the best shim and the best deployable path, the accuracy of
#    each implementation, the criteria
#
# STAGE=tests or STAGE=grid runs one of steps 2 and 3 (default: both). BENCH_ARGS adds
# bench-decode arguments (e.g. "--heads 16 --tokens 512" for a single cell). Everything lands in
# results/device-bench-decode/<UTC time>/; when OUT is set, a tar.gz of it and the key files go
# there (8 files, the most a device call returns). Step 3 is capped so the whole script stays
# under TOTAL_S seconds (default 570, about 9.5 minutes: the device's per-call limit, less the
# transfers).
# Exit status: 0 when the tests passed and bench-decode exited 0, else 1.

set -uo pipefail
cd "$(dirname "$0")/.."

T0=$(date +%s)
STAGE=${STAGE:-all}
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
WORK=results/device-bench-decode/$STAMP
mkdir -p "$WORK"
SUMMARY=$WORK/summary.txt
status=0
note() { echo "$*" | tee -a "$SUMMARY"; }

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    2>&1 | tail -n 3
else
  note "no .whl/*.whl carried: using the packages already installed"
fi
export PYTHONPATH="$PWD:/tmp/site:$PWD/.flashmla${PYTHONPATH:+:$PYTHONPATH}"
export COLUMNS=${COLUMNS:-200} PYTHONUNBUFFERED=1
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-$PWD/build/flashinfer-jit}
[ -n "${NOPEBENCH_GIT_SHA:-}" ] || note "NOPEBENCH_GIT_SHA is not set: rows will carry no git sha"
nvidia-smi >"$WORK/nvidia-smi.txt" 2>&1 || true
python3 - <<'PY' 2>&1 | tee -a "$SUMMARY"
from nopebench.impls import flashmla
from nopebench.environment import gpu_info
print("gpu:", gpu_info().get("gpu"), "SM", gpu_info().get("sm"))
print("flashmla:", flashmla.import_error() or "importable, from %s %s" % flashmla.flashmla_library())
PY

if [ "$STAGE" = all ] || [ "$STAGE" = tests ]; then
  timeout 180 python3 -m pytest -q -p no:cacheprovider -rs tests/test_flashmla.py \
    >"$WORK/flashmla_tests.log" 2>&1
  rc=$?
  tail -n 20 "$WORK/flashmla_tests.log"
  note "flashmla GPU tests: exit $rc ($(tail -n 1 "$WORK/flashmla_tests.log"))"
  [ "$rc" -eq 0 ] || status=1
fi

if [ "$STAGE" = all ] || [ "$STAGE" = grid ]; then
  left=$((${TOTAL_S:-570} - ($(date +%s) - T0)))
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
  timeout "$left" python3 -m nopebench bench-decode --config h200-nope \
    --impl native --impl flashmla --impl flashinfer-fa3-bf16 --impl flashinfer-fa3-fp8 \
    ${BENCH_ARGS:-} --results-dir "$WORK/runs" >"$WORK/bench_decode.log" 2>&1
  rc=$?
  note "bench-decode: exit $rc after $(($(date +%s) - T0)) s of the script (cap ${left} s)"
  [ "$rc" -eq 0 ] || status=1
  RUN=$(ls -d "$WORK"/runs/bench-decode/*/ 2>/dev/null | tail -n 1)
  if [ -n "$RUN" ] && [ -f "$RUN/nope_vs_shim.csv" ]; then
    python3 - "$RUN" <<'PY' 2>&1 | tee -a "$SUMMARY"
import sys

import pandas as pd

run = sys.argv[1]
rows = pd.read_csv(f"{run}/results.csv")
answer = pd.read_csv(f"{run}/nope_vs_shim.csv")
ms = rows[rows.median_ms.notna()].pivot_table(
    index=["width", "heads", "query_tokens"], columns=["impl", "mode"], values="median_ms"
)
pick = [("native", "nope"), ("flashinfer-fa3-bf16", "nope"), ("flashinfer-fa3-fp8", "nope"),
        ("flashmla", "nope"), ("flashmla", "shim"), ("native", "shim")]
table = ms.reindex(columns=pd.MultiIndex.from_tuples(pick))
table.columns = ["native", "fa3-bf16", "fa3-fp8", "flashmla(nope)", "flashmla shim", "native shim"]
native = answer[answer.impl == "native"].set_index(["width", "heads", "query_tokens"])
table["best shim"] = native.best_shim
table["NoPE/best shim"] = native.vs_best_shim.round(2)
table["NoPE/best deploy"] = native.vs_best_deployable.round(2)
table["NoPE/own shim"] = native.vs_own_shim.round(2)
with pd.option_context("display.width", 250, "display.max_rows", 200, "display.float_format", "{:.4f}".format):
    print("median ms (native's NoPE ratios: > 1 means native NoPE is faster)")
    print(table.to_string())
ran = rows[rows.skipped.isna()].assign(passed=lambda d: d.passed.fillna(False).astype(bool))
for col in ("cos_diff", "mismatch_fraction", "error", "accuracy_class", "library", "library_version"):
    ran[col] = ran[col] if col in ran else None
ran["passed_strict"] = ran.passed_strict.fillna(False).astype(bool) if "passed_strict" in ran else False
acc = ran.groupby("impl").agg(
    cells=("case", "count"), passed=("passed", "sum"), accuracy_class=("accuracy_class", "first"),
    strict_too=("passed_strict", "sum"),
    worst_cos=("cos_diff", "max"), worst_mismatch=("mismatch_fraction", "max"),
    errors=("error", "count"), library=("library", "first"), version=("library_version", "first"),
)
print("\naccuracy, every cell that ran (each held to its own class)")
print(acc.to_string())
crit = pd.read_csv(f"{run}/criteria.csv")
print("\ncriteria")
cols = ["criterion", "cell", "measured", "target", "passed", "within_spread", "cells", "failing_cells"]
print(crit.reindex(columns=cols).to_string(index=False))
PY
  else
    note "no finished bench-decode run directory (see bench_decode.log)"
    tail -n 30 "$WORK/bench_decode.log"
  fi
fi

note "total $(($(date +%s) - T0)) s, exit $status"
if [ -n "${OUT:-}" ]; then
  tar -czf "$OUT/device-bench-decode.tar.gz" -C "$(dirname "$WORK")" "$STAMP"
  cp "$SUMMARY" "$OUT/"
  for f in flashmla_tests.log bench_decode.log; do [ -f "$WORK/$f" ] && cp "$WORK/$f" "$OUT/"; done
  if [ -n "${RUN:-}" ]; then
    for f in results.csv criteria.csv criteria_cells.csv run.json; do  # the rest: in the tar.gz
      [ -f "$RUN/$f" ] && cp "$RUN/$f" "$OUT/"
    done
  fi
fi
exit $status
