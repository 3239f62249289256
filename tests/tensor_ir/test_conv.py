"""Convolutions and transposed convolutions (1d, 2d, 3d) against eager PyTorch: the Tensor IR
interpreter on the options torch has, the emitted CUDA on the CPU emulator for a sample."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.tensor_ir.emitted import assert_emitted_cuda_matches_eager

CONVS = {
    # name: (module, input shape)
    "conv1d": (nn.Conv1d(3, 5, 3), (2, 3, 10)),
    "conv1d_stride_pad_dilation": (nn.Conv1d(4, 6, 3, stride=2, padding=2, dilation=2),
                                   (2, 4, 13)),
    "conv1d_groups_no_bias": (nn.Conv1d(4, 6, 3, groups=2, bias=False), (2, 4, 9)),
    "conv1d_unbatched": (nn.Conv1d(3, 4, 2), (3, 7)),
    "conv2d": (nn.Conv2d(3, 4, 3, padding=1), (2, 3, 8, 8)),
    "conv2d_rect": (nn.Conv2d(2, 3, (2, 3), stride=(2, 1), padding=(1, 0)), (1, 2, 7, 9)),
    "conv2d_same_even_kernel": (nn.Conv2d(3, 6, 4, padding="same", groups=3, dilation=2),
                                (1, 3, 7, 6)),
    "conv2d_valid": (nn.Conv2d(2, 2, 3, padding="valid"), (1, 2, 5, 5)),
    "conv2d_depthwise": (nn.Conv2d(4, 4, 3, padding=1, groups=4), (2, 4, 6, 6)),
    "conv2d_pointwise": (nn.Conv2d(4, 8, 1), (2, 4, 5, 5)),
    "conv3d": (nn.Conv3d(2, 3, 3, padding=1, stride=(1, 2, 2)), (1, 2, 4, 6, 5)),
    "conv_transpose1d": (nn.ConvTranspose1d(3, 4, 3, stride=2), (2, 3, 6)),
    "conv_transpose1d_pad_out_pad": (nn.ConvTranspose1d(3, 4, 4, stride=3, padding=1,
                                                        output_padding=2), (2, 3, 5)),
    "conv_transpose2d": (nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1), (1, 3, 5, 4)),
    "conv_transpose2d_groups_dilation": (nn.ConvTranspose2d(4, 6, 3, stride=2, groups=2,
                                                            dilation=2, bias=False),
                                         (1, 4, 4, 5)),
    "conv_transpose3d": (nn.ConvTranspose3d(2, 3, 2, stride=2), (1, 2, 3, 2, 3)),
    "conv_transpose2d_unbatched": (nn.ConvTranspose2d(2, 3, 3), (2, 4, 4)),
}


@pytest.mark.parametrize("name", sorted(CONVS))
def test_conv_matches_eager(check, name):
    module, shape = CONVS[name]
    check(module, torch.randn(*shape))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_convs(check, dtype):
    conv = nn.Conv2d(4, 6, 3, padding=1).to(dtype)
    up = nn.ConvTranspose2d(6, 2, 2, stride=2).to(dtype)
    check(lambda t: up(torch.relu(conv(t))), torch.randn(2, 4, 6, 6).to(dtype))


def test_emmy_ops_lists_convolutions_and_pools():
    from emmy.tensor_ir.decomp import SUPPORTED_OPS

    for n in (1, 2, 3):
        assert {f"conv{n}d", f"conv{n}d.padding", f"conv_transpose{n}d.input", f"max_pool{n}d",
                f"avg_pool{n}d", f"adaptive_avg_pool{n}d"} <= set(SUPPORTED_OPS)


@pytest.mark.parametrize("expr", [
    "nn.Conv2d(3, 4, 3, padding=1)(torch.randn(2, 3, 8, 8))",
    "nn.Conv2d(3, 6, 4, padding='same', groups=3, dilation=2)(torch.randn(1, 3, 7, 6))",
    "nn.Conv2d(4, 8, 1)(torch.randn(2, 4, 8, 8))",
    "nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1)(torch.randn(1, 3, 5, 5))",
    "nn.Conv1d(4, 6, 3, stride=2, groups=2).half()(torch.randn(2, 4, 9).half())",
])
def test_emitted_cuda_convs_match_eager(expr):
    assert_emitted_cuda_matches_eager(expr)


def test_functional_conv_with_a_computed_weight(check):
    """The weight need not be a parameter: any tensor the model computes."""
    check(lambda x, w: F.conv2d(x, w * 0.5, stride=2), torch.randn(1, 3, 7, 7),
          torch.randn(4, 3, 3, 3))


@pytest.mark.parametrize("args, blocks", [
    (dict(output_size=(4, 5), kernel_size=(2, 2)), (1, 12, 12)),
    (dict(output_size=(7, 8), kernel_size=(3, 2), stride=(2, 1), padding=1, dilation=(1, 2)),
     (2, 12, 32)),
    (dict(output_size=(4, 4), kernel_size=2), (12, 9)),          # unbatched
])
def test_fold_adds_overlapping_blocks_back(check, args, blocks):
    check(nn.Fold(**args), torch.randn(*blocks))


def test_fold_of_unfold_as_emitted_cuda():
    assert_emitted_cuda_matches_eager(
        "F.fold(F.unfold(torch.randn(2, 3, 8, 8), 3, padding=1, stride=2), (8, 8), 3, "
        "padding=1, stride=2)")
