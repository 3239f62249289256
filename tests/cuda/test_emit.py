"""The emitted CUDA: the primitives a row asks for appear, NVRTC accepts it, and it is
byte-identical from one process to the next."""

import os
import subprocess
import sys

import numpy as np
import pytest

from emmy.check import program_inputs
from emmy.cuda.nvrtc import compile_cuda
from emmy.frontend.workload import load_expr
from emmy.pipeline import Options, compile_to
from emmy.schedule.targets import get_target

RMS = "nn.RMSNorm(2048)(torch.randn(32, 2048))"


def cuda(expr: str, row: str | None = None, target: str = "sm_90a"):
    options = Options(target=target, rows={"": row} if row else {})
    return compile_to(load_expr(expr), "cuda", options)["cuda"]


def source(expr: str, row: str | None = None) -> str:
    return "\n".join(u.source for u in cuda(expr, row).units)


def test_block_row_uses_vector_loads_and_a_block_reduction():
    text = source(RMS, "WORK=block:256 TILE=v4x1 REDUCE=shuffle STAGE=direct PLACE=fuse")
    assert "__launch_bounds__(256)" in text
    assert "em_vload(x + (a0*2048 + it1), in0_0, in0_1, in0_2, in0_3);" in text
    assert "em_block_allreduce<EmSum>(acc0_c0, scratch, 256)" in text
    assert "em_vstore(out0 + (" in text


def test_warp_row_reduces_with_shuffles_only():
    text = source(RMS, "WORK=warp:4 TILE=v2x1 REDUCE=shuffle STAGE=direct PLACE=fuse")
    assert "em_warp_allreduce<EmSum>" in text
    assert "em_block_allreduce" not in text and "__syncthreads" not in text


def test_smem_tree_and_ilp_chains():
    text = source(RMS, "WORK=block:128 TILE=v1x4 REDUCE=smem STAGE=direct PLACE=fuse")
    assert "em_block_tree<EmSum>" in text
    for n in range(4):
        assert f"acc0_c{n}" in text
    assert "acc0_c0 = EmSum::apply(acc0_c0, acc0_c3);" in text


def test_async_staging_fills_shared_memory_with_cp_async():
    prog = cuda(RMS, "WORK=warp:4 TILE=v4x1 REDUCE=shuffle STAGE=smem:async PLACE=fuse")
    text = prog.units[0].source
    assert "em_cp_async<sizeof(x[0]) * 4>(stage_x + (" in text
    assert "em_cp_async_wait_all();" in text
    assert prog.units[0].launches[0].shared_bytes == 4 * 2048 * 4  # 4 rows of 2048 floats


def test_cut_makes_two_launches():
    prog = cuda(RMS, "WORK=block:256 TILE=v4x1 REDUCE=shuffle STAGE=direct PLACE=cut")
    assert [l.function for l in prog.units[0].launches] == ["k0_rmsnorm_stat", "k0_rmsnorm_apply"]


def test_split_combine_makes_a_partial_and_a_combine_kernel():
    prog = cuda("torch.sum(torch.randn(4096))", "WORK=block:256 TILE=v4x1 REDUCE=split:4:combine")
    names = [l.function for l in prog.units[0].launches]
    assert names[0].endswith("_partial") and names[1].endswith("_combine")


def test_split_atomic_zeroes_the_output_first():
    prog = cuda("torch.sum(torch.randn(4096))", "WORK=block:256 TILE=v4x1 REDUCE=split:4:atomic")
    unit = prog.units[0]
    assert unit.zero_fill == (prog.outputs[0].name,)
    assert "atomicAdd(" in unit.source


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
def test_nvrtc_accepts_the_default_rows(target):
    for expr in (RMS, "nn.Softmax(-1)(torch.randn(8, 100))", "torch.cumsum(torch.randn(4, 50), 1)",
                 "nn.GELU()(torch.randn(64, 64))"):
        for unit in cuda(expr, target=target).units:
            result = compile_cuda(unit.source, get_target(target))
            assert result.ok, result.log
            assert result.resources_of(unit.launches[0].function).registers > 0


def test_source_is_byte_identical_across_processes():
    def emit(seed: str) -> bytes:
        env = {**os.environ, "PYTHONHASHSEED": seed}
        return subprocess.run([sys.executable, "-m", "emmy", "compile", "-c", RMS, "--ir", "cuda",
                               "--row", "WORK=block:128 TILE=v4x2 REDUCE=shuffle STAGE=smem PLACE=fuse"],
                              capture_output=True, env=env, check=True).stdout
    assert emit("1") == emit("2")


# A 16-bit value the kernel computes in float is rounded to its type where a step function
# reads it (a cast to an integer, a comparison, floor): one rounding step there moves an index
# or a mask by a whole unit. Elsewhere (arithmetic, a store) it is not rounded twice.
STEPS = [
    # the product rounded to f16, truncated to a row index (eager: 5.0 where float has 4.9995)
    "torch.randn(40, 64).half()[(torch.randn(16, 32).half() @ torch.randn(32, 24).half())"
    ".abs().long().clamp(0, 39)].sum(-1)",
    "torch.floor(torch.randn(64, 96).bfloat16() * 7.3)",
    "torch.where(torch.randn(64, 96).half() * 1.7 > 1.0, 1.0, -1.0).half()",
]


@pytest.mark.parametrize("expr", STEPS)
def test_step_functions_read_16_bit_values_rounded(expr):
    from tests.tensor_ir.emitted import assert_emitted_cuda_matches_eager

    stages = assert_emitted_cuda_matches_eager(expr)
    text = "\n".join(u.source for u in stages["cuda"].units)
    assert "em_cvt<float>(em_cvt<" in text


@pytest.mark.parametrize("row", [None, "WORK=warp:4 TILE=v2x1 REDUCE=shuffle PLACE=fuse",
                                 "WORK=block:64 TILE=v4x1 REDUCE=smem PLACE=fuse"])
def test_a_vector_store_of_a_value_from_outside_its_group_repeats_it(row):
    """A row's sum stored along a wider axis (expand(..).contiguous()): each element of a
    vector store is the one value, not a per-element copy the group never defined (it did not
    compile at any vector width, the default row's included)."""
    from emmy.check import check_cuda_program

    w = load_expr("torch.randn(8, 16).sum(-1, keepdim=True).expand(8, 64).contiguous()")
    (name,) = [k.name for k in compile_to(w, "tile")["tile"].program.kernels]
    stages = compile_to(w, "cuda", Options(rows={name: row} if row else {}))
    report, failed = check_cuda_program(w, stages["torch"], stages["cuda"])
    assert report is not None and report.ok, report or failed.log[-2000:]
    assert "em_vstore(" in "\n".join(u.source for u in stages["cuda"].units)


def test_vector_lanes_of_an_interleaved_layout_fold_their_parity():
    """A map kernel's vector of V elements starts at a multiple of V along the last axis, so
    each lane's position modulo a divisor of V is a constant: a complex pair's real lane and
    imaginary lane select statically, and the pair is loaded once, not once per lane."""
    expr = ("torch.view_as_real(torch.view_as_complex(torch.randn(8, 64, 2)) * "
            "torch.view_as_complex(torch.randn(8, 64, 2))).flatten(1)")
    text = source(expr, "WORK=thread:128 TILE=v4x1")
    assert "% 2" not in text and "a1_v = (a1 / 4)" in text
    loads = [line.split("= ", 1)[1] for line in text.splitlines() if "em_cvt<float>(" in line]
    assert len(loads) == 16 and len(set(loads)) == 8     # 4 lanes x 2 operands x (re, im)


@pytest.mark.parametrize("expr", [
    # SmoothQuant's per-token quantization: the scale amax / 127 computed in the kernel
    "(lambda x: x.div(x.abs().max(dim=-1, keepdim=True)[0].div(127)).round())"
    "((torch.randn(64, 96) * 3).half())",
    "(lambda w: torch.round(w / w.abs().amax() * 127))(torch.randn(16, 128).bfloat16())",
    "(lambda x: (x * 0.37 + 1.1).floor() > (x * 1.9).ceil() - 2)(torch.randn(64, 96).half())",
])
def test_a_chain_of_16_bit_ops_into_a_step_rounds_after_each_op_as_eager(expr):
    """Every 16-bit op leading to a step (round, floor, a comparison) takes its operands rounded
    to the type, as eager has them after each op; a division there stays a division (not a
    multiplication by the reciprocal). Fake quantization's levels then agree exactly (1-3% of
    them had moved a whole unit)."""
    from emmy.loop_ir.interp import run as run_loop
    from emmy.runtime.cpu import run_program

    w = load_expr(expr)
    stages = compile_to(w, "cuda")
    want = w.model(*w.inputs).float().numpy()
    inputs = program_inputs(stages["torch"], w.inputs)
    got = run_program(stages["cuda"], inputs)
    assert got.ok, got.log[-2000:]
    np.testing.assert_array_equal(np.asarray(got.outputs[0]).astype(np.float32), want)
    (loop,) = run_loop(stages["loop"], inputs)
    np.testing.assert_array_equal(np.asarray(loop).astype(np.float32), want)
