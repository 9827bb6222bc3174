set -e
pip install --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site NOPEBENCH_GIT_SHA=$(cat .sha)
for v in "R4@regpath2.cu" "R3@regpath.cu"; do
  n=$(echo $v | tr -c 'a-zA-Z0-9\n' '_')
  ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats --section SourceCounters -k regex:regpath -c 1 python3 results/reference/decode-tuning/regpath/src/probe.py --ncu --variants "$v" > $OUT/ncu-$n.txt 2>&1 || true
  echo "== $v"; grep -E "Duration|Issued Ipc|Eligible Warps|Warp Cycles Per Issued|No Eligible|Stall|stall|highest-utilized" $OUT/ncu-$n.txt | head -30
done
