set -e
pip install --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site NOPEBENCH_GIT_SHA=$(cat .sha)
python3 results/reference/decode-tuning/regpath/src/probe.py --variants "${VARIANTS}" 2>&1 | tee $OUT/probe.txt
REGPATH_SRC=${SRC:-regpath2.cu} python3 results/reference/decode-tuning/regpath/src/bench.py --rings ${RINGS:-6} --extra="${EXTRA:-}" --cases ${CASES:-16x512,16x128} --widths ${WIDTHS:-2176} 2>&1 | tee $OUT/bench.txt | grep -E "debug|^ *[0-9]+ +[0-9]+ [0-9]+ "
