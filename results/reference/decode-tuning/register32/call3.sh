#!/usr/bin/env bash
# Device call 3 (da51c92, the register kernel back to 16 heads): its GPU tests, then the full
# bench-decode grid (tools/device_bench_decode.sh). Only the files the grid's tar.gz lacks are
# kept beside it under $OUT (the device returns at most 8).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
PYTHONPATH=$PWD:/tmp/site timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/test_native_decode.py -k register > $OUT/register_gpu_tests.log 2>&1
echo "register GPU tests: rc $? ($(tail -n 1 $OUT/register_gpu_tests.log))"
NOPEBENCH_GIT_SHA=${SHA:-unset} TOTAL_S=480 bash tools/device_bench_decode.sh
rc=$?
(cd $OUT && rm -f results.csv criteria_cells.csv nope_vs_shim.csv run.json criteria.csv)
exit $rc
