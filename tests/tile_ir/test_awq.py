"""AWQ's checkpoint format (examples/awq_linear.py): eight 4-bit weights an int32 word along n,
in AWQ's interleaved order, undone in the forward by indexing with a constant list; zero points
packed the same way. The list reads back as index arithmetic (emmy.tensor_ir.tables), the
weight operand is packed along n (its tiles read along n, one word a vector of 8 outputs), and
neighbouring outputs, nibbles i and i + 4 of a word, come two at a time from one shift and one
LOP3 (em_4x2_il), each pair's zero points taken away with the magic number."""

from pathlib import Path

import pytest

from emmy.schedule.gemm import problem_of
from emmy.tile_ir.contract import pair_kinds
from tests.tile_ir.quantized import (ROW_IDS, ROWS, assert_the_k_loop_has_no_conversions, checked,
                                    default_place, lifted)

AWQ = Path(__file__).resolve().parents[2] / "examples" / "awq_linear.py"


def test_a_word_of_eight_nibbles_is_read_along_n_with_its_zero_points():
    k = lifted(AWQ)
    op = k.contract.b
    assert (op.load.buffer, op.packing, op.k_major) == ("qweight", 8, False)
    kinds = pair_kinds(op)
    assert op.paired and "nibbles:il" in kinds.values()
    words = [s.buffer for s in op.gather if kinds[s.dst] == "zero:word"]
    assert words == ["qzeros"]
    b = problem_of(k.contract).b
    assert (b.vector, b.paired, b.bytes_read) == (8, True, 0.5)
    from emmy.tile_ir.printer import print_kernel

    assert "8 to an i32 of qweight along n (" in print_kernel(k)


@pytest.mark.parametrize("sets,row,target", ROWS, ids=ROW_IDS)
def test_rows_compute_the_weights_on_interleaved_pairs_and_match_eager(sets, row, target):
    """Ragged (200 outputs: tiles past the edge), f16 and bf16, a raw ring, one tile held with
    a K split summed by its last block, and a wgmma row."""
    unit = checked(AWQ, sets, row + " PLACE=fuse", target)
    assert "em_4x2_il<" in unit.source and "& 0x000F000Fu)" in unit.source


VARIANT = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, qweight, qzeros, scales):
        shifts = torch.arange(0, 32, 4)
        w = ((qweight[:, :, None] >> shifts) & 15).view(256, 64){order}
        z = ((qzeros[:, :, None] >> shifts) & 15).view(2, 64){order}
        w = ({weight}).half() * scales.repeat_interleave(128, dim=0)
        return x @ w


def get_inputs():
    return [torch.randn(24, 256).half(), torch.randint(-2**31, 2**31 - 1, (256, 8),
            dtype=torch.int32), torch.randint(-2**31, 2**31 - 1, (2, 8), dtype=torch.int32),
            (torch.rand(2, 64) * 0.01).half()]


def get_init_inputs():
    return []
"""
INTERLEAVED = "[:, torch.arange(64).view(-1, 8)[:, [0, 4, 1, 5, 2, 6, 3, 7]].view(-1)]"


@pytest.mark.parametrize("order,weight,kind,paired", [
    (INTERLEAVED, "w - z.repeat_interleave(128, dim=0)", "nibbles:il", True),
    ("", "w - z.repeat_interleave(128, dim=0)", "nibbles:lo", True),    # nibbles in order
    (INTERLEAVED, "w.half() - 8", "nibbles:il", True),                   # symmetric
    (INTERLEAVED, "w - 8", "nibbles:il", True),                          # ... before the cast
    # a zero point read along n but not packed as the weights are: computed one at a time
    (INTERLEAVED, "w - z.repeat_interleave(128, dim=0).flip(1)", "", False),
], ids=["interleaved", "in_order", "symmetric", "symmetric_int", "zeros_flipped"])
def test_weights_packed_along_n_pair_in_any_order_they_are_read(order, weight, kind, paired,
                                                                 tmp_path):
    path = tmp_path / "awq.py"
    path.write_text(VARIANT.format(order=order, weight=weight))
    op = lifted(path).contract.b
    assert (op.packing, op.k_major, op.paired) == (8, False, paired)
    assert not paired or kind in pair_kinds(op).values()
    row = "WORK=warps:2x2 TILE=mma:32x32x32 REDUCE=serial STAGE=async:3 RASTER=row PLACE=fuse"
    unit = checked(path, (), row)
    assert ("em_4x2" in unit.source) == paired


def test_the_k_loop_of_awq_weights_has_no_conversions():
    """SASS (sm_90a, NVRTC on the CPU): 16 HMMA and no I2F in the K loop of an mma.sync row."""
    assert_the_k_loop_has_no_conversions(AWQ)


def test_the_default_fuses_a_decoding_batch():
    """`modeled`: 16 rows x 4,096 -> 4,096 on sm_90a: the weights computed inside the product."""
    sets = (("batch", 16), ("in_features", 4096), ("out_features", 4096))
    assert default_place(AWQ, sets) == "fuse"
