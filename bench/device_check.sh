#!/usr/bin/env bash
# One prepared GPU session: GPU tests, `emmy run --bench`, then the suites; logs under $OUT
# (or ./device-out). Run on the GPU machine from the repository root, with the project on
# PYTHONPATH, e.g.
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \
#   export PYTHONPATH=$PWD:/tmp/site && bash bench/device_check.sh
# Knobs (environment): SUITES="core matmul attention" (the suites to run, in order),
# BUDGET=400 (each suite's --budget in seconds), ONLY="" (--only prefixes), TESTS=1 (0 skips
# the GPU tests).
set -o pipefail
export PYTHONUNBUFFERED=1
# Logs go to $work; after each step they are packed into $OUT/device.tgz (the device tool brings
# back only a few files), so a run stopped at its limit still returns what it finished.
dest=${OUT:-device-out}
out=$(mktemp -d /tmp/emmy-device.XXXX)
mkdir -p "$dest"
pack() { cp BENCHMARKS.md "$out/" 2>/dev/null; tar czf "$dest/device.tgz" -C "$out" .; }
SUITES=${SUITES:-core}
BUDGET=${BUDGET:-400}
only=()
for o in ${ONLY:-}; do only+=(--only "$o"); done
step() {  # step NAME SECONDS CMD...: run with a time limit, log to $out/NAME.log
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    echo "== $name: $*"
    timeout -k 10 "$limit" "$@" > "$out/$name.log" 2>&1
    local rc=$?
    tail -n "${TAIL:-25}" "$out/$name.log"
    echo "== $name: rc=$rc in $((SECONDS - t0)) s"
    pack
}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv \
    > "$out/gpu.txt" 2>&1; cat "$out/gpu.txt"
python3 -c "import torch, cupy; print('torch', torch.__version__, 'cupy', cupy.__version__)"
if [ "${TESTS:-1}" = 1 ]; then
    step gpu_tests 240 python3 -m pytest -m gpu tests -q -p no:cacheprovider
fi
step run_bench 120 python3 -m emmy run examples/rmsnorm.py --bench --json "$out/rmsnorm_bench.json"
for s in $SUITES; do
    TAIL=40 step "suite_$s" $((BUDGET + 200)) python3 -m emmy bench --suite "$s" "${only[@]}" \
        --budget "$BUDGET" --json "$out/$s.json"
done
pack
