set -e
pip install --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site NOPEBENCH_GIT_SHA=$(cat .sha)
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
python3 results/reference/decode-tuning/regpath/src/bench.py --rings ${RINGS:-2,3} --cases ${CASES:-16x512,16x128,32x512,32x128} --widths ${WIDTHS:-2176} 2>&1 | tee $OUT/log.txt
