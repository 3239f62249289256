"""Contractions (matrix products with fused epilogues) are recognized in Tile IR, with the
operand layouts the templates need; fused chains of products cut into two contractions."""

import pytest

from emmy.frontend.workload import load_expr, load_file
from emmy.pipeline import Options, compile_to
from emmy.schedule.gemm import problem_of
from emmy.schedule.space import Space
from emmy.schedule.targets import get_target
from emmy.tile_ir.chain import cut_chain, find_chain
from emmy.tile_ir.ir import KernelKind

SM90 = get_target("sm_90a")
# the one row of a fused chain that cuts it (its WORK and TILE are unused, and say so)
CUT = "WORK=warps:1x1 TILE=simt:32x32x8x16 PLACE=cut"


def tile(expr: str, **sets):
    return compile_to(load_expr(expr), "tile")["tile"].program.kernels


def example(name: str, *rows):
    opts = Options(rows=dict(rows))
    return compile_to(load_file(f"examples/{name}.py", ()), "tile", opts)["tile"]


@pytest.mark.parametrize("expr, shape, a_layout, b_layout, batch", [
    ("torch.matmul(torch.randn(32, 48), torch.randn(48, 16))", (32, 16, 48), (48, 1), (1, 16), 1),
    ("torch.bmm(torch.randn(3, 32, 48), torch.randn(3, 48, 16))", (32, 16, 48), (48, 1), (1, 16), 3),
    # x @ w.t(): the weight is read k-contiguous
    ("nn.Linear(48, 16)(torch.randn(32, 48))", (32, 16, 48), (48, 1), (48, 1), 1),
    # a 3-D input: batch and sequence read on as one row index, so they merge into m
    ("nn.Linear(48, 16, bias=False)(torch.randn(2, 8, 48))", (16, 16, 48), (48, 1), (48, 1), 1),
    # a transposed 3-D input does not: its batches stay batches (the weight's stride 0)
    ("(lambda x, w: x.transpose(1, 2) @ w)(torch.randn(2, 48, 8), torch.randn(48, 16))",
     (8, 16, 48), (1, 8), (1, 16), 2),
    # a 1x1 convolution: height and width merge into n; the batch stays one
    ("nn.Conv2d(4, 8, 1)(torch.randn(2, 4, 5, 5))", (8, 25, 4), (4, 1), (1, 25), 2),
])
def test_products_are_contractions_with_their_layouts(expr, shape, a_layout, b_layout, batch):
    (k,) = tile(expr)
    assert k.kind is KernelKind.CONTRACT
    p = problem_of(k.contract)
    assert (p.m, p.n, p.k, p.batch) == (*shape, batch)
    assert (p.a.stride_outer, p.a.stride_k) == a_layout
    assert (p.b.stride_outer, p.b.stride_k) == b_layout


def test_the_epilogue_is_the_statements_after_the_fold():
    (k,) = example("linear").program.kernels          # relu(x @ w.t() + b)
    assert k.kind is KernelKind.CONTRACT
    assert not k.contract.plain_store          # bias + relu: split:S:atomic is refused
    space = Space(k, SM90)
    row = "WORK=warps:2x2 TILE=simt:32x32x8 REDUCE=split:2:atomic STAGE=smem RASTER=row"
    from emmy.schedule.row import parse
    (refusal,) = space.check(parse(row))
    assert refusal.rule == "reduce.split_range" and "split:S:combine" in refusal.reason


@pytest.mark.parametrize("expr", [
    "torch.matmul(torch.randn(32, 48), torch.randn(48))",             # a matrix-vector product
    "nn.RMSNorm(64)(torch.randn(4, 64))",
])
def test_other_reductions_are_not_contractions(expr):
    assert all(k.kind is not KernelKind.CONTRACT for k in tile(expr))


def test_half_products_offer_tensor_core_tiles_and_refuse_misaligned_copies():
    (k,) = example("matmul_half").program.kernels
    space = Space(k, SM90)
    values = dict(space.decision_points())
    assert all(v.startswith("mma:") for v in values["TILE"])
    assert values["STAGE"] == ["smem"]          # K = 63: rows of 126 bytes, no 16-byte chunks
    from emmy.schedule.row import parse
    bad = parse("WORK=warps:2x2 TILE=mma:64x64x32 REDUCE=serial STAGE=async:2 RASTER=row")
    (refusal,) = space.check(bad)
    assert refusal.rule == "stage.alignment" and "126 bytes" in refusal.reason


def lifted(name: str, *sets):
    """The example's Tile IR kernels before rows are chosen (a default row may cut a chain)."""
    from emmy.tile_ir.lift import lift_program

    return lift_program(compile_to(load_file(f"examples/{name}.py", sets), "loop")["loop"]).kernels


@pytest.mark.parametrize("name", ["chained_matmul", "mlp"])
def test_a_fused_chain_cuts_into_two_contractions(name):
    (k,) = lifted(name)
    assert k.kind is KernelKind.CHAIN and find_chain(k) is not None
    first, second, mid = cut_chain(k, find_chain(k))
    assert first.kind is second.kind is KernelKind.CONTRACT
    assert first.outputs == (mid,) and mid in second.inputs
    cut = CUT
    space = Space(k, SM90)
    assert sum(r["PLACE"] == "cut" for r in space.all_rows) == 1   # one row says "cut"
    from emmy.schedule.row import parse
    assert space.check(parse(cut)) == []
    (refusal,) = space.check(parse(cut.replace("warps:1x1", "warps:2x2")))
    assert refusal.rule == "work.unused_after_cut" and f"{k.name}_cut0" in refusal.reason
    scheduled = example(name, (k.name, cut))
    assert [x.name for x in scheduled.program.kernels] == [f"{k.name}_cut0", f"{k.name}_cut1"]
    assert mid in scheduled.program.intermediates
    assert set(scheduled.rows) == {f"{k.name}_cut0", f"{k.name}_cut1"}


def test_rows_for_the_cut_kernels_are_given_by_name():
    from emmy.errors import UserError

    cut = ("k0_chained_matmul", CUT)
    row = "WORK=warps:1x2 TILE=simt:32x32x16 REDUCE=serial STAGE=smem RASTER=row"
    scheduled = example("chained_matmul", cut, ("k0_chained_matmul_cut1", row))
    assert str(scheduled.rows["k0_chained_matmul_cut1"]) == row
    with pytest.raises(UserError, match="exist when k0_chained_matmul's row has PLACE=cut"):
        example("chained_matmul", ("k0_chained_matmul_cut1", row))


@pytest.mark.parametrize("name, sets, default", [
    ("chained_matmul", (), "fuse"),
    ("mlp_half", (), "fuse"),
    # f32 on CUDA cores, 8 column tiles of 32: the cut's two products spread over more SMs
    ("mlp", (), "cut"),
    # a Llama feed-forward's width: fused, the down projection would compute the 4,096-wide
    # intermediate again for each of its 64 column tiles of 64
    ("mlp_half", (("tokens", 512), ("features", 4096), ("hidden", 4096)), "cut"),
])
def test_a_chain_is_fused_by_default_unless_the_cost_model_says_the_cut_is_faster(
        name, sets, default):
    from emmy.runtime.costmodel.api import estimate_kernel

    (k,) = lifted(name, *sets)
    space = Space(k, SM90)
    row = space.default()
    assert row["PLACE"] == default
    other = next(r for r in space.rows() if r["PLACE"] != default and
                 (default == "fuse" or r["WORK"] == "warps:2x2"))
    assert (estimate_kernel(k, row, SM90, nvrtc=False).seconds
            <= estimate_kernel(k, other, SM90, nvrtc=False).seconds)


def test_a_workload_that_allows_tf32_offers_tf32_tiles_and_a_tf32_tolerance():
    """torch.set_float32_matmul_precision("high") in the file: tf32 tiles become legal, the
    check holds f32 outputs to f16's tolerance; the setting does not leak into the process."""
    import torch

    from emmy.dtypes import DType, tolerance

    before = torch.get_float32_matmul_precision()
    w = load_file("examples/matmul_tf32.py", ())
    assert w.tf32 and torch.get_float32_matmul_precision() == before
    (k,) = compile_to(w, "tile")["tile"].program.kernels
    assert k.contract.allow_tf32
    tiles = dict(Space(k, SM90).decision_points())["TILE"]
    assert any(t.startswith("tf32:") for t in tiles)
    assert not load_file("examples/matmul.py", ()).tf32
    assert tolerance(DType.F32, tf32=True) == tolerance(DType.F16)


def test_a_misaligned_operand_start_refuses_async_copies():
    """A's rows are 144 bytes apart (aligned) but it starts one element into its buffer."""
    (k,) = tile("(lambda a, b: a[:, 1:65] @ b)"
                "(torch.randn(64, 72).half(), torch.randn(64, 64).half())")
    assert k.kind is KernelKind.CONTRACT
    stages = dict(Space(k, SM90).decision_points())["STAGE"]
    assert stages == ["smem"]


def test_the_cut_row_of_a_chain_evaluates_and_is_modeled():
    """The agent's evaluation and the cost model take the fused kernel's cut row: the two
    kernels it becomes are compiled, checked and modeled together."""
    from emmy.evaluate import Evaluator
    from emmy.runtime.costmodel.api import estimate_kernel

    cut = CUT
    ev = Evaluator(load_file("examples/chained_matmul.py", ()), device="cpu")
    result = ev.evaluate("k0_chained_matmul", cut)
    assert result.verdict == "ok", result.reasons
    assert {"k0_chained_matmul_cut0", "k0_chained_matmul_cut1"} <= set(result.resources)
    (k,) = example("chained_matmul").program.kernels
    modeled = estimate_kernel(k, cut, SM90)
    assert modeled.seconds > 0 and len(modeled.launches) == 2


def test_a_chain_its_default_row_cuts_is_still_offered_to_the_agents():
    """mlp's chain is cut by default; the evaluator lists the chain itself before its halves,
    so a row may fuse it again, and a row for a half applies to the default cut."""
    from emmy.evaluate import Evaluator

    ev = Evaluator(load_file("examples/mlp.py", ()), device="cpu")
    infos = ev.kernels()
    assert [k.name for k in infos] == ["k0_mlp", "k0_mlp_cut0", "k0_mlp_cut1"]
    assert infos[0].kind == "chain" and "PLACE=cut" in infos[0].default_row
    fused = ev.evaluate("k0_mlp", "WORK=warps:2x2 TILE=simt:32x32x8x16 PLACE=fuse")
    assert fused.verdict == "ok" and set(fused.resources) == {"k0_mlp"}
    half = ev.evaluate("k0_mlp_cut1",
                       "WORK=warps:2x2 TILE=simt:32x32x8 REDUCE=serial STAGE=smem RASTER=row")
    assert half.verdict == "ok" and set(half.resources) == {"k0_mlp_cut1"}


def test_a_half_precision_chain_cuts_into_two_tensor_core_products():
    """Eager rounds (A@B) to f16 before @C: the intermediate buffer holds f16, and both cut
    kernels are f16 contractions (tensor-core tiles), checked against torch."""
    from emmy.check import check_cuda_program
    from emmy.dtypes import DType

    w = load_expr("(lambda a, b, c: (a @ b) @ c)(torch.randn(32, 64).half(), "
                  "torch.randn(64, 48).half(), torch.randn(48, 16).half())")
    cut = Options(rows={"k0_expr": CUT})
    results = compile_to(w, "cuda", cut)
    first, second = results["tile"].program.kernels
    assert first.kind is second.kind is KernelKind.CONTRACT
    assert first.contract.tensor_core_ok and second.contract.tensor_core_ok
    assert first.outputs[0].type.dtype is DType.F16
    report, _ = check_cuda_program(w, results["torch"], results["cuda"])
    assert report is not None and report.ok


@pytest.mark.parametrize("expr, row", [
    ("(lambda a, b, c: (a @ b) @ c)(torch.randn(33, 70).half(), torch.randn(70, 45).half(), "
     "torch.randn(45, 50).half())", "WORK=warps:2x2 TILE=mma:32x64x16x32 PLACE=fuse"),
    ("(lambda a, b, c: torch.bmm(torch.bmm(a, b), c))(torch.randn(2, 33, 70), "
     "torch.randn(2, 70, 45), torch.randn(2, 45, 50))", "WORK=warps:2x2 TILE=simt:32x32x8x16 PLACE=fuse"),
])
def test_a_fused_chain_runs_back_to_back(expr, row):
    """Ragged sizes, f16 on tensor cores (the intermediate rounded as eager rounds it) and a
    batched f32 chain: one back-to-back kernel, checked against torch on the emulator."""
    from emmy.check import check_cuda_program

    w = load_expr(expr)
    (k,) = tile(expr)
    assert k.kind is KernelKind.CHAIN and k.chain.half == ("half" in expr)
    results = compile_to(w, "cuda", Options(rows={"": row}))
    assert [u.kernel for u in results["cuda"].units] == [k.name]
    report, _ = check_cuda_program(w, results["torch"], results["cuda"])
    assert report is not None and report.ok


@pytest.mark.parametrize("name, sets", [
    ("matmul", ()),
    ("matmul_half", (("K", 64), ("N", 256))),     # its multiply reads b before a
    ("linear_half", ()),
])
def test_the_output_is_contiguous_along_the_templates_columns(name, sets):
    """The contraction's n axis is the output's contiguous one, whichever order the multiply
    reads its operands in (a template stores neighbouring columns together)."""
    from emmy.loop_ir.ir import Store
    from emmy.schedule.facts import offset, stride_along

    (k,) = compile_to(load_file(f"examples/{name}.py", sets), "tile")["tile"].program.kernels
    con = k.contract
    (store,) = [s for s in con.epilogue if isinstance(s, Store)]
    shape = {b.name: b.type.shape for b in k.outputs}[store.buffer]
    assert stride_along(offset(store.index, shape), con.n.var) == 1
    assert stride_along(offset(store.index, shape), con.m.var) != 1


def test_pair_epilogues_need_aligned_even_columns():
    """Two neighbouring output columns become one vector store where every access along the
    columns starts at an even element; an odd row length, or atomic stores, keep one element
    at a time."""
    from dataclasses import replace

    from emmy.kernel_ir.elements import element_pair_lines

    def pair(expr, **kw):
        (k,) = tile(expr)
        con = k.contract
        return element_pair_lines(replace(k, **kw), con.epilogue, con.acc, (con.m, con.n),
                                  con.batch, ("0", "r", "c", "x0", "x1"))

    lines = pair("nn.Linear(48, 16)(torch.randn(32, 48))")     # bias along the columns
    assert lines is not None and sum("em_vstore" in x for x in lines) == 1
    assert sum("em_vload" in x for x in lines) == 1               # the bias, two at a time
    assert pair("torch.matmul(torch.randn(32, 48), torch.randn(48, 15))") is None   # odd rows
    assert pair("torch.matmul(torch.randn(32, 48), torch.randn(48, 16))", atomic=True) is None


def test_a_cut_chain_keeps_what_its_inner_fold_reads_from_the_outer_body():
    """fc(mean(relu(x * g[c] + b[c]))): the per-channel g[c] and b[c] are loaded in the outer
    fold's body (over c), before the inner fold (over the spatial axis) that reads them. Cut,
    the producer kernel must load them too; every sampled cut row matches eager."""
    from emmy.frontend.workload import load_expr
    from emmy.verify import verify_rows

    w = load_expr("(lambda g, b, fc: lambda x: fc(torch.relu(x * g[:, None] + b[:, None])"
                  ".mean(-1)))(torch.rand(6) + 0.5, torch.randn(6), nn.Linear(6, 5))"
                  "(torch.randn(3, 6, 10))")
    from emmy.tile_ir.lift import lift_program

    (k,) = lift_program(compile_to(w, "loop")["loop"]).kernels     # before its default cut
    chain = find_chain(k)
    assert chain is not None
    first, second, mid = cut_chain(k, chain)
    loads = {s.buffer for s in _walk(first.body) if hasattr(s, "buffer")}
    assert len(loads) >= 3                        # x, g and b: the producer loads all three
    results = verify_rows(w, per_kernel=2, seed=5, targets=("sm_90a",))
    assert any("_cut" in r.kernel for r in results)
    assert all(r.verdict == "ok" for r in results), [r for r in results if r.verdict != "ok"]


def _walk(items):
    for i in items:
        yield i
        yield from _walk(getattr(i, "body", ()))


def test_chains_no_template_tiles_are_cut_by_default_and_again_when_nested():
    """fc2(relu(fc1(flatten(pool(conv(x)))))): the convolution is stored (a pool reduces it),
    then fused, every fc1 output would recompute the pool (the Loop IR's note counts how
    often); the default row cuts the chain, and the cut's own producer, itself a chain, is cut
    again. The result matches eager; the fused form stays a legal row."""
    from emmy.schedule.rules import CHAIN_CUT_ROW
    from tests.tensor_ir.emitted import assert_emitted_cuda_matches_eager

    expr = ("(lambda c, f1, f2: lambda x: f2(torch.relu(f1(nn.functional.max_pool2d("
            "torch.relu(c(x)), 2).flatten(1)))))(nn.Conv2d(2, 3, 3), nn.Linear(27, 6), "
            "nn.Linear(6, 4))(torch.randn(2, 2, 8, 8))")
    stages = assert_emitted_cuda_matches_eager(expr)
    names = [k.name for k in stages["tile"].program.kernels]
    assert any(n.endswith("_cut0_cut0") for n in names) and len(names) == 4, names
    assert stages["tile"].program.kernels[0].kind is KernelKind.CONTRACT
    w = load_expr(expr)
    cut_row = " ".join(f"{k}={v}" for k, v in CHAIN_CUT_ROW.items())
    conv, chain = compile_to(w, "loop")["loop"].kernels
    fused = compile_to(w, "cuda", Options(rows={chain.name: cut_row.replace(
        "thread:32 TILE=v1x1 REDUCE=serial", "warp:4 TILE=v1x1 REDUCE=shuffle") + " PLACE=fuse"}))
    assert len(fused["cuda"].units) == 2


@pytest.mark.parametrize("expr, row", [
    # m = 3 x 5 merged rows (ragged), cp.async copies of the merged A
    ("nn.Linear(64, 32).half()(torch.randn(3, 5, 64).half())",
     "WORK=warps:1x2 TILE=mma:32x32x32 REDUCE=serial STAGE=async:2 RASTER=row"),
    # n = 5 x 5 merged columns: the epilogue stores one element at a time
    ("nn.Conv2d(24, 8, 1)(torch.randn(2, 24, 5, 5))",
     "WORK=warps:1x1 TILE=simt:32x32x8 REDUCE=split:2:combine STAGE=smem RASTER=row"),
])
def test_merged_rows_and_columns_match_eager(expr, row):
    from emmy.check import check_cuda_program

    (k,) = tile(expr)
    assert k.contract.a.parts or k.contract.b.parts
    w = load_expr(expr)
    results = compile_to(w, "cuda", Options(rows={"": row}))
    report, failed = check_cuda_program(w, results["torch"], results["cuda"])
    assert report is not None, failed.log[-2000:]
    assert report.ok, report.outputs


def test_a_cut_chain_carries_the_job_statements_its_producer_reads():
    """A depthwise convolution feeding a 1x1 one is a chain no template tiles, so it is cut;
    the depthwise half reads the output position (an index value computed once per job,
    before the outer fold) in its padding test, so that statement goes with it."""
    from tests.tensor_ir.emitted import assert_emitted_cuda_matches_eager

    stages = assert_emitted_cuda_matches_eager(
        "nn.Sequential(nn.Conv2d(4, 4, 3, padding=1, groups=4), nn.Conv2d(4, 8, 1))"
        "(torch.randn(2, 4, 6, 6))")
    assert [u.kernel.endswith(("_cut0", "_cut1")) for u in stages["cuda"].units] == [True, True]


@pytest.mark.parametrize("expr", [
    # an int8 weight dequantized in f16: the product on tensor cores (mma.sync, wgmma rows)
    "torch.randn(40, 64).half() @ (torch.randint(-127, 128, (64, 48)).to(torch.int8).half()"
    " * torch.rand(48).half())",
    # a convolution of an activation: the activation stored, the window read by the template
    "nn.Conv2d(8, 16, 3, padding=1)(torch.relu(torch.randn(2, 8, 10, 10)))",
])
def test_a_product_of_an_element_wise_operand_is_a_contraction_on_sampled_rows(expr):
    from tests.tensor_ir.emitted import assert_sampled_rows_match_eager

    kinds = [k.kind for k in compile_to(load_expr(expr), "tile")["tile"].program.kernels]
    assert kinds[-1] is KernelKind.CONTRACT and KernelKind.ROW not in kinds
    assert_sampled_rows_match_eager(expr, per_kernel=2, seed=9)


@pytest.mark.parametrize("expr", [
    "torch.randn(40, 64).half() @ torch.randn(64, 48).half() > 0",
    "(torch.randn(40, 64) @ torch.randn(64, 48)).round().clamp(-128, 127).to(torch.int8)",
])
def test_a_product_whose_epilogue_stores_bytes_or_bools(expr):
    """A tensor-core thread stores two neighbouring columns as one vector: two bytes, which
    the explicit st.global path (4, 8 or 16 bytes) did not take; NVRTC refused the kernel."""
    from tests.tensor_ir.emitted import assert_sampled_rows_match_eager

    assert_sampled_rows_match_eager(expr, per_kernel=2, seed=10)


@pytest.mark.parametrize("dtype", ["bfloat16", "half"])
def test_a_16_bit_activation_two_kernels_read_is_stored_once_in_its_type(dtype):
    """a = conv1x1(x); conv3x3(a) + a in 16 bits: `a` is stored as it is (not its f32 copy for
    the next convolution), so the 3x3 convolution is a 16-bit contraction and the residual add
    reads `a` instead of computing the 1x1 convolution again."""
    from tests.tensor_ir.emitted import assert_emitted_cuda_matches_eager

    expr = (f"(lambda x, p, c: (lambda a: F.conv2d(a, c, padding=1) + a)(F.conv2d(x, p)))"
            f"(torch.randn(1, 32, 8, 8).{dtype}(), torch.randn(32, 32, 1, 1).{dtype}() * 0.2, "
            f"torch.randn(32, 32, 3, 3).{dtype}() * 0.05)")
    kernels = tile(expr)
    assert [k.kind for k in kernels] == [KernelKind.CONTRACT, KernelKind.CONTRACT]
    stored = kernels[0].outputs[0].type.dtype
    assert str(stored) == {"bfloat16": "bf16", "half": "f16"}[dtype]
    assert len(kernels[1].inputs) == 2 and kernels[0].outputs[0].name in \
        {b.name for b in kernels[1].inputs}          # `a` and the 3x3 weight, not x
    assert_emitted_cuda_matches_eager(expr)


def test_a_gather_reads_the_widened_product_it_gathers_from():
    """The gather's source (a bf16 product widened to f32) is stored as the gather reads it:
    storing the bf16 product instead, as for a window, left a gather of a computed cast that no
    kernel could inline (an internal error on DeiT's position embeddings in bf16)."""
    from tests.tensor_ir.emitted import assert_emitted_cuda_matches_eager

    assert_emitted_cuda_matches_eager(
        "(torch.randn(8, 16).bfloat16() @ torch.randn(16, 32).bfloat16()).float()"
        "[torch.randint(0, 8, (5,))] * 2")
