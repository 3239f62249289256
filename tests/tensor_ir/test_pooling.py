"""Pooling (max, average, adaptive average and max; 1d, 2d, 3d) against eager PyTorch: the Tensor IR
interpreter on every option torch has, the emitted CUDA on the CPU emulator for a sample."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F


from tests.tensor_ir.emitted import assert_emitted_cuda_matches_eager

POOLS = {
    # name: (module, input shape)
    "max1d": (nn.MaxPool1d(2), (2, 3, 8)),
    "max1d_stride_pad_dilation": (nn.MaxPool1d(3, stride=2, padding=1, dilation=2), (2, 3, 11)),
    "max1d_unbatched_ceil": (nn.MaxPool1d(3, stride=2, ceil_mode=True), (3, 10)),
    "max2d": (nn.MaxPool2d(2), (2, 3, 8, 8)),
    "max2d_pad_ceil": (nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True), (2, 2, 9, 7)),
    "max2d_rect_dilation": (nn.MaxPool2d((2, 3), stride=(1, 2), dilation=(2, 1)), (1, 2, 9, 10)),
    "max3d": (nn.MaxPool3d(2), (1, 2, 4, 6, 4)),
    "max3d_pad": (nn.MaxPool3d(3, stride=2, padding=1), (1, 2, 5, 5, 6)),
    "avg1d": (nn.AvgPool1d(3, stride=2), (2, 3, 9)),
    "avg1d_pad": (nn.AvgPool1d(4, stride=3, padding=2), (2, 3, 10)),
    "avg1d_pad_excluded": (nn.AvgPool1d(4, stride=3, padding=2, count_include_pad=False),
                           (2, 3, 10)),
    "avg2d": (nn.AvgPool2d(2), (2, 3, 8, 8)),
    "avg2d_ceil_excluded": (nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True,
                                         count_include_pad=False), (2, 2, 8, 9)),
    "avg2d_ceil_included": (nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True), (2, 2, 8, 9)),
    "avg2d_divisor": (nn.AvgPool2d(3, stride=1, padding=1, divisor_override=5), (1, 2, 6, 6)),
    "avg2d_unbatched": (nn.AvgPool2d((2, 3)), (3, 6, 9)),
    "avg3d": (nn.AvgPool3d(2, stride=(1, 2, 2)), (1, 2, 4, 6, 4)),
    "adaptive1d_divisible": (nn.AdaptiveAvgPool1d(4), (2, 3, 12)),
    "adaptive1d_ragged": (nn.AdaptiveAvgPool1d(5), (2, 3, 12)),
    "adaptive2d_global": (nn.AdaptiveAvgPool2d(1), (2, 3, 7, 5)),
    "adaptive2d_ragged": (nn.AdaptiveAvgPool2d((3, 4)), (2, 2, 7, 10)),
    "adaptive2d_none": (nn.AdaptiveAvgPool2d((None, 2)), (1, 2, 5, 6)),
    "adaptive3d": (nn.AdaptiveAvgPool3d((2, 3, 2)), (1, 2, 5, 7, 4)),
    # adaptive max: values and positions in the input plane, ragged windows too
    "adaptive_max1d_ragged": (nn.AdaptiveMaxPool1d(5, return_indices=True), (2, 3, 12)),
    "adaptive_max2d_ragged": (nn.AdaptiveMaxPool2d((3, 4), return_indices=True), (2, 2, 7, 10)),
    "adaptive_max2d_global": (nn.AdaptiveMaxPool2d(1), (2, 3, 7, 5)),
    "adaptive_max2d_unbatched": (nn.AdaptiveMaxPool2d((4, None), return_indices=True), (3, 9, 5)),
    "adaptive_max3d": (nn.AdaptiveMaxPool3d((2, 3, 2), return_indices=True), (1, 2, 5, 7, 4)),
}


@pytest.mark.parametrize("name", sorted(POOLS))
def test_pool_matches_eager(check, name):
    module, shape = POOLS[name]
    check(module, torch.randn(*shape))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_pools(check, dtype):
    x = torch.randn(2, 3, 9, 9).to(dtype)
    check(lambda t: (F.max_pool2d(t, 3, 2, 1), F.avg_pool2d(t, 3, 2, 1),
                     F.adaptive_avg_pool2d(t, 4)), x)


def test_pool_with_infinities_and_a_fused_epilogue(check):
    """-inf inputs stay -inf under max (the padding's fill does not win over them), and the pool
    fuses with what follows."""
    x = torch.randn(2, 3, 8, 8)
    x[0, 0, :3, :3] = -torch.inf
    check(lambda t: torch.relu(F.max_pool2d(t, 3, 2, 1)) + F.avg_pool2d(t, 2).mean(), x)


@pytest.mark.parametrize("expr", [
    "nn.MaxPool2d(2, return_indices=True)(torch.randn(1, 2, 4, 4))",
    "nn.MaxPool2d(3, stride=2, padding=1, return_indices=True)(torch.randn(2, 3, 9, 9).half())",
    "F.adaptive_max_pool2d(torch.randn(2, 3, 8, 8), 2, return_indices=True)",
])
def test_max_positions_lower_through_torchs_decomposition(expr):
    """max_pool2d_with_indices has no decomposition of emmy's own: torch's (a window's max,
    its argmax, turned into a position in the input plane)."""
    assert_emitted_cuda_matches_eager(expr)


def test_adaptive_max_takes_the_first_nan_and_the_first_of_ties(check):
    x = torch.randint(0, 3, (2, 3, 10, 13)).float()
    x[0, 0, 1, 2] = x[1, 2, 7, 11] = torch.nan
    check(lambda t: F.adaptive_max_pool2d(t, (3, 4), return_indices=True), x)


@pytest.mark.parametrize("expr", [
    "nn.AdaptiveMaxPool2d((3, 4), return_indices=True)(torch.randn(2, 3, 10, 13))",
    "F.adaptive_max_pool3d(torch.randn(1, 2, 5, 7, 6).half(), (2, 3, 4), return_indices=True)",
    # bytes: the padding's fill is 0, the least byte (it was -128, which a byte reads as 128)
    "F.max_pool2d(torch.randint(0, 256, (2, 3, 10, 13)).to(torch.uint8), 3, 2, padding=1)",
])
def test_emitted_cuda_adaptive_max_and_byte_pools_match_eager(expr):
    assert_emitted_cuda_matches_eager(expr)


@pytest.mark.parametrize("expr", [
    "nn.MaxPool2d(3, stride=2, padding=1)(torch.randn(2, 3, 9, 9))",
    "nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)"
    "(torch.randn(2, 3, 8, 9))",
    "nn.AdaptiveAvgPool2d((3, 4))(torch.randn(2, 2, 7, 10))",
    "nn.MaxPool1d(4, stride=3, padding=2)(torch.randn(2, 3, 17).half())",
])
def test_emitted_cuda_pools_match_eager(expr):
    assert_emitted_cuda_matches_eager(expr)


@pytest.mark.parametrize("batch, work", [(4, "warp:4"), (32, "thread:256")])
def test_default_row_of_a_window_reduction(batch, work):
    """A window's rows are too few for a warp's lanes: the default row takes one thread per
    output once the outputs fill a block of 256 on every SM (below that, a warp per output
    keeps more SMs busy, as the cost model also finds)."""
    from emmy.frontend.workload import load_file
    from emmy.pipeline import compile_to
    from emmy.schedule.space import Space
    from emmy.schedule.targets import get_target

    w = load_file("examples/pooling.py", (("batch_size", batch),))
    kernel = compile_to(w, "tile")["tile"].program.kernels[0]
    assert str(Space(kernel, get_target("sm_90a")).default()).startswith(f"WORK={work} ")
