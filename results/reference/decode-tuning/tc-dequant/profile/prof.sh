set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -1
export PYTHONPATH="$PWD:/tmp/site"
R=$OUT
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt 2>&1; ncu --version | tail -1 >> $R/gpu.txt
for h in 16 32; do
for m in base tc; do
  if [ $m = tc ]; then export NOPEBENCH_EXP_TC_DEQ=1; else unset NOPEBENCH_EXP_TC_DEQ; fi
  timeout 100 ncu --clock-control none -k regex:hopper_ws --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters --import-source no \
    -o /tmp/prof-$h-$m python3 tools/profile_native.py --ws --heads $h --tokens 512 > $R/ncu-h$h-$m.log 2>&1
  echo "h$h $m ncu rc=$?"
  ncu -i /tmp/prof-$h-$m.ncu-rep --page source --csv --print-source sass > /tmp/src-$h-$m.csv 2>/dev/null
  python3 tools/ncu_partitions.py /tmp/src-$h-$m.csv --top 25 > $R/partitions-h$h-$m.txt 2>&1
  ncu -i /tmp/prof-$h-$m.ncu-rep --page details > $R/details-h$h-$m.txt 2>&1
  head -6 $R/partitions-h$h-$m.txt
  grep -E "Duration|Compute \(SM\) Throughput|DRAM Throughput|L1/TEX Cache Throughput|Issue Slots Busy|No Eligible" $R/details-h$h-$m.txt | head -8
done
done
cd $R && tar czf prof.tgz *.txt *.log && rm -f partitions* details* ncu-*
