#!/usr/bin/env bash
# Device call: an ncu profile (--set full, with per-instruction warp-state samples) of the register
# kernel at 16 x 512, NoPE and shim rows, width 2176 with 2051 active; the details pages and the
# SASS source pages (CSV) come back for reading on a CPU machine.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi > $OUT/nvidia-smi.txt 2>&1; date -u >> $OUT/nvidia-smi.txt; echo "${SHA:-unset}" >> $OUT/nvidia-smi.txt
python3 -m nopebench build > /tmp/build.log 2>&1; grep -E "registers|spill" /tmp/build.log | head -4
for mode in nope shim; do
  extra=""; [ $mode = shim ] && extra="--rope"
  timeout 200 ncu --clock-control none --set full --import-source yes -k regex:register_decode \
    --launch-skip 2 --launch-count 1 -f -o /tmp/reg16-$mode \
    python3 tools/profile_native.py --register --heads 16 --tokens 512 $extra > /tmp/ncu-$mode.log 2>&1
  echo "$mode: ncu rc $?"; tail -2 /tmp/ncu-$mode.log
  ncu --import /tmp/reg16-$mode.ncu-rep --page details --print-details all > $OUT/details-$mode.txt 2>&1
  ncu --import /tmp/reg16-$mode.ncu-rep --page source --csv --print-source sass > /tmp/sass-$mode.csv 2>&1
  gzip -c /tmp/sass-$mode.csv > $OUT/sass-$mode.csv.gz
  ls -la $OUT/sass-$mode.csv.gz; head -c 600 /tmp/sass-$mode.csv; echo
done
grep -E "Duration|Issue Slots Busy|Warp Cycles Per Issued|Achieved Occupancy|Memory Throughput|Registers Per" $OUT/details-nope.txt | head -12
