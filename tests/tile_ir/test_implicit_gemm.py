"""Convolutions as implicit GEMMs: a contraction whose input operand is gathered (each element
computed under the window, zero in the padding) while the weights stay an affine operand. The
rows the space lists are checked on the CPU emulator against eager PyTorch."""

from dataclasses import replace

import pytest

from emmy.check import check_cuda_program
from emmy.frontend.workload import load_expr, load_file
from emmy.pipeline import Options, compile_to
from emmy.schedule.gemm import problem_of
from emmy.schedule.row import parse
from emmy.schedule.space import Space
from emmy.schedule.targets import get_target
from emmy.tile_ir.ir import KernelKind
from emmy.tile_ir.printer import print_kernel

SM90 = get_target("sm_90a")
CONV = "nn.Conv2d(3, 5, 3, padding=1)(torch.randn(2, 3, 7, 9))"
HALF = ("nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU()).half()"
        "(torch.randn(2, 8, 11, 10).half())")


def kernel(expr: str):
    (k,) = compile_to(load_expr(expr), "tile")["tile"].program.kernels
    return k


def test_a_padded_convolution_is_a_product_over_its_whole_window():
    k = kernel(CONV)
    assert k.kind is KernelKind.CONTRACT
    con = k.contract
    # m: output channels (the weights' rows); n: batch x height x width, merged; k: C x 3 x 3
    assert (con.m.extent, con.n.extent, con.k.extent) == (5, 2 * 7 * 9, 3 * 3 * 3)
    assert not con.a.gathered and con.b.gathered
    assert [a.var for a in con.b.parts] == ["a0", "a2", "a3"] and not con.batch
    p = problem_of(con)
    # the nested (c, kh, kw) reduction reads the weights back as one affine index
    assert (p.a.stride_outer, p.a.stride_k) == (27, 1)
    # the input's neighbouring output columns are neighbours in memory: tiles laid out
    # with the columns contiguous
    assert p.b.gathered and p.b.stride_outer == 1
    assert "B gathered (implicit GEMM)" in print_kernel(k)


def test_a_grouped_convolution_is_a_batch_of_products_one_per_group():
    """Output channel c reads the input channels of its group c / 16: split into (group,
    channel in group), the group is an axis both operands read (the batch) and the channel in
    its group one only the weights read (m)."""
    k = kernel("nn.Conv2d(16, 32, 3, groups=2, padding=1)(torch.randn(2, 16, 6, 6))")
    assert k.kind is KernelKind.CONTRACT
    con = k.contract
    assert [a.var for a in con.batch] == ["a1g"] and con.batch_size == 2
    assert (con.m.var, con.m.extent, con.n.extent, con.k.extent) == ("a1c", 16, 72, 72)


@pytest.mark.parametrize("expr", [
    "nn.Conv1d(4, 6, 3, groups=2)(torch.randn(2, 4, 9))",       # 3 channels per group
    "nn.Conv2d(8, 8, 3, groups=8)(torch.randn(1, 8, 6, 6))",    # depthwise
    "nn.Conv2d(8, 16, 3, groups=8)(torch.randn(1, 8, 6, 6))",   # depthwise, multiplier 2
])
def test_small_groups_stay_window_folds(expr):
    """Fewer than 8 output channels per group: a product tile would be mostly empty, so the
    convolution stays a fold per output element."""
    assert kernel(expr).kind is KernelKind.ROW


def test_gathered_operands_refuse_tma_and_wgmma_and_big_held_tiles_with_the_reason():
    space = Space(kernel(HALF), SM90)
    values = dict(space.decision_points())
    # an async ring copies the weights by cp.async and the gathered input through registers
    assert values["STAGE"] == ["smem", "async:2", "async:3", "async:4"]
    assert all(v.startswith("mma:") for v in values["TILE"])
    assert not space.check(parse(
        "WORK=warps:2x2 TILE=mma:32x32x32 REDUCE=serial STAGE=async:2 RASTER=row"))
    refusals = space.check(parse(
        "WORK=warps:4x1 TILE=wgmma:64x64x64 REDUCE=serial STAGE=tma:3 RASTER=row"))
    assert any(r.rule == "tile.instruction_set" and "use mma" in r.reason for r in refusals)
    # 128 x 64 gathered elements over 4 warps: 64 registers each
    (refusal,) = space.check(parse(
        "WORK=warps:2x2 TILE=mma:32x128x64 REDUCE=serial STAGE=async:3 RASTER=row"))
    assert refusal.rule == "stage.held_registers" and "64 elements per thread" in refusal.reason


def _check(workload, row: str | None):
    results = compile_to(workload, "cuda", Options(rows={"": row} if row else {}))
    report, failed = check_cuda_program(workload, results["torch"], results["cuda"])
    assert report is not None, failed.log[-2000:]
    assert report.ok, report.outputs
    return results


@pytest.mark.parametrize("expr, row", [
    # ragged everywhere (M 5, N 126, K 27), the default row and a split-K row
    (CONV, None),
    (CONV, "WORK=warps:1x2 TILE=simt:32x64x8 REDUCE=split:2:combine STAGE=smem RASTER=group:4"),
    ("nn.Conv1d(4, 6, 3, stride=2, padding=2, dilation=2)(torch.randn(2, 4, 13))", None),
    ("nn.Conv3d(2, 3, 3, padding=1, stride=(1, 2, 2))(torch.randn(1, 2, 4, 6, 5))", None),
    # a transposed convolution: the gather's mask also tests the stride's divisibility
    ("nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1)(torch.randn(1, 3, 5, 5))",
     None),
    # f16 and bf16 on tensor cores (mma.sync, ldmatrix from the gathered shared tiles)
    (HALF, None),
    (HALF, "WORK=warps:2x2 TILE=mma:32x32x32 REDUCE=split:2:combine STAGE=smem RASTER=row"),
    ("nn.Conv1d(8, 16, 3, padding=1).bfloat16()(torch.randn(2, 8, 20).bfloat16())", None),
    # grouped: one product per group (f16 on tensor cores, a transposed one in f32)
    ("nn.Sequential(nn.Conv2d(16, 32, 3, groups=4, stride=2, padding=1), nn.ReLU()).half()"
     "(torch.randn(2, 16, 9, 9).half())",
     "WORK=warps:2x1 TILE=mma:32x32x16 REDUCE=split:2:combine STAGE=smem RASTER=row"),
    ("nn.ConvTranspose2d(16, 32, 3, groups=2, stride=2)(torch.randn(1, 16, 4, 4))", None),
    # one output position per row: neighbouring k are nearer in memory, so the gathered
    # operand's tiles are laid out k-major (ldmatrix without .trans)
    ("nn.Conv1d(8, 16, 16, padding=1).half()(torch.randn(3, 8, 14).half())", None),
    # cp.async rings: the weights by cp.async, the gathered input through registers one K
    # tile ahead (mma's pipelined fragments, SIMT's plain ring; ragged K, split K)
    (HALF, "WORK=warps:2x2 TILE=mma:32x32x16 REDUCE=serial STAGE=async:2 RASTER=row"),
    (HALF, "WORK=warps:1x2 TILE=mma:32x32x32 REDUCE=split:2:combine STAGE=async:4 RASTER=row"),
    ("nn.Conv2d(8, 16, 3, padding=1)(torch.randn(2, 8, 7, 7))",
     "WORK=warps:1x2 TILE=simt:32x32x8 REDUCE=serial STAGE=async:3 RASTER=row"),
    # one buffer, 64 gathered elements per thread: stored one by one, not held in registers
    (HALF, "WORK=warps:1x2 TILE=mma:32x64x64 REDUCE=serial STAGE=smem RASTER=row"),
])
def test_implicit_gemm_rows_match_eager(expr, row):
    w = load_expr(expr)
    results = _check(w, row)
    con = results["tile"].program.kernels[0].contract
    assert con.a.gathered or con.b.gathered
    (unit,) = results["cuda"].units
    assert "gathered" in unit.source and "emmy gemm" in unit.source


def test_a_tf32_convolution(tmp_path):
    f = tmp_path / "conv_tf32.py"
    f.write_text(
        "import torch\nimport torch.nn as nn\n"
        "torch.set_float32_matmul_precision('high')\n"
        "class Model(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.conv = nn.Conv2d(8, 16, 3, padding=1)\n"
        "    def forward(self, x):\n"
        "        return self.conv(x)\n"
        "def get_inputs():\n    return [torch.randn(2, 8, 9, 9)]\n"
        "def get_init_inputs():\n    return []\n")
    row = "WORK=warps:2x2 TILE=tf32:32x32x16 REDUCE=serial STAGE=smem RASTER=row"
    _check(load_file(str(f), ()), row)


def test_the_default_tile_covers_no_more_than_the_output_needs():
    """64 output channels: a 128-row tile would compute half padding, so the default takes the
    first preferred tile no larger than the output's next power of two (the cost model finds
    that row about three times faster than the 128x128 one at this size)."""
    from emmy.schedule.gemm import read_tile

    k = kernel("nn.Conv2d(64, 64, 3, padding=1)(torch.randn(8, 64, 28, 28))")
    tile = read_tile(Space(k, SM90).default()["TILE"])
    assert tile.bm <= 64 and k.contract.m.extent == 64


def test_a_windowed_operand_tabulates_its_k_side_in_shared_memory():
    """The input of a padded convolution is a window: the kernel fills one int2 per k of
    its K range after its stages, and its launch asks for that shared memory too."""
    from emmy.cuda.gemm import TABLE_ENTRY_BYTES, smem_bytes
    from emmy.cuda.gemm_spec import GemmConfig

    k = kernel(HALF)
    p = problem_of(k.contract)
    assert p.b.windowed and not p.a.windowed
    row = "WORK=warps:2x2 TILE=mma:32x32x32 REDUCE=split:2:combine STAGE=async:2 RASTER=row"
    results = compile_to(load_expr(HALF), "cuda", Options(rows={"": row}))
    (unit,) = [u for u in results["cuda"].units if "gm_b_tab" in u.source]
    assert "gathered through a window" in unit.source
    # K = 8 x 3 x 3 = 72 in 3 tiles of 32, split 2: a split holds at most 2 tiles = 64 k
    plain = replace(p, b=replace(p.b, windowed=False))
    c = GemmConfig(inst="mma", bm=32, bn=32, bk=32, wm=2, wn=2, stages=2, split=2,
                   split_mode="combine")
    assert smem_bytes(p, c) == -(-smem_bytes(plain, c) // 16) * 16 + 64 * TABLE_ENTRY_BYTES
