"""Tensor-core intrinsics: the CPU versions of mma.sync m16n8k16 and ldmatrix follow the PTX
ISA's fragment layouts (checked against numpy here), and on a GPU the hardware agrees."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from emmy.cuda.emulate.run import build_and_run
from tests.cuda import gpu

SOURCE = (Path(__file__).parent / "kernels" / "mma.cu").read_text()
rng = np.random.default_rng(7)
LANES = np.arange(32)


# --- the documented layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"), g = lane/4, t = lane%4
def a_position(lane, i):
    g, t = lane // 4, lane % 4
    return g + 8 * ((i // 2) % 2), 2 * t + i % 2 + 8 * (i // 4)


def b_position(lane, i):
    g, t = lane // 4, lane % 4
    return 2 * t + i % 2 + 8 * (i // 2), g


def c_position(lane, i):
    g, t = lane // 4, lane % 4
    return g + 8 * (i // 2), 2 * t + i % 2


def sixteen_bit(kind, shape):
    """Random values exactly representable in the 16-bit format, as (float32 values, raw bits)."""
    x = rng.standard_normal(shape).astype(np.float32)
    if kind == "f16":
        h = x.astype(np.float16)
        return h.astype(np.float32), h.view(np.uint16)
    bits = (x.view(np.uint32) >> 16).astype(np.uint16)           # truncate to bf16
    return (bits.astype(np.uint32) << 16).view(np.float32), bits


def fragments(a_bits, b_bits):
    """Registers per lane, [a0a1, a2a3, a4a5, a6a7, b0b1, b2b3], low element in the low half."""
    frags = np.zeros((32, 6), np.uint32)
    for lane in LANES:
        for reg in range(4):
            lo, hi = (a_bits[a_position(lane, 2 * reg + h)] for h in (0, 1))
            frags[lane, reg] = int(lo) | int(hi) << 16
        for reg in range(2):
            lo, hi = (b_bits[b_position(lane, 2 * reg + h)] for h in (0, 1))
            frags[lane, 4 + reg] = int(lo) | int(hi) << 16
    return frags


def gather_d(d):
    """The 16x8 result from each lane's four accumulators."""
    out = np.zeros((16, 8), np.float32)
    for lane in LANES:
        for i in range(4):
            out[c_position(lane, i)] = d[lane, i]
    return out


def expected_c():
    c = np.zeros((16, 8), np.float32)
    for lane in LANES:
        for i in range(4):
            c[c_position(lane, i)] = i + 1
    return c


def test_layouts_cover_each_element_once():
    assert sorted(a_position(l, i) for l in LANES for i in range(8)) == \
        [(r, k) for r in range(16) for k in range(16)]
    assert sorted(b_position(l, i) for l in LANES for i in range(4)) == \
        [(k, n) for k in range(16) for n in range(8)]
    assert sorted(c_position(l, i) for l in LANES for i in range(4)) == \
        [(r, n) for r in range(16) for n in range(8)]


def emulate(kernel, args):
    r = build_and_run(SOURCE, kernel, 1, 32, 0, args)
    assert r.ok, f"{r.status}: {r.log}"


@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_mma_fragments_match_numpy(kind):
    a, a_bits = sixteen_bit(kind, (16, 16))
    b, b_bits = sixteen_bit(kind, (16, 8))
    d = np.zeros((32, 4), np.float32)
    emulate("mma_frag", [d, fragments(a_bits, b_bits), int(kind == "bf16")])
    np.testing.assert_allclose(gather_d(d), a @ b + expected_c(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_cp_async_ldmatrix_mma_tile_matches_numpy(kind):
    a, a_bits = sixteen_bit(kind, (16, 16))
    b, b_bits = sixteen_bit(kind, (16, 8))
    c = np.zeros((16, 8), np.float32)
    emulate(f"mma_{kind}", [c, a_bits, b_bits])
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def expected_ldmatrix(m):
    """What each lane holds after x1, x2, x4, x1.trans, x2.trans, x4.trans on matrices m[4,8,8]."""
    m = m.astype(np.uint32)
    out = np.zeros((32, 14), np.uint32)
    for lane in LANES:
        r, c = lane // 4, 2 * (lane % 4)
        plain = [m[j, r, c] | m[j, r, c + 1] << 16 for j in range(4)]
        trans = [m[j, c, r] | m[j, c + 1, r] << 16 for j in range(4)]
        out[lane] = plain[:1] + plain[:2] + plain + trans[:1] + trans[:2] + trans
    return out


def test_ldmatrix_forms_match_the_layout():
    m = rng.integers(0, 2**16, (4, 8, 8)).astype(np.uint16)
    out = np.zeros((32, 14), np.uint32)
    emulate("ldmatrix_probe", [out, m])
    np.testing.assert_array_equal(out, expected_ldmatrix(m))


ONE = {"f16": 0x3C00, "bf16": 0x3F80}    # 1.0 in each 16-bit format


@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_peak_probe_counts_its_products(kind):
    """The issue-rate probe's result is exact, so the GPU test can check what it timed."""
    out = np.zeros(32, np.float32)
    emulate("mma_peak", [out, np.uint32(ONE[kind]), 3, int(kind == "bf16")])
    np.testing.assert_array_equal(out, 16 * 3)


# --- on a GPU: the same kernels through NVRTC and the driver ---------------------------------

def run_on_gpu(kernel: str, grid, block, args):
    """Launch `kernel` from SOURCE on device 0; numpy array arguments are copied back."""
    gpu.run_on_gpu(SOURCE, kernel, grid, block, 0, args)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_gpu_mma_agrees_with_the_emulator(kind):
    a, a_bits = sixteen_bit(kind, (16, 16))
    b, b_bits = sixteen_bit(kind, (16, 8))
    frags = fragments(a_bits, b_bits)
    on_gpu, on_cpu = np.zeros((32, 4), np.float32), np.zeros((32, 4), np.float32)
    run_on_gpu("mma_frag", (1, 1, 1), (32, 1, 1), [on_gpu, frags, int(kind == "bf16")])
    emulate("mma_frag", [on_cpu, frags, int(kind == "bf16")])
    np.testing.assert_allclose(on_gpu, on_cpu, rtol=1e-5, atol=1e-5)
    tile = np.zeros((16, 8), np.float32)
    run_on_gpu(f"mma_{kind}", (1, 1, 1), (32, 1, 1), [tile, a_bits, b_bits])
    np.testing.assert_allclose(tile, a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_gpu_ldmatrix_agrees_with_the_layout():
    m = rng.integers(0, 2**16, (4, 8, 8)).astype(np.uint16)
    out = np.zeros((32, 14), np.uint32)
    run_on_gpu("ldmatrix_probe", (1, 1, 1), (32, 1, 1), [out, m])
    np.testing.assert_array_equal(out, expected_ldmatrix(m))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_gpu_mma_sync_issue_rate(kind):
    """The most mma.sync m16n8k16 can do on this GPU: register operands, no memory traffic, 8
    independent chains per warp, 4 blocks of 8 warps per multiprocessor. Prints its TFLOP/s
    against torch.matmul (cuBLAS) at 4096^3 in the same format: the ceiling of every mma.sync
    row, whatever its staging."""
    import torch

    from tests.cuda.gpu import seconds, torch_launcher

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    blocks, threads, iters, chains = 4 * sms, 256, 16384, 8
    out = torch.zeros(blocks * threads, device="cuda", dtype=torch.float32)
    launch = torch_launcher(SOURCE, "mma_peak", blocks, threads, 0,
                            [out, ONE[kind], iters, int(kind == "bf16")])
    launch()
    torch.cuda.synchronize()
    assert torch.all(out == 16 * iters), "the probe's accumulators are off"
    flops = blocks * threads // 32 * iters * chains * 2 * 16 * 8 * 16
    ours = seconds(launch, reps=10)
    dtype = torch.float16 if kind == "f16" else torch.bfloat16
    x = torch.randn(4096, 4096, device="cuda", dtype=dtype)
    w = torch.randn(4096, 4096, device="cuda", dtype=dtype)
    theirs = seconds(lambda: torch.matmul(x, w))
    rate, cublas = flops / ours / 1e12, 2 * 4096**3 / theirs / 1e12
    print(f"\nmma.sync {kind} issue rate: {rate:.0f} TFLOP/s ({ours * 1e3:.3f} ms, "
          f"{launch.resources['mma_peak']}); torch.matmul 4096^3 {cublas:.0f} TFLOP/s: "
          f"the mma.sync ceiling is {rate / cublas:.2f}x cuBLAS")
