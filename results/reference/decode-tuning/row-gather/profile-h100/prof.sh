# Nsight Compute on the 64-head kernel at 64 x 512 (NoPE, width 2176), the tree's form and
# the row-gather form (ab/rowwarp.diff), one launch each; shared wavefronts by opcode and
# partition stalls for both.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site
nvidia-smi > $OUT/nvidia-smi.txt; date -u >> $OUT/nvidia-smi.txt; ncu --version | tail -1 >> $OUT/nvidia-smi.txt
prof() {
  timeout 150 ncu --clock-control none -k regex:hopper_wide --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section SourceCounters --import-source no -o /tmp/$1 \
    python3 tools/profile_native.py --wide --heads 64 --tokens 512 > $OUT/ncu-$1.log 2>&1
  echo "$1 rc=$?"
  ncu -i /tmp/$1.ncu-rep > $OUT/details-$1.txt 2>&1
  ncu -i /tmp/$1.ncu-rep --page source --csv --print-source sass > /tmp/src-$1.csv 2>/dev/null
  python3 tools/ncu_partitions.py /tmp/src-$1.csv --shared --blocks 16896 > $OUT/shared-$1.txt 2>&1
  python3 tools/ncu_partitions.py /tmp/src-$1.csv --top 25 > $OUT/partitions-$1.txt 2>&1
  gzip -c /tmp/src-$1.csv > $OUT/src-$1.csv.gz
  grep -E "Duration|L1/TEX Cache Throughput|Memory Throughput|SM Frequency" $OUT/details-$1.txt | head -6
  tail -1 $OUT/shared-$1.txt
}
prof before
(git apply ab/rowwarp.diff || patch -s -p1 < ab/rowwarp.diff) && prof rowwarp
git checkout nopebench/impls/native/hopper_ws_decode.py
for f in before rowwarp; do echo "== $f"; head -6 $OUT/shared-$f.txt; done
