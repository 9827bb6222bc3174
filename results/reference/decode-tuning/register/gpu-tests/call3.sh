#!/usr/bin/env bash
# GPU tests at the planned tree: the register kernel's (every GPU test that names it), the cache
# kernels' (their build moved), the registry's (plans through choose_plan).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /tmp/pip.log 2>&1
export PYTHONPATH=$PWD:/tmp/site:$PWD/.flashmla PYTHONUNBUFFERED=1 COLUMNS=200
mkdir -p /tmp/o
nvidia-smi > /tmp/o/nvidia-smi.txt 2>&1
cp .sha /tmp/o/sha.txt; date -u > /tmp/o/date.txt; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" > /tmp/o/versions.txt 2>&1
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_native_decode.py -k register > /tmp/o/register_gpu_tests.log 2>&1; echo "register rc $?"; tail -2 /tmp/o/register_gpu_tests.log
timeout 250 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cache_kernels_gpu.py tests/test_impl_registry.py > /tmp/o/other_gpu_tests.log 2>&1; echo "other rc $?"; tail -2 /tmp/o/other_gpu_tests.log
tar -czf $OUT/gpu-tests.tar.gz -C /tmp o
