#!/usr/bin/env bash
# One device call: how busy each pipe of the SM is, under Nsight Compute, for native NoPE and
# FlashInfer fa3 bf16 on the same cell's inputs (tools/profile_peer.py: bench-decode's cache,
# queries and index rows, each output checked before the profiled launches), at 128 x 512 and
# 64 x 512 (NoPE, width 2176, 2051 active). The metrics are those of METRICS that this ncu knows
# for the GPU (ncu --query-metrics), each as the average over SMs in % of its peak while active.
# Carry .whl. Under $OUT: query.txt (the metrics found), pipes.csv (cell, impl, kernel, metric,
# value), profiles.tar.gz (ncu logs and the program's output), env.json.
set -uo pipefail
T0=$(date +%s)
W=/tmp/pipes && rm -rf $W && mkdir -p $W
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
python3 -c "import json; from nopebench.environment import environment_header as e; print(json.dumps(e(), default=str, indent=1))" > $OUT/env.json 2>&1
METRICS=${METRICS:-"sm__pipe_tensor_op_gmma_cycles_active sm__pipe_tensor_op_hmma_cycles_active sm__pipe_shared_cycles_active sm__pipe_fma_cycles_active sm__pipe_alu_cycles_active sm__pipe_xu_cycles_active sm__inst_executed_pipe_lsu sm__inst_executed_pipe_xu smsp__issue_active l1tex__data_pipe_lsu_wavefronts_mem_shared l1tex__data_pipe_lsu_wavefronts l1tex__throughput dram__throughput"}
ncu --query-metrics --chip gh100 > $W/query-all.txt 2>&1
LIST=""
for m in $METRICS; do
  if grep -q "^$m\b" $W/query-all.txt; then LIST="$LIST,$m.avg.pct_of_peak_sustained_active"; echo "$m" >> $OUT/query.txt
  else echo "$m (not known to this ncu)" >> $OUT/query.txt; fi
done
LIST="gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second${LIST}"
echo "metrics: $LIST"
for cell in ${CELLS:-128x512 64x512}; do
  h=${cell%x*}; t=${cell#*x}
  for impl in native flashinfer-fa3-bf16; do
    left=$(( ${TOTAL_S:-400} - 15 - ($(date +%s) - T0) ))
    if [ $left -lt 30 ]; then echo "no time left for $impl $cell"; continue; fi
    tag=${impl}_h${h}t${t}
    timeout $left ncu --clock-control none --nvtx --nvtx-include "profile/" --metrics "$LIST" \
      --csv --page raw --log-file $W/$tag.ncu.log python3 tools/profile_peer.py --impl $impl \
      --heads $h --tokens $t > $W/$tag.out 2> $W/$tag.err
    echo "$tag rc $? at $(( $(date +%s) - T0 )) s: $(tail -1 $W/$tag.out) $(tail -1 $W/$tag.err)"
  done
done
python3 - $W $OUT <<'PY'
import csv, glob, io, os, sys
work, out = sys.argv[1:3]
rows = []
for path in sorted(glob.glob(os.path.join(work, "*.ncu.log"))):
    impl, cell = os.path.basename(path)[: -len(".ncu.log")].rsplit("_", 1)
    text = open(path).read()
    start = text.find('"ID"')
    if start < 0:
        continue
    table = list(csv.reader(io.StringIO(text[start:])))
    head, units, body = table[0], table[1], table[2:]
    for r in body:  # --page raw: one row a launch, one column a metric; keep each kernel's last
        rec = dict(zip(head, r))
        for name, unit in zip(head, units):
            if "__" in name:
                rows.append(dict(cell=cell, impl=impl, kernel=rec.get("Kernel Name", "")[:60],
                                 launch=rec.get("ID"), metric=name, unit=unit, value=rec[name]))
last = {}
for r in rows:
    last[(r["cell"], r["impl"], r["kernel"], r["metric"])] = r
with open(os.path.join(out, "pipes.csv"), "w", newline="") as fh:
    w = csv.DictWriter(fh, fieldnames=["cell", "impl", "kernel", "launch", "metric", "unit", "value"])
    w.writeheader(); w.writerows(last.values())
for (cell, impl, kernel, metric), r in last.items():
    print(f"{cell:9} {impl:20} {kernel[:28]:28} {metric[:60]:60} {r['value']} {r['unit']}")
PY
tar -czf $OUT/profiles.tar.gz -C $W .
echo "total $(( $(date +%s) - T0 )) s"
