"""The f32 flash-attention template on CUDA cores (emmy.cuda.attention_simt): its kernels, run
on the CPU emulator, agree with a float64 softmax(q k^T * scale + mask) v on small ragged
shapes (head dimensions that are not multiples of 32, grouped k and v, a bias); its
configurations compile with NVRTC for sm_80 and sm_90a without register spills; its
constraints refuse what it cannot build, saying why; and on a GPU it agrees with torch."""

from __future__ import annotations

import math

import numpy as np
import pytest

from emmy.cuda.attention import AttentionConfig, AttentionProblem, AttnBias, AttnOperand
from emmy.cuda.attention_simt import attention_simt_body, constraints_simt, smem_bytes
from emmy.cuda.nvrtc import compile_cuda
from emmy.schedule.targets import get_target
from tests.cuda.test_attention import (emulate, kernel_source, launch_on_gpu, program, reference,
                                       relative_error)

rng = np.random.default_rng(7)


def problem(batch=1, heads=2, sq=70, sk=70, d=64, causal=False, layout="bhsd", group=1,
            scale=None, bias=None) -> AttentionProblem:
    def op(name, seq, g=1):
        kv_heads = heads // g
        strides = {"bhsd": (kv_heads * seq * d, seq * d, d, 1),
                   "bshd": (seq * kv_heads * d, d, kv_heads * d, 1)}[layout]
        return AttnOperand(name, "float", strides, g)
    return AttentionProblem(batch, heads, sq, sk, d, op("q", sq), op("k", sk, group),
                            op("v", sk, group), scale=d ** -0.5 if scale is None else scale,
                            causal=causal, bias=bias)


class F32Inputs:
    """q, k, v as float64 (b, h, s, d) views (k and v repeated over a group) and as stored."""

    def __init__(self, p: AttentionProblem, layout: str):
        self.values, self.bits = [], []
        for op, s in ((p.q, p.sq), (p.k, p.sk), (p.v, p.sk)):
            heads = p.heads // op.group
            shape = (p.batch, heads, s, p.d) if layout == "bhsd" else (p.batch, s, heads, p.d)
            x = rng.standard_normal(shape).astype(np.float32)
            view = x.astype(np.float64)
            view = view if layout == "bhsd" else view.transpose(0, 2, 1, 3)
            self.values.append(np.repeat(view, op.group, axis=1))
            self.bits.append(x)


def run(p: AttentionProblem, config: AttentionConfig, layout="bhsd", extra=()):
    source, body = kernel_source(p, config, build=attention_simt_body)
    if extra:      # the bias buffer: one more parameter after the output
        source = source.replace("float* __restrict__ out)",
                                "float* __restrict__ out, const float* __restrict__ m)")
    x = F32Inputs(p, layout)
    return emulate(program(source), body, x, p, extra), x


CASES = [
    # batch, heads, sq, sk, d, causal, layout, (bq, bkv, warps, stages)
    (1, 2, 70, 70, 64, True, "bhsd", (64, 32, 4, 2)),         # the default
    (1, 2, 70, 70, 64, False, "bhsd", (32, 64, 2, 1)),
    (2, 2, 50, 50, 128, True, "bshd", (64, 32, 4, 2)),
    (1, 1, 40, 100, 40, False, "bhsd", (32, 32, 4, 2)),        # d 40: a lane's chunk is ragged
    (1, 1, 30, 100, 20, True, "bhsd", (16, 16, 1, 1)),         # causal, sq < sk
    (1, 1, 90, 50, 32, True, "bshd", (128, 32, 4, 2)),         # causal, sq > sk, 8 rows a lane
    (1, 2, 64, 64, 16, False, "bhsd", (32, 32, 8, 2)),         # sizes divide, 1 row a lane
]


@pytest.mark.parametrize("batch,heads,sq,sk,d,causal,layout,cfg", CASES)
def test_emulated_kernel_matches_numpy(batch, heads, sq, sk, d, causal, layout, cfg):
    p = problem(batch, heads, sq, sk, d, causal, layout)
    config = AttentionConfig(*cfg, inst="simt")
    assert constraints_simt(p, config, "sm_90a") == []
    out, x = run(p, config, layout)
    assert np.isfinite(out).all()
    assert relative_error(out, reference(*x.values, p.scale, causal)) < 1e-5


def test_grouped_keys_and_values_and_a_negative_scale():
    p = problem(heads=4, sq=40, sk=56, d=32, causal=True, group=2, scale=-0.3)
    out, x = run(p, AttentionConfig(32, 32, 2, 2, inst="simt"))
    assert relative_error(out, reference(*x.values, -0.3, True)) < 1e-5


@pytest.mark.parametrize("kind", ["add", "keep"])
def test_a_bias_or_mask_read_per_score(kind):
    sq = sk = 45
    bias = AttnBias(kind, "m", "float", (0, 0, sk, 1))
    p = problem(sq=sq, sk=sk, d=32, bias=bias)
    m = rng.standard_normal((sq, sk)).astype(np.float32)
    if kind == "keep":
        m = (m > -0.5).astype(np.float32)
        m[3] = 0.0                                   # a row that sees no key: NaN, as torch
    out, x = run(p, AttentionConfig(32, 16, 2, 2, inst="simt"), extra=(m,))
    q, k, v = x.values
    s = np.einsum("bhid,bhjd->bhij", q, k) * p.scale
    s = s + m if kind == "add" else np.where(m != 0, s, -np.inf)
    with np.errstate(invalid="ignore"):
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        want = np.einsum("bhij,bhjd->bhid", e / e.sum(axis=-1, keepdims=True), v)
    assert np.array_equal(np.isnan(out), np.isnan(want))
    ok = ~np.isnan(want)
    assert relative_error(out[ok], want[ok]) < 1e-5


def test_body_launch_shape():
    p = problem(batch=3, heads=5, sq=300, sk=200, d=64)
    config = AttentionConfig(64, 32, 4, 2, inst="simt")
    _, body = kernel_source(p, config, build=attention_simt_body)
    assert (body.grid, body.threads) == (3 * 5 * 5, 128)
    assert body.smem_bytes == smem_bytes(p, config) == ((64 + 4 * 32) * 68 + 64 * 36) * 4


# --- NVRTC ------------------------------------------------------------------------------------

# sm_80 in the full sweep (-m slow): the same templates, another register allocation
@pytest.mark.parametrize("target", ["sm_90a", pytest.param("sm_80", marks=pytest.mark.slow)])
def test_configs_compile_without_spills(target):
    kernels, names = [], []
    for d, causal, cfg in [(128, False, (64, 32, 4, 2)), (128, True, (64, 64, 4, 1)),
                           (64, True, (128, 32, 4, 2)), (256, False, (32, 32, 4, 1)),
                           (40, True, (64, 32, 4, 1))]:
        name = f"attn_d{d}_{'causal' if causal else 'full'}_{cfg[0]}x{cfg[1]}"
        p = problem(batch=4, heads=32, sq=4001, sk=4001, d=d, causal=causal)
        config = AttentionConfig(*cfg, inst="simt")
        assert constraints_simt(p, config, target) == []
        kernels.append(kernel_source(p, config, name, build=attention_simt_body)[0])
        names.append(name)
    result = compile_cuda(program(*kernels), get_target(target))
    assert result.ok, result.log
    for name in names:
        res = result.resources_of(name)
        assert (res.spill_store_bytes, res.spill_load_bytes, res.stack_bytes) == (0, 0, 0), \
            f"{name}: {res}"


@pytest.mark.slow
@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
def test_every_legal_config_of_the_row_space_compiles_without_spills(target):
    """The schedule space's simt tiles, warps and stages (emmy.schedule.flash) over d 32..256,
    causal and ragged (the most code): what constraints_simt accepts spills nothing."""
    import itertools

    kernels, names = [], []
    for d in (32, 64, 96, 112, 128, 192, 256):
        p = problem(batch=4, heads=32, sq=4001, sk=4001, d=d, causal=True)
        for bq, bkv, warps, stages in itertools.product((32, 64, 128), (32, 64), (4, 8), (1, 2)):
            config = AttentionConfig(bq, bkv, warps, stages, inst="simt")
            if not constraints_simt(p, config, target):
                names.append(f"attn_d{d}_{bq}x{bkv}_w{warps}_s{stages}")
                kernels.append(kernel_source(p, config, names[-1], build=attention_simt_body)[0])
    assert len(names) > 60
    result = compile_cuda(program(*kernels), get_target(target))
    assert result.ok, result.log
    spilled = [(n, r) for n in names
               if (r := result.resources_of(n)).spill_store_bytes or r.stack_bytes]
    assert spilled == []


# --- constraints ------------------------------------------------------------------------------

@pytest.mark.parametrize("change,config,fragment", [
    (dict(d=66), (64, 32, 4, 2), "head dimension 66 is not a multiple of 4"),
    (dict(d=260), (64, 32, 4, 2), "head dimension 260 is not a multiple of 4 in 4..256"),
    ({}, (40, 32, 4, 2), "bq 40 over 4 warps"),
    ({}, (256, 32, 4, 2), "bq 256 over 4 warps"),
    ({}, (64, 12, 4, 2), "bkv 12 is not a positive multiple of 8"),
    ({}, (64, 32, 4, 3), "stages 3"),
    (dict(d=256), (128, 64, 4, 2), "each thread would hold 352 f32 values"),
    (dict(d=256), (32, 32, 1, 2), "32 threads copy a tile row of 64 16-byte chunks"),
    (dict(batch=0), (64, 32, 4, 2), "empty problem"),
    (dict(scale=math.nan), (64, 32, 4, 2), "scale nan is not finite"),
])
def test_constraints_refuse_with_a_reason(change, config, fragment):
    why = constraints_simt(problem(**change), AttentionConfig(*config, inst="simt"), "sm_90a")
    assert any(fragment in reason for reason in why), why


def test_operands_must_be_f32_rows_aligned_for_cp_async():
    p = problem(d=64)
    half = AttentionProblem(**{**p.__dict__, "q": AttnOperand("q", "__half", p.q.strides)})
    assert constraints_simt(half, AttentionConfig(64, 32, 4, 2, inst="simt"), "sm_90a") == [
        "q is __half: the template takes float",
        "q, k and v have different types (__half, float, float)"]
    odd = AttnOperand("v", "float", (70 * 66, 70 * 66, 66, 1))
    why = constraints_simt(AttentionProblem(**{**p.__dict__, "v": odd}),
                           AttentionConfig(64, 32, 4, 2, inst="simt"), "sm_90a")
    assert why == [f"v's strides {odd.strides} (and start 0) are not all multiples of 4 "
                   f"elements: its rows are not 16-byte aligned for cp.async"]
    assert "inst 'mma' is a tensor-core template's" in " ".join(
        constraints_simt(p, AttentionConfig(64, 32, 4, 2), "sm_90a"))


def test_shared_memory_is_checked_against_the_target():
    p, config = problem(d=128), AttentionConfig(64, 64, 4, 2, inst="simt")
    assert constraints_simt(p, config, "sm_90a") == []
    assert constraints_simt(p, config, "sm_80") == [
        "shared memory 186368 B (182.0 KiB) is over sm_80's 163 KiB per block"]


# --- on a GPU: against torch ------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("d,causal,layout,cfg", [
    (128, True, "bshd", (64, 32, 4, 2)),
    (64, False, "bhsd", (128, 32, 4, 2)),
])
def test_gpu_kernel_matches_torch(tmp_path, d, causal, layout, cfg):
    import torch
    import torch.nn.functional as F

    batch, heads, seq = 2, 3, 1000
    p = problem(batch, heads, seq, seq, d, causal, layout)
    source, body = kernel_source(p, AttentionConfig(*cfg, inst="simt"), build=attention_simt_body)
    shape = (batch, heads, seq, d) if layout == "bhsd" else (batch, seq, heads, d)
    q, k, v = (torch.randn(shape, device="cuda") for _ in range(3))
    out = torch.full((batch, heads, seq, d), math.nan, device="cuda")
    launch_on_gpu(tmp_path, program(source), body, (q, k, v, out))
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal,
                                          scale=p.scale)
    assert ((out.double() - want).norm() / want.norm()).item() < 1e-5


def test_eight_rows_a_thread_at_d_128_only_on_sm90a():
    """192 values of state (8 rows of d 128, 32 keys a step) compile without spills for sm_90a
    and spill on sm_80 (the slow sweep), so only sm_90a takes them, and only at 32 keys."""
    p = problem(d=128)
    config = AttentionConfig(128, 32, 4, 2, inst="simt")
    assert constraints_simt(p, config, "sm_90a") == []
    assert constraints_simt(p, config, "sm_80") == [
        "each thread would hold 192 f32 values (O, S and P for its rows), over the 160 that "
        "leave room in 255 registers for the rest (on sm_90a 192 at up to 32 keys a step, d a "
        "multiple of 32)"]
    assert constraints_simt(problem(d=112), config, "sm_90a") != []
