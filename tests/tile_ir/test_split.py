"""REDUCE=split over any length (ragged slices), and the default that splits a reduction whose
jobs leave most SMs idle: both checked on the CPU emulator against PyTorch."""

import pytest

from emmy.check import check_cuda_program
from emmy.frontend.workload import load_expr
from emmy.pipeline import Options, compile_to
from emmy.schedule import decisions as dec
from emmy.schedule.row import parse
from emmy.schedule.space import Space
from emmy.schedule.targets import get_target
from emmy.tile_ir.apply import apply_row
from tests.tickets import record_tickets

SM90 = get_target("sm_90a")


def _kernel(expr: str):
    return compile_to(load_expr(expr), "tile")["tile"].program.kernels[-1]


def _check(expr: str, row: str | None, target: str = "sm_90a"):
    w = load_expr(expr)
    results = compile_to(w, "cuda", Options(target=target, rows={"": row} if row else {}))
    report, failed = check_cuda_program(w, results["torch"], results["cuda"])
    assert report is not None, f"{failed.failed}: {failed.status}\n{failed.log[-2000:]}"
    assert report.ok, [o for o in report.outputs if not o.ok]
    return results["cuda"]


@pytest.mark.parametrize("n,k,vec", [(50257, 8, 1), (50257, 128, 1), (1001, 4, 1), (2050, 16, 2),
                                     (50000, 16, 4), (4096, 4, 4)])
def test_slices_are_whole_vectors_and_the_last_is_never_empty(n, k, vec):
    chunk = dec.split_chunk(n, k, vec)
    assert chunk % vec == 0
    assert 0 < n - (k - 1) * chunk <= chunk
    if n % (k * vec) == 0:
        assert chunk * k == n


# lengths no split divides (1,001 = 7 x 11 x 13; 2,050 = 2 x 1,025; 999 = 27 x 37), each dtype
# and reduction a split takes, slices of whole vectors, several chains a lane
RAGGED = [
    ("torch.randn(3, 1001).sum(-1)", "WORK=block:32 TILE=v1x1 REDUCE=split:4:combine"),
    ("torch.randn(3, 1001).sum(-1)", "WORK=block:64 TILE=v1x4 REDUCE=split:8:atomic"),
    ("torch.randn(2, 2050).half().amax(-1)", "WORK=block:32 TILE=v2x2 REDUCE=split:16:combine"),
    ("torch.randn(1003, dtype=torch.float64).mean()",
     "WORK=block:32 TILE=v1x2 REDUCE=split:8:combine"),
    ("torch.randint(0, 9, (2, 999)).sum(-1)", "WORK=block:32 TILE=v1x1 REDUCE=split:16:combine"),
    ("torch.randn(2, 5000).abs().amin(-1)", "WORK=block:64 TILE=v4x1 REDUCE=split:16:combine"),
]


@pytest.mark.parametrize("expr,row", RAGGED)
def test_ragged_split_rows_are_correct(expr, row):
    assert not Space(_kernel(expr), SM90).check(parse(row))
    prog = _check(expr, row)
    assert "_partial" in prog.units[0].launches[0].function
    assert "min(" in prog.units[0].source      # the last slice stops at the axis' end


# split:K:last: one launch; f64 and int64 partials, a v2 row whose K partials are folded one at
# a time, one warp and several warps a block
RAGGED_LAST = [
    ("torch.randn(1003, dtype=torch.float64).mean()", "WORK=block:64 TILE=v1x2 REDUCE=split:8:last"),
    ("torch.randint(0, 9, (2, 999)).sum(-1)", "WORK=block:32 TILE=v1x1 REDUCE=split:16:last"),
    ("torch.randn(2, 2050).half().amax(-1)", "WORK=block:32 TILE=v2x2 REDUCE=split:16:last"),
]


@pytest.mark.parametrize("expr,row", RAGGED_LAST)
def test_ragged_last_block_rows_are_one_launch_and_leave_the_tickets_zero(expr, row, monkeypatch):
    """The last of a job's K blocks to take its ticket folds the partials and stores the
    result; the tickets (an int per job, the launch's last argument) are zero after every
    emulated run."""
    after = record_tickets(monkeypatch)
    assert not Space(_kernel(expr), SM90).check(parse(row))
    prog = _check(expr, row)
    (unit,) = prog.units
    (launch,) = unit.launches
    assert unit.zeroed == (launch.args[-1],) and launch.args[-1].endswith("_tickets")
    assert "min(" in unit.source and "atomicAdd" in unit.source
    assert after and all(not t.any() for t in after)


def test_the_last_block_fences_its_ticket_in_the_machine_code():
    """SASS (sm_80, NVRTC on the CPU) of a split:8:last sum: a fence before each block's ticket
    and one after the last block's, the ticket a global atomic, the vote one barrier."""
    from emmy.cuda.nvrtc import compile_cuda
    from emmy.cuda.sass import cuobjdump, disassemble

    if cuobjdump() is None:
        pytest.skip("cuobjdump (and nvdisasm) not installed")
    results = compile_to(load_expr("torch.randn(8, 20011).sum(-1)"), "cuda",
                         Options(target="sm_80",
                                 rows={"": "WORK=block:256 TILE=v1x1 REDUCE=split:8:last"}))
    sass = disassemble(compile_cuda(results["cuda"].units[0].source, SM80).cubin)
    assert sass.count("MEMBAR.SC.GPU") == 2 and "ATOMG.E.ADD" in sass and "BAR.RED.OR" in sass


def test_a_split_that_divides_the_axis_has_no_bound_check():
    prog = _check("torch.randn(2, 4096).sum(-1)", "WORK=block:64 TILE=v4x1 REDUCE=split:4:combine")
    assert "_stop" not in prog.units[0].source


def test_the_last_slice_stops_at_the_end_of_the_axis():
    """Slices of ceil(50,257 / 8) = 6,283: the eighth holds 6,276."""
    k = _kernel("torch.randn(8, 50257).sum(-1)")
    row = parse("WORK=block:256 TILE=v1x1 REDUCE=split:8:combine")
    partial = apply_row(k, row, SM90).parts[0].kernel
    (fold,) = partial.folds
    assert fold.axis.extent == 6283
    assert str(fold.limit) == "-a1_slice*6283 + 50257"


SM80 = get_target("sm_80")


@pytest.mark.parametrize("expr,target,kind", [
    # a loss's mean over one 4,096 x 4,096 batch: one job; a cluster holds at most 8 blocks
    ("((torch.randn(4096, 4096) - torch.randn(4096, 4096)) ** 2).mean()", SM90, "split:"),
    # a few long rows: 8 x a 50,257-word vocabulary, 4 rows of a million: one kernel of
    # clusters where there are clusters, else a split whose last block of each row sums it;
    # 4 rows of a million want more blocks a row than a cluster holds (8: 32 blocks, too few
    # to keep HBM busy), so 16 share each row there too
    ("torch.randn(8, 50257).sum(-1)", SM90, "cluster:"),
    ("torch.randn(8, 50257).sum(-1)", SM80, "split:"),
    ("torch.randn(4, 1000000).abs().amax(-1)", SM90, "split:16:last"),
    ("torch.randn(4, 1000000).abs().amax(-1)", SM80, "split:"),
    # not pure reductions: clusters only
    ("F.softmax(torch.randn(8, 50257), -1)", SM90, "cluster:"),
    ("nn.LayerNorm(8192)(torch.randn(4, 8192))", SM90, "cluster:"),
    # top-p's cumulative sum over 8 x GPT-2's vocabulary: each block continues from the
    # blocks before it
    ("torch.cumsum(torch.randn(8, 50257), 1)", SM90, "cluster:"),
    # greedy decoding's argmax over Llama-3's vocabulary: a cluster carries positions
    ("torch.argmax(torch.randn(1, 128256), -1)", SM90, "cluster:"),
])
def test_default_shares_a_reduction_over_few_jobs(expr, target, kind):
    from emmy.runtime.costmodel.api import estimate_kernel

    k = _kernel(expr)
    space = Space(k, target)
    row = space.default()
    assert row["REDUCE"].startswith(kind), row
    assert not row["REDUCE"].endswith(":atomic"), row
    alone = space._preferred_row()
    shared_s = estimate_kernel(k, row, target, nvrtc=False).seconds
    assert shared_s < 0.9 * estimate_kernel(k, alone, target, nvrtc=False).seconds


@pytest.mark.parametrize("expr,target", [
    ("torch.randn(4, 64).sum(-1)", SM90),          # small: nothing to gain
    ("torch.randn(4096, 1024).sum(-1)", SM90),     # 4,096 jobs fill every SM
    ("torch.argmax(torch.randn(4, 100000), 1)", SM80),  # a split does not carry positions
    ("F.softmax(torch.randn(8, 50257), -1)", SM80),    # no clusters, and not a pure reduction
])
def test_default_keeps_a_job_in_one_block_where_sharing_does_not_pay(expr, target):
    row = Space(_kernel(expr), target).default()
    assert not row["REDUCE"].startswith(("split", "cluster")), row


def test_a_default_split_row_is_correct():
    """Eight rows of 20,011 (prime) elements on sm_80: the default splits them (ragged), and
    the last block of each row to finish sums its partials, in the same kernel."""
    expr = "torch.randn(8, 20011).sum(-1)"
    row = Space(_kernel(expr), SM80).default()
    assert row["REDUCE"].endswith(":last"), row
    prog = _check(expr, None, "sm_80")
    assert [l.function for l in prog.units[0].launches] == ["k0_sum"]


@pytest.mark.gpu
@pytest.mark.parametrize("expr,row", [
    ("F.mse_loss(torch.randn(4096, 4096), torch.randn(4096, 4096))",
     "WORK=block:256 TILE=v4x4 REDUCE=split:64:last"),
    ("torch.randn(8, 20011).half().sum(-1)", "WORK=block:256 TILE=v1x2 REDUCE=split:8:last"),
])
def test_gpu_last_block_rows_pass_the_harness(expr, row):
    """On the GPU, through the harness (2 seeds x 3 input distributions): each job's last block
    folds the partials of the others (the fences and the ticket's atomic as the hardware runs
    them, blocks finishing in any order)."""
    from emmy.bench.harness import check_program

    w = load_expr(expr)
    stages = compile_to(w, "cuda", Options(rows={"": row}))
    result = check_program(w, stages["torch"], stages["cuda"], device="gpu")
    assert result.verdict == "ok" and len(result.cases) == 6, result
