"""REDUCE=split:S:last (emmy.cuda.gemm, _Emitter.last_block): S blocks share a product tile's K
range and store their partial sums; the last of them to take its tile's ticket adds the S
partials in split order and runs the epilogue, in the same kernel (split:S:combine launches a
second kernel for that)."""

from pathlib import Path

import pytest

from emmy.check import check_cuda_program
from emmy.frontend.workload import load_file
from emmy.pipeline import Options, compile_to
from emmy.runtime.costmodel.api import estimate_kernel
from emmy.schedule.row import make_row
from emmy.schedule.space import Space
from emmy.schedule.targets import get_target
from tests.tickets import assert_gpu_runs_repeat_their_bits, record_tickets

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("example,sets,row", [
    ("int4_linear", (("batch", 37), ("in_features", 512), ("out_features", 72)),
     "WORK=warps:2x2 TILE=mma:32x64x32 REDUCE=split:4:last STAGE=async:3 RASTER=row PLACE=fuse"),
    ("bmm", (("batch_size", 3), ("M", 33), ("K", 128), ("N", 40)),
     "WORK=warps:2x2 TILE=simt:32x32x16 REDUCE=split:8:last STAGE=smem RASTER=group:4"),
], ids=["int4_mma", "bmm_simt"])
def test_each_tiles_last_block_sums_the_partials_and_leaves_the_tickets_zero(example, sets, row,
                                                                            monkeypatch):
    """Ragged tiles on both sides (and a batch of 3): one launch, its partials and tickets as
    temporaries (the tickets zero before the run, and after it: the last block of each tile
    resets its ticket for the next launch); the emulated program matches eager."""
    after = record_tickets(monkeypatch)
    w = load_file(EXAMPLES / f"{example}.py", sets)
    results = compile_to(w, "cuda", Options(rows={"": row}))
    (unit,) = results["cuda"].units
    (launch,) = unit.launches
    tickets = next(name for name, ctype, _ in unit.temporaries if ctype == "int")
    assert unit.zeroed == (tickets,) and launch.args[-1] == tickets
    report, failed = check_cuda_program(w, results["torch"], results["cuda"])
    assert report is not None and report.ok, failed or report.outputs
    assert after and all(not t.any() for t in after)


def test_the_last_block_is_modeled_to_save_the_combine_launch():
    """`modeled`, H200: a decoding batch's projection (16 x 4,096 -> 4,096, f16) split 16 ways
    costs less with each tile's last block summing the partials than with a combine kernel
    (its launch, and the partial planes read again from memory)."""
    from emmy.frontend.workload import load_expr

    w = load_expr("nn.Linear(4096, 4096, bias=False).half()(torch.randn(16, 4096).half())")
    (k,) = compile_to(w, "tile")["tile"].program.kernels
    sm90 = get_target("sm_90a")
    row = Space(k, sm90).first_row({"REDUCE": "split:16:last"})
    combine = make_row({**dict(row.items), "REDUCE": "split:16:combine"})
    last, other = (estimate_kernel(k, r, sm90, nvrtc=False) for r in (row, combine))
    assert len(last.launches) == 1 and len(other.launches) == 2
    assert last.seconds < other.seconds


def test_the_tickets_are_atomics_between_fences_and_the_partials_are_read_through_l2():
    """SASS (sm_90a, NVRTC on the CPU): the fence before a block's ticket and after the last
    block's, the ticket a global atomic, the vote on it one barrier (BAR.RED.OR), and the
    partials read with GPU-scope loads (ld.cg: no L1 copy from before the other blocks' stores)."""
    from emmy.cuda.nvrtc import compile_cuda
    from emmy.cuda.sass import cuobjdump, disassemble

    if cuobjdump() is None:
        pytest.skip("cuobjdump (and nvdisasm) not installed")
    w = load_file(EXAMPLES / "int4_linear.py", (("batch", 16), ("in_features", 1024),
                                                ("out_features", 512)))
    row = "WORK=warps:2x4 TILE=mma:32x64x16 REDUCE=split:8:last STAGE=async:4 RASTER=group:8"
    (unit,) = compile_to(w, "cuda", Options(rows={"": row + " PLACE=fuse"}))["cuda"].units
    sass = disassemble(compile_cuda(unit.source, get_target("sm_90a")).cubin)
    assert sass.count("MEMBAR.SC.GPU") == 2 and "ATOMG.E.ADD" in sass
    assert "BAR.RED.OR" in sass and "LDG.E.STRONG.GPU" in sass


@pytest.mark.gpu
def test_gpu_runs_back_to_back_give_the_same_bits_and_leave_the_tickets_zero():
    """On the GPU: a decoding batch's int4 projection split 16 ways (tests/tickets.py)."""
    w = load_file(EXAMPLES / "int4_linear.py", (("batch", 16), ("in_features", 4096),
                                                ("out_features", 4096)))
    assert_gpu_runs_repeat_their_bits(w, "WORK=warps:2x4 TILE=mma:32x64x16 REDUCE=split:16:last "
                                         "STAGE=async:4 RASTER=group:8 PLACE=fuse")


@pytest.mark.parametrize("example,row,message", [
    ("int4_linear", "WORK=warps:2x4 TILE=mma:32x64x16 REDUCE=split:3:last STAGE=async:4 "
     "RASTER=group:8 PLACE=fuse", "not a REDUCE value"),
    ("int4_linear", "WORK=warps:2x4 TILE=wgmma:128x128x64 REDUCE=split:4:last STAGE=async:4 "
     "RASTER=group:8 PLACE=fuse", "the wgmma template does not split K"),
    ("decode_attention", "WORK=warps:4 TILE=flash:64x32 REDUCE=split:3:last STAGE=async:2",
     "not a REDUCE value"),
    ("decode_attention", "WORK=warps:8 TILE=wgmma:128x64 REDUCE=split:2:last STAGE=async:2",
     "split-KV is built for flash:BQxBKV and simt:BQxBKV tiles"),
], ids=["product_grammar", "product_wgmma", "attention_grammar", "attention_wgmma"])
def test_a_refused_last_block_row_is_a_message_and_exit_code_2(example, row, message, capsys):
    from emmy.cli import main

    rc = main(["compile", str(EXAMPLES / f"{example}.py"), "--row", row, "--ir", "tile"])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err, err
