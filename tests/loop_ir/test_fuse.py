"""The fusion decisions: what is stored, why, and which outputs share a kernel."""

import pytest
import torch
import torch.nn.functional as F

from emmy.dtypes import DType
from emmy.loop_ir.dataflow import walk
from emmy.loop_ir.fuse import plan_fusion
from emmy.loop_ir.ir import Load, Loop, LoopKind, Store
from emmy.tensor_ir.builder import Builder
from emmy.tensor_ir.ir import EwOp, ReduceOp, TensorType

from .programs import Fn, check, check_torch, random_feeds


def loads(k):
    return [s.buffer for s in walk(k.body) if isinstance(s, Load)]


def test_a_scan_read_by_a_reduction_is_materialized_and_the_note_says_why():
    lp = check_torch(lambda x: torch.cumsum(x, 1).sum(1), torch.randn(4, 16))
    assert [k.name for k in lp.kernels] == ["k0_cumsum", "k1_sum"]
    (tmp,) = lp.intermediates
    assert loads(lp.kernels[1]) == [tmp.name]
    (note,) = lp.notes
    assert note.startswith("scan `") and f"materialized as `{tmp.name}`" in note
    assert "reads it from memory" not in note and "read it from memory" in note


def test_a_scan_with_an_elementwise_epilogue_runs_in_the_outputs_kernel():
    lp = check_torch(lambda x: torch.cumsum(x, 1) * 2 + x, torch.randn(4, 16))
    (k,) = lp.kernels
    assert lp.intermediates == ()
    assert [l.kind for l in walk(k.body) if isinstance(l, Loop)] == [LoopKind.PARALLEL,
                                                                      LoopKind.SCAN]
    assert "never stored" in lp.notes[0]


def test_reverse_scans_and_two_scans_along_different_axes():
    x = torch.randn(4, 16)
    lp = check_torch(lambda x: torch.flip(torch.cumsum(torch.flip(x, [1]), 1), [1]), x)
    (scan,) = [l for l in walk(lp.kernels[0].body) if isinstance(l, Loop) and l.kind is LoopKind.SCAN]
    assert scan.reverse
    lp = check_torch(lambda x: torch.cumsum(x, 1) * torch.cumsum(x, 0), x)
    assert len(lp.kernels) == 2 and len(lp.intermediates) == 1
    assert any("already runs scan" in n for n in lp.notes)


def test_exclusive_scans_store_before_they_fold():
    for op in (ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MAX, ReduceOp.MIN):
        for reverse in (False, True):
            b2 = Builder("excl")
            x = b2.input("x", TensorType((3, 7), DType.F32))
            y = b2.ew(EwOp.ADD, b2.scan(op, x, 1, reverse=reverse, exclusive=True), 1.0)
            p = b2.finish([y])
            lp = check(p, random_feeds(p))
            (scan,) = [l for l in walk(lp.kernels[0].body) if isinstance(l, Loop)
                       and l.kind is LoopKind.SCAN]
            kinds = [type(s).__name__ for s in scan.body]
            assert kinds.index("Store") < kinds.index("Accum")


def test_a_scan_that_is_an_output_is_stored_and_its_consumers_load_it():
    lp = check_torch(lambda x: (torch.cumsum(x, 1), torch.cumsum(x, 1) * 2), torch.randn(4, 16))
    assert len(lp.kernels) == 2
    assert loads(lp.kernels[1]) == [lp.outputs[0].name]


def test_outputs_of_one_shape_share_a_kernel_and_its_loads():
    lp = check_torch(lambda x: (x + 1, x * 2), torch.randn(4, 16))
    (k,) = lp.kernels
    assert len(k.outputs) == 2 and len(loads(k)) == 1
    lp = check_torch(lambda x: (x.exp(), x.exp() + 1), torch.randn(4, 16))
    (k,) = lp.kernels
    assert len(k.outputs) == 2


def test_an_output_read_at_other_positions_is_loaded_by_a_later_kernel():
    lp = check_torch(lambda x: (x.exp(), x.exp().T + 1), torch.randn(5, 5))
    assert len(lp.kernels) == 2
    assert loads(lp.kernels[1]) == [lp.outputs[0].name]


def test_outputs_of_different_shapes_or_with_nothing_in_common_get_their_own_kernels():
    lp = check_torch(lambda x: (torch.softmax(x, -1), x.sum(-1)), torch.randn(4, 16))
    assert len(lp.kernels) == 2 and lp.intermediates == ()
    lp = check_torch(lambda x, y: (x.exp(), y.exp()), torch.randn(4, 16), torch.randn(4, 16))
    assert len(lp.kernels) == 2


def test_an_input_returned_as_is_is_copied_by_the_kernel_of_its_shape():
    """The caller gets a tensor of its own (an output aliasing an input had been left to the
    runtimes, which poisoned it as an output); the copy joins x + 1's kernel."""
    lp = check_torch(lambda x: (x, x + 1), torch.randn(4, 16))
    assert len(lp.kernels) == 1
    assert lp.outputs[0].name != lp.inputs[0].name
    assert len(lp.kernels[0].outputs) == 2


def test_kernels_follow_what_they_load():
    b = Builder("order")
    x = b.input("x", TensorType((4, 6), DType.F32))
    c = b.scan(ReduceOp.SUM, x, 1)
    y = b.reduce(ReduceOp.MAX, c, [1])        # reads the scan: the scan is stored first
    z = b.ew(EwOp.EXP, x)
    p = b.finish([z, y])
    plan = plan_fusion(p)
    stored = [k.roots for k in plan.kernels]
    assert stored.index((p.defs[1].name,)) < stored.index((p.outputs[1],))
    check(p, random_feeds(p))


def test_grouped_kernels_never_wait_on_each_other():
    """Two branches, each a product, a rotation and a product, gathered and normalized, then
    combined: grouping outputs by shape could put one branch's first product with the other's
    second, two kernels each reading the other (found by bench/fuzz.py, seed 1702)."""
    def rotate(t):
        return t * 0.5 + torch.cat((-t[..., 8:], t[..., :8]), -1) * 0.25

    def branch(x, w, v, idx):
        return F.log_softmax(rotate(rotate(x @ w) @ v)[idx], 1)

    def fn(x1, w1, v1, i1, x2, w2, v2, i2):
        return branch(x1, w1, v1, i1) - branch(x2, w2, v2, i2).mean(-1, keepdim=True)

    def one():
        return (torch.randn(17, 1), torch.randn(1, 16), torch.randn(16, 16),
                torch.randint(-17, 17, (32,)))

    lp = check_torch(fn, *one(), *one())
    done: set[str] = set()
    for k in lp.kernels:          # each kernel after every kernel whose stores it loads
        stored_here = {s.buffer for s in walk(k.body) if isinstance(s, Store)}
        assert all(b in done or b in stored_here for b in loads(k)
                   if b in {t.name for t in lp.intermediates}), k.name
        done |= stored_here


def test_stores_write_each_output_once_per_element():
    lp = check_torch(lambda x: (torch.softmax(x, -1), x + 1), torch.randn(4, 16))
    for k in lp.kernels:
        stores = [s for s in walk(k.body) if isinstance(s, Store)]
        assert sorted(s.buffer for s in stores) == sorted(b.name for b in k.outputs)


def test_a_convolution_read_by_a_window_is_stored_once_not_recomputed_per_read():
    """conv -> relu -> conv and conv -> overlapping max pool: the second window would recompute
    the first convolution at every window position; the first one's output (with its relu) is
    stored."""
    import torch.nn as nn
    import torch.nn.functional as F

    conv1, conv2 = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 5, 3)
    lp = check_torch(lambda x: conv2(torch.relu(conv1(x))), torch.randn(2, 3, 8, 8))
    assert len(lp.kernels) == 2 and len(lp.intermediates) == 1
    assert lp.intermediates[0].type.shape == (2, 4, 8, 8)
    (note,) = lp.notes
    assert "sliding window" in note and "reads of its 512 elements" in note
    overlapping = check_torch(lambda x: F.max_pool2d(conv1(x), 3, 2, 1), torch.randn(2, 3, 8, 8))
    assert len(overlapping.kernels) == 2
    # 2x2 windows at stride 2 read each element once: nothing would be recomputed, but the
    # pool is a reduction over a product, which is stored for its own template
    tiled = check_torch(lambda x: F.max_pool2d(conv1(x), 2), torch.randn(2, 3, 8, 8))
    assert len(tiled.kernels) == 2 and "matrix-product kernel of its own" in tiled.notes[0]


def test_a_norm_over_a_product_stores_the_product():
    """group norm over a linear layer, instance norm over a convolution: inlined, every output
    element would recompute its group's products for the mean and again for the variance.
    The product is stored (then a contraction) and the norm's kernel reads it."""
    import torch.nn as nn
    import torch.nn.functional as F

    lin, conv = nn.Linear(12, 8), nn.Conv2d(3, 4, 3, padding=1)
    for fn, x in ((lambda x: F.group_norm(lin(x), 2), torch.randn(6, 12)),
                  (lambda x: F.instance_norm(conv(x)) / 2, torch.randn(2, 3, 6, 6))):
        lp = check_torch(fn, x)
        assert len(lp.kernels) == 2 and len(lp.intermediates) == 1
        (note,) = lp.notes
        assert "reads this product" in note
        # what is stored is the layer's output, bias added (the product's epilogue adds it):
        # the norm's kernel reads nothing else
        assert len(set(loads(lp.kernels[0]))) == 3
        assert set(loads(lp.kernels[1])) == {lp.intermediates[0].name}


def test_a_softmax_over_a_product_that_feeds_a_product_stays_fused():
    """Attention written out (softmax(q @ k^T) @ v): the flash templates' pattern, one kernel,
    over a head dimension the template takes: in f16/bf16 a multiple of 16 (mma.sync), in f32 a
    multiple of 4. Over another (f16 at 4, f32 at 6), or when the softmax feeds no second
    product (a classifier's probabilities), the product is stored like a norm's."""
    q, k, v = torch.randn(6, 16), torch.randn(5, 16), torch.randn(5, 16)
    attention = lambda q, k, v: torch.softmax(q @ k.t(), -1) @ v     # noqa: E731
    lp = check_torch(attention, q.half(), k.half(), v.half())
    assert len(lp.kernels) == 1 and not lp.intermediates
    assert len(check_torch(attention, q, k, v).kernels) == 1
    q4, k4, v4 = q[:, :4].contiguous(), k[:, :4].contiguous(), v[:, :4].contiguous()
    assert len(check_torch(attention, q4, k4, v4).kernels) == 1
    assert len(check_torch(attention, q4.half(), k4.half(), v4.half()).kernels) == 2
    q6, k6, v6 = q[:, :6].contiguous(), k[:, :6].contiguous(), v[:, :6].contiguous()
    assert len(check_torch(attention, q6, k6, v6).kernels) == 2
    w = torch.randn(16, 7).half()
    assert len(check_torch(lambda x, w: torch.softmax(x @ w, -1), q.half(), w).kernels) == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_softmax_product_no_flash_template_takes_stores_its_scores(dtype):
    """softmax(x @ W) @ E with W stored (in, out): the pattern of attention, but its key operand
    is not read along a contiguous head dimension, so no flash template takes the fused kernel
    (Tile IR's recognizer says so) and the scores are stored: fused, every output element would
    compute its row's scores again."""
    x, w, e = torch.randn(16, 8), torch.randn(8, 12), torch.randn(12, 4)
    lp = check_torch(lambda x, w, e: torch.softmax(x @ w, -1) @ e,
                     x.to(dtype), w.to(dtype), e.to(dtype))
    assert len(lp.kernels) == 2 and len(lp.intermediates) == 1
    assert any("no flash template takes" in note for note in lp.notes), lp.notes


def test_broadcast_reads_of_a_reduction_stay_fused():
    """A product of a reduction's result (attention's scores, a chain's first product) reads it
    along axes its index does not name, which the templates tile: no window, one kernel."""
    a, b, c = torch.randn(8, 16), torch.randn(16, 12), torch.randn(12, 10)
    assert len(check_torch(lambda x, y, z: (x @ y) @ z, a, b, c).kernels) == 1
    q = torch.randn(1, 2, 8, 16).half()
    lp = check_torch(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v),
                     q, q.clone(), q.clone())
    assert len(lp.kernels) == 1 and not lp.intermediates


def test_the_note_names_a_window_only_when_positions_overlap():
    """A convolution's window (o + k: neighbouring outputs share inputs) is a sliding window;
    a reshape broadcast over a new axis (h*4 + d, distinct positions) is an index map."""
    from emmy.loop_ir.fuse import _overlapping
    from emmy.symbolic import var
    from emmy.tensor_ir.ir import IndexMap

    t = TensorType((3, 5, 4), DType.F32)
    window = IndexMap("w", t, "x", (var("a0"), var("a1") + var("a2")))
    heads = IndexMap("h", t, "x", (var("a0"), var("a1") * 4 + var("a2")))
    assert _overlapping(window) and not _overlapping(heads)


def test_the_stored_products_note_is_the_same_in_every_process():
    """The note names the first reduction (in program order) reading the product, not
    whichever a set happened to list first under this process's string hashing."""
    import os
    import subprocess
    import sys

    expr = ("(lambda m: lambda x: nn.functional.group_norm(m(x), 2))(nn.Linear(12, 8))"
            "(torch.randn(6, 12))")

    runs = [subprocess.Popen([sys.executable, "-m", "emmy", "compile", "-c", expr, "--ir",
                              "loop"], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONHASHSEED": seed}) for seed in ("1", "2")]
    first, second = ["\n".join(line for line in run.communicate()[0].splitlines()
                               if line.startswith("# note")) for run in runs]
    assert all(run.returncode == 0 for run in runs)
    assert "reads this product" in first and second == first


# ---- products whose operands or outputs a fused kernel could not tile ----------------------

def kinds(lp):
    from emmy.tile_ir.lift import lift_program

    return [k.kind.value for k in lift_program(lp).kernels]


def test_a_norm_before_a_projection_is_stored_and_the_projection_is_a_product_kernel():
    """Pre-norm transformers: inlined, the projection's kernel would compute the RMS statistic
    and then every dot product one by one (a row kernel re-reading the weight for each row)."""
    x, w, g = torch.randn(8, 64), torch.randn(48, 64), torch.randn(64)
    lp = check_torch(lambda x, w, g: F.linear(F.rms_norm(x, (64,), g), w), x, w, g)
    assert kinds(lp) == ["row", "contract"] and len(lp.intermediates) == 1
    assert any("computed from a reduction" in n and "matrix-product kernel" in n
               for n in lp.notes), lp.notes
    lp = check_torch(lambda x, w: F.layer_norm(x, (64,)) @ w.T, x, w)
    assert kinds(lp) == ["row", "contract"]
    lp = check_torch(lambda x, w: torch.softmax(x, -1) @ w.T, x, w)
    assert kinds(lp) == ["row", "contract"]


def test_a_few_products_of_a_normalized_row_stay_in_its_kernel():
    """A matrix-vector product after a norm (each normalized element feeds fewer than
    MIN_OPERAND_REUSE products): one pass over each row is best, nothing is stored."""
    from emmy.loop_ir.fuse import MIN_OPERAND_REUSE

    x, w = torch.randn(8, 64), torch.randn(MIN_OPERAND_REUSE - 1, 64)
    lp = check_torch(lambda x, w: F.linear(F.rms_norm(x, (64,)), w), x, w)
    assert kinds(lp) == ["row"] and lp.intermediates == ()


def test_an_operand_computed_element_wise_is_stored_and_the_product_is_a_product_kernel():
    """An activation before a linear layer, a scaled weight: inlined, the product's kernel
    would be a row kernel computing each output element's dot product alone, the operand
    again for every one (2048 x 4096 x 4096 after a gelu, f16: 35 ms modeled; stored, a map
    and an mma.sync product, 0.14 ms)."""
    x, w = torch.randn(32, 64), torch.randn(48, 64)
    lp = check_torch(lambda x, w: F.linear(F.gelu(x), w), x, w)
    assert kinds(lp) == ["map", "contract"] and len(lp.intermediates) == 1
    assert any("computed element by element from the program's inputs" in n for n in lp.notes)
    lp = check_torch(lambda x, w: x @ (w.T * 2), x, w)
    assert kinds(lp) == ["map", "contract"]


@pytest.mark.parametrize("weight", [
    lambda q, s, z: q.half() * s.half(),                    # per-row scale
    lambda q, s, z: (q.half() - z.half()) * s.half(),       # and a zero point
    lambda q, s, z: q.to(torch.bfloat16) * s.to(torch.bfloat16),
])
def test_a_dequantized_int8_weight_stays_in_the_product(weight):
    """Stored, the f16 weight costs a kernel reading the int8 weight and writing twice its
    bytes, which the product then reads; fused, the product's template computes each element
    as it copies the weight's tiles, reading one byte an element (emmy.tile_ir.contract's
    computed operands; PLACE=cut stores it after all)."""
    x = torch.randn(32, 64)
    q = torch.randint(-127, 128, (48, 64), dtype=torch.int8)
    s, z = torch.rand(48, 1), torch.randint(-3, 4, (48, 1)).float()
    dtype = weight(q, s, z).dtype
    lp = check_torch(lambda x, q, s, z: F.linear(x.to(dtype), weight(q, s, z)), x, q, s, z)
    assert kinds(lp)[-1] == "contract" and "map" not in kinds(lp)[1:]
    from emmy.tile_ir.lift import lift_program

    kernel = lift_program(lp).kernels[-1]
    (side,) = [op for op in (kernel.contract.a, kernel.contract.b) if op.computed]
    assert side.dtype is (DType.F16 if dtype is torch.float16 else DType.BF16)
    assert [b.type.dtype for b in kernel.inputs if b.name == side.buffer] == [DType.I8]


def test_an_element_wise_operand_of_few_products_stays_fused():
    """A matrix-vector product reads each operand element once (one pass is best)."""
    from emmy.loop_ir.fuse import MIN_OPERAND_REUSE

    x, w = torch.randn(8, 64), torch.randn(MIN_OPERAND_REUSE - 1, 64)
    lp = check_torch(lambda x, w: F.linear(torch.relu(x), w), x, w)
    assert kinds(lp) == ["row"] and lp.intermediates == ()


def test_a_convolution_of_an_activation_stores_the_activation_not_its_window():
    """The implicit-GEMM template reads the window over the stored activation (the window
    itself, C*KH*KW times larger, stays an index expression); the padding's mask is computed
    from positions alone and is not stored."""
    img, k = torch.randn(2, 8, 10, 10), torch.randn(16, 8, 3, 3)
    lp = check_torch(lambda x, k: F.conv2d(torch.relu(x), k, padding=1), img, k)
    assert kinds(lp) == ["map", "contract"]
    assert [b.type.shape for b in lp.intermediates] == [(2, 8, 10, 10)]


def rotate(x):
    half = x.shape[-1] // 2
    return x * 0.5 + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * 0.25


def test_a_product_read_at_other_columns_is_stored():
    """A rotary embedding reads a projection at its own column and the rotated one: fused, each
    dot product would run at every column that reads it."""
    x, w = torch.randn(2, 8, 32), torch.randn(32, 32)
    lp = check_torch(lambda x, w: rotate(x @ w.T), x, w)
    assert kinds(lp) == ["contract", "map"]
    assert any("different indices" in n for n in lp.notes), lp.notes


def test_products_combined_element_wise_are_a_kernel_each():
    """SwiGLU's silu(x W1) * (x W3): the first product is stored, the second's epilogue reads
    it; two products of one input returned side by side do not share a kernel either."""
    x, w1, w3 = torch.randn(16, 32), torch.randn(48, 32), torch.randn(48, 32)
    lp = check_torch(lambda x, a, b: F.silu(x @ a.T) * (x @ b.T), x, w1, w3)
    assert kinds(lp) == ["contract", "contract"]
    assert any("also computes this product" in n for n in lp.notes), lp.notes
    lp = check_torch(lambda x, a, b: (x @ a.T, x @ b.T), x, w1, w3)
    assert kinds(lp) == ["contract", "contract"]


def test_a_16_bit_product_is_stored_in_16_bits():
    """silu widens the f16 product to f32 for its arithmetic: the stored tensor is the f16
    product, not its widened copy (the same values in half the bytes)."""
    x, w1, w3 = (torch.randn(16, 32).half(), torch.randn(48, 32).half(),
                 torch.randn(48, 32).half())
    lp = check_torch(lambda x, a, b: F.silu(x @ a.T) * (x @ b.T), x, w1, w3)
    (tmp,) = lp.intermediates
    assert tmp.type.dtype is DType.F16


def test_a_softmax_that_only_looks_like_attention_is_stored_before_its_product():
    """A product, a layer norm, a softmax and a product: the fusion planner first takes it for
    attention (scores, softmax, P V) and keeps the softmax fused; once no flash template takes
    the kernel and the scores are stored, the softmax is an operand like any other, stored
    before its product."""
    x, w, v = torch.randn(16, 32), torch.randn(32, 32), torch.randn(48, 32)
    lp = check_torch(lambda x, w, v: torch.softmax(F.layer_norm(x @ w.T, (32,)), -1) @ v.T,
                     x, w, v)
    assert kinds(lp)[0] == "contract" and kinds(lp)[-1] == "contract"
    assert "row" in kinds(lp) and len(kinds(lp)) == 3


def test_a_reduction_read_inside_a_loop_it_does_not_depend_on_is_stored():
    """Each element's count of smaller ones (a rank), read by every output of a second
    reduction over the elements: inlined, the n-long count would run n times per value; stored,
    it runs once. A reduction a product reads (a pool before a linear layer) stays fused: Tile
    IR's PLACE=cut stores it where a matrix-product template takes the product."""
    def ranked(x):
        rank = (x.unsqueeze(-2) < x.unsqueeze(-1)).sum(-1)           # [r, i]
        return torch.where(rank.unsqueeze(-2) == torch.arange(9).unsqueeze(-1),
                           x.unsqueeze(-2), 0).sum(-1)               # [r, position]

    lp = check_torch(ranked, torch.randn(3, 9))
    assert len(lp.kernels) == 2 and len(lp.intermediates) == 1
    assert any("would run 9 times per value" in n for n in lp.notes), lp.notes
    assert not any("recomputed" in n for n in lp.notes)
    lin = torch.nn.Linear(8, 10)
    pooled = check_torch(lambda x: lin(x.mean((2, 3))), torch.randn(2, 8, 4, 4))
    assert len(pooled.kernels) == 1
    assert any("recomputed up to 10x" in n for n in pooled.notes), pooled.notes


def test_a_softmax_compared_with_its_maximum_is_stored():
    """HF's MoE load-balancing loss: top-k of a softmax, whose experts are counted by one_hot.
    torch decomposes topk as maxima and equality tests; recomputed in each kernel, a softmax
    whose sum another kernel takes in another order can miss its own maximum by a bit (no
    expert then selected: the counts come out short), so the probabilities are stored and
    every kernel compares the same bits; emulated with the default rows, counts exact."""
    from tests.tensor_ir.emitted import assert_emitted_cuda_matches_eager

    def route(logits, m):
        p = F.softmax(logits, dim=-1)
        counts = F.one_hot(torch.topk(p, 2, dim=-1)[1], 7).float() * m[:, None, None]
        return counts.sum(0), (p * m[:, None]).sum(0)

    torch.manual_seed(0)
    lp = check_torch(route, torch.randn(99, 7), (torch.rand(99) > 0.3).float())
    assert any("compared with its maximum" in n for n in lp.notes), lp.notes
    assert_emitted_cuda_matches_eager(
        "(lambda l, m: F.one_hot(torch.topk(F.softmax(l, -1), 2, dim=-1)[1], 7).float()"
        ".mul(m[:, None, None]).sum(0))(torch.randn(99, 7), (torch.rand(99) > 0.3).float())")


def test_a_maximum_of_values_computed_element_wise_is_compared_in_place():
    """x == x.amax(...) over values no reduction computes: nothing stored for it."""
    lp = check_torch(lambda x: (x.sigmoid() == x.sigmoid().amax(-1, keepdim=True)).float(),
                     torch.randn(5, 9))
    assert not any("compared with its" in n for n in lp.notes)


def test_a_trunk_two_kernels_read_is_stored_once_and_added_products_are_apart():
    """N-BEATS's doubly residual blocks: each block's MLP trunk feeds its backcast (x - ...) and
    its forecast (f + ...). The trunk's products are stored once, not computed by both
    kernels, and the forecast of the first block, added to the second's, is stored before the
    sum (a sum of two products is no one's epilogue): no kernel is left recomputing a chain of
    products inside another's loops."""
    import torch.nn as nn

    torch.manual_seed(0)
    blocks = [(nn.Linear(12, 16), nn.Linear(16, 16), nn.Linear(16, 12), nn.Linear(16, 5))
              for _ in range(2)]

    def nbeats(x):
        f = torch.zeros(x.shape[0], 5)
        for fc0, fc1, back, fore in blocks:
            h = F.relu(fc1(F.relu(fc0(x))))
            x, f = x - back(h), f + fore(h)
        return x, f

    lp = check_torch(nbeats, torch.randn(3, 12))
    assert any("2 kernels compute this product" in n for n in lp.notes), lp.notes
    assert not any("recomputed up to" in n for n in lp.notes), lp.notes


def test_a_maximum_the_comparing_kernel_finds_itself_keeps_the_softmax_fused():
    """examples/moe_router.py: its softmax, top-k maxima and equality tests all in one kernel,
    which compares bits it computed itself: nothing stored for them."""
    from emmy.frontend.workload import load_file
    from emmy.pipeline import compile_to

    lp = compile_to(load_file("examples/moe_router.py", ()), "loop")["loop"]
    assert len(lp.kernels) == 2, [k.name for k in lp.kernels]
    assert not any("compared with its" in n for n in lp.notes)


def test_sums_a_row_dot_reads_are_stored_not_recomputed_per_element():
    """SwAV's Sinkhorn-Knopp: alternating row and column sums, then the loss's `(q * x).sum(1)`.
    That dot is no matrix product (neither factor is broadcast), so the sums before it are
    stored, where inlined each output element ran them all again (75,497,472 times)."""
    def swav(out, x):
        q = torch.exp(out / 0.05).t()
        q = q / q.sum()
        for _ in range(3):
            q = q / q.sum(1, keepdim=True) / q.shape[0]
            q = q / q.sum(0, keepdim=True) / q.shape[1]
        q = (q * q.shape[1]).t()
        return q, (q * x).sum(1)

    lp = check_torch(Fn(swav), torch.randn(32, 48) * 0.3, torch.randn(32, 48))
    assert not any("recomputed up to" in n for n in lp.notes), lp.notes
    assert 5 <= len(lp.kernels) <= 9


def test_a_statistic_carried_from_step_to_step_is_stored_as_it_grows():
    """Log-domain Sinkhorn: each step's potential u += eps * (-logsumexp(...)) is computed
    from every earlier step's stored maxima and sums unless it is stored itself; inlined, the
    last kernels read all of them (and a program of T steps grows as T squared)."""
    def sinkhorn(x, y):
        c = ((x.unsqueeze(-2) - y.unsqueeze(-3)) ** 2).sum(-1)
        u, v = torch.zeros(2, 12), torch.zeros(2, 10)
        for _ in range(8):
            u = 0.1 * -torch.logsumexp((-c + u[..., None] + v[..., None, :]) / 0.1, -1) + u
            v = 0.1 * -torch.logsumexp(((-c + u[..., None] + v[..., None, :]) / 0.1)
                                       .transpose(-2, -1), -1) + v
        return u, v

    lp = check_torch(Fn(sinkhorn), torch.rand(2, 12, 2), torch.rand(2, 10, 2))
    assert any("stored ones" in n for n in lp.notes), lp.notes
    assert max(len(k.inputs) for k in lp.kernels) <= 9, [len(k.inputs) for k in lp.kernels]
