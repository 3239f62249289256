"""The CPU emulator runs CUDA source with g++: barriers, shared memory, shuffles, atomics,
vector loads, cp.async timing, 16-bit floats, and faults reported as results.

All kernels live in kernels/basics.cu, which builds to one program (cached for the session)."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import numpy as np
import pytest

from emmy.cuda.emulate import run as emulate
from emmy.cuda.emulate.run import (build, build_and_run, build_together, compile_command,
                                   harness_source, precompiled_dir, rewrite_dynamic_shared,
                                   runtime_object)
from emmy.cuda.nvrtc import compile_cuda
from emmy.schedule.targets import get_target

SOURCE = (Path(__file__).parent / "kernels" / "basics.cu").read_text()
rng = np.random.default_rng(1234)


def run(kernel, grid, block, args, smem=0, **kw):
    r = build_and_run(SOURCE, kernel, grid, block, smem, args, **kw)
    assert r.ok, f"{r.status}: {r.log}"
    return r


def test_block_reduction_matches_numpy():
    x = rng.standard_normal((6, 1000)).astype(np.float32)
    out = np.full(6, np.nan, np.float32)
    r = run("row_sum", 6, 256, [out, x, 1000])
    np.testing.assert_allclose(out, x.sum(axis=1), rtol=1e-5, atol=1e-4)
    assert r.outputs[0] is out


def test_dynamic_shared_memory_and_warp_max():
    x = rng.standard_normal((3, 300)).astype(np.float32)
    out = np.zeros(3, np.float32)
    run("row_max_dynamic", 3, 128, [out, x, 300], smem=4 * 4)
    np.testing.assert_array_equal(out, x.max(axis=1))


def test_atomics_across_blocks():
    n = 3000
    x = rng.random(n, dtype=np.float32)
    bins = rng.integers(0, 10, n).astype(np.int32)
    total, hist = np.zeros(1, np.float32), np.zeros(10, np.int32)
    biggest, count = np.zeros(1, np.int32), np.zeros(1, np.int32)
    run("atomics", (n + 127) // 128, 128, [total, hist, biggest, count, x, bins, n])
    np.testing.assert_allclose(total[0], x.sum(dtype=np.float64), rtol=1e-5)
    np.testing.assert_array_equal(hist, np.bincount(bins, minlength=10))
    assert biggest[0] == (bins * 1000 + np.arange(n) % 1000).max()
    assert count[0] == n


def test_float4_loads_with_a_scalar_tail():
    n = 1003
    x, y = rng.random(n, dtype=np.float32), np.zeros(n, np.float32)
    run("axpb_float4", (n // 4 + 128) // 128, 128, [y, x, 3.0, -1.0, n])
    np.testing.assert_allclose(y, 3 * x - 1, rtol=1e-6)


def test_shuffles_votes_and_barrier_count():
    v = rng.integers(0, 100, 64).astype(np.int32)
    out = np.zeros((64, 8), np.int32)
    run("warp_ops", 1, 64, [out, v])
    for t in range(64):
        w, lane = divmod(t, 32)
        warp = v[32 * w: 32 * w + 32]
        seg = lane & ~7
        ballot = sum(1 << i for i in range(32) if warp[i] % 3 == 0)
        expected = [
            warp[5],
            warp[lane - 3] if lane >= 3 else v[t],
            warp[lane + 3] if lane + 3 < 32 else v[t],
            warp[lane ^ 6],
            warp[lane + 1] if lane + 1 < seg + 8 else v[t],
            np.uint32(ballot).view(np.int32),
            int((warp >= 0).all()) + 2 * int((warp > 90).any()),
            16,
        ]
        assert out[t].tolist() == expected, f"thread {t}"


def test_cp_async_lands_at_the_wait():
    x = rng.random(128, dtype=np.float32)
    before, after = np.zeros(32, np.float32), np.zeros(32, np.float32)
    run("async_copy_timing", 1, 32, [before, after, x])
    np.testing.assert_array_equal(before, -1.0)
    np.testing.assert_array_equal(after, x[3::4])


def test_half_and_bfloat16_rounding():
    special = np.array([0.0, -0.0, 65504, 65519, 65520, 1e-8, 2.0**-24, 2.0**-25, 3 * 2.0**-25,
                        2.0**-14 * 0.99951171875, 1.0009765625 + 2.0**-11, np.inf, -np.inf],
                       np.float32)
    scale = 10.0 ** rng.integers(-9, 6, 500)
    x = np.concatenate([special, rng.standard_normal(500) * scale]).astype(np.float32)
    h, b = np.zeros_like(x), np.zeros_like(x)
    run("half_round_trip", (len(x) + 127) // 128, 128, [h, b, x, len(x)])
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(h, x.astype(np.float16).astype(np.float32))
    u = x.view(np.uint32).astype(np.uint64)
    bf = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
    np.testing.assert_array_equal(b, bf)


def test_8_bit_floats_round_and_widen_as_torch():
    """Every byte read as e4m3 and e5m2, and floats around each format's rounding points
    (ties, the subnormal range, overflow, infinity, NaN) converted to both: the bits torch
    gives, e4m3 saturating at 448 as torch and __NV_SATFINITE do."""
    import torch

    grid = torch.arange(256, dtype=torch.uint8)
    widened = (grid.view(torch.float8_e4m3fn).float(), grid.view(torch.float8_e5m2).float())
    edges = [e for v in widened
             for e in (v, v.nextafter(torch.tensor(np.inf)), v.nextafter(torch.tensor(-np.inf)))]
    mids = [(a[1:] + a[:-1]) / 2 for a in (torch.sort(e)[0] for e in edges[::3])]
    special = torch.tensor([448, 464, 465, 479, 480, 1e6, 57344, 61439, 61440, 1e9, np.inf,
                            -np.inf, np.nan, -0.0, 2.0 ** -10, 2.0 ** -17, 2.0 ** -16 * 1.5])
    x = torch.cat([*edges, *mids, special, torch.randn(500) * 10.0 ** torch.randint(-6, 5, (500,))])
    x = x.float().contiguous()
    n = len(x)
    e4, e5 = np.zeros(n, np.uint8), np.zeros(n, np.uint8)
    w4, w5 = np.zeros(256, np.float32), np.zeros(256, np.float32)
    run("fp8_round_trip", (n + 127) // 128, 128, [e4, e5, w4, w5, x.numpy(), n])
    for got, dtype in ((e4, torch.float8_e4m3fn), (e5, torch.float8_e5m2)):
        want = x.to(dtype).view(torch.uint8).numpy()
        same = (got == want) | (np.isnan(torch.from_numpy(got).view(dtype).float().numpy())
                                & np.isnan(x.numpy()))
        assert same.all(), (dtype, x.numpy()[~same][:8], got[~same][:8], want[~same][:8])
    np.testing.assert_array_equal(w4, grid.view(torch.float8_e4m3fn).float().numpy())
    np.testing.assert_array_equal(w5, grid.view(torch.float8_e5m2).float().numpy())


def test_bytes_become_pairs_of_16_bit_floats_exactly():
    """Every byte, read signed and unsigned, as f16 and as bf16 (a computed operand's int8
    weights, two at a time): the bits of its exact value."""
    raw = np.arange(256, dtype=np.uint8)
    out = np.zeros((64, 4, 2, 2), np.uint16)       # word, variant, pair, half
    run("bytes_to_pairs", 1, 64, [out, raw.view(np.uint32), 64])
    for variant, (signed, bf16) in enumerate([(1, 0), (0, 0), (1, 1), (0, 1)]):
        values = (raw.view(np.int8) if signed else raw).astype(np.float32)
        bits = values.view(np.uint32) >> 16 if bf16 else values.astype(np.float16).view(np.uint16)
        np.testing.assert_array_equal(out[:, variant].reshape(-1), bits.astype(np.uint16),
                                      err_msg=f"signed={signed} bf16={bf16}")


def test_nibbles_become_pairs_of_16_bit_floats_exactly():
    """Every byte's two nibbles (a computed operand's int4 weights, two to a byte), low first
    and high first, read unsigned and as 4-bit two's complement, as f16 and as bf16: the bits
    of their exact values."""
    raw = np.arange(256, dtype=np.uint8)
    out = np.zeros((64, 8, 4, 2), np.uint16)       # word, variant, byte, half
    run("nibbles_to_pairs", 1, 64, [out, raw.view(np.uint32), 64])
    lo, hi = (raw & 15).astype(np.int32), (raw >> 4).astype(np.int32)
    for variant, (bf16, signed, hi_first) in enumerate(
            [(b, s, h) for b in (0, 1) for s in (0, 1) for h in (0, 1)]):
        pair = np.stack([hi, lo] if hi_first else [lo, hi], axis=-1)
        values = ((pair ^ 8) - 8 if signed else pair).astype(np.float32)
        bits = values.view(np.uint32) >> 16 if bf16 else values.astype(np.float16).view(np.uint16)
        np.testing.assert_array_equal(out[:, variant].reshape(256, 2), bits.astype(np.uint16),
                                      err_msg=f"bf16={bf16} signed={signed} hi={hi_first}")


def test_grid_and_block_indices():
    grid, block = (3, 2, 2), (4, 2, 3)
    out = np.zeros((12, 24, 6), np.int32)
    run("indices", grid, block, [out])
    for bz in range(2):
        for by in range(2):
            for bx in range(3):
                for tz in range(3):
                    for ty in range(2):
                        for tx in range(4):
                            b = bx + 3 * (by + 2 * bz)
                            t = tx + 4 * (ty + 2 * tz)
                            assert out[b, t].tolist() == [tx, ty, tz, bx, by, bz]


def test_one_worker_gives_the_same_answer():
    x = rng.standard_normal((4, 512)).astype(np.float32)
    a, b = np.zeros(4, np.float32), np.zeros(4, np.float32)
    run("row_sum", 4, 128, [a, x, 512], workers=1)
    run("row_sum", 4, 128, [b, x, 512], workers=4)
    np.testing.assert_array_equal(a, b)


def test_programs_are_cached():
    x, out = np.zeros((1, 32), np.float32), np.zeros(1, np.float32)
    run("row_sum", 1, 32, [out, x, 32])
    r = run("axpb_float4", 1, 32, [np.zeros(4, np.float32), np.ones(4, np.float32), 1.0, 0.0, 4])
    assert r.cached and r.build_seconds == 0.0


def test_builds_read_the_headers_precompiled(tmp_path):
    """g++ precompiles emu_pch.h once; a build finds the .gch first on its include path (g++ -H
    marks a precompiled header it reads with "!")."""
    folder = precompiled_dir()
    assert folder is not None and precompiled_dir() == folder
    src = tmp_path / "harness.cpp"
    src.write_text(harness_source(SOURCE, "row_sum"))
    runtime, log = runtime_object()
    assert runtime is not None, log
    proc = subprocess.run([*compile_command(src, tmp_path / "program", runtime), "-H"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert f"! {folder / 'emu_pch.h.gch'}" in proc.stderr


def _failing_gxx(tmp_path, monkeypatch, word: str) -> None:
    """g++ through a script that fails (saying so) when an argument contains `word`, with a
    fresh cache."""
    gxx = tmp_path / "gxx"
    gxx.write_text(f'#!/bin/sh\nfor a in "$@"; do case "$a" in *{word}*) '
                   f'echo "refused: $a" >&2; exit 1;; esac; done\nexec g++ "$@"\n')
    gxx.chmod(0o755)
    monkeypatch.setenv("EMMY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(emulate, "CXX", str(gxx))


def test_a_compiler_that_cannot_precompile_still_builds(tmp_path, monkeypatch):
    _failing_gxx(tmp_path, monkeypatch, "c++-header")
    assert precompiled_dir() is None
    x, out = np.ones((2, 40), np.float32), np.zeros(2, np.float32)
    r = run("row_sum", 2, 32, [out, x, 40])
    assert not r.cached
    np.testing.assert_array_equal(out, [40, 40])


def test_a_compiler_without_gold_links_with_its_default_linker(tmp_path, monkeypatch):
    _failing_gxx(tmp_path, monkeypatch, "-fuse-ld=gold")
    emulate.linker_flags.cache_clear()
    try:
        assert emulate.linker_flags() == ()
        x, out = np.ones((2, 40), np.float32), np.zeros(2, np.float32)
        r = run("row_sum", 2, 32, [out, x, 40])
        assert not r.cached
        np.testing.assert_array_equal(out, [40, 40])
    finally:
        emulate.linker_flags.cache_clear()


def test_a_gold_that_cannot_link_libstdcxx_is_not_used(tmp_path, monkeypatch):
    """A toolchain (seen on a GPU machine) whose gold answers --version but cannot find its
    libstdc++: the probe program does not link, so builds use the default linker."""
    gxx = tmp_path / "gxx"
    gxx.write_text('#!/bin/sh\ngold=0; link=1\nfor a in "$@"; do case "$a" in -fuse-ld=gold) '
                   'gold=1;; -c|-Wl,--version|c++-header) link=0;; esac; done\n'
                   'if [ $gold = 1 ] && [ $link = 1 ]; then echo "ld.gold: error: cannot open '
                   'libstdc++.so" >&2; exit 1; fi\nexec g++ "$@"\n')
    gxx.chmod(0o755)
    monkeypatch.setenv("EMMY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(emulate, "CXX", str(gxx))
    emulate.linker_flags.cache_clear()
    try:
        assert emulate.linker_flags() == ()
        x, out = np.ones((2, 40), np.float32), np.zeros(2, np.float32)
        r = run("row_sum", 2, 32, [out, x, 40])
        assert r.status == "ok", r.log
        np.testing.assert_array_equal(out, [40, 40])
    finally:
        emulate.linker_flags.cache_clear()


def test_a_runtime_that_does_not_build_is_a_compile_error(tmp_path, monkeypatch):
    _failing_gxx(tmp_path, monkeypatch, "emu_runtime.cpp")
    r = build_and_run(SOURCE, "row_sum", 1, 32, 0,
                      [np.zeros(1, np.float32), np.zeros(32, np.float32), 32])
    assert r.status == "compile_error" and "refused:" in r.log and "emu_runtime.cpp" in r.log


def test_a_compiler_that_fails_silently_is_named_with_its_status(tmp_path, monkeypatch):
    monkeypatch.setenv("EMMY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(emulate, "CXX", "false")
    r = build_and_run(SOURCE, "row_sum", 1, 32, 0,
                      [np.zeros(1, np.float32), np.zeros(32, np.float32), 32])
    assert r.status == "compile_error" and "`false -std=c++20" in r.log
    assert "exited with status 1" in r.log


# two sources that each define a helper `scale` (their own namespaces keep them apart)
TOGETHER = ['#include "emmy_kernel.cuh"\n'
            '__device__ float scale(float x) { return 2.f * x; }\n'
            'extern "C" __global__ void twice(float* y) { y[threadIdx.x] = scale(y[threadIdx.x]); }\n',
            '__device__ float scale(float x) { return x + 10.f; }\n'
            'extern "C" __global__ void plus_ten(float* y) { y[threadIdx.x] = scale(y[threadIdx.x]); }\n'
            'extern "C" __global__ void zero(float* y) { y[threadIdx.x] = 0.f; }\n']


def _fresh(source: str) -> str:
    """`source` under a comment no other run wrote: not in the (shared) cache yet."""
    return f"// {uuid.uuid4()}\n{source}"


def test_sources_built_together_run_from_the_cache():
    sources = [_fresh(s) for s in TOGETHER]
    pairs = [(sources[0], "twice"), (sources[1], "plus_ten")]
    assert build_together(pairs) == 2
    assert build_together(pairs) == 0                    # nothing left to build
    for source, kernel, want in [(sources[0], "twice", [2, 4]),
                                 (sources[1], "plus_ten", [11, 12]),
                                 (sources[1], "zero", [0, 0])]:
        y = np.array([1, 2], np.float32)
        r = run_source(source, kernel, y)
        assert r.cached and r.ok, r.log
        np.testing.assert_array_equal(y, want)


def test_sources_built_together_are_copied_where_links_fail(monkeypatch):
    def no_links(*args):
        raise OSError("no hard links here")
    monkeypatch.setattr(emulate.os, "link", no_links)
    sources = [_fresh(s) for s in TOGETHER]
    assert build_together([(sources[0], "twice"), (sources[1], "plus_ten")]) == 2
    y = np.array([1, 2], np.float32)
    r = run_source(sources[1], "plus_ten", y)
    assert r.cached and r.ok, r.log
    np.testing.assert_array_equal(y, [11, 12])


def run_source(source, kernel, y):
    return build_and_run(source, kernel, 1, len(y), 0, [y])


@pytest.mark.parametrize("second, why", [
    ('#include <cmath>\nextern "C" __global__ void other(float* y) {}\n', "an #include"),
    ('extern "C" __global__ void twice(float* y) {}\n', "a kernel name twice"),
    ('extern "C" __global__ void broken(float* y) { y[0] = undeclared; }\n', "a compile error"),
])
def test_sources_that_cannot_go_together_are_built_one_by_one(second, why):
    first, second = _fresh(TOGETHER[0]), _fresh(second)
    name = emulate.entry_points(second, "")[-1]
    assert build_together([(first, "twice"), (second, name)]) == 0, why
    y = np.array([1, 2], np.float32)
    r = run_source(first, "twice", y)
    assert r.ok and not r.cached
    np.testing.assert_array_equal(y, [2, 4])
    r = run_source(second, name, np.zeros(2, np.float32))
    if why == "a compile error":
        assert r.status == "compile_error" and "undeclared" in r.log
    else:
        assert r.ok, r.log


def test_a_missing_barrier_reads_stale_shared_memory():
    """Threads run until they block, so a read that needed a barrier sees the old value."""
    out = np.zeros(64, np.float32)
    run("missing_barrier", 1, 64, [out])
    assert out[0] == 0.0 and out[63] == 1.0    # thread 1 had not written yet; thread 0 had


def test_the_same_source_builds_with_nvrtc_and_gpp():
    assert compile_cuda(SOURCE, get_target("sm_90a")).ok
    assert build(SOURCE, "row_sum").binary is not None


def test_divergent_barrier_is_a_reported_deadlock():
    r = build_and_run(SOURCE, "divergent_barrier", 1, 32, 0, [np.zeros(32, np.float32)])
    assert r.status == "error" and "deadlock" in r.log


def test_out_of_bounds_store_is_a_crash_naming_the_thread():
    r = build_and_run(SOURCE, "out_of_bounds", 1, 32, 0, [np.zeros(32, np.float32), 32])
    assert r.status == "crash" and "block (0,0,0) thread" in r.log


def test_threads_keep_their_own_registers_across_barriers():
    blocks, threads, rounds = 3, 96, 40
    out, steps = np.zeros(blocks * threads, np.float32), np.zeros(blocks * threads, np.int32)
    run("private_values_across_barriers", blocks, threads, [out, steps, rounds])
    f = np.tile(np.arange(threads, dtype=np.float32) * 0.5, blocks)
    a = np.tile(np.arange(threads, dtype=np.int64), blocks)
    b = 3 * a + 1
    for r in range(rounds):
        a = a * 3 + r      # wraps as the kernel's long long does
        b ^= a
        f = f * np.float32(0.75) + np.float32(1.0)
    np.testing.assert_array_equal(out, f)
    np.testing.assert_array_equal(steps, ((a ^ b) & 0x7FFFFFFF).astype(np.int32))


def test_a_stack_overflow_is_a_crash_naming_the_thread():
    r = build_and_run(SOURCE, "stack_overflow", 1, 4, 0, [np.zeros(4, np.int32)])
    assert r.status == "crash" and "stack overflow" in r.log and "thread (0,0,0)" in r.log


def test_endless_kernel_times_out():
    r = build_and_run(SOURCE, "spin_forever", 1, 1, 0, [np.zeros(1, np.int32)], timeout=0.5)
    assert r.status == "timeout"


def test_wrong_argument_count_is_an_error():
    r = build_and_run(SOURCE, "row_sum", 1, 32, 0, [np.zeros(1, np.float32)])
    assert r.status == "error" and "takes 3 arguments, 1 were given" in r.log


def test_compile_error_is_a_result():
    r = build_and_run(SOURCE.replace("acc += row[i];", "acc += rows[i];"), "row_sum", 1, 32, 0, [])
    assert r.status == "compile_error" and "rows" in r.log and "kernel.cu:" in r.log


@pytest.mark.parametrize("decl, expected", [
    ("extern __shared__ float s[];",
     "float* const s = reinterpret_cast<float*>(emmy_emu::dynamic_shared());"),
    ("extern __shared__ __align__(16) unsigned char smem[];",
     "unsigned char* const smem = reinterpret_cast<unsigned char*>(emmy_emu::dynamic_shared());"),
    ("extern int not_shared[];", "extern int not_shared[];"),
])
def test_rewrite_dynamic_shared(decl, expected):
    assert rewrite_dynamic_shared(decl) == expected
