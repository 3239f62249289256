"""The flash-attention template (emmy.cuda.attention): its kernels, run on the CPU emulator,
agree with a float64 softmax(q k^T * scale + mask) v on small ragged shapes; its recommended
configurations compile with NVRTC for sm_80 and sm_90a without register spills; constraints()
refuses what it cannot build, saying why; and on a GPU it agrees with torch."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from emmy.cuda.attention import (AttentionConfig, AttentionProblem, AttnOperand,
                                 attention_body, constraints, smem_bytes)
from emmy.cuda.emulate.run import build_and_run
from emmy.cuda.gemm_spec import Body
from emmy.cuda.nvrtc import compile_cuda
from emmy.schedule.targets import get_target

rng = np.random.default_rng(2024)
CTYPES = {"f16": "__half", "bf16": "__nv_bfloat16"}


# --- printing a kernel around the body, as emmy/cuda/emit.py prints a function ---------------

def kernel_source(problem: AttentionProblem, config: AttentionConfig, name: str = "attn",
                  out_ctype: str = "float", build=attention_body) -> tuple[str, Body]:
    """One kernel `name(q, k, v, out)` writing out[bz, h, row, col] (contiguous), its body
    from `build` (the mma.sync template unless said)."""
    t = problem.q.ctype
    h, sq, d = problem.heads, problem.sq, problem.d

    def store(bz, head, row, col, value):
        return [f"out[(({bz} * {h} + {head}) * {sq}LL + {row}) * {d} + {col}] = "
                f"em_cvt<{out_ctype}>({value});"]

    body = build(problem, config, store)
    params = ", ".join([f"const {t}* __restrict__ {p}" for p in "qkv"]
                       + [f"{out_ctype}* __restrict__ out"])
    lines = [f"// launch: grid {body.grid}, block {body.threads}, "
             f"dynamic shared memory {body.smem_bytes} B",
             f'extern "C" __global__ void __launch_bounds__({body.threads}'
             f'{f", {body.min_blocks}" if body.min_blocks else ""}) {name}({params}) {{',
             "  const int tid = threadIdx.x;",
             "  const long long bid = blockIdx.x;",
             "  extern __shared__ __align__(16) unsigned char emmy_smem[];",
             *["  " + line for line in body.lines],
             "}"]
    return "\n".join(lines) + "\n", body


def emulate(source: str, body: Body, x, p: AttentionProblem, extra=()) -> np.ndarray:
    """Kernel `attn` of `source` run on the CPU emulator over the inputs `x` (and `extra`
    arguments after the output); its f32 output (b, h, sq, d), NaN where it wrote nothing."""
    out = np.full((p.batch, p.heads, p.sq, p.d), np.nan, np.float32)
    r = build_and_run(source, "attn", body.grid, body.threads, body.smem_bytes,
                      [*x.bits, out, *extra], timeout=600)
    assert r.ok, f"{r.status}: {r.log}"
    return out


def launch_on_gpu(tmp_path, source: str, body: Body, tensors) -> None:
    """Kernel `attn` of the program `source`, compiled for this GPU, launched on `tensors` (its
    parameters, in order); returns once it has finished."""
    import cupy as cp
    import torch

    major = torch.cuda.get_device_capability()[0]
    compiled = compile_cuda(source, get_target("sm_90a" if major == 9 else "sm_80"))
    assert compiled.ok, compiled.log
    (tmp_path / "attn.cubin").write_bytes(compiled.cubin)
    kernel = cp.RawModule(path=str(tmp_path / "attn.cubin")).get_function("attn")
    kernel.max_dynamic_shared_size_bytes = body.smem_bytes
    kernel((body.grid,), (body.threads,), tuple(cp.uint64(t.data_ptr()) for t in tensors),
           shared_mem=body.smem_bytes)
    torch.cuda.synchronize()


def program(*kernels: str, headers: tuple[str, ...] = ()) -> str:
    return "\n".join(['#include "emmy_kernel.cuh"', *(f'#include "{h}"' for h in headers), "",
                      *kernels])


# --- problems ---------------------------------------------------------------------------------

def operand(buffer: str, kind: str, batch: int, heads: int, seq: int, d: int,
            layout: str) -> AttnOperand:
    """An operand stored (b, h, s, d) ("bhsd") or (b, s, h, d) ("bshd", i.e. a transposed view
    of the (b, h, s, d) tensor), contiguous in memory."""
    strides = {"bhsd": (heads * seq * d, seq * d, d, 1),
               "bshd": (seq * heads * d, d, heads * d, 1)}[layout]
    return AttnOperand(buffer, CTYPES[kind], strides)


def problem(kind="f16", batch=1, heads=1, sq=70, sk=70, d=64, causal=False, layout="bhsd",
            scale=None) -> AttentionProblem:
    ops = [operand(n, kind, batch, heads, s, d, layout) for n, s in (("q", sq), ("k", sk), ("v", sk))]
    return AttentionProblem(batch, heads, sq, sk, d, *ops,
                            scale=d ** -0.5 if scale is None else scale, causal=causal)


def sixteen_bit(kind: str, shape) -> tuple[np.ndarray, np.ndarray]:
    """Random values exactly representable in the 16-bit type: (float64 values, raw bits)."""
    x = rng.standard_normal(shape).astype(np.float32)
    if kind == "f16":
        h = x.astype(np.float16)
        return h.astype(np.float64), h.view(np.uint16)
    bits = (x.view(np.uint32) >> 16).astype(np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64), bits


def reference(q, k, v, scale: float, causal: bool) -> np.ndarray:
    """softmax(q k^T * scale + mask) v in float64; q, k, v as (b, h, s, d)."""
    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    if causal:
        i, j = np.arange(q.shape[2])[:, None], np.arange(k.shape[2])[None, :]
        s = np.where(j <= i, s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return np.einsum("bhij,bhjd->bhid", p / p.sum(axis=-1, keepdims=True), v)


@dataclass(frozen=True)
class Inputs:
    values: tuple[np.ndarray, np.ndarray, np.ndarray]   # float64, (b, h, s, d) views
    bits: tuple[np.ndarray, np.ndarray, np.ndarray]     # raw 16-bit, as stored (contiguous)


def inputs(kind: str, p: AttentionProblem, layout: str) -> Inputs:
    values, bits = [], []
    for s in (p.sq, p.sk, p.sk):
        shape = (p.batch, p.heads, s, p.d) if layout == "bhsd" else (p.batch, s, p.heads, p.d)
        x, b = sixteen_bit(kind, shape)
        values.append(x if layout == "bhsd" else x.transpose(0, 2, 1, 3))
        bits.append(np.ascontiguousarray(b))
    return Inputs(tuple(values), tuple(bits))


def relative_error(got, want) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


# --- the emulator against numpy ----------------------------------------------------------------

CASES = [
    # kind, batch, heads, sq, sk, d, causal, layout, (bq, bkv, warps, stages)
    ("f16", 1, 2, 70, 70, 64, True, "bhsd", (64, 64, 4, 2)),
    ("bf16", 1, 2, 70, 70, 64, False, "bhsd", (64, 32, 2, 1)),
    ("f16", 1, 1, 70, 70, 128, True, "bhsd", (128, 32, 4, 2)),    # the d = 128 default
    ("bf16", 1, 1, 70, 70, 128, False, "bhsd", (64, 64, 4, 1)),
    ("f16", 2, 2, 70, 70, 32, True, "bshd", (32, 32, 2, 2)),
    ("bf16", 2, 3, 64, 64, 64, True, "bshd", (32, 16, 1, 2)),     # sizes divide: fast path
    ("f16", 1, 2, 40, 100, 64, False, "bhsd", (32, 64, 2, 2)),    # sq < sk
    ("bf16", 1, 1, 30, 100, 32, True, "bhsd", (32, 32, 1, 1)),    # causal, sq < sk
    ("f16", 1, 1, 90, 50, 32, True, "bshd", (32, 32, 2, 2)),      # causal, sq > sk
    ("bf16", 1, 2, 128, 128, 64, False, "bhsd", (128, 128, 4, 2)),  # the d = 64 default
]


@pytest.mark.parametrize("kind,batch,heads,sq,sk,d,causal,layout,cfg", CASES)
def test_emulated_kernel_matches_numpy(kind, batch, heads, sq, sk, d, causal, layout, cfg):
    p = problem(kind, batch, heads, sq, sk, d, causal, layout)
    config = AttentionConfig(*cfg)
    assert constraints(p, config, "sm_90a") == []
    source, body = kernel_source(p, config)
    x = inputs(kind, p, layout)
    out = emulate(program(source), body, x, p)
    assert np.isfinite(out).all()
    assert relative_error(out, reference(*x.values, p.scale, causal)) < 2e-2


def test_a_scale_of_zero_or_below_is_applied_before_the_softmax():
    p = problem("f16", sq=40, sk=50, d=32, causal=True, scale=-0.4)
    source, body = kernel_source(p, AttentionConfig(32, 32, 2, 2))
    x = inputs("f16", p, "bhsd")
    out = emulate(program(source), body, x, p)
    assert relative_error(out, reference(*x.values, -0.4, True)) < 2e-2


def test_body_launch_shape():
    p = problem("f16", batch=3, heads=5, sq=300, sk=200, d=64)
    config = AttentionConfig(128, 64, 4, 2)
    _, body = kernel_source(p, config)
    assert (body.grid, body.threads) == (3 * 5 * 3, 128)
    assert body.smem_bytes == smem_bytes(p, config) == (128 + 2 * 2 * 64) * (64 + 8) * 2


# --- NVRTC: the recommended configurations, at the size they are for, spill no registers -------

DEFAULTS = [  # d, causal, config
    (128, False, (128, 32, 4, 2)),
    (128, True, (128, 32, 4, 2)),
    (64, False, (128, 128, 4, 2)),
    (64, True, (128, 64, 4, 2)),
]


# sm_80 in the full sweep (-m slow): the same templates, another register allocation
@pytest.mark.parametrize("target", ["sm_90a", pytest.param("sm_80", marks=pytest.mark.slow)])
def test_recommended_configs_compile_without_spills(target):
    kernels, names = [], []
    for kind in CTYPES:
        for d, causal, cfg in DEFAULTS:
            for seq in (4096, 4001):          # sizes that divide the tiles, and ragged ones
                name = f"attn_{kind}_d{d}_{'causal' if causal else 'full'}_{seq}"
                p = problem(kind, batch=4, heads=32, sq=seq, sk=seq, d=d, causal=causal)
                assert constraints(p, AttentionConfig(*cfg), target) == []
                kernels.append(kernel_source(p, AttentionConfig(*cfg), name, CTYPES[kind])[0])
                names.append(name)
    result = compile_cuda(program(*kernels), get_target(target))
    assert result.ok, result.log
    for name in names:
        res = result.resources_of(name)
        assert (res.spill_store_bytes, res.spill_load_bytes, res.stack_bytes) == (0, 0, 0), \
            f"{name}: {res}"
        assert res.registers <= 255


# --- constraints --------------------------------------------------------------------------------

def test_a_buildable_config_has_no_constraints():
    assert constraints(problem(d=128), AttentionConfig(128, 32, 4, 2), "sm_80") == []


@pytest.mark.parametrize("change,config,fragment", [
    (dict(d=72), (64, 64, 4, 2), "head dimension 72 is not a multiple of 16"),
    (dict(d=272), (64, 64, 4, 2), "head dimension 272 is not a multiple of 16"),
    ({}, (96, 64, 4, 2), "bq 96 is not a multiple of 16 x 4 warps"),
    ({}, (64, 24, 4, 2), "bkv 24 is not a positive multiple of 16"),
    ({}, (64, 64, 4, 3), "stages 3"),
    ({}, (64, 64, 0, 2), "0 warps"),
    (dict(d=256), (128, 64, 4, 2), "each thread would hold 320 f32 accumulators"),
    (dict(batch=0), (64, 64, 4, 2), "empty problem"),
    (dict(scale=math.inf), (64, 64, 4, 2), "scale inf is not finite"),
])
def test_constraints_refuse_with_a_reason(change, config, fragment):
    why = constraints(problem(**change), AttentionConfig(*config), "sm_90a")
    assert any(fragment in reason for reason in why), why


def test_shared_memory_is_checked_against_the_target():
    p, config = problem(d=256), AttentionConfig(128, 64, 8, 2)   # 198 KiB
    assert constraints(p, config, "sm_90a") == []
    assert constraints(p, config, "sm_80") == [
        "shared memory 202752 B (198.0 KiB) is over sm_80's 163 KiB per block"]


def test_operands_must_suit_cp_async():
    p = problem(d=64)
    strided = AttnOperand("k", "__half", (70 * 128, 70 * 128, 128, 2))
    why = constraints(AttentionProblem(**{**p.__dict__, "k": strided}),
                      AttentionConfig(64, 64, 4, 2), "sm_90a")
    assert why == ["k's head dimension is not contiguous (stride 2): cp.async copies 16-byte "
                   "runs of it"]
    odd = AttnOperand("v", "__half", (70 * 68, 70 * 68, 68, 1))   # 136-byte rows
    why = constraints(AttentionProblem(**{**p.__dict__, "v": odd}),
                      AttentionConfig(64, 64, 4, 2), "sm_90a")
    assert why == [f"v's strides {odd.strides} (and start 0) are not all multiples of 8 "
                   f"elements: its rows are not 16-byte aligned for cp.async"]


def test_operand_types_are_checked():
    p = problem(d=64)
    mixed = AttentionProblem(**{**p.__dict__, "v": AttnOperand("v", "__nv_bfloat16",
                                                                p.v.strides)})
    assert any("different types" in r
               for r in constraints(mixed, AttentionConfig(64, 64, 4, 2), "sm_90a"))
    f32 = AttentionProblem(**{**p.__dict__, "q": AttnOperand("q", "float", p.q.strides)})
    assert any("q is float: the template takes __half or __nv_bfloat16" in r
               for r in constraints(f32, AttentionConfig(64, 64, 4, 2), "sm_90a"))


def test_only_k_and_v_may_be_grouped():
    p = problem(d=64)
    grouped_q = AttentionProblem(**{**p.__dict__, "q": AttnOperand("q", "__half", p.q.strides,
                                                                    group=2)})
    assert constraints(grouped_q, AttentionConfig(64, 64, 4, 2), "sm_90a") == [
        "q is read at head h // 2: only k and v may be grouped"]
    grouped_kv = AttentionProblem(**{**p.__dict__, "k": AttnOperand("k", "__half", p.k.strides,
                                                                     group=2)})
    assert constraints(grouped_kv, AttentionConfig(64, 64, 4, 2), "sm_90a") == []


def test_scores_rounded_to_a_16_bit_type_only():
    p = problem(d=64)
    for rounded, ok in (("__half", True), ("__nv_bfloat16", True), ("float", False)):
        why = constraints(AttentionProblem(**{**p.__dict__, "rounded": rounded}),
                          AttentionConfig(64, 64, 4, 2), "sm_90a")
        assert (why == []) is ok, why


def test_attention_body_refuses_an_unbuildable_config():
    with pytest.raises(ValueError, match="bq 96 is not a multiple"):
        attention_body(problem(), AttentionConfig(96, 64, 4, 2), lambda *a: [])


# --- on a GPU: against torch ---------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("kind,d,causal,layout,cfg", [
    ("f16", 128, True, "bshd", (128, 32, 4, 2)),
    ("bf16", 64, False, "bhsd", (128, 128, 4, 2)),
    ("bf16", 64, True, "bhsd", (128, 64, 4, 2)),
])
def test_gpu_kernel_matches_torch(tmp_path, kind, d, causal, layout, cfg):
    import torch
    import torch.nn.functional as F

    batch, heads, seq = 2, 3, 1000
    p = problem(kind, batch, heads, seq, seq, d, causal, layout)
    source, body = kernel_source(p, AttentionConfig(*cfg))
    dtype = torch.float16 if kind == "f16" else torch.bfloat16
    shape = (batch, heads, seq, d) if layout == "bhsd" else (batch, seq, heads, d)
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(3))
    out = torch.full((batch, heads, seq, d), math.nan, device="cuda", dtype=torch.float32)
    launch_on_gpu(tmp_path, program(source), body, (q, k, v, out))
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                          scale=p.scale)
    assert ((out - want).norm() / want.norm()).item() < 2e-2
