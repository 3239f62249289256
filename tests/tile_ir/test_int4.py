"""int4 weights two to a byte (examples/int4_linear.py): the product computes each weight from
its nibble as it copies the weight's tiles (a computed operand whose load reads packed[n, k // 2],
emmy.tile_ir.contract), two at a time without a conversion instruction where the unpacking is
a known nibble order (em_4x2), else one at a time; PLACE=cut stores the f16 weight first."""

from pathlib import Path

import pytest

from emmy.check import check_cuda_program
from emmy.frontend.workload import load_file
from emmy.pipeline import Options, compile_to
from emmy.schedule.space import space_of
from emmy.schedule.targets import get_target
from emmy.tile_ir.contract import pair_kinds
from emmy.tile_ir.cut import splits
from emmy.tile_ir.lift import lift_program

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
INT4 = EXAMPLES / "int4_linear.py"
RAGGED = (("batch", 37), ("in_features", 256), ("out_features", 72))


def lifted(path, sets=()):
    return lift_program(compile_to(load_file(path, sets), "loop")["loop"]).kernels


def checked(path, sets, row, target="sm_90a"):
    """The program under `row`, checked against eager on the emulator; its one CUDA unit."""
    w = load_file(path, sets)
    results = compile_to(w, "cuda", Options(rows={"": row}, target=target))
    report, failed = check_cuda_program(w, results["torch"], results["cuda"])
    assert report is not None and report.ok, failed or report.outputs
    return results["cuda"].units


def test_the_unpacked_weight_is_one_computed_operand_of_the_product():
    """The Loop IR keeps the unpacking (bit operations, a selection by the index's parity, two
    reshapes) inside the product; Tile IR finds the weight's byte at k // 2 (the reshapes'
    pieces put back together), the scale per group a load per element, and the nibble order."""
    (k,) = lifted(INT4)
    op = k.contract.b
    assert op.computed and op.packing == 2 and op.load.buffer == "packed"
    assert op.paired and "nibbles:lo" in pair_kinds(op).values() and splits(k)
    assert str(op.offset) == "a1*256 + (a2 / 2)"


WEIGHT = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, x, p, scale):
        n = {nibbles}
        w = (({value}).view(40, 2, 64).{dtype}() {zero}) * scale
        return F.linear(x, w.view(40, 128))


def get_inputs():
    return [torch.randn(24, 128).{dtype}(), torch.randint(0, 256, (40, 64), dtype=torch.uint8),
            (torch.rand(40, 2, 1) * 0.1).{dtype}()]


def get_init_inputs():
    return []
"""
LO = "torch.stack([p & 15, p >> 4], dim=-1).view(40, 128)"
HI = "torch.stack([p >> 4, p & 15], dim=-1).view(40, 128)"


@pytest.mark.parametrize("nibbles,value,zero,dtype,kind", [
    (LO, "n", "- 8", "half", "nibbles:lo"),
    (HI, "n", "- 8", "bfloat16", "nibbles:hi"),
    (LO, "torch.where(n >= 8, n.short() - 16, n.short())", "+ 0.5", "half", "nibbles:lo:signed"),
    (LO, "((n >> 1) & 7)", "- 8", "half", None),          # no nibble: one element at a time
    (LO, "n.short() - 8", "", "half", "nibbles:lo"),      # less 8 before the cast, in int16
    (LO, "n - 8", "", "half", None),                      # ... in uint8, which wraps: not pairs
], ids=["low_first", "high_first_bf16", "signed", "not_nibbles", "less_8_int16",
        "less_8_uint8_wraps"])
def test_each_nibble_order_is_computed_on_pairs_and_matches_eager(nibbles, value, zero, dtype,
                                                                  kind, tmp_path):
    """Low nibble first or high first, unsigned or as 4-bit two's complement, f16 or bf16: two
    weights from one byte (em_4x2, with the constant subtracted next folded into its magic
    number); other unpacking, one weight at a time. The emulated program matches eager with a
    raw ring (async:3)."""
    path = tmp_path / "weight.py"
    path.write_text(WEIGHT.format(nibbles=nibbles, value=value, zero=zero, dtype=dtype))
    (k,) = lifted(path)
    kinds = pair_kinds(k.contract.b) or {}
    assert k.contract.b.packing == 2 and (kind in kinds.values() if kind else not kinds)
    row = "WORK=warps:2x2 TILE=mma:32x32x32 REDUCE=serial STAGE=async:3 RASTER=row PLACE=fuse"
    (unit,) = checked(path, (), row)
    assert ("em_4x2<" in unit.source) == (kind is not None)
    assert "em_cp_async<4>" in unit.source      # 8 weights, 4 bytes a copy


@pytest.mark.parametrize("row,target", [
    ("WORK=warps:2x2 TILE=mma:64x32x32 REDUCE=serial STAGE=smem RASTER=row", "sm_80"),
    ("WORK=warps:2x2 TILE=mma:32x64x32 REDUCE=split:2:combine STAGE=async:2 RASTER=row",
     "sm_80"),
    ("WORK=warps:4x1 TILE=wgmma:64x64x64 REDUCE=serial STAGE=async:4 RASTER=group:8", "sm_90a"),
], ids=["smem", "held_split", "wgmma"])
def test_rows_of_each_staging_are_correct_at_a_ragged_shape(row, target):
    """37 rows x 256 -> 72 (partial tiles on both sides): synchronous copies, one tile held in
    registers (with a K split), and a wgmma row computing each tile into its swizzled stage."""
    checked(INT4, RAGGED, row + " PLACE=fuse", target)


@pytest.mark.parametrize("batch,target,place", [
    (16, "sm_90a", "fuse"), (2048, "sm_90a", "fuse"), (8192, "sm_90a", "cut"),
    (16, "sm_80", "fuse"), (4096, "sm_80", "cut")])
def test_the_default_fuses_unless_the_cut_is_modeled_faster(batch, target, place):
    """`modeled`, 4,096 x 4,096 weights: fused, a product reads half a byte a weight; cut, a map
    reads that and writes two bytes, and the product reads two. A long prompt on sm_80 converts
    every weight again for each of its 32 block rows, and the cut (once) wins there. On sm_90a
    the cut's product stores its tiles by TMA (STAGE=tma:4:store) while the fused one (a
    cp.async ring) stores them from registers, about 4 us a tile as measured on the TMA rows:
    the cut wins from about 4,096 rows."""
    sets = (("batch", batch), ("in_features", 4096), ("out_features", 4096))
    (k,) = lifted(INT4, sets)
    assert space_of(k, get_target(target)).default()["PLACE"] == place


def test_nibble_pairs_leave_the_k_loops_without_conversions():
    """SASS (sm_90a, NVRTC on the CPU): the K loop of an mma.sync row on nibble pairs has its 16
    HMMA and no I2F (bench/dequant_sass.py counts its instructions for the cost model); a wgmma
    row's kernel has its HGMMA and no local memory."""
    from emmy.cuda.nvrtc import compile_cuda
    from emmy.cuda.sass import cuobjdump, disassemble, longest_loop

    if cuobjdump() is None:
        pytest.skip("cuobjdump (and nvdisasm) not installed")
    for sets, row, want in [
        ((("batch", 256),), "WORK=warps:2x2 TILE=mma:64x64x32 REDUCE=serial STAGE=async:2 "
         "RASTER=row", "HMMA.16816.F32"),
        ((("batch", 1024), ("in_features", 4096), ("out_features", 4096)),
         "WORK=warps:2x4 TILE=wgmma:128x128x64 REDUCE=serial STAGE=async:4 RASTER=group:8",
         "HGMMA.64x128x16.F32")]:
        w = load_file(INT4, sets)
        (unit,) = compile_to(w, "cuda", Options(rows={"": row + " PLACE=fuse"}))["cuda"].units
        sass = disassemble(compile_cuda(unit.source, get_target("sm_90a")).cubin)
        loop = longest_loop(sass)
        assert want in sass and "LDL" not in sass and "STL" not in sass
        assert not any(o.startswith("I2F") for o in loop), row
        if want.startswith("HMMA"):
            assert loop.count(want) == 16
