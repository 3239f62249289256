"""GPTQ's checkpoint format (examples/gptq_linear.py): eight 4-bit weights an int32 word along k,
the words along n ((in // 8, out)), a zero point per group of 128 k packed the same way along n.
The product reads one word for 8 weights (its nibbles in the order int4 weights two to a byte
have, the low first) and computes them two at a time (em_4x2), taking the group's zero point
away with the magic number (one integer multiply-add a vector, no conversion)."""

from pathlib import Path

import pytest

from emmy.dtypes import DType
from emmy.schedule.gemm import problem_of
from emmy.tile_ir.contract import pair_kinds
from tests.tile_ir.quantized import (ROW_IDS, ROWS, assert_the_k_loop_has_no_conversions, checked,
                                    default_place, lifted)

GPTQ = Path(__file__).resolve().parents[2] / "examples" / "gptq_linear.py"


def test_a_word_of_eight_nibbles_is_read_along_k_and_its_zero_point_once_a_vector():
    k = lifted(GPTQ)
    op = k.contract.b
    assert (op.load.buffer, op.load.dtype, op.packing, op.k_major) == ("qweight", DType.I32, 8,
                                                                        True)
    kinds = pair_kinds(op)
    assert op.paired and kinds[op.load.dst] == "raw" and "nibbles:lo" in kinds.values()
    zero = {s.dst for s in op.gather if kinds[s.dst] == "zero"}
    loads = {s.buffer for s in op.gather if s.dst in zero and hasattr(s, "buffer")}
    assert loads == {"qzeros"}
    b = problem_of(k.contract).b
    assert (b.vector, b.paired, b.bytes_read) == (8, True, 0.5)


@pytest.mark.parametrize("sets,row,target", ROWS, ids=ROW_IDS)
def test_rows_compute_the_weights_on_pairs_and_match_eager(sets, row, target):
    """Ragged on both sides (200 outputs: 25 words of zero points a group), f16 and bf16, a raw
    ring, one tile held with a K split summed by its last block, and a wgmma row."""
    unit = checked(GPTQ, sets, row + " PLACE=fuse", target)
    assert "em_4x2<" in unit.source and "_bias = " in unit.source


VARIANT = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, qweight, qzeros, scales):
        shifts = torch.arange(0, 32, 4, dtype=torch.int32)
        q = (qweight.unsqueeze(1) >> shifts.view(1, 8, 1)) & 15
        zeros = {zeros}
        w = (q.reshape({groups}, {group}, 64) - zeros.reshape({groups}, 1, 64)).half() \\
            * scales.unsqueeze(1)
        return x @ w.reshape(256, 64)


def get_inputs():
    return [torch.randn(24, 256).half(), torch.randint(-2**31, 2**31 - 1, (32, 64),
            dtype=torch.int32), torch.randint(-2**31, 2**31 - 1, ({groups}, 8), dtype=torch.int32),
            (torch.rand({groups}, 64) * 0.01).half()]


def get_init_inputs():
    return []
"""
NIBBLES = "(qzeros.unsqueeze(2) >> shifts.view(1, 1, 8)) & 15"


@pytest.mark.parametrize("zeros,group,paired", [
    (f"({NIBBLES}) + 1", 128, True),          # GPTQ's first format: zero points stored less 1
    (NIBBLES, 4, False),                      # a zero point every 4 k: not one a vector
    ("(qzeros.unsqueeze(2) >> shifts.view(1, 1, 8)) & 255", 128, False),   # up to 255
], ids=["plus_one", "group_of_4", "wide"])
def test_zero_points_are_taken_by_the_magic_only_where_exact(zeros, group, paired, tmp_path):
    """A zero point bounded by 0..127 and one value for each vector of 8 k goes into em_4x2's
    bias; others leave the weights computed one at a time. Both match eager."""
    path = tmp_path / "gptq.py"
    path.write_text(VARIANT.format(zeros=zeros, group=group, groups=256 // group))
    k = lifted(path)
    assert k.contract.b.packing == 8 and k.contract.b.paired == paired
    row = "WORK=warps:2x2 TILE=mma:32x32x32 REDUCE=serial STAGE=async:3 RASTER=row PLACE=fuse"
    unit = checked(path, (), row)
    assert ("em_4x2<" in unit.source) == paired


def test_the_k_loop_of_gptq_weights_has_no_conversions():
    """SASS (sm_90a, NVRTC on the CPU): 16 HMMA and no I2F in the K loop of an mma.sync row
    (bench/dequant_sass.py counts its instructions: 4.5 an element against 20 computed one at
    a time)."""
    assert_the_k_loop_has_no_conversions(GPTQ)


def test_the_default_fuses_a_decoding_batch():
    """`modeled`: 16 rows x 4,096 -> 4,096 on sm_90a: the weights computed inside the product."""
    sets = (("batch", 16), ("in_features", 4096), ("out_features", 4096))
    assert default_place(GPTQ, sets) == "fuse"


def test_the_weight_is_the_main_load_in_every_process(tmp_path):
    """Scales one every 4 k take as many bytes as the int32 words: the integer data is the
    operand's main load whatever order Python's string hashing gives the statements (two hash
    seeds that picked the scales before the tie was broken)."""
    import os
    import subprocess
    import sys

    path = tmp_path / "gptq.py"
    path.write_text(VARIANT.format(zeros=NIBBLES, group=4, groups=64))
    code = ("import sys; from tests.tile_ir.test_gptq import lifted; "
            "print(lifted(sys.argv[1]).contract.b.load.buffer)")
    root = Path(__file__).resolve().parents[2]
    for seed in ("2", "4"):
        out = subprocess.run([sys.executable, "-c", code, str(path)], cwd=root, check=True,
                             capture_output=True, text=True,
                             env={**os.environ, "PYTHONHASHSEED": seed})
        assert out.stdout.split() == ["qweight"], out.stderr[-2000:]


def test_shifts_in_a_tensor_attribute_pair_as_computed_ones(tmp_path):
    """AutoGPTQ keeps its shifts in a plain tensor attribute (`self.wf`): a constant, read back
    as index arithmetic (emmy.tensor_ir.tables), so the words' nibbles pair as before."""
    source = GPTQ.read_text().replace(
        "        shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=x.device)",
        "        shifts = self.wf").replace(
        "        groups = in_features // group",
        "        groups = in_features // group\n"
        "        self.wf = torch.tensor(list(range(0, 32, 4)), dtype=torch.int32)")
    assert "self.wf" in source and "torch.arange" not in source
    path = tmp_path / "gptq_wf.py"
    path.write_text(source)
    op = lifted(path).contract.b
    assert (op.packing, op.k_major, op.paired) == (8, True, True)
    row = "WORK=warps:2x2 TILE=mma:32x32x32 REDUCE=serial STAGE=async:3 RASTER=row PLACE=fuse"
    assert "em_4x2<" in checked(path, (), row).source
