#!/usr/bin/env bash
# One prepared GPU session: GPU tests, then the `core` suite, logs under $OUT (or ./device-out).
# Run on the GPU machine from the repository root, with the project on PYTHONPATH, e.g.
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \
#   export PYTHONPATH=$PWD:/tmp/site && bash bench/device_check.sh
set -o pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-device-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$out/gpu.txt"
python3 -m pytest -m gpu tests -q -p no:cacheprovider 2>&1 | tee "$out/gpu_tests.log"
python3 -m emmy run examples/rmsnorm.py --bench --json "$out/rmsnorm_bench.json" 2>&1 | tee "$out/run_bench.log"
python3 -m emmy bench --suite core --json "$out/core.json" 2>&1 | tee "$out/core.log"
cp BENCHMARKS.md "$out/"
