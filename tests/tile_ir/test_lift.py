"""Lifting Loop IR kernels into Tile IR: the grid of jobs, the Fold tree, the kernel's kind,
collapsed nested reductions, and the printer."""

from __future__ import annotations

import itertools
from functools import lru_cache

import pytest

from emmy.frontend.workload import load_expr
from emmy.loop_ir.ir import Accum, Init, Load, Store
from emmy.pipeline import compile_to
from emmy.schedule.row import parse
from emmy.symbolic import FloorDiv, Mod, Sym, evaluate, var
from emmy.tensor_ir.ir import ReduceOp
from emmy.tile_ir.ir import Axis, Fold, FoldKind, KernelKind, TileKernel
from emmy.tile_ir.printer import print_kernel, print_program

RMS = "nn.RMSNorm(2048)(torch.randn(32, 2048))"
CHAIN = "(lambda x, y: torch.relu(x * y + 1))(torch.randn(4, 8, 16), torch.randn(4, 8, 16))"
CUMSUM = "(lambda x: torch.cumsum(x, 1))(torch.randn(8, 64))"
REV_CUMSUM = "(lambda x: torch.cumsum(x.flip(1), 1).flip(1))(torch.randn(4, 8))"
SUM_2D = "(lambda x: x.sum())(torch.randn(64, 128))"
SUM_3D = "(lambda x: x.sum())(torch.randn(2, 3, 4))"
SUM_INNER = "(lambda x: x.sum((1, 2)))(torch.randn(3, 4, 5))"
SOFTMAX = "nn.Softmax(-1)(torch.randn(8, 100))"


@lru_cache(maxsize=None)
def program(expr: str):
    return compile_to(load_expr(expr), "tile")["tile"].program


def kernel(expr: str) -> TileKernel:
    tp = program(expr)
    assert len(tp.kernels) == 1, [k.name for k in tp.kernels]
    return tp.kernels[0]


def stmts(items, kind):
    return [i for i in items if isinstance(i, kind)]


def test_rmsnorm_is_a_row_kernel():
    k = kernel(RMS)
    assert k.kind is KernelKind.ROW
    assert k.grid == (Axis("a0", 32),) and k.jobs == 32
    assert [f.kind for f in k.folds] == [FoldKind.REDUCE, FoldKind.MAP]
    reduce, out_pass = k.folds
    assert reduce.axis == Axis("a1", 2048) and out_pass.axis == Axis("a2", 2048)
    assert [(i.acc, i.op) for i in reduce.accs] == [("acc0", ReduceOp.SUM)]
    assert out_pass.accs == () and not reduce.reverse
    # the Init moved into its fold; the observer (mean, + eps, rsqrt) sits between the folds
    assert not stmts(k.body, Init)
    between = k.body[k.body.index(reduce) + 1:k.body.index(out_pass)]
    assert between and not stmts(between, Fold) and not stmts(between, Load)
    # the reduce reads x, the output pass reads weight and x again and stores out0
    assert {l.buffer for l in stmts(reduce.body, Load)} == {"x"}
    assert {l.buffer for l in stmts(out_pass.body, Load)} == {"x", "weight"}
    assert [s.buffer for s in stmts(out_pass.body, Store)] == ["out0"]
    assert [a.acc for a in stmts(reduce.body, Accum)] == ["acc0"]
    assert not k.atomic


def test_softmax_folds_twice_then_maps():
    k = kernel(SOFTMAX)
    assert k.kind is KernelKind.ROW and k.grid == (Axis("a0", 8),)
    assert [f.kind for f in k.folds] == [FoldKind.REDUCE, FoldKind.REDUCE, FoldKind.MAP]
    assert [[i.op for i in f.accs] for f in k.folds] == [[ReduceOp.MAX], [ReduceOp.SUM], []]
    assert all(f.axis.extent == 100 for f in k.folds)


def test_elementwise_chain_is_a_map_with_every_loop_in_the_grid():
    k = kernel(CHAIN)
    assert k.kind is KernelKind.MAP
    assert [a.extent for a in k.grid] == [4, 8, 16] and k.jobs == 4 * 8 * 16
    assert len({a.var for a in k.grid}) == 3
    assert k.folds == () and not stmts(k.body, Fold)
    grid_index = tuple(str(a.var) for a in k.grid)
    for item in stmts(k.body, Load) + stmts(k.body, Store):
        assert tuple(str(e) for e in item.index) == grid_index


def test_cumsum_is_a_scan():
    k = kernel(CUMSUM)
    assert k.kind is KernelKind.SCAN and k.grid == (Axis("a0", 8),)
    (scan,) = k.folds
    assert scan.kind is FoldKind.SCAN and scan.axis == Axis("a1", 64) and not scan.reverse
    assert [(i.acc, i.op) for i in scan.accs] == [("acc0", ReduceOp.SUM)]
    # the running value is read inside the fold: the store is in the scan's body
    assert [s.value for s in stmts(scan.body, Store)] == ["acc0"]


def test_reverse_cumsum_is_a_reversed_scan():
    k = kernel(REV_CUMSUM)
    assert k.kind is KernelKind.SCAN
    (scan,) = k.folds
    assert scan.kind is FoldKind.SCAN and scan.reverse


def _indices_read(fold: Fold, load: Load, fixed=()):
    """The load's index evaluated at every value of the fold's axis, in order."""
    return [tuple(evaluate(e, {fold.axis.var: i, **dict(fixed)}) for e in load.index)
            for i in range(fold.axis.extent)]


def _atoms(e):
    for atom, _ in e.terms:
        yield atom
        if isinstance(atom, (FloorDiv, Mod)):
            yield from _atoms(atom.num)


def test_full_reduction_collapses_into_one_fold():
    k = kernel(SUM_2D)
    assert k.kind is KernelKind.ROW and k.grid == () and k.jobs == 1
    (fold,) = k.folds
    assert fold.kind is FoldKind.REDUCE and fold.axis == Axis("a0_a1", 64 * 128)
    assert [i.op for i in fold.accs] == [ReduceOp.SUM]
    assert not stmts(fold.body, Fold), "the nested reduce is merged, not kept"
    (load,) = stmts(fold.body, Load)
    row, col = load.index
    assert [type(a) for a in _atoms(row)] == [FloorDiv, Sym]
    assert [type(a) for a in _atoms(col)] == [Mod, Sym]
    assert row.terms == ((FloorDiv(var("a0_a1"), 128), 1),) and row.const == 0
    assert col.terms == ((Mod(var("a0_a1"), 128), 1),) and col.const == 0
    assert {s.name for e in load.index for s in _atoms(e) if isinstance(s, Sym)} == {"a0_a1"}
    seen = _indices_read(fold, load)
    assert sorted(seen) == list(itertools.product(range(64), range(128)))
    assert seen[0] == (0, 0) and seen[129] == (1, 1)


def test_three_nested_reductions_collapse_recursively():
    k = kernel(SUM_3D)
    (fold,) = k.folds
    assert fold.axis == Axis("a0_a1_a2", 24) and not stmts(fold.body, Fold)
    (load,) = stmts(fold.body, Load)
    seen = _indices_read(fold, load)
    assert seen == list(itertools.product(range(2), range(3), range(4))), "row-major order"


def test_partial_reduction_collapses_the_reduced_axes_only():
    k = kernel(SUM_INNER)
    assert k.grid == (Axis("a0", 3),)
    (fold,) = k.folds
    assert fold.axis == Axis("a1_a2", 20)
    (load,) = stmts(fold.body, Load)
    for job in range(3):
        seen = _indices_read(fold, load, fixed={"a0": job})
        assert seen == [(job, i, j) for i in range(4) for j in range(5)]


def test_nested_reduce_with_its_own_accumulator_is_not_collapsed():
    """A row sum inside a max over rows: the inner reduce owns its accumulator, so it stays
    nested."""
    k = kernel("(lambda x: x.sum(-1).amax(-1))(torch.randn(3, 16, 8))")
    first = k.folds[0]
    assert first.kind is FoldKind.REDUCE
    inner = stmts(first.body, Fold)
    assert len(inner) == 1 and inner[0].kind is FoldKind.REDUCE and inner[0].accs
    assert inner[0].axis.extent == 8 and first.axis.extent == 16


# --- the printer ----------------------------------------------------------------------------

def test_printer_shows_grid_and_folds():
    text = print_kernel(kernel(RMS))
    lines = text.splitlines()
    assert lines[0].startswith("kernel k0_rmsnorm(x: f32[32,2048], weight: f32[2048]) -> "
                               "(out0: f32[32,2048])  # row, id ")
    assert "  grid a0 in 0..32  (32 jobs)" in lines
    assert "    reduce a1 in 0..2048 into acc0 = init(add) : f32" in lines
    assert "    map a2 in 0..2048" in lines
    assert "      acc0 <- add(acc0, v0)" in lines
    assert "schedule:" not in text
    assert text.endswith("\n")


def test_printer_shows_the_row():
    row = parse("WORK=block:256 TILE=v4x1 REDUCE=shuffle STAGE=direct PLACE=fuse")
    text = print_kernel(kernel(RMS), row, explain=["why: because"])
    assert f"  schedule: {row}" in text.splitlines()
    assert "    why: because" in text.splitlines()
    assert print_program(program(RMS), {"k0_rmsnorm": row}) == print_kernel(kernel(RMS), row)


@pytest.mark.parametrize("expr, lines", [
    (SUM_2D, ["  grid (one job)  (1 job)", "    reduce a0_a1 in 0..8192 into acc0 = init(add) : f32",
              "      in0 = load x[(a0_a1 / 128), (a0_a1 % 128)]"]),
    (REV_CUMSUM, ["    scan a1 in 0..8 reversed into acc0 = init(add) : f32"]),
    (CHAIN, ["  grid a0 in 0..4 × a1 in 0..8 × a2 in 0..16  (512 jobs)"]),
])
def test_printer_lines(expr, lines):
    text = print_kernel(kernel(expr)).splitlines()
    for line in lines:
        assert line in text, "\n".join(text)


def test_a_collapsed_window_inside_a_collapsed_mean_keeps_its_extent():
    """mean over (h, w) of a 2x2 max pool: the pool's window folds merge first (kh_kw), then
    the mean's (h_w) substitute into a body that already uses kh_kw; both merged axes keep
    their extents, and the kernel computes the eager result on the emulator."""
    from emmy.check import check_cuda_program

    w = load_expr("(lambda x: nn.functional.max_pool2d(x, 2).mean((2, 3)))"
                  "(torch.randn(2, 3, 8, 8))")
    stages = compile_to(w, "cuda")
    (k,) = stages["tile"].program.kernels
    folds = [i for i in k.body if isinstance(i, Fold)]
    assert folds and folds[0].axis.extent == 16                      # the mean's 4 x 4
    assert any(isinstance(i, Fold) and i.axis.extent == 4 for i in folds[0].body)  # 2 x 2
    report, failed = check_cuda_program(w, stages["torch"], stages["cuda"])
    assert report is not None and report.ok, failed
