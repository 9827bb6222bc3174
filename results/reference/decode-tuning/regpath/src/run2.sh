set -e
pip install --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site NOPEBENCH_GIT_SHA=$(cat .sha)
python3 results/reference/decode-tuning/regpath/src/probe.py --variants "${VARIANTS}" 2>&1 | tee $OUT/probe.txt
cuobjdump -sass $OUT/regpath-r3.so > $OUT/sass.txt 2>&1 || true
ncu --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section InstructionStats --section Occupancy --section MemoryWorkloadAnalysis -k regex:regpath -c 1 python3 results/reference/decode-tuning/regpath/src/probe.py --ncu --variants "" > $OUT/ncu.txt 2>&1 || true
grep -E "Pipe|pipe|Throughput|Issue|Stall|Warp Cycles|Eligible|Active Warps|Duration|Registers|Achieved|Executed Ipc" $OUT/ncu.txt | head -60
grep -oE "^\s+/\*[0-9a-f]+\*/\s+[A-Z0-9_.]+" $OUT/sass.txt | awk '{print $2}' | sort | uniq -c | sort -rn | head -30
