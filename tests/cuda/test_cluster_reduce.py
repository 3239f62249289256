"""REDUCE=cluster:C: a job shared by the C blocks of a thread-block cluster (sm_90), each
folding its slice of every fold, reductions combined through distributed shared memory.
Checked on the CPU emulator against PyTorch, compiled by NVRTC, and (with a GPU) run."""

import pytest

from emmy.check import check_cuda_program
from emmy.cuda.nvrtc import compile_cuda
from emmy.frontend.workload import load_expr
from emmy.pipeline import Options, compile_to
from emmy.schedule.row import parse
from emmy.schedule.space import Space
from emmy.schedule.targets import get_target

SM90 = get_target("sm_90a")

# ragged lengths (5,003 and 1,001 are odd, 4,098 = 2 x 2,049), a statistic and an output pass
# (softmax: max then sum; LayerNorm: two folds, a weight and a bias), 16-bit and f64 data,
# integer sums, vectors and several chains a lane, clusters of 2, 4 and 8
CASES = [
    ("F.softmax(torch.randn(8, 5003), -1)", "WORK=block:128 TILE=v1x1 REDUCE=cluster:8 STAGE=direct PLACE=fuse"),
    ("F.log_softmax(torch.randn(2, 4098).half(), -1)",
     "WORK=block:64 TILE=v2x2 REDUCE=cluster:4 STAGE=direct PLACE=fuse"),
    ("nn.LayerNorm(3000)(torch.randn(2, 3000))",
     "WORK=block:128 TILE=v4x1 REDUCE=cluster:2 STAGE=direct PLACE=fuse"),
    ("nn.RMSNorm(2048)(torch.randn(3, 2048).bfloat16())",
     "WORK=block:64 TILE=v2x1 REDUCE=cluster:4 STAGE=direct PLACE=fuse"),
    ("torch.logsumexp(torch.randn(2, 1001, dtype=torch.float64), -1)",
     "WORK=block:32 TILE=v1x1 REDUCE=cluster:2"),
    ("torch.randint(-9, 9, (2, 999)).sum(-1)", "WORK=block:32 TILE=v1x4 REDUCE=cluster:8"),
    ("torch.randn(3, 2050).half().amax(-1)", "WORK=block:32 TILE=v2x1 REDUCE=cluster:4"),
    # positions: ties (the first wins, across the cluster's blocks too), NaN (the first NaN
    # wins), a max with its indices (two accumulators of one fold)
    ("torch.argmax(torch.randint(0, 5, (2, 3001)), -1)",
     "WORK=block:64 TILE=v1x2 REDUCE=cluster:8"),
    ("torch.argmin(torch.where(torch.randn(2, 3001) > 2.5, torch.full((2, 3001), float('nan')), "
     "torch.randn(2, 3001)), -1)", "WORK=block:64 TILE=v1x1 REDUCE=cluster:4"),
    ("torch.max(torch.randn(2, 3002).half(), -1)", "WORK=block:32 TILE=v2x1 REDUCE=cluster:2"),
    # scans: each block continues from the totals of the blocks before it (sums, integers,
    # logcumsumexp in f64, several elements a lane; a scan divided by the row's sum)
    ("torch.cumsum(torch.randn(3, 3001), 1)", "WORK=block:64 TILE=v1x1 REDUCE=cluster:4"),
    ("torch.cumsum(torch.randint(-5, 5, (2, 2999)), 1)", "WORK=block:32 TILE=v1x4 REDUCE=cluster:8"),
    ("torch.logcumsumexp(torch.randn(2, 1500, dtype=torch.float64), 1)",
     "WORK=block:64 TILE=v1x2 REDUCE=cluster:2"),
    ("(lambda x: torch.cumsum(x, 1) / x.sum(1, keepdim=True))(torch.randn(4, 2000))",
     "WORK=block:64 TILE=v1x1 REDUCE=cluster:4"),
    # a reduction too short to share (40), folded whole by every block; the output pass shared
    ("(lambda x, y: y * x.sum(-1, keepdim=True))(torch.randn(4, 40), torch.randn(4, 4000))",
     "WORK=block:64 TILE=v1x1 REDUCE=cluster:4 PLACE=fuse"),
]


def _compile(expr: str, row: str | None, target: str = "sm_90a"):
    w = load_expr(expr)
    return w, compile_to(w, "cuda", Options(target=target, rows={"": row} if row else {}))


def _check(expr: str, row: str | None):
    w, results = _compile(expr, row)
    report, failed = check_cuda_program(w, results["torch"], results["cuda"])
    assert report is not None, f"{failed.failed}: {failed.status}\n{failed.log[-2000:]}"
    assert report.ok, [o for o in report.outputs if not o.ok]
    return results["cuda"]


@pytest.mark.parametrize("expr,row", CASES)
def test_cluster_rows_are_correct(expr, row):
    kernel = compile_to(load_expr(expr), "tile")["tile"].program.kernels[-1]
    assert not Space(kernel, SM90).check(parse(row))
    prog = _check(expr, row)
    (unit,) = prog.units
    (launch,) = unit.launches
    size = int(row.split("cluster:")[1].split()[0])
    assert f"EMMY_CLUSTER_DIMS({size}, 1, 1)" in unit.source
    assert launch.grid % size == 0


def test_each_fold_combines_with_one_barrier_and_alternating_slots():
    """LayerNorm's two folds: its mean in slot 0, its variance in slot 16, one cluster barrier
    each, and one more before the blocks exit."""
    _, results = _compile(*CASES[2])
    text = results["cuda"].units[0].source
    assert text.count("cluster_sync();") == 3
    assert "em_cluster_fold<EmSum, float>(cluster_scratch + 0, 2)" in text
    assert "em_cluster_fold<EmSum, float>(cluster_scratch + 16, 2)" in text


def test_only_the_first_block_stores_a_jobs_value():
    _, results = _compile(*CASES[4])
    assert "if (lane == 0 && crank == 0) {" in results["cuda"].units[0].source


def test_nvrtc_compiles_a_cluster_row_to_cluster_barriers():
    """sm_90a SASS: the cluster barrier (UCGABAR_ARV / UCGABAR_WAIT), no local memory."""
    from emmy.cuda.sass import cuobjdump, disassemble, instructions

    _, results = _compile(*CASES[0])
    compiled = compile_cuda(results["cuda"].units[0].source, SM90)
    used = compiled.resources_of()
    assert used.spill_store_bytes == used.spill_load_bytes == 0
    if cuobjdump() is None:
        pytest.skip("cuobjdump is not installed (pip install nvidia-cuda-cuobjdump)")
    ops = instructions(disassemble(compiled.cubin))
    for op in ("UCGABAR_ARV", "UCGABAR_WAIT"):
        assert op in ops, sorted(set(ops))
    assert not any(o.startswith(("LDL", "STL")) for o in ops)


def test_a_default_cluster_row_is_correct():
    """Softmax over 8 rows of 20,011 (prime) on sm_90a: the default shares each row among a
    cluster's blocks."""
    expr = "F.softmax(torch.randn(8, 20011), -1)"
    _, results = _compile(expr, None)
    assert "cluster:" in results["cuda"].units[0].row
    _check(expr, None)


@pytest.mark.gpu
@pytest.mark.parametrize("expr,row", [CASES[0], CASES[2], CASES[3]])
def test_gpu_cluster_rows_pass_the_harness(expr, row):
    from emmy.bench.harness import check_program

    w, stages = _compile(expr, row)
    result = check_program(w, stages["torch"], stages["cuda"], device="gpu")
    assert result.verdict == "ok" and len(result.cases) == 6, result


def _shared(row) -> bool:
    return row.get("REDUCE", "").startswith(("cluster:", "split:"))


@pytest.mark.parametrize("name,sets", [
    ("softmax", (("batch_size", 4),)), ("layernorm", (("batch_size", 2), ("seq_len", 2))),
    ("rmsnorm", (("batch_size", 4),)), ("log_softmax", (("batch_size", 4),)),
    ("losses", (("batch_size", 8),)),
    # a norm over a whole tensor, and a dozen row kernels: half a minute and more
    pytest.param("norms", (), marks=pytest.mark.slow),
    pytest.param("sampling", (), marks=pytest.mark.slow)])
def test_sampled_shared_rows_of_the_examples_are_correct(name, sets):
    """Rows that share a job among blocks (clusters, splits; the other sampled tests leave
    clusters out: tests/rows.py), sampled on their own, for every row kernel of the example
    that takes them, at a few rows (each row a cluster of blocks on the emulator)."""
    from pathlib import Path

    from emmy.frontend.workload import load_file
    from emmy.verify import verify_rows

    path = Path(__file__).resolve().parents[2] / "examples" / f"{name}.py"
    results = verify_rows(load_file(path, sets), per_kernel=2, seed=5, targets=("sm_90a",),
                          where=_shared)
    assert results
    bad = [r for r in results if r.verdict != "ok"]
    assert not bad, bad
