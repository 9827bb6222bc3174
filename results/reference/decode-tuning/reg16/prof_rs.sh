pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | grep -v WARN | tail -1
export PYTHONPATH=$PWD:/tmp/site
cd _dev
ST=4 MB=2 EXTRA="-DRS -DIDX_SMEM=2208" OUT=$OUT timeout 240 ncu --kernel-name reg16_decode --launch-skip 2 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section SourceCounters -o $OUT/r python3 prof_reg16.py > $OUT/ncu.log 2>&1
ncu -i $OUT/r.ncu-rep --page details > $OUT/details.txt 2>&1
ncu -i $OUT/r.ncu-rep --page source --csv --print-source sass > $OUT/src.csv 2>&1; gzip $OUT/src.csv; rm -f $OUT/r.ncu-rep
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
grep -E "Duration|Issued Warp|Eligible Warps|Active Warps Per|Warp Cycles Per Issued|SM Frequency|excessive" $OUT/details.txt
