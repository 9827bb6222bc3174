set -e
pip install --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site NOPEBENCH_GIT_SHA=$(cat .sha)
for v in "R3@regpath4.cu -DBN=32 -DSPLITACC=1" "R3@regpath4.cu -DBN=32 -DEXACT=0"; do
  n=$(echo "$v" | tr -c 'a-zA-Z0-9\n' '_')
  ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats --section Occupancy -k regex:regpath -c 1 python3 results/reference/decode-tuning/regpath/src/probe.py --ncu --variants "$v" > $OUT/ncu-$n.txt 2>&1 || true
  echo "== $v"; grep -E "Duration|Issued Ipc|Eligible Warps|Active Warps Per|Warp Cycles Per Issued|No Eligible|highest-utilized|Registers Per|Achieved Active|DRAM Throughput|Compute \(SM\)|stall|Stall" $OUT/ncu-$n.txt | head -30
done
