pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | grep -v WARN | tail -1
export PYTHONPATH=$PWD:/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
CASES=16x128,16x512 VARIANTS='[[4,2,"-DRS -DIDX_SMEM=2208"],[4,2,"-DRS -DIDX_SMEM=2208 -DFTZ"]]' OUT=$OUT/ftz timeout 200 python3 _dev/run_reg16.py > $OUT/ftz.log 2>&1
grep -E "^\|" $OUT/ftz.log; grep -iE "error|Traceback" $OUT/ftz.log | head -3
cp _dev/reg16.cu $OUT/
