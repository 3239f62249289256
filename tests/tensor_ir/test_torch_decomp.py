"""Ops emmy has no decomposition of its own for, lowered through torch's (emmy.tensor_ir.
torch_decomp), and the elementwise ops those decompositions lean on (isnan, signbit,
copysign, fmax / fmin, lgamma; digamma and erfinv, which torch has no decomposition for): the
Tensor IR against eager PyTorch, a sample through the emitted CUDA on the emulator, and the
messages where torch's decomposition does not help."""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from emmy.errors import UnsupportedOp
from emmy.frontend.workload import Workload
from emmy.tensor_ir.decomp import REGISTRY
from emmy.tensor_ir.lower import lower
from emmy.torch_ir.capture import capture
from tests.tensor_ir.conftest import Fn, check_module
from tests.tensor_ir.emitted import assert_workload_cuda_matches_eager

r = torch.randn
INF, NAN = math.inf, math.nan
# -0.0, NaN of both signs, the infinities, gamma's poles
AWKWARD = torch.tensor([[0.0, -0.0, NAN, -NAN, INF, -INF, 1.5, -2.5],
                        [-1.0, -2.0, 3.0, -0.5, 1e-30, -1e-30, 7.0, 0.25]])

# bags of 2, 0, 3 and 3 indices (an empty one; 2 is the padding_idx some cases leave out)
BAG_INDICES, BAG_OFFSETS = torch.tensor([1, 2, 3, 4, 5, 1, 2, 9]), torch.tensor([0, 2, 2, 5])

# op as torch.export names it -> (function, inputs); none of these ops is in emmy's tables
THROUGH_TORCH = {
    "diff": (lambda x: torch.diff(x, dim=-1), (r(4, 9),)),
    "tile": (lambda x: x.tile((2, 1, 3)), (r(3, 4),)),
    "outer": (torch.outer, (r(5), r(7))),
    "kron": (torch.kron, (r(2, 3), r(3, 2))),
    "tensordot": (lambda x, y: torch.tensordot(x, y, dims=2), (r(4, 5, 3), r(5, 3, 2))),
    "rot90": (lambda x: torch.rot90(x, 1, [0, 1]), (r(3, 5),)),
    "heaviside": (torch.heaviside, (AWKWARD, r(2, 8))),
    "xlogy.Tensor": (torch.xlogy, (torch.tensor([0.0, 1.0, 2.0, NAN, 0.0]),
                                   torch.tensor([0.0, 2.0, NAN, 1.0, NAN]))),
    "nansum": (lambda x: torch.nansum(x, dim=-1), (AWKWARD.clamp(-9, 9),)),
    "nanmean": (lambda x: torch.nanmean(x, dim=-1), (AWKWARD.clamp(-9, 9),)),
    "pairwise_distance": (F.pairwise_distance, (r(6, 16), r(6, 16))),
    "multi_margin_loss": (F.multi_margin_loss, (r(8, 5), torch.randint(0, 5, (8,)))),
    "count_nonzero": (lambda x: torch.count_nonzero(x > 0, dim=-1), (r(4, 9),)),
    "channel_shuffle": (nn.ChannelShuffle(2), (r(2, 4, 3, 3),)),
    "sinc": (torch.sinc, (torch.tensor([0.0, 0.5, -1.0, 2.5]),)),
    "deg2rad": (torch.deg2rad, (r(3, 4),)),
    "bucketize.Tensor": (lambda x, edges: torch.bucketize(x, edges),
                         (r(4, 6), torch.linspace(-2, 2, 9))),
    "im2col": (lambda x: F.unfold(x, kernel_size=3, padding=1), (r(2, 3, 5, 6),)),
    "upsample_bicubic2d.vec": (lambda x: F.interpolate(x, scale_factor=2, mode="bicubic"),
                               (r(1, 2, 4, 5),)),
    "grid_sampler": (lambda x, g: F.grid_sample(x, g, align_corners=False),
                     (r(1, 2, 5, 5), torch.rand(1, 3, 4, 2) * 2 - 1)),
    "special_entr": (torch.special.entr, (torch.tensor([0.0, 0.5, 1.0, -1.0, INF]),)),
    # recurrent layers, unrolled over their steps (their cells update chunks of the gates in
    # place: traced again through functionalization)
    "lstm.input": (nn.LSTM(5, 6, num_layers=2, bidirectional=True), (r(4, 2, 5),)),
    "gru.input": (nn.GRU(5, 6, batch_first=True), (r(2, 4, 5), r(1, 2, 6))),
    "lstm_cell": (nn.LSTMCell(5, 6), (r(3, 5),)),
    "gru_cell": (nn.GRUCell(5, 6), (r(3, 5), r(3, 6))),
}

NATIVE = {
    "isnan": (lambda x: torch.isnan(x), (AWKWARD,)),
    "isnan_int": (lambda x: torch.isnan(x), (torch.arange(6),)),
    "signbit": (torch.signbit, (AWKWARD,)),
    "signbit_int": (torch.signbit, (torch.arange(-3, 3),)),
    "copysign": (torch.copysign, (AWKWARD.flip(1), AWKWARD)),
    "copysign_scalar": (lambda x: torch.copysign(x, -0.0), (AWKWARD,)),
    "copysign_int": (torch.copysign, (torch.arange(-4, 4), AWKWARD[0])),
    "fmax": (torch.fmax, (AWKWARD, AWKWARD.flip(1))),
    "fmin": (torch.fmin, (AWKWARD, AWKWARD.flip(0))),
    "fmax_int": (torch.fmax, (torch.arange(6), torch.arange(6).flip(0))),
    "lgamma": (torch.lgamma, (torch.cat([AWKWARD.flatten(), r(16) * 4]),)),
    # the poles and their signed zeros, the recurrence's end (10), reflection (x < 0)
    "digamma": (torch.digamma, (torch.cat([AWKWARD.flatten(), r(16) * 30, torch.tensor(
        [-3.0, -2.5, -0.25, 10.0, 9.999, 1e20])]),)),
    "digamma_f64": (torch.special.psi, (torch.cat([AWKWARD.flatten(), r(16) * 30]).double(),)),
    "erfinv": (torch.erfinv, (torch.tensor([-1.0, 1.0, 1.5, -2.0, 0.0, -0.0, NAN, INF, 0.5,
                                            -0.999, 0.99999, 1e-8, -0.3]),)),
    "unfold": (lambda x: x.unfold(1, 3, 2), (r(2, 9, 4),)),
    "constant_pad_nd": (lambda x: torch.constant_pad_nd(x, (1, 2), 2.5), (r(3, 4),)),
    "rrelu_eval": (lambda x: F.rrelu(x, training=False), (r(4, 8),)),
    "addbmm": (lambda c, x, y: torch.addbmm(c, x, y, beta=0.5, alpha=2.0),
               (r(3, 5), r(4, 3, 6), r(4, 6, 5))),
    "bilinear": (nn.Bilinear(6, 4, 3), (r(2, 5, 6), r(2, 5, 4))),
    "cdist": (torch.cdist, (r(2, 7, 5), r(2, 6, 5))),
    "cdist_p": (lambda x, y: (torch.cdist(x, y, p=1.0), torch.cdist(x, y, p=0.0),
                              torch.cdist(x, y, p=INF), torch.cdist(x, y, p=3.0)),
                (r(7, 5), torch.cat([r(3, 5), torch.zeros(1, 5)]))),
    "searchsorted": (lambda s, v: (torch.searchsorted(s, v), torch.searchsorted(s, v, right=True)),
                     (torch.tensor([-1.0, 0.0, 0.0, 2.0]), AWKWARD)),
    "searchsorted_rows": (lambda s, v: torch.searchsorted(s, v, side="right", out_int32=True),
                          (torch.sort(r(3, 7), dim=-1).values, r(3, 5))),
    **{f"embedding_bag_{mode}_{pad}": (
        lambda w, i, o, mode=mode, pad=pad: torch.ops.aten.embedding_bag.padding_idx(
            w, i, o, False, mode, False, None, False, pad),
        (r(10, 4), BAG_INDICES, BAG_OFFSETS)) for mode in (0, 1, 2) for pad in (None, 2)},
    "embedding_bag_weighted_last_offset": (
        lambda w, i, o, p: torch.ops.aten.embedding_bag.padding_idx(w, i, o, False, 0, False, p,
                                                                   True, None)[:3],
        (r(10, 4), BAG_INDICES, torch.tensor([0, 2, 2, 5, 8]), torch.rand(8))),
    "embedding_bag_mean_last_offset": (
        lambda w, i, o: torch.ops.aten.embedding_bag.padding_idx(w, i, o, False, 1, False, None,
                                                                True, 2)[0],
        (r(10, 4), BAG_INDICES, torch.tensor([0, 2, 2, 5, 8]))),
    "embedding_bag_2d": (nn.EmbeddingBag(10, 4, mode="max"), (torch.randint(0, 10, (3, 5)),)),
    # a weight that requires grad: export records _embedding_bag's bookkeeping shapes (one
    # bag size a bag), not _embedding_bag_forward_only's (one an offset)
    **{f"embedding_bag_module_last_offset_{mode}": (
        nn.EmbeddingBag(10, 4, mode=mode, include_last_offset=True),
        (BAG_INDICES, torch.tensor([0, 2, 2, 5, 8]))) for mode in ("sum", "mean", "max")},
    "median": (lambda x: torch.median(x, dim=1), (r(4, 9),)),
    "median_even_keepdim": (lambda x: torch.median(x, dim=0, keepdim=True), (r(8, 3),)),
    "median_nan": (lambda x: torch.median(x, dim=-1).values, (AWKWARD,)),
    "median_all": (torch.median, (r(5, 7),)),
    "kthvalue": (lambda x: torch.kthvalue(x, 3, dim=-1), (r(4, 10),)),
    "kthvalue_from_the_top": (lambda x: torch.kthvalue(x, 39, dim=-1, keepdim=True),
                              (r(3, 40),)),
    # the data's range (also where min == max); a given one with NaN and elements outside it;
    # an element at max (last bin) and on bin edges; equal bounds widened by 1; 16-bit counts
    "histc": (lambda x: torch.histc(x, bins=7), (r(6, 50),)),
    "histc_range": (lambda x: (torch.histc(x, bins=5, min=-1, max=1),
                               torch.histc(x.nan_to_num().clamp(-3, 3), bins=4, min=0.5, max=0.5)),
                    (torch.cat([AWKWARD.flatten(), r(40), torch.tensor([1.0, -0.6, 0.2])]),)),
    "histc_edges": (lambda x: torch.histc(x, bins=5, min=0, max=4), (torch.arange(-1.0, 6.0),)),
    "histc_constant": (lambda x: torch.histc(x * 0 + 2, bins=4), (r(9),)),
    "histc_half": (lambda x: torch.histc(x, bins=6), (r(300).half(),)),
    # torch.ao's HistogramObserver: the bounds are the batch's aminmax, 0-d tensors; equal
    # ones (a constant batch) fall back to the data's own range, widened by one
    "histc_tensor_bounds": (lambda x: (torch.histc(x, 16, *torch.aminmax(x)),
                                       torch.histc(x, 8, x.min() * 0.5, x.max() * 0.5),
                                       torch.histc(x * 0 + 3, 4, *torch.aminmax(x * 0 + 3)),
                                       torch.histc(x, 4, x[0, 0], x[0, 0])), (r(6, 50),)),
    # every pair i < j of rows, in order; a repeated row (distance 0) and p's special cases
    "pdist": (lambda x: (F.pdist(x), F.pdist(x, 1), F.pdist(x, 0), F.pdist(x, INF),
                         F.pdist(x, 3.0)), (torch.cat([r(6, 5), r(1, 5).expand(2, 5)]),)),
    "pdist_two_rows": (F.pdist, (r(2, 3),)),
    # both last axes contracted: (3, 4) and (5, 4) give (3, 5) (it was lowered as matmul)
    "inner": (lambda x, y, z, s: (torch.inner(x, y), torch.inner(z, y), torch.inner(y[0], z),
                                  torch.inner(s, x)), (r(3, 4), r(5, 4), r(2, 3, 4), r(()))),
    # image features into the tokens a mask marks (LLaVA's merge: the mask broadcast over the
    # hidden axis, source rows taken in order), and an element mask over integers
    "masked_scatter": (lambda e, feats, image, y, m: (
        e.masked_scatter(image.unsqueeze(-1), feats), y.masked_scatter(m, torch.arange(30))),
        (r(2, 6, 8), r(5, 8), torch.tensor([[0, 1, 1, 0, 0, 0], [1, 0, 0, 0, 1, 0]]).bool(),
         torch.randint(-9, 9, (5, 6)), torch.rand(5, 6) < 0.5)),
}


def _check_tensor_ir(fn, inputs):
    torch.manual_seed(0)
    return check_module(fn, *inputs)


@pytest.mark.parametrize("name", THROUGH_TORCH)
def test_op_lowers_through_torchs_decomposition(name):
    fn, inputs = THROUGH_TORCH[name]
    graph = capture(Fn(fn).eval(), inputs, name="t")
    assert name in {n.op for n in graph.nodes}, "the Torch IR keeps the op as written"
    assert name not in REGISTRY, "emmy has its own decomposition: this case tests nothing"
    _check_tensor_ir(fn, inputs)


@pytest.mark.parametrize("name", NATIVE)
def test_new_op_matches_eager(name):
    fn, inputs = NATIVE[name]
    _check_tensor_ir(fn, inputs)


@pytest.mark.parametrize("name", ["heaviside", "nanmean", "im2col", "tensordot", "lstm.input",
                                  "gru_cell"])
def test_through_torch_emitted_cuda_matches(name):
    _assert_cuda_matches(*THROUGH_TORCH[name], name)


@pytest.mark.parametrize("name", ["isnan", "signbit", "copysign", "copysign_int", "fmax",
                                  "lgamma", "digamma", "digamma_f64", "erfinv", "unfold",
                                  "cdist_p", "median", "median_nan",
                                  "kthvalue_from_the_top", "bilinear", "searchsorted",
                                  "histc", "histc_range", "histc_half", "pdist", "inner",
                                  "masked_scatter",
                                  "embedding_bag_2d"])
def test_new_op_emitted_cuda_matches(name):
    _assert_cuda_matches(*NATIVE[name], name)


def _assert_cuda_matches(fn, inputs, name):
    model = fn if isinstance(fn, nn.Module) else Fn(fn)
    assert_workload_cuda_matches_eager(
        Workload(name, model.eval(), tuple(inputs), source=name, origin="<test>"))


def test_median_positions_among_ties_are_judged_by_value():
    x = torch.randint(0, 3, (9, 6)).float()           # every column full of ties
    _assert_cuda_matches(lambda t: torch.median(t, dim=0), (x,), "median_ties")


def test_in_place_step_of_a_decomposition_reads_as_its_result():
    """nanmean decomposes into `isnan(x).logical_not_()` and a sum of the updated tensor."""
    x = torch.tensor([[1.0, NAN, 3.0], [NAN, NAN, 2.0]])
    program = _check_tensor_ir(lambda t: torch.nanmean(t, dim=1), (x,))
    assert "logical_not" not in str(program)


@pytest.mark.parametrize("call, message", [
    ("torch.histogram(x, bins=4)[0]", "unsupported op `histogram.bin_ct`"),
    ("torch.logdet(x @ x.t())", "torch decomposes it into ops that include"),
    ("torch.kthvalue(x, 1, dim=1)", None),
    ("torch.kthvalue(y, 40, dim=1)", None),     # 41 rounds of topk: ranked instead
    ("F.rrelu(x, training=True)", "training mode draws a random slope"),
])
def test_what_torch_cannot_decompose_is_refused_with_the_reason(call, message):
    def fn(x, y):
        return eval(call)

    inputs = (r(4, 6), r(2, 80))
    if message is None:
        lower(capture(Fn(fn).eval(), inputs, name="t"))
        return
    with pytest.raises(UnsupportedOp) as e:
        lower(capture(Fn(fn).eval(), inputs, name="t"))
    assert message in str(e.value)


@pytest.mark.parametrize("mode, padding, corners", [
    ("bilinear", "zeros", False), ("bilinear", "border", True), ("bilinear", "reflection", False),
    ("bilinear", "reflection", True), ("nearest", "zeros", True), ("nearest", "border", False),
])
def test_a_volume_grid_sample_matches_eager(mode, padding, corners):
    """5-D F.grid_sample (DVGO's voxel grids), which torch has no decomposition of: trilinear
    or nearest, every padding mode, points inside, on the faces and outside the volume."""
    g = torch.Generator().manual_seed(0)
    volume, points = torch.randn(2, 3, 4, 5, 6, generator=g), torch.rand(2, 3, 2, 4, 3,
                                                                          generator=g) * 2.6 - 1.3
    points[0, 0, 0, 0] = torch.tensor([1.0, -1.0, 1.0])
    check_module(Fn(lambda v, p: F.grid_sample(v, p, mode=mode, padding_mode=padding,
                                               align_corners=corners)), volume, points)


def test_a_half_volume_grid_sample_emits_cuda_that_matches_eager():
    args = (torch.randn(1, 2, 3, 4, 5).half(), (torch.rand(1, 2, 2, 3, 3) * 2 - 1).half())
    assert_workload_cuda_matches_eager(Workload(
        "volume", Fn(lambda v, p: F.grid_sample(v, p, align_corners=True)).eval(), args,
        source="", origin="<test>"))


@pytest.mark.parametrize("corners", [True, False])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_an_image_grid_sample_scales_the_grid_as_torch_s_kernel(mode, padding, corners):
    """A grid on every pixel's edge and centre, where a nearest sample's row depends on how
    the grid is scaled to pixels (y = linspace(-1, 1, 13)[1] on 7 rows is 0.50000006 as
    torch's CPU kernel scales it, 0.5 as torch._decomp's does: row 1, not row 0); emmy scales
    it as the kernel does. Bicubic stays torch._decomp's."""
    ys, xs = torch.linspace(-1.1, 1.1, 23), torch.linspace(-1, 1, 13)
    grid = torch.stack(torch.meshgrid(xs, ys, indexing="xy"), -1)[None].expand(2, -1, -1, -1)
    image = torch.randn(2, 3, 7, 9, generator=torch.Generator().manual_seed(0))
    check_module(Fn(lambda v, p: F.grid_sample(v, p, mode=mode, padding_mode=padding,
                                               align_corners=corners)), image, grid)
    check_module(Fn(lambda v, p: F.grid_sample(v, p, mode="bicubic", padding_mode=padding,
                                               align_corners=corners)), image, grid)


@pytest.mark.parametrize("n, start, end", [(7, -1, 1), (8, -1, 1), (13, -1, 1), (16, -1, 1),
                                           (100, 0.1, 7.3), (1000, -3.7, 2.2)])
def test_linspace_is_torch_s_to_the_bit(n, start, end):
    """torch's kernels round start + step * i once (a fused multiply-add): linspace(-1, 1, 7)
    has -2.98e-08 in the middle, not 0, and a nearest sample at a half-pixel tie goes by it."""
    from emmy.tensor_ir.interp import run

    g = capture(Fn(lambda x: x + torch.linspace(start, end, n)), (torch.zeros(n),))
    (got,) = run(lower(g), {g.inputs[0].name: torch.zeros(n).numpy()})
    assert torch.equal(torch.from_numpy(got), torch.linspace(start, end, n))


@pytest.mark.parametrize("size", [(2, 1, 6, 8), (1, 1, 7, 13), (1, 1, 3, 4, 5)])
@pytest.mark.parametrize("corners", [True, False])
def test_affine_grid_is_aten_s_to_the_bit_and_a_tie_samples_as_eager(size, corners):
    """ATen's affine_grid scales linspace(-1, 1, n) by (n - 1) / n, two roundings, where
    torch._decomp takes linspace(-(n - 1) / n, (n - 1) / n, n): an identity grid at half
    resolution puts every nearest sample on a half-pixel tie, which those units decide."""
    from emmy.tensor_ir.interp import run

    dims = len(size) - 2
    theta = torch.eye(dims, dims + 1)[None].expand(size[0], -1, -1).contiguous()
    g = capture(Fn(lambda t: F.affine_grid(t, size, align_corners=corners)), (theta,))
    (got,) = run(lower(g), {g.inputs[0].name: theta.numpy()})
    assert torch.equal(torch.from_numpy(got), F.affine_grid(theta, size, align_corners=corners))
    labels = torch.arange(12 * 16, dtype=torch.float32).view(1, 1, 12, 16)
    warp = Fn(lambda lab, t: F.grid_sample(lab, F.affine_grid(t, (1, 1, 6, 8),
                                                              align_corners=False),
                                           mode="nearest", align_corners=False))
    check_module(warp, labels, torch.eye(2, 3)[None])
