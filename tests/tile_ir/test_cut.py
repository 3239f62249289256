"""A product whose operand its template computes (an int8 weight dequantized): PLACE decides
whether the template computes it as it copies the tiles (fuse) or a map kernel stores it
first (cut, emmy.tile_ir.cut)."""

from pathlib import Path

import pytest

from emmy.cli import main
from emmy.dtypes import DType
from emmy.frontend.workload import load_expr, load_file
from emmy.pipeline import Options, compile_to
from emmy.schedule.row import parse
from emmy.schedule.space import Space, space_of
from emmy.schedule.targets import get_target
from emmy.tile_ir.cut import cut_in_two, splits
from emmy.tile_ir.ir import KernelKind
from emmy.verify import verify_rows

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
INT8 = EXAMPLES / "int8_linear.py"
RAGGED = (("batch", 37), ("in_features", 136), ("out_features", 72))
CUT = "WORK=warps:1x1 TILE=mma:32x32x16 REDUCE=serial STAGE=smem RASTER=row PLACE=cut"


def lifted(path, sets=()):
    from emmy.tile_ir.lift import lift_program

    return lift_program(compile_to(load_file(path, sets), "loop")["loop"]).kernels


def test_place_is_decided_first_and_only_for_a_product_with_a_computed_operand():
    (k,) = lifted(INT8)
    assert k.kind is KernelKind.CONTRACT and splits(k)
    space = Space(k, get_target("sm_90a"))
    assert space.keys[0] == "PLACE"
    # the other decisions read their unused values (tests/schedule/test_template_rules.py
    # refuses each other value)
    assert str(space.first_row({"PLACE": "cut"})) == CUT and not space.check(parse(CUT))
    (plain,) = lifted(EXAMPLES / "linear_half.py")
    assert not splits(plain) and "PLACE" not in Space(plain, get_target("sm_90a")).keys


def test_the_cut_stores_the_operand_by_a_map_and_the_product_reads_it_plainly():
    (k,) = lifted(INT8)
    first, second, mid = cut_in_two(k)
    assert first.kind is KernelKind.MAP and first.outputs == (mid,)
    assert mid.type.dtype is DType.F16 and mid.type.shape == (256, 512)   # (out, in): the weight
    assert {b.type.dtype for b in first.inputs} == {DType.I8, DType.F16}  # weight, scale
    assert second.kind is KernelKind.CONTRACT
    assert not (second.contract.a.gathered or second.contract.b.gathered)
    assert DType.I8 not in {b.type.dtype for b in second.inputs}
    assert "scale" not in {b.name for b in second.inputs}    # the scale went with the operand


def test_a_cut_row_must_leave_the_other_decisions_unused(capsys):
    row = CUT.replace("WORK=warps:1x1", "WORK=warps:2x2")
    (k,) = lifted(INT8)
    (refusal,) = Space(k, get_target("sm_90a")).check(parse(row))
    assert refusal.rule == "place.cut_unused_work" and "reads WORK=warps:1x1" in refusal.reason
    rc = main(["compile", str(INT8), "--row", row, "--ir", "tile"])
    err = capsys.readouterr().err
    assert rc == 2 and "k0_int8_linear_cut0 stores the computed operand" in err
    assert "Traceback" not in err


def test_a_cut_program_has_both_kernels_each_with_its_own_row():
    w = load_file(INT8)
    rows = {"k0_int8_linear": CUT, "k0_int8_linear_cut1":
            "WORK=warps:2x2 TILE=mma:64x64x32 REDUCE=serial STAGE=async:2 RASTER=row"}
    tile = compile_to(w, "tile", Options(rows=rows))["tile"]
    names = [k.name for k in tile.program.kernels]
    assert names == ["k0_int8_linear_cut0", "k0_int8_linear_cut1"]
    assert str(tile.rows["k0_int8_linear_cut1"]) == rows["k0_int8_linear_cut1"]
    assert [b.name for b in tile.program.intermediates] == ["k0_int8_linear_operand"]


@pytest.mark.parametrize("batch,target,place,tile", [
    (64, "sm_90a", "fuse", "mma:"), (256, "sm_90a", "fuse", "wgmma:"),
    (4096, "sm_90a", "fuse", "wgmma:"), (16384, "sm_80", "cut", "")])
def test_the_default_fuses_unless_the_cut_is_modeled_faster(batch, target, place, tile):
    """`modeled`: a decoding batch's product reads one byte a weight fused, against a map's
    read and write and the product's read of two bytes cut. A long prompt's product converts
    every weight again for each block row: on sm_90a its wgmma rows hide that under the
    products; on sm_80 (mma.sync) at 16,384 rows the cut, which converts once, is faster. A
    fused default takes a cp.async ring (an mma tile whose weight share its threads can hold)."""
    sets = (("batch", batch), ("in_features", 4096), ("out_features", 4096))
    (k,) = lifted(INT8, sets)
    row = space_of(k, get_target(target)).default()
    assert row["PLACE"] == place
    assert place == "cut" or (row["STAGE"].startswith("async:") and row["TILE"].startswith(tile))


def test_sampled_rows_fused_and_cut_are_correct_at_a_ragged_shape():
    """Legal => correct on the emulator: rows of the fused kernel and of both halves of its
    cut (verify_rows samples each), 37 rows x 136 x 72."""
    results = verify_rows(load_file(INT8, RAGGED), per_kernel=1, seed=5, targets=("sm_80",))
    assert {"k0_int8_linear", "k0_int8_linear_cut0", "k0_int8_linear_cut1"} <= \
        {r.kernel for r in results}
    bad = [r for r in results if r.verdict != "ok"]
    assert not bad, bad


ZERO_POINT = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, x, q, zero, scale):
        return F.linear(x, (q.bfloat16() - zero) * scale)


def get_inputs():
    return [torch.randn(24, 72).bfloat16(), torch.randint(-127, 128, (40, 72)).to(torch.int8),
            torch.randint(-3, 4, (40, 1)).bfloat16(), torch.rand(40, 1).bfloat16()]


def get_init_inputs():
    return []
"""


GROUPS = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, x, q, scale):
        return F.linear(x, (q.view(40, 3, 24).half() * scale).view(40, 72))


def get_inputs():
    return [torch.randn(24, 72).half(), torch.randint(-127, 128, (40, 72)).to(torch.int8),
            torch.rand(40, 3, 1).half()]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("source,sampled", [(ZERO_POINT, True), (GROUPS, False)],
                         ids=["zero_point", "groups"])
def test_other_dequantizations_are_correct(source, sampled, tmp_path):
    """A bf16 weight less a zero point (sampled rows); a scale per group of 24 along k (read at
    k / 24: the product walks the int8 weight's layout, not the scale's; its default row)."""
    from emmy.check import check_cuda_program

    path = tmp_path / "weights.py"
    path.write_text(source)
    (k,) = lifted(path)
    (side,) = [op for op in (k.contract.a, k.contract.b) if op.computed]
    assert side.buffer == "q"
    w = load_file(path)
    if not sampled:
        results = compile_to(w, "cuda")
        report, failed = check_cuda_program(w, results["torch"], results["cuda"])
        assert report is not None and report.ok, failed or report.outputs
        return
    results = verify_rows(w, per_kernel=1, seed=2, targets=("sm_90a",))
    assert len(results) == 3      # a fused row, and one for each half of the cut
    bad = [r for r in results if r.verdict != "ok"]
    assert not bad, bad


EXPERTS = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, q, s, q2, s2):
        # each expert's (k, n) int8 weight with a scale per column, then a shared (k, n) one
        return torch.bmm(x, q.half() * s) @ (q2.half() * s2)


def get_inputs():
    return [torch.randn(3, 40, 72).half(), torch.randint(-127, 128, (3, 72, 48)).to(torch.int8),
            (torch.rand(3, 1, 48) * 0.01).half(), torch.randint(-127, 128, (48, 40)).to(torch.int8),
            (torch.rand(1, 40) * 0.01).half()]


def get_init_inputs():
    return []
"""


def test_a_chain_of_dequantizing_products_cuts_twice_and_stays_correct(tmp_path):
    """Batched weights laid out (k, n), in a chain of two products: the chain's halves each
    compute their weight, and a row for a half may cut it again (`<half>_cut0` stores the
    weight); a row naming a kernel that another row cut is not an unknown kernel."""
    from emmy.check import check_cuda_program

    path = tmp_path / "experts.py"
    path.write_text(EXPERTS)
    (chain,) = lifted(path)
    assert all(half.contract.b.computed for half in cut_in_two(chain)[:2])
    w = load_file(path)
    cut_chain = Space(chain, get_target("sm_90a")).first_row({"PLACE": "cut"})
    rows = {"k0_experts": str(cut_chain), "k0_experts_cut0": CUT}
    results = compile_to(w, "cuda", Options(rows=rows))
    names = [k.name for k in results["tile"].program.kernels]
    assert names == ["k0_experts_cut0_cut0", "k0_experts_cut0_cut1", "k0_experts_cut1"]
    report, failed = check_cuda_program(w, results["torch"], results["cuda"])
    assert report is not None, failed.log[-2000:]
    assert report.ok, report.outputs


BOTH = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, xq, sx, wq, sw, x, w):
        # int8 activations and weights, each with its scale; an operand of 12 products only
        return F.linear(xq.half() * sx, wq.half() * sw), (x * 2) @ w


def get_inputs():
    return [torch.randint(-127, 128, (48, 72)).to(torch.int8), (torch.rand(48, 1) * 0.01).half(),
            torch.randint(-127, 128, (40, 72)).to(torch.int8), (torch.rand(40, 1) * 0.01).half(),
            torch.randn(24, 64).half(), torch.randn(64, 12).half()]


def get_init_inputs():
    return []
"""


def test_both_operands_computed_and_an_operand_of_few_products(tmp_path):
    """Each operand of the first product is computed (A is cut first with PLACE=cut); `x * 2`
    feeds 12 products only, so the Loop IR keeps it fused, and its product is a template
    rather than a row kernel of dot products."""
    from emmy.check import check_cuda_program
    from emmy.tile_ir.printer import print_kernel

    path = tmp_path / "both.py"
    path.write_text(BOTH)
    first, second = lifted(path)
    assert first.contract.a.computed and first.contract.b.computed
    assert second.kind is KernelKind.CONTRACT and second.contract.a.computed
    assert "A computed (as a dequantized weight is)" in print_kernel(first)
    w = load_file(path)
    results = compile_to(w, "cuda")
    report, failed = check_cuda_program(w, results["torch"], results["cuda"])
    assert report is not None and report.ok, failed or report.outputs


@pytest.mark.parametrize("in_features,width", [(136, 8), (100, 1)])
def test_the_weight_is_fetched_eight_at_a_time_where_its_rows_allow(in_features, width):
    """8 int8 weights in one 8-byte load (two words, computed as four pairs of halves) and one
    16-byte shared store, where a weight row is whole vectors (136 = 17 x 8); else one at a
    time (100)."""
    sets = (("batch", 24), ("in_features", in_features), ("out_features", 40))
    row = "WORK=warps:2x2 TILE=mma:32x32x32 REDUCE=serial STAGE=smem RASTER=row PLACE=fuse"
    cuda = compile_to(load_file(INT8, sets), "cuda", Options(rows={"": row}))["cuda"]
    (unit,) = cuda.units
    assert ("EmVec<2, uint32_t> gm_raww" in unit.source) == (width == 8)
    assert unit.source.count("em_8x2_half2<true") == (4 if width == 8 else 0)
    assert ("gm_b_vec(" in unit.source or "gm_a_vec(" in unit.source) == (width == 8)


PAIRS = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, x, q, zero, scale):
        return F.linear(x, {expr})


def get_inputs():
    return [torch.randn(24, 72).half(), torch.randint(0, 256, (40, 72)).to(torch.{raw}),
            torch.randint(120, 136, (40, 1)).half(), (torch.rand(40, 1) * 0.01).half()]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("expr,raw,paired", [
    ("q.half() * scale", "int8", True),
    ("-(q.half() - zero) * scale * 0.5", "uint8", True),      # a zero point, NEG, a constant
    ("(q.half() - zero) * 0.1", "uint8", False),   # 0.1 is no f16: PyTorch multiplies in f32
    ("q.to(torch.int16).half() * scale", "int8", False),      # the raw value widened first
], ids=["scale", "zero_point_neg", "inexact_constant", "widened"])
def test_a_dequantized_weight_is_computed_on_pairs_where_its_math_is_16_bit(expr, raw, paired,
                                                                          tmp_path):
    """The template converts two bytes at a time (em_8x2_half2) and does the dequantizing
    arithmetic on half2 where every value is f16 (each operation rounded as eager rounds it);
    otherwise one element at a time. Either way the emulated program matches eager."""
    from emmy.check import check_cuda_program
    from emmy.tile_ir.contract import pair_kinds

    path = tmp_path / "pairs.py"
    path.write_text(PAIRS.format(expr=expr, raw=raw))
    (k,) = lifted(path)
    assert k.contract.b.computed and (pair_kinds(k.contract.b) is not None) == paired
    w = load_file(path)
    row = "WORK=warps:2x2 TILE=mma:32x32x32 REDUCE=serial STAGE=async:2 RASTER=row PLACE=fuse"
    results = compile_to(w, "cuda", Options(rows={"": row}))
    (unit,) = results["cuda"].units
    assert ("em_8x2_half2" in unit.source) == paired
    report, failed = check_cuda_program(w, results["torch"], results["cuda"])
    assert report is not None and report.ok, failed or report.outputs


@pytest.mark.parametrize("stages,in_features", [(3, 24), (4, 40), (2, 40)])
def test_three_stages_or_more_bring_the_raw_bytes_through_their_own_ring(stages, in_features):
    """async:3 and async:4: the int8 bytes of stages - 2 K tiles in flight by cp.async (8 bytes
    a copy), each tile computed from shared memory during the K step before its mma; async:2
    holds the loads of one tile in registers for one step. Correct on the emulator with one
    and two K tiles (the steps past the end compute a stale stage no step reads)."""
    from emmy.check import check_cuda_program

    sets = (("batch", 20), ("in_features", in_features), ("out_features", 40))
    row = (f"WORK=warps:2x2 TILE=mma:32x32x32 REDUCE=serial STAGE=async:{stages} RASTER=row "
           "PLACE=fuse")
    w = load_file(INT8, sets)
    results = compile_to(w, "cuda", Options(rows={"": row}))
    (unit,) = results["cuda"].units
    assert ("gm_ring_fetch" in unit.source and "em_cp_async<8>" in unit.source) == (stages > 2)
    report, failed = check_cuda_program(w, results["torch"], results["cuda"])
    assert report is not None and report.ok, failed or report.outputs


def test_the_raw_ring_is_modeled_to_hide_the_weights_latency():
    """`modeled`, H200: at 16 rows of 4,096 x 4,096 weights each K step of a fused row waits
    on its weight tile's DRAM latency when only one tile is in flight (async:2); async:4's raw
    ring keeps two in flight."""
    from emmy.runtime.costmodel.api import estimate_row

    sets = (("batch", 16), ("in_features", 4096), ("out_features", 4096))
    (k,) = lifted(INT8, sets)
    row = "WORK=warps:2x4 TILE=mma:32x64x32 REDUCE=split:8:combine STAGE=async:{} RASTER=row PLACE=fuse"
    two, four = (estimate_row(k, "", row.format(s), get_target("sm_90a"), nvrtc=False)
                 for s in (2, 4))
    assert four < 0.75 * two


def test_wgmma_rows_compute_the_weight_into_their_swizzled_stages(tmp_path):
    """sm_90a: a wgmma row takes a computed operand with cp.async staging: its raw bytes in a
    ring of their own, each tile computed into the 128-byte-swizzled stage a copy would fill
    and fenced into the async proxy before the wgmmas read it. Correct on the emulator
    K-major at a ragged shape (37 x 136 -> 72) and (k, n)-major in a batch (the experts'
    chain, cut); HGMMA and nothing in local memory at 1024 x 4096 -> 4096."""
    from emmy.check import check_cuda_program
    from emmy.cuda.sass import cuobjdump

    row = "WORK=warps:2x2 TILE=wgmma:64x64x64 REDUCE=serial STAGE=async:3 RASTER=row PLACE=fuse"
    path = tmp_path / "experts.py"
    path.write_text(EXPERTS)
    for w, rows in ((load_file(INT8, RAGGED), {"": row}),
                    (load_file(path), {"k0_experts_cut0": row, "k0_experts_cut1": row})):
        results = compile_to(w, "cuda", Options(rows=rows))
        assert all("wgmma" in u.row for u in results["cuda"].units)
        report, failed = check_cuda_program(w, results["torch"], results["cuda"])
        assert report is not None and report.ok, failed or report.outputs
    if cuobjdump() is None:
        return
    from emmy.cuda.nvrtc import compile_cuda
    from emmy.cuda.sass import disassemble

    big = load_file(INT8, (("batch", 1024), ("in_features", 4096), ("out_features", 4096)))
    row = "WORK=warps:2x4 TILE=wgmma:128x256x64 REDUCE=serial STAGE=async:3 RASTER=group:8 PLACE=fuse"
    (unit,) = compile_to(big, "cuda", Options(rows={"": row}))["cuda"].units
    sass = disassemble(compile_cuda(unit.source, get_target("sm_90a")).cubin)
    assert "HGMMA.64x256x16.F32" in sass and "LDL" not in sass and "STL" not in sass


def test_pairs_leave_the_k_loop_without_conversions():
    """SASS (sm_90a, the K loop: emmy.cuda.sass.longest_loop): the int8 row on f16 pairs has no
    I2F and fewer instructions than the same row converting each weight (an inexact constant,
    * 0.1, keeps it unpaired); bench/dequant_sass.py prints the counts the cost model uses."""
    from emmy.cuda.nvrtc import compile_cuda
    from emmy.cuda.sass import cuobjdump, disassemble, longest_loop

    if cuobjdump() is None:
        pytest.skip("cuobjdump (and nvdisasm) not installed")
    row = "WORK=warps:2x2 TILE=mma:64x64x32 REDUCE=serial STAGE=async:2 RASTER=row PLACE=fuse"
    loops = []
    for weight in ("q.half() * s", "q.half() * 0.1"):
        w = load_expr(f"(lambda x, q, s: F.linear(x, {weight}))(torch.randn(256, 512).half(), "
                      "torch.randint(-127, 128, (256, 512)).to(torch.int8), "
                      "torch.rand(256, 1).half())")
        (unit,) = compile_to(w, "cuda", Options(rows={"": row}))["cuda"].units
        loops.append(longest_loop(disassemble(compile_cuda(unit.source,
                                                           get_target("sm_90a")).cubin)))
    paired, unpaired = loops
    assert paired.count("HMMA.16816.F32") == unpaired.count("HMMA.16816.F32") == 16
    assert not any(o.startswith("I2F") for o in paired)
    assert sum(o.startswith("I2F") for o in unpaired) == 16
    assert len(paired) < len(unpaired)
