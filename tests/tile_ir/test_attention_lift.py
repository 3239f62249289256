"""Attention's three folds are recognized as one flash kernel only when every part matches:
the same scores in each fold, a causal mask or none, a plain load of v."""

import pytest

from emmy.frontend.workload import load_expr, load_file
from emmy.pipeline import compile_to
from emmy.tile_ir.ir import KernelKind


def kernels(w):
    return compile_to(w, "tile")["tile"].program.kernels


@pytest.mark.parametrize("sets, causal", [((), True), ((("is_causal", False),), False),
                                          ((("dtype", "bfloat16"),), True)])
def test_sdpa_in_half_precision_is_one_flash_kernel(sets, causal):
    (k,) = kernels(load_file("examples/attention_half.py", sets))
    assert k.kind is KernelKind.ATTENTION
    a = k.attention
    assert (a.causal, a.dim, a.keys, a.query.extent, a.scale) == (causal, 64, 70, 70, 0.125)
    assert (a.q.buffer, a.k.buffer, a.v.buffer) == ("q", "k", "v")


def test_fp32_attention_is_one_flash_kernel_on_cuda_cores():
    """f32 q, k and v: the f32 flash template (CUDA cores) takes it, so it is one attention
    kernel whose rows are simt tiles. Over a head dimension that template does not take (not a
    multiple of 4), fused, every output element would compute its row's scores again (once per
    head-dim element), so the scores are a product kernel of their own, the softmax reads them
    (a row kernel), and the product with v, which reads each probability 30 times, is another
    product kernel (fused into the softmax's, it would be a dot product per output element)."""
    from emmy.schedule.space import Space
    from emmy.schedule.targets import get_target

    (k,) = kernels(load_file("examples/attention.py", ()))
    assert k.kind is KernelKind.ATTENTION and k.attention.q.dtype.name == "F32"
    space = Space(k, get_target("sm_90a"))
    # (8 blocks: the cost model splits the keys in two, the last block of each query block
    # combining, for 5.7 us against 6.5 us, modeled)
    default = space.default()
    assert (default["WORK"], default["TILE"], default["STAGE"]) == ("warps:4", "simt:64x32",
                                                                     "async:2")
    assert default["REDUCE"] in ("serial", "split:2:last")
    assert {str(r["TILE"]).split(":")[0] for r in space.rows()} == {"simt"}
    ks = kernels(load_file("examples/attention.py", (("head_dim", 30),)))
    assert [k.kind for k in ks] == [KernelKind.CONTRACT, KernelKind.ROW, KernelKind.CONTRACT]


def test_a_hand_written_softmax_attention():
    """softmax(q kᵀ s) v written by hand: in f32, one flash kernel on CUDA cores, as sdpa. In
    f16, eager rounds the scores and the probabilities to f16 between the ops: the flash kernel
    rounds each score as the program does (`rounded`) and rounds P for its P V product, and
    agrees with torch, also where scores overflow f16 (whole rows NaN, as in eager)."""
    from emmy.check import check_cuda_program
    from emmy.dtypes import DType

    expr = ("(lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) * 0.25, -1) @ v)"
            "(torch.randn(2, 32, 16){h}, torch.randn(2, 32, 16){h}, torch.randn(2, 32, 16){h})")
    w = load_expr(expr.format(h=""))
    (k,) = kernels(w)
    assert k.kind is KernelKind.ATTENTION and k.attention.rounded is None
    results = compile_to(w, "cuda")
    report, _ = check_cuda_program(w, results["torch"], results["cuda"])
    assert report is not None and report.ok, report
    for scale in ("", ".mul(100)"):    # x100: some scores overflow f16, 49 rows NaN in eager
        w = load_expr(expr.format(h=f"{scale}.half()"))
        (k,) = kernels(w)
        assert k.kind is KernelKind.ATTENTION and k.attention.rounded is DType.F16
        assert (k.attention.scale, k.attention.causal) == (0.25, False)
        results = compile_to(w, "cuda")
        report, _ = check_cuda_program(w, results["torch"], results["cuda"])
        assert report is not None and report.ok, report


@pytest.mark.parametrize("mask", [
    "torch.ones(32, 32, dtype=torch.bool).tril()",              # keep where j <= i
    "~torch.ones(32, 32, dtype=torch.bool).triu(1)",            # keep where not j > i
])
def test_hand_written_causal_masks_are_causal_attention(mask):
    """A mask built from tril/triu of a constant folds to a comparison of the indices, which
    the recognizer reads as the causal mask, whichever way the comparison is written."""
    w = load_expr(f"(lambda q, k, v: torch.softmax((q @ k.transpose(-1, -2) * 0.25)"
                  f".masked_fill(~({mask}), float('-inf')), -1) @ v)"
                  "(torch.randn(2, 32, 16).half(), torch.randn(2, 32, 16).half(), "
                  "torch.randn(2, 32, 16).half())")
    (k,) = kernels(w)
    assert k.kind is KernelKind.ATTENTION and k.attention.causal


def test_a_mask_that_is_not_causal_keeps_the_generic_space():
    """j < i (the diagonal hidden) and j <= i + 1 are masks, not the causal one: no flash
    kernel takes them, so the scores are stored (a product kernel), a row kernel computes the
    softmax, and the product with v is a product kernel (fused, every output element would
    compute its row's scores again)."""
    for mask in ("torch.ones(32, 32, dtype=torch.bool).tril(-1)",
                 "torch.ones(32, 32, dtype=torch.bool).tril(1)"):
        w = load_expr(f"(lambda q, k, v: torch.softmax((q @ k.transpose(-1, -2) * 0.25)"
                      f".masked_fill(~({mask}), float('-inf')), -1) @ v)"
                      "(torch.randn(2, 32, 16).half(), torch.randn(2, 32, 16).half(), "
                      "torch.randn(2, 32, 16).half())")
        assert [k.kind for k in kernels(w)] == [KernelKind.CONTRACT, KernelKind.ROW,
                                                KernelKind.CONTRACT]


def test_computed_values_are_stored_for_the_flash_kernel():
    """softmax(q kᵀ) (2 v): v * 2 is computed, so it is stored (a kernel of its own) and the
    attention reads it as its v: one flash kernel after it, correct."""
    from emmy.check import check_cuda_program

    w = load_expr("(lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2), -1) @ (v * 2))"
                  "(torch.randn(16, 16).half(), torch.randn(16, 16).half(), "
                  "torch.randn(16, 16).half())")
    scaled, attention = kernels(w)
    assert scaled.kind is KernelKind.MAP and attention.kind is KernelKind.ATTENTION
    assert attention.attention.v.buffer == scaled.outputs[0].name
    results = compile_to(w, "cuda")
    report, _ = check_cuda_program(w, results["torch"], results["cuda"])
    assert report is not None and report.ok


def test_q_k_v_sliced_from_one_packed_tensor_are_read_in_place():
    """k and v start 64 and 128 elements into the packed buffer: the flash templates start
    them there (cp.async, and TMA maps whose tensor starts inside the buffer)."""
    from emmy.check import check_cuda_program
    from emmy.pipeline import Options

    w = load_expr("(lambda x: F.scaled_dot_product_attention(x[..., :64], x[..., 64:128], "
                  "x[..., 128:]))(torch.randn(1, 2, 16, 192).half())")
    (k,) = kernels(w)
    assert k.kind is KernelKind.ATTENTION
    assert [o.offset.const for o in (k.attention.q, k.attention.k, k.attention.v)] == [0, 64, 128]
    for row in ("WORK=warps:4 TILE=flash:64x32 REDUCE=serial STAGE=async:2",
                "WORK=warps:4 TILE=wgmma:64x64 REDUCE=serial STAGE=tma:2"):
        results = compile_to(w, "cuda", Options(rows={k.name: row}))
        report, _ = check_cuda_program(w, results["torch"], results["cuda"])
        assert report is not None and report.ok, row


def test_a_softmax_over_a_transposed_convolution_is_not_attention():
    """softmax(conv_transpose3d(x), dim=1) also has a max fold, a sum fold and a map, but its
    score accumulates in folds nested below the first level: not attention, and it compiles
    and matches eager (the recognizer unpacked a missing accumulation: an internal error)."""
    from emmy.check import check_cuda_program

    w = load_expr("(lambda m: lambda x: torch.softmax(m(x), 1))(nn.ConvTranspose3d(2, 3, 2, "
                  "stride=2))(torch.randn(1, 2, 2, 3, 3))")
    stages = compile_to(w, "cuda")
    assert all(k.kind is not KernelKind.ATTENTION for k in stages["tile"].program.kernels)
    report, failed = check_cuda_program(w, stages["torch"], stages["cuda"])
    assert report is not None and report.ok, failed


GQA = {   # 4 query heads over 2 key/value heads, three ways to write it
    "enable_gqa": "F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)",
    "repeat_interleave": "F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), "
                         "v.repeat_interleave(2, 1), is_causal=True)",
    "expand_reshape": "F.scaled_dot_product_attention(q, k[:, :, None].expand(2, 2, 2, 24, 64)"
                      ".reshape(2, 4, 24, 64), v[:, :, None].expand(2, 2, 2, 24, 64)"
                      ".reshape(2, 4, 24, 64), is_causal=True)",
}


@pytest.mark.parametrize("form", sorted(GQA))
def test_grouped_query_attention_is_one_flash_kernel(form):
    """Query head h reads key/value head h // 2 however the program says so; the flash
    templates address k and v at that head (mma.sync, and wgmma fed by cp.async or TMA)."""
    from emmy.check import check_cuda_program
    from emmy.pipeline import Options

    w = load_expr(f"(lambda q, k, v: {GQA[form]})(torch.randn(2, 4, 24, 64).half(), "
                  "torch.randn(2, 2, 24, 64).half(), torch.randn(2, 2, 24, 64).half())")
    (k,) = kernels(w)
    assert k.kind is KernelKind.ATTENTION
    a = k.attention
    assert (a.q.group, a.k.group, a.v.group, a.causal) == (1, 2, 2, True)
    rows = ["WORK=warps:4 TILE=flash:64x32 REDUCE=serial STAGE=async:2"]
    if form == "enable_gqa":
        rows += ["WORK=warps:4 TILE=wgmma:64x64 REDUCE=serial STAGE=async:2",
                 "WORK=warps:4 TILE=wgmma:64x64 REDUCE=serial STAGE=tma:2"]
    for row in rows:
        results = compile_to(w, "cuda", Options(rows={"": row}))
        assert results["cuda"].units[0].row == row
        report, failed = check_cuda_program(w, results["torch"], results["cuda"])
        assert report is not None and report.ok, (row, report or failed.log[-2000:])


MASKS = {   # (attn_mask expression, the bias's kind, its strides over (batch, head, query, key))
    "added": ("F.scaled_dot_product_attention(q, k, v, attn_mask=b)", "add", (0, 0, 24, 1)),
    "padding": ("F.scaled_dot_product_attention(q, k, v, attn_mask=pad)", "add", (24, 0, 0, 1)),
    "bool": ("F.scaled_dot_product_attention(q, k, v, attn_mask=keep)", "keep",
             (24 * 24, 0, 24, 1)),
    "masked_fill": ("torch.softmax((q @ k.transpose(-2, -1) / 8).masked_fill(~keep, "
                    "float('-inf')), -1) @ v", "keep", (24 * 24, 0, 24, 1)),
    # computed from the input b: stored first (a kernel of its own), then read as an added bias
    "causal_and_added": ("F.scaled_dot_product_attention(q, k, v, attn_mask=b + torch.zeros("
                         "24, 24, dtype=torch.half).masked_fill(~torch.ones(24, 24, dtype="
                         "torch.bool).tril(), float('-inf')))", "add", (0, 0, 24, 1)),
    "computed_padding": ("F.scaled_dot_product_attention(q, k, v, attn_mask=(1.0 - keep[:, :, "
                         ":1].half()) * -10000.0)", "add", (24, 0, 0, 1)),
}


@pytest.mark.parametrize("form", sorted(MASKS))
def test_attention_masks_read_from_tensors(form):
    """attn_mask (added, or bool), masked_fill by a mask tensor: one flash kernel that reads
    the mask element of each score (broadcast axes stride 0), on mma.sync and wgmma rows; a
    mask the program computes from its inputs is stored first (a kernel of its own)."""
    from emmy.check import check_cuda_program
    from emmy.pipeline import Options

    text, kind, strides = MASKS[form]
    w = load_expr(f"(lambda q, k, v, b, pad, keep: {text})(torch.randn(2, 2, 24, 64).half(), "
                  "torch.randn(2, 2, 24, 64).half(), torch.randn(2, 2, 24, 64).half(), "
                  "torch.randn(24, 24).half(), torch.zeros(2, 1, 1, 24).half().masked_fill("
                  "torch.rand(2, 1, 1, 24) < 0.3, float('-inf')), torch.rand(2, 1, 24, 24) < 0.7)")
    *computed, k = kernels(w)
    assert len(computed) == form.startswith(("causal_and", "computed"))
    assert k.kind is KernelKind.ATTENTION and k.attention.bias.kind == kind
    from emmy.schedule.flash import problem_of

    assert problem_of(k.attention).bias.strides == strides
    for row in ("WORK=warps:4 TILE=flash:64x32 REDUCE=serial STAGE=async:2",
                "WORK=warps:4 TILE=wgmma:64x64 REDUCE=serial STAGE=tma:2"):
        results = compile_to(w, "cuda", Options(rows={k.name: row}))
        report, failed = check_cuda_program(w, results["torch"], results["cuda"])
        assert report is not None and report.ok, (row, report or failed.log[-2000:])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_transformer_attention_block_is_product_flash_product(dtype):
    """minGPT's attention block: the q|k|v projection is stored (each score would compute it
    again), the flash kernel reads q, k and v inside that packed buffer (k and v start C and 2C
    elements in) and the mask from the registered buffer, and the output projection reads the
    stored attention. Checked against torch."""
    from emmy.check import check_cuda_program

    w = load_file("examples/attention_block.py", (("dtype", dtype),))
    ks = kernels(w)
    assert [k.kind for k in ks] == [KernelKind.CONTRACT, KernelKind.ATTENTION,
                                    KernelKind.CONTRACT]
    a = ks[1].attention
    assert (a.q.offset.const, a.k.offset.const, a.v.offset.const) == (0, 128, 256)
    assert a.bias.kind == "keep" and a.bias.buffer == "bias"
    results = compile_to(w, "cuda")
    report, failed = check_cuda_program(w, results["torch"], results["cuda"])
    assert report is not None and report.ok, report or failed.log[-2000:]


@pytest.mark.parametrize("h", [".half()", ""])
def test_batch_axes_before_the_heads_are_one_batch_axis(h):
    """q, k, v of shape (2, 3, 4 heads, 32, 16): the two leading axes are one batch axis of 6
    in memory, so a flash kernel takes it (f16 on mma.sync, f32 on CUDA cores) and agrees with
    torch. With those axes swapped in memory (a transposed view) they are not one axis: no
    flash template takes it, so the scores are stored, a row kernel computes the softmax and,
    in f32, a product kernel its product with v (in f16, sdpa's probabilities are f32 and v is
    f16: no template multiplies those, so the softmax's row kernel computes that product)."""
    from emmy.check import check_cuda_program

    sdpa = "torch.nn.functional.scaled_dot_product_attention"
    x = f"torch.randn({{}}, 4, 32, 16){h}"
    cases = {
        "one": (f"(lambda q, k, v: {sdpa}(q, k, v, is_causal=True))"
                f"({x.format('2, 3')}, {x.format('2, 3')}, {x.format('2, 3')})",
                [KernelKind.ATTENTION]),
        "swapped": (f"(lambda q, k, v: {sdpa}(q.transpose(0, 1), k.transpose(0, 1), "
                    f"v.transpose(0, 1)))({x.format('3, 2')}, {x.format('3, 2')}, "
                    f"{x.format('3, 2')})",
                    [KernelKind.CONTRACT, KernelKind.ROW] + [KernelKind.CONTRACT] * (not h)),
    }
    for expr, kinds in cases.values():
        w = load_expr(expr)
        assert [k.kind for k in kernels(w)] == kinds
        results = compile_to(w, "cuda")
        report, _ = check_cuda_program(w, results["torch"], results["cuda"])
        assert report is not None and report.ok, report
    (k,) = kernels(load_expr(cases["one"][0]))
    from emmy.schedule.flash import problem_of

    p = problem_of(k.attention)
    assert (p.batch, p.heads, p.q.strides[:2]) == (6, 4, (4 * 32 * 16, 32 * 16))


def test_q_k_and_v_over_different_head_dimensions():
    """MLA's shape (q . k over one head dimension, v and the output over another: DeepSeek's
    192 and 128, here 48 and 32, causal over a ragged 70): one flash kernel on the mma.sync
    template, which stages and reads v at its own row length; its rows compute what torch does
    (two stages, one, split-KV). The templates that read q, k and v at one head dimension
    (wgmma, and simt for f32, where the kernel stays on the generic path) refuse it."""
    from emmy.check import check_cuda_program
    from emmy.pipeline import Options
    from emmy.schedule.space import Space
    from emmy.schedule.targets import get_target

    expr = ("F.scaled_dot_product_attention(torch.randn(1, 2, 70, 48){h}, torch.randn(1, 2, 70, "
            "48){h}, torch.randn(1, 2, 70, 32){h}, is_causal=True)")
    w = load_expr(expr.format(h=".half()"))
    (k,) = kernels(w)
    assert k.kind is KernelKind.ATTENTION and (k.attention.dim, k.attention.dim_v) == (48, 32)
    for row in ("WORK=warps:4 TILE=flash:64x32 REDUCE=serial STAGE=async:2",
                "WORK=warps:8 TILE=flash:128x64 REDUCE=serial STAGE=smem",
                "WORK=warps:4 TILE=flash:64x32 REDUCE=split:2:combine STAGE=async:2"):
        results = compile_to(w, "cuda", Options(rows={k.name: row}))
        report, failed = check_cuda_program(w, results["torch"], results["cuda"])
        assert report is not None and report.ok, (row, report or failed.log[-2000:])
    rows = Space(k, get_target("sm_90a")).all_rows
    assert rows and all(r["TILE"].startswith("flash:") for r in rows)
    assert all(x.kind is not KernelKind.ATTENTION for x in kernels(load_expr(expr.format(h=""))))


@pytest.mark.parametrize("h", [".half()", ".bfloat16()", ""])
def test_a_mask_that_hides_every_key_of_a_row_gives_zeros_there(h):
    """torch's attention gives 0 for a query row whose every key is masked (softmax itself
    gives 0 / 0 = NaN, as the hand-written form keeps): the flash kernel (`zero_empty`) on
    mma.sync, wgmma, split-KV and CUDA-core rows agrees, the rows fully hidden too."""
    from emmy.check import check_cuda_program
    from emmy.pipeline import Options

    keep = ("(torch.rand(2, 1, 24, 40) < 0.7).logical_and(torch.arange(24).view(24, 1) % 5 "
            "!= 0)")                                  # rows 0, 5, 10, ... see no key
    w = load_expr(f"(lambda q, k, v, keep: F.scaled_dot_product_attention(q, k, v, "
                  f"attn_mask=keep))(torch.randn(2, 2, 24, 64){h}, torch.randn(2, 2, 40, 64){h}, "
                  f"torch.randn(2, 2, 40, 64){h}, {keep})")
    (k,) = kernels(w)
    assert k.kind is KernelKind.ATTENTION and k.attention.zero_empty
    rows = ["WORK=warps:4 TILE=flash:64x32 REDUCE=serial STAGE=async:2",
            "WORK=warps:4 TILE=flash:64x32 REDUCE=split:2:combine STAGE=async:2",
            "WORK=warps:4 TILE=wgmma:64x64 REDUCE=serial STAGE=tma:2"] if h else [None]
    for row in rows:
        results = compile_to(w, "cuda", Options(rows={k.name: row} if row else {}))
        report, failed = check_cuda_program(w, results["torch"], results["cuda"])
        assert report is not None and report.ok, (row, report or failed.log[-2000:])
    written = load_expr(f"(lambda q, k, v, keep: torch.softmax((q @ k.transpose(-2, -1) / 8)"
                        f".masked_fill(~keep, float('-inf')), -1) @ v)(torch.randn(2, 2, 24, 64)"
                        f"{h}, torch.randn(2, 2, 40, 64){h}, torch.randn(2, 2, 40, 64){h}, {keep})")
    (k,) = kernels(written)
    assert k.kind is KernelKind.ATTENTION and not k.attention.zero_empty


class _FinfoMinMask:
    """Hugging Face's eager attention under its padding mask: finfo(dtype).min added to the
    scaled scores of the keys a query must not see, a query row left of the padding seeing
    none (rows 0 and 1 here)."""

    def __init__(self, dtype):
        import torch

        self.dtype = dtype
        self.mask = torch.zeros(1, 1, 24, 40, dtype=dtype)
        self.mask[..., :2, :] = torch.finfo(dtype).min
        self.mask[..., 2:, 30:] = torch.finfo(dtype).min

    def __call__(self, q, k, v, mask):
        import torch

        w = torch.matmul(q, k.transpose(-1, -2)) * 0.125 + mask
        return torch.matmul(torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype), v)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_a_finfo_min_mask_over_a_whole_row_averages_it_as_eager_does(dtype):
    """finfo.min times log2(e) would overflow to -inf in the kernel's log2 domain (a row masked
    everywhere then NaN): the bias is held finite, and where eager adds it in the scores'
    16-bit type, their sum is rounded to it, so that such a row is every score alike and its
    output the average of v, as in eager (mma.sync, wgmma, CUDA-core and split-KV rows)."""
    import torch

    from emmy.check import check_cuda_program
    from emmy.frontend.workload import Workload
    from emmy.pipeline import Options
    from tests.tensor_ir.conftest import Fn

    t = getattr(torch, dtype)
    fn = _FinfoMinMask(t)
    torch.manual_seed(0)
    w = Workload(name="finfo_mask", model=Fn(fn).eval(), source="", origin="<test>",
                 inputs=(torch.randn(1, 2, 24, 64).to(t), torch.randn(1, 2, 40, 64).to(t),
                         torch.randn(1, 2, 40, 64).to(t), fn.mask))
    (k,) = kernels(w)
    assert k.kind is KernelKind.ATTENTION and k.attention.bias.kind == "add"
    assert k.attention.bias.rounded is (dtype != "float32")
    rows = ([None] if dtype == "float32" else
            [None, "WORK=warps:4 TILE=flash:64x32 REDUCE=split:2:combine STAGE=async:2",
             "WORK=warps:4 TILE=wgmma:64x64 REDUCE=serial STAGE=tma:2"])
    for row in rows:
        results = compile_to(w, "cuda", Options(rows={k.name: row} if row else {}))
        report, failed = check_cuda_program(w, results["torch"], results["cuda"])
        assert report is not None and report.ok and report.outputs[0].reference == "eager", \
            (row, report or failed.log[-2000:])


def test_keys_from_windows_unfolded_out_of_an_image_are_read_where_they_are():
    """HaloNet's keys: 2-D windows unfolded from the image, their positions floor divisions and
    remainders of the key index; recognizing the attention renames inside them (it had needed
    extents it did not have, and crashed)."""
    from tests.tensor_ir.emitted import assert_emitted_cuda_matches_eager

    assert_emitted_cuda_matches_eager(
        "(lambda q, kv: (lambda k: (q @ k.transpose(-1, -2)).softmax(-1) @ k)("
        "kv.unfold(2, 4, 4).unfold(3, 4, 4).reshape(1, 8, 4, -1).permute(0, 2, 3, 1)))"
        "(torch.randn(1, 4, 16, 8), torch.randn(1, 8, 8, 8))")
