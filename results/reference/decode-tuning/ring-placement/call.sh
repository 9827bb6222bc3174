#!/usr/bin/env bash
# One device call: build gather.cu, time its three placements, then count each one's shared
# wavefronts and cp.async instructions under Nsight Compute (clocks left as they are).
set -uo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
nvcc --version | tail -n 2 > "$OUT/nvcc.txt"
nvcc -arch=sm_90a -O3 -o /tmp/gather gather.cu || exit 1
for v in 0 1 2; do /tmp/gather $v; done | tee "$OUT/times.txt"
m="l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed_op_ldgsts.sum"
for v in 0 1 2; do
    ncu --clock-control none --launch-count 1 --csv --metrics "$m" /tmp/gather $v > "$OUT/ncu-$v.csv" 2>&1
    ncu --clock-control none --launch-count 1 --csv \
        --metrics "regex:l1tex__data_pipe_lsu_wavefronts_mem_shared.*\.sum$" /tmp/gather $v \
        > "$OUT/ncu-regex-$v.csv" 2>&1
done
grep -h "gather" "$OUT"/ncu-[012].csv | cut -c1-400
