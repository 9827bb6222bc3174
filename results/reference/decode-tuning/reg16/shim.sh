pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | grep -v WARN | tail -1
export PYTHONPATH=$PWD:/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
V='[[4,2,"-DRS -DIDX_SMEM=2208 -DROPE"]]'
MODE=shim RANDOM_ROPE=1 CASES=16x1,16x128,16x512 VARIANTS="$V" OUT=$OUT/random-rope timeout 200 python3 _dev/run_reg16.py > $OUT/random-rope.log 2>&1
grep -E "^\|" $OUT/random-rope.log; grep -iE "error|Traceback" $OUT/random-rope.log | head -3
MODE=shim CASES=16x256,16x512 WIDTHS=2176,2048 VARIANTS="$V" OUT=$OUT/shim timeout 240 python3 _dev/run_reg16.py > $OUT/shim.log 2>&1
grep -E "^\|" $OUT/shim.log; grep -iE "error|Traceback" $OUT/shim.log | head -3
cp _dev/reg16.cu _dev/run_reg16.py $OUT/
