"""Split-KV attention (REDUCE=split:S:combine and split:S:last) and attention with one query a
head (a decoding step): the recognizer takes a kernel whose query axis is gone, the split rows
compute what torch computes on the CPU emulator (f16, bf16 and f32, grouped k and v, a causal
mask whose later splits see no key for the early rows, ragged key blocks), the lowering
launches the template's partial kernel and then the combine (combine), or one kernel whose
last block of each query block combines (last: its tickets zero before and after), and the
default row splits where the cost model says that is faster."""

from __future__ import annotations

import pytest

from emmy.check import check_cuda_program
from emmy.frontend.workload import load_expr, load_file
from emmy.pipeline import Options, compile_to
from emmy.schedule.row import parse
from emmy.schedule.space import Space
from emmy.schedule.targets import get_target
from emmy.tile_ir.ir import KernelKind
from tests.tickets import assert_gpu_runs_repeat_their_bits, record_tickets

SM90 = get_target("sm_90a")
DECODE = "examples/decode_attention.py"
LLAMA_DECODE = (("batch_size", 1), ("n_heads", 32), ("n_kv_heads", 8), ("cache_len", 4096),
                ("head_dim", 128))


def only_kernel(w):
    (k,) = compile_to(w, "tile")["tile"].program.kernels
    return k


def test_one_query_a_head_is_one_flash_kernel():
    """q of length 1: no grid axis is the query axis; every grid axis is a batch axis, k and v
    are read at head h // 4 (grouped-query), and the query block holds one row."""
    k = only_kernel(load_file(DECODE))
    assert k.kind is KernelKind.ATTENTION
    a = k.attention
    assert (a.query.extent, a.keys, a.dim, a.causal) == (1, 300, 64, False)
    assert [ax.extent for ax in a.batch] == [2, 8]
    assert (a.k.group, a.v.group, a.q.group) == (4, 4, 1)
    # written by hand too, and with one (batch, head) only (an empty grid)
    for shape in ("2, 4", "1, 1"):
        hand = load_expr(f"(lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) * 0.125, -1) "
                         f"@ v)(torch.randn({shape}, 1, 64).half(), torch.randn({shape}, 100, 64)"
                         f".half(), torch.randn({shape}, 100, 64).half())")
        assert only_kernel(hand).kind is KernelKind.ATTENTION


def test_attention_read_through_an_upsampling_is_not_one_query_a_head():
    """Nearest upsampling of attention's output (found by bench/fuzz.py, seed 9402): the
    kernel reads q at row // 2 and v at column // 2, which is not attention with one query a
    head; it stays on the generic path and agrees with torch."""
    w = load_expr("F.interpolate(F.scaled_dot_product_attention(torch.randn(2, 3, 70, 32)"
                  ".bfloat16(), torch.randn(2, 3, 70, 32).bfloat16(), torch.randn(2, 3, 70, 32)"
                  ".bfloat16()), scale_factor=2, mode='nearest')")
    results = compile_to(w, "cuda")
    assert all(k.kind is not KernelKind.ATTENTION for k in results["tile"].program.kernels)
    report, failed = check_cuda_program(w, results["torch"], results["cuda"])
    assert report is not None and report.ok, failed


def run_row(w, row: str):
    k = only_kernel(w)
    results = compile_to(w, "cuda", Options(rows={k.name: row}))
    report, failed = check_cuda_program(w, results["torch"], results["cuda"])
    assert report is not None, f"{failed.failed}: {failed.status}\n{failed.log[-2000:]}"
    assert report.ok, [o for o in report.outputs if not o.ok]
    return results


def run_last_row(w, row: str, monkeypatch):
    """run_row for a split:S:last row: one launch, the tickets its last argument and a zeroed
    temporary, zero after every emulated run (each query block's last block resets its own)."""
    after = record_tickets(monkeypatch)
    results = run_row(w, row)
    (unit,) = results["cuda"].units
    (launch,) = unit.launches
    assert unit.zeroed == (launch.args[-1],) and launch.args[-1].endswith("_tickets")
    assert after and all(not t.any() for t in after)
    return results


@pytest.mark.parametrize("sets, row", [
    ((), "WORK=warps:4 TILE=flash:64x32 REDUCE=split:4:combine STAGE=async:2"),
    ((("dtype", "bfloat16"),), "WORK=warps:8 TILE=flash:128x64 REDUCE=split:2:combine STAGE=smem"),
    ((("dtype", "float32"),), "WORK=warps:4 TILE=simt:32x32 REDUCE=split:4:combine STAGE=async:2"),
])
def test_split_decode_rows_agree_with_torch(sets, row):
    results = run_row(load_file(DECODE, sets), row)
    (kp,) = results["kernel"].kernels
    assert [f.name.rsplit("_", 1)[1] for f in kp.functions] == ["partial", "combine"]
    ((name, ctype, count),) = kp.temporaries
    # each of the splits' outputs, then its rows' m and log2 l: 2 x 8 heads, one query, d 64
    splits = int(parse(row)["REDUCE"].split(":")[1])
    assert (ctype, count) == ("float", splits * 2 * 8 * 1 * (64 + 2))


@pytest.mark.parametrize("sets, row", [
    ((), "WORK=warps:4 TILE=flash:64x32 REDUCE=split:4:last STAGE=async:2"),
    ((("dtype", "float32"),), "WORK=warps:4 TILE=simt:32x32 REDUCE=split:2:last STAGE=smem"),
], ids=["f16", "f32"])
def test_split_last_decode_rows_agree_with_torch_in_one_launch(sets, row, monkeypatch):
    results = run_last_row(load_file(DECODE, sets), row, monkeypatch)
    (kp,) = results["kernel"].kernels
    assert [f.name for f in kp.functions] == [kp.name]
    splits = int(parse(row)["REDUCE"].split(":")[1])
    # the partials as split:S:combine stores them; a ticket per (batch x key/value head, query
    # block): 2 x 2 heads of 4 query rows each, one query block
    assert sorted(t[1:] for t in kp.temporaries) == [("float", splits * 2 * 8 * 1 * (64 + 2)),
                                                    ("int", 4)]


@pytest.mark.parametrize("how", ["combine", "last"])
def test_split_causal_prefill_agrees_with_torch(how, monkeypatch):
    """200 queries, causal, 7 key blocks in runs of 2: the early rows' later splits see no key
    (log-sum-exp -inf, weight 0), the last split holds one, ragged, block; the last query
    block is ragged too (rows 192..199: its last block combines only those)."""
    w = load_file("examples/attention_half.py", (("seq_len", 200),))
    row = f"WORK=warps:4 TILE=flash:64x32 REDUCE=split:4:{how} STAGE=async:2"
    if how == "last":
        run_last_row(w, row, monkeypatch)
    else:
        run_row(w, row)


def test_the_query_heads_of_a_key_value_head_are_its_query_rows():
    """One query a head over grouped k and v: the template's problem has the key/value heads
    as its heads and their 4 query heads as 4 query rows (q's row stride is its head stride),
    so a block reads its keys and values once; the output lands at head h * 4 + row."""
    from emmy.schedule.flash import problem_of

    k = only_kernel(load_file(DECODE))
    p = problem_of(k.attention)
    assert (p.batch, p.heads, p.sq, p.query_heads, p.k.group, p.v.group) == (2, 2, 4, 4, 1, 1)
    assert p.q.strides == (8 * 64, 4 * 64, 64, 1)
    # under a mask tensor too (a batch's padding mask over the keys, here per head as well):
    # query head h * 2 + r reads its mask at row r of head h, the mask's head stride its row's
    masked = load_expr("(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, "
                       "attn_mask=m, enable_gqa=True))(torch.randn(2, 4, 1, 64).half(), "
                       "torch.randn(2, 2, 40, 64).half(), torch.randn(2, 2, 40, 64).half(), "
                       "torch.rand(2, 4, 1, 40) > 0.3)")
    km = only_kernel(masked)
    pm = problem_of(km.attention)
    assert km.kind is KernelKind.ATTENTION and (pm.heads, pm.sq, pm.query_heads) == (2, 2, 2)
    assert pm.bias.strides == (4 * 40, 2 * 40, 40, 1)
    run_row(masked, str(Space(km, SM90).default()))
    run_row(masked, "WORK=warps:4 TILE=flash:64x32 REDUCE=split:2:combine STAGE=async:2")


def test_the_default_splits_where_the_model_says_it_is_faster():
    """A Llama-3-8B decoding step (32 query heads over 8 key/value heads, one query each: 8
    blocks unsplit on 132 SMs) splits; the example's 300-token cache is one kernel (the
    combine's launch costs more)."""
    from emmy.runtime.costmodel.api import estimate_kernel

    k = only_kernel(load_file(DECODE, LLAMA_DECODE))
    row = Space(k, SM90).default()
    assert row["REDUCE"].startswith("split:"), row
    serial = parse(str(row).replace(row["REDUCE"], "serial"))
    assert (estimate_kernel(k, row, SM90, nvrtc=False).seconds
            < 0.9 * estimate_kernel(k, serial, SM90, nvrtc=False).seconds)
    assert Space(only_kernel(load_file(DECODE)), SM90).default()["REDUCE"] == "serial"
    # one kernel: the last block of each query block combines (no combine launch, modeled
    # cheaper than the same split with a combine kernel)
    assert row["REDUCE"].endswith(":last"), row
    combine = parse(str(row).replace(row["REDUCE"], row["REDUCE"].replace("last", "combine")))
    last, other = (estimate_kernel(k, r, SM90, nvrtc=False) for r in (row, combine))
    assert (len(last.launches), len(other.launches)) == (1, 2)
    assert last.seconds < other.seconds


def test_split_rows_are_refused_where_they_cannot_be_built():
    k = only_kernel(load_file(DECODE))
    space = Space(k, SM90)
    (r,) = space.check(parse("WORK=warps:8 TILE=wgmma:128x64 REDUCE=split:2:combine "
                             "STAGE=async:2"))
    assert r.rule == "reduce.split_template" and "REDUCE=serial" in r.reason
    (r,) = space.check(parse("WORK=warps:4 TILE=flash:64x64 REDUCE=split:8:combine "
                             "STAGE=async:2"))
    assert r.rule == "reduce.split_keys" and "8 splits of 5 key blocks" in r.reason
    (r,) = space.check(parse("WORK=warps:8 TILE=wgmma:128x64 REDUCE=split:2:last "
                             "STAGE=async:2"))
    assert r.rule == "reduce.split_template"
    splits = {row["REDUCE"] for row in space.all_rows}
    assert splits == {"serial", *(f"split:{s}:{how}" for s in (2, 4)
                                  for how in ("combine", "last"))}


def test_the_last_block_fences_its_ticket_and_reads_the_partials_through_l2():
    """SASS (sm_80, NVRTC on the CPU) of a split:8:last decoding row: a fence before each
    block's ticket and one after the last block's, the ticket a global atomic, the vote one
    barrier (BAR.RED.OR), the partials read with GPU-scope loads (ld.cg)."""
    from emmy.cuda.nvrtc import compile_cuda
    from emmy.cuda.sass import cuobjdump, disassemble

    if cuobjdump() is None:
        pytest.skip("cuobjdump (and nvdisasm) not installed")
    w = load_file(DECODE, LLAMA_DECODE)
    row = "WORK=warps:4 TILE=flash:64x64 REDUCE=split:8:last STAGE=async:2"
    (unit,) = compile_to(w, "cuda", Options(rows={"": row}, target="sm_80"))["cuda"].units
    sass = disassemble(compile_cuda(unit.source, get_target("sm_80")).cubin)
    assert sass.count("MEMBAR.SC.GPU") == 2 and "ATOMG.E.ADD" in sass
    assert "BAR.RED.OR" in sass and "LDG.E.STRONG.GPU" in sass


@pytest.mark.gpu
def test_gpu_split_last_decoding_gives_the_same_bits_and_leaves_the_tickets_zero():
    """On the GPU: a Llama-3-8B decoding step split 8 ways, each query block's last block
    combining (tests/tickets.py; tests/bench/test_gpu.py checks the row against eager through
    the GPU harness)."""
    assert_gpu_runs_repeat_their_bits(load_file(DECODE, LLAMA_DECODE), "WORK=warps:4 "
                                      "TILE=flash:64x64 REDUCE=split:8:last STAGE=async:2")
