#!/usr/bin/env bash
# One prepared GPU session: GPU tests, `emmy run --bench`, then the suites; logs under $OUT
# (or ./device-out). Run on the GPU machine from the repository root, with the project on
# PYTHONPATH, e.g.
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \
#   export PYTHONPATH=$PWD:/tmp/site && bash bench/device_check.sh
# The defaults fit one 15-minute lease with its start-up (about 12 minutes of steps): the GPU
# tests, two wgmma+TMA matmul rows (one with clusters) and FlashAttention-3's attention row
# through `emmy run --bench`, then the matmul and
# attention suites (attention: f16 causal and full, f32 causal on CUDA cores, then bf16 and a
# Llama-3-8B decoding step (split-KV rows), as far as its budget goes: "attention:60:decode"
# times the decoding step alone; the core suite was measured on 2026-11-30; the conv suite is new: with time
# left, or TESTS=0 RUN_BENCH=0, add it as SUITES="... conv:90", and the gather suite, GPT-2's
# embeddings and LayerNorm, as "gather:40", and the block suite, a Llama-3-8B decoder layer
# and DeepSeek-V3's MoE router (top 8 of 256 experts) and GPT-2-vocabulary sampling filters
# (top 50, top-p) against eager and torch.compile, as "block:180" ("block:60:moe" times the
# router alone, "block:60:sampling" the filters; the layer's plan, 193 programs through the cost
# model, took 74 s on a 2-core CPU); the row kernels' cheaper
# arithmetic, bench/sass_counts.py, is timed by "core:60:softmax,log_softmax,elementwise"; the
# rows suite, a few long rows shared by thread-block clusters (REDUCE=cluster:C, never timed),
# as "rows:45"; the weight-only int8 linear layers (dequantized inside mma.sync or, at 4,096
# rows, wgmma products, or cut; never timed; last in the matmul suite, past its default
# budget) as "matmul:60:int8", and the int4 ones (two weights to a byte, never timed) as
# "matmul:90:int4", GPTQ's format (eight to an int32, zero points on the pairs) as
# "matmul:60:gptq", AWQ's (eight along n, interleaved) as "matmul:60:awq"; the split:S:last
# rows (one kernel, each tile's, query block's or job's last block summing the partials) are in
# the GPU tests and the decoding step's attention).
# Knobs (environment):
# SUITES="matmul:120 attention:120" — each item SUITE[:BUDGET[:ONLY]] runs
# `emmy bench --suite SUITE --budget BUDGET (400) --only ONLY` (ONLY: a comma-separated list of
# workload-name prefixes); ROWS_<SUITE>="ROW;ROW;..." adds `--row ROW` for each (rows checked
# and timed besides the planned ones); TESTS=1 (0 skips the GPU tests), TESTS_LIMIT=180
# (seconds), TEST_FILES="a.py b.py" (these test files first), TESTS_AFTER=1 (the tests after the
# suites), RUN_BENCH=1 (0 skips the `emmy run --bench` steps; RMSNORM=1 adds rmsnorm's),
# SUITE_SLACK=30 (seconds a suite may run past its budget before it is stopped), DEADLINE=0
# (seconds from the start after which every step is cut short, so that the logs are packed
# before the device call's own limit; 0: no deadline).
set -o pipefail
export PYTHONUNBUFFERED=1
# Logs go to $work; after each step they are packed into $OUT/device.tgz (the device tool brings
# back only a few files), so a run stopped at its limit still returns what it finished.
# `python bench/device_summary.py device.tgz` turns the archive into markdown.
dest=${OUT:-device-out}
out=$(mktemp -d /tmp/emmy-device.XXXX)
mkdir -p "$dest"
pack() { cp BENCHMARKS.md "$out/" 2>/dev/null; tar czf "$dest/device.tgz" -C "$out" .; }
step() {  # step NAME SECONDS CMD...: run with a time limit, log to $out/NAME.log
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    if [ "${DEADLINE:-0}" -gt 0 ] && [ $((DEADLINE - SECONDS)) -lt "$limit" ]; then
        limit=$((DEADLINE - SECONDS))
        if [ "$limit" -lt 10 ]; then
            echo "== $name: skipped, the deadline (${DEADLINE} s) is near"
            printf '%s\t%s\t%s\n' "$name" skipped 0 >> "$out/steps.tsv"
            return
        fi
    fi
    echo "== $name: $*"
    timeout -k 10 "$limit" "$@" > "$out/$name.log" 2>&1
    local rc=$?
    tail -n "${TAIL:-25}" "$out/$name.log"
    echo "== $name: rc=$rc in $((SECONDS - t0)) s"
    printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >> "$out/steps.tsv"
    pack
}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv \
    > "$out/gpu.txt" 2>&1; cat "$out/gpu.txt"
python3 -c "import torch, cupy; print('torch', torch.__version__, 'cupy', cupy.__version__)"
gpu_tests() {
    # One pytest process per file, the measured paths first: a kernel that traps (an mbarrier
    # wait's timeout) leaves its CUDA context unusable, which must not fail the other files.
    # -s writes what the template speed tests print (TFLOP/s against torch) as they run, so a
    # step stopped at its limit keeps them.
    files=$(for f in ${TEST_FILES:-} tests/bench/test_gpu.py tests/bench/test_timing.py tests/bench/test_suites.py \
                tests/cuda/test_mma.py tests/cuda/test_gemm.py tests/cuda/test_attention.py \
                tests/cuda/test_tf32.py tests/cuda/test_sm90.py tests/cuda/test_attention_sm90.py \
                $(grep -rl "mark.gpu" tests --include="test_*.py" | sort); do echo "$f"; done \
            | awk '!seen[$0]++')
    TAIL=40 step gpu_tests "${TESTS_LIMIT:-180}" bash -c 'for f in "$@"; do
        echo "-- $f"; python3 -m pytest -m gpu "$f" -q -s -p no:cacheprovider -rfE; done' _ $files
}
if [ "${TESTS:-1}" = 1 ] && [ "${TESTS_AFTER:-0}" != 1 ]; then gpu_tests; fi
if [ "${RUN_BENCH:-1}" = 1 ]; then
    if [ "${RMSNORM:-0}" = 1 ]; then
        step run_bench 120 python3 -m emmy run examples/rmsnorm.py --bench \
            --json "$out/rmsnorm_bench.json"
    fi
    # a wgmma row fed by TMA through the runtime's tensor-map binding (persistent grid,
    # setmaxnreg), its output tile stored by TMA, checked and timed against cuBLAS
    step tma_bench 90 python3 -m emmy run examples/matmul_half.py --set M=4096 --set K=4096 \
        --set N=4096 --bench --json "$out/tma_bench.json" \
        --row "WORK=warps:2x4 TILE=wgmma:128x256x64 REDUCE=serial STAGE=tma:4:store RASTER=group:8"
    # the same with clusters of two blocks sharing B's tile (TMA multicast)
    step cluster_bench 60 python3 -m emmy run examples/matmul_half.py --set M=4096 --set K=4096 \
        --set N=4096 --bench --json "$out/cluster_bench.json" \
        --row "WORK=warps:2x4 TILE=wgmma:128x256x64 REDUCE=serial STAGE=tma:4:cluster:2x1:store RASTER=group:8"
    # FlashAttention-3's order on wgmma + TMA (the attention target's likeliest row, which the
    # suite's sample may miss), checked and timed against torch's SDPA
    step fa3_bench 90 python3 -m emmy run examples/attention_half.py --set batch_size=4 \
        --set heads=32 --set seq_len=4096 --set head_dim=128 --bench --json "$out/fa3_bench.json" \
        --row "WORK=warps:8 TILE=wgmma:128x128 REDUCE=serial STAGE=tma:2:overlap"
fi
for item in ${SUITES:-matmul:120 attention:120}; do
    IFS=: read -r suite budget only <<< "$item"
    budget=${budget:-400}
    args=(--suite "$suite" --budget "$budget" --json "$out/$suite.json")
    for o in ${only//,/ }; do args+=(--only "$o"); done
    rows_var="ROWS_$suite"
    IFS=';' read -ra rows <<< "${!rows_var:-}"
    for r in "${rows[@]}"; do args+=(--row "$r"); done
    TAIL=30 step "suite_$suite" $((budget + ${SUITE_SLACK:-30})) python3 -m emmy bench "${args[@]}"
done
if [ "${TESTS:-1}" = 1 ] && [ "${TESTS_AFTER:-0}" = 1 ]; then gpu_tests; fi
pack
