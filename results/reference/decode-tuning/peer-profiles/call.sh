#!/usr/bin/env bash
# One device call: Nsight Compute on native NoPE and its two fastest peers (FlashInfer fa3 bf16,
# FlashMLA), the same cell's inputs for each (tools/profile_peer.py: bench-decode's cache,
# queries and index rows, checked before the profiled launches), at the cells where native is
# furthest from the done-when: 128 x 512, 64 x 512, 32 x 512 (NoPE, width 2176, 2051 active).
# Carry .whl and .flashmla. Under $OUT: profiles.tar.gz (each run's ncu log, which holds its CSV,
# and the program's output), metrics.csv
# (long form: impl, cell, kernel, launch, section, metric, unit, value), summary.txt (the key
# metrics, one column a kernel), env.json.
set -uo pipefail
T0=$(date +%s)
W=/tmp/prof && rm -rf $W && mkdir -p $W
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site:$PWD/.flashmla PYTHONUNBUFFERED=1
export FLASHINFER_WORKSPACE_BASE=$PWD/build/flashinfer-jit
python3 -c "import json; from nopebench.environment import environment_header as e; print(json.dumps(e(), default=str, indent=1))" > $OUT/env.json 2>&1
SECTIONS="SpeedOfLight LaunchStats Occupancy ComputeWorkloadAnalysis MemoryWorkloadAnalysis WarpStateStats SchedulerStats InstructionStats"
ARGS=""; for s in $SECTIONS; do ARGS="$ARGS --section $s"; done
for cell in ${CELLS:-128x512 64x512 32x512}; do
  h=${cell%x*}; t=${cell#*x}
  for impl in native flashinfer-fa3-bf16 flashmla; do
    left=$(( ${TOTAL_S:-430} - 20 - ($(date +%s) - T0) ))  # 20 s kept for the summary
    if [ $left -lt 30 ]; then echo "no time left for $impl $cell"; continue; fi
    tag=${impl}_h${h}t${t}
    timeout $left ncu --clock-control none --nvtx --nvtx-include "profile/" $ARGS --csv --page details \
      --log-file $W/$tag.ncu.log python3 tools/profile_peer.py --impl $impl --heads $h --tokens $t \
      > $W/$tag.out 2> $W/$tag.err  # ncu's own output, its CSV included, goes to the log
    echo "$tag rc $? at $(( $(date +%s) - T0 )) s: $(tail -1 $W/$tag.out) $(tail -1 $W/$tag.err)"
  done
done
python3 - $W $OUT <<'PY'
import csv, glob, io, os, sys
work, out = sys.argv[1:3]
rows = []
for path in sorted(glob.glob(os.path.join(work, "*.ncu.log"))):  # ncu writes its CSV there
    impl, cell = os.path.basename(path)[: -len(".ncu.log")].rsplit("_", 1)
    text = open(path).read()
    start = text.find('"ID"')
    if start < 0:
        continue
    for r in csv.DictReader(io.StringIO(text[start:])):
        if not r.get("Metric Name") or r.get("Kernel Name") is None:
            continue  # a rule's advice, or a line of ncu's own
        rows.append(dict(impl=impl, cell=cell, kernel=r["Kernel Name"][:80], launch=r["ID"],
                         section=r["Section Name"], metric=r["Metric Name"],
                         unit=r["Metric Unit"], value=r["Metric Value"]))
with open(os.path.join(out, "metrics.csv"), "w", newline="") as fh:
    w = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["impl"])
    w.writeheader(); w.writerows(rows)
KEY = ["Duration", "SM Frequency", "Grid Size", "Block Size", "Registers Per Thread",
       "Dynamic Shared Memory Per Block", "Waves Per SM", "Achieved Occupancy",
       "Compute (SM) Throughput", "Memory Throughput", "DRAM Throughput", "L2 Hit Rate",
       "L1/TEX Hit Rate", "Executed Ipc Active", "Issue Slots Busy", "SM Busy",
       "No Eligible", "Warp Cycles Per Issued Instruction", "Executed Instructions"]
cols = {}
for r in rows:  # the last launch of each kernel
    cols.setdefault((r["cell"], r["impl"], r["kernel"]), {})[r["metric"]] = f'{r["value"]} {r["unit"]}'.strip()
lines = []
for (cell, impl, kernel), m in cols.items():
    lines.append(f"== {cell} {impl}: {kernel}")
    lines += [f"  {k:36} {m[k]}" for k in KEY if k in m]
open(os.path.join(out, "summary.txt"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
tar -czf $OUT/profiles.tar.gz -C $W .
echo "total $(( $(date +%s) - T0 )) s"
