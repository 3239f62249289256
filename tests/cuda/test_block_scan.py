"""Scans by a block of threads a row (WORK=block:N): each warp scans its 32 values by shuffles,
the first warp scans the warps' totals in shared memory, and the block walks its row a chunk of
N at a time; and lanes that fold n consecutive elements each (TILE=v1xn) before the lanes'
totals are scanned. Checked on the CPU emulator against eager at lengths no chunk divides, for
every fold, reversed and exclusive scans, and 16-bit and integer values."""

import pytest
import torch

from emmy.frontend.workload import Workload
from emmy.kernel_ir.printer import print_program as print_kernel
from emmy.pipeline import Options, compile_to
from emmy.schedule.rules import RULES
from emmy.schedule.space import Space
from emmy.schedule.targets import get_target
from emmy.tile_ir.ir import KernelKind
from emmy.verify import verify_rows
from tests.tensor_ir.conftest import Fn

CASES = {
    "sums": (lambda x: (torch.cumsum(x, 1), torch.cumsum(x.flip(1), 1).flip(1),
                        torch.cumsum(x, 1) - x), [torch.randn(3, 999)]),
    "products": (lambda x: torch.cumprod(1 + 0.01 * x, 1), [torch.randn(2, 700)]),
    "max": (lambda x: torch.cummax(x, 1), [torch.randn(3, 1000)]),
    "logcumsumexp": (lambda x: torch.logcumsumexp(x, 1), [torch.randn(2, 333)]),
    "half": (lambda x: torch.cumsum(x, 1), [torch.randn(2, 1500).half()]),
    "ints": (lambda x: torch.cumsum(x, 0), [torch.randint(-5, 5, (2100, 3))]),
}


def _workload(name):
    fn, inputs = CASES[name]
    return Workload(name, Fn(fn).eval(), tuple(inputs), source=name, origin="<test>")


def _block(row) -> bool:
    return row["WORK"].startswith("block:") and row["WORK"] != "block:32"


@pytest.mark.parametrize("name", CASES)
def test_block_scan_rows_are_correct(name):
    results = verify_rows(_workload(name), per_kernel=2, seed=5, targets=("sm_90a",),
                          where=_block)
    assert results and all(r.row.split()[0].startswith("WORK=block") for r in results)
    bad = [r for r in results if r.verdict != "ok"]
    assert not bad, bad


def _several(row) -> bool:
    return row["TILE"] != "v1x1"


@pytest.mark.parametrize("name", CASES)
def test_lanes_folding_several_elements_are_correct(name):
    results = verify_rows(_workload(name), per_kernel=2, seed=11, targets=("sm_90a",),
                          where=_several)
    assert results and all("TILE=v1x1" not in r.row for r in results)
    bad = [r for r in results if r.verdict != "ok"]
    assert not bad, bad


def _scan_space(expr_fn, x) -> Space:
    w = Workload("scan", Fn(expr_fn).eval(), (x,), source="scan", origin="<test>")
    (k,) = compile_to(w, "tile")["tile"].program.kernels
    assert k.kind is KernelKind.SCAN
    return Space(k, get_target("sm_90a"))


def test_a_few_long_rows_default_to_a_block_a_row():
    """Eight rows of 50,257: a warp a row would leave 124 SMs idle and walk 1,571 chunks; the
    cost model gives a block a row (as many chunks fewer) less time."""
    sp = _scan_space(lambda x: torch.cumsum(x, -1), torch.randn(8, 50257))
    assert sp.default()["WORK"].startswith("block:")
    many = _scan_space(lambda x: torch.cumsum(x, -1), torch.randn(65536, 64))
    assert not many.default()["WORK"].startswith("block:")


def test_a_block_scan_shuffles():
    sp = _scan_space(lambda x: torch.cumsum(x, -1), torch.randn(4, 256))
    rule = next(r for r in RULES if r.name == "reduce.block_scan_shuffles")
    refusals = sp.check(sp.default().replace("WORK", "block:128").replace("REDUCE", "smem"))
    assert [r.rule for r in refusals] == [rule.name]


def test_the_kernel_ir_and_cuda_name_the_block_scan():
    w = Workload("scan", Fn(lambda x: torch.cumsum(x, 1)).eval(), (torch.randn(4, 300),),
                 source="scan", origin="<test>")
    stages = compile_to(w, "cuda", Options(rows={"": "WORK=block:128 TILE=v1x1 REDUCE=shuffle"}))
    assert "block_scan.sum" in print_kernel(stages["kernel"].kernels[0])
    assert "em_block_scan<EmSum>(" in stages["cuda"].units[0].source
