"""Padding (every mode), pixel shuffle / unshuffle and nearest upsampling against eager
PyTorch: the Tensor IR interpreter, and the emitted CUDA on the CPU emulator for a sample."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from emmy.errors import UserError

from tests.tensor_ir.emitted import assert_emitted_cuda_matches_eager

CASES = {
    "zero_pad2d": (nn.ZeroPad2d(2), (1, 2, 4, 4)),
    "pad_and_crop": (nn.ZeroPad2d((1, -1, 2, 0)), (1, 2, 4, 4)),
    "crop_only": (lambda x: F.pad(x, (-1, -2)), (2, 3, 7)),
    "constant_value": (nn.ConstantPad1d((2, 3), 1.5), (2, 5)),
    "constant_3d": (nn.ConstantPad3d((1, 0, 0, 2, 1, 1), -2.0), (1, 2, 3, 3, 2)),
    "reflect2d": (nn.ReflectionPad2d(2), (1, 2, 4, 5)),
    "reflect1d_wide": (nn.ReflectionPad1d((3, 1)), (2, 2, 5)),
    "replicate2d": (nn.ReplicationPad2d((1, 2, 3, 0)), (1, 2, 4, 5)),
    "replicate3d": (nn.ReplicationPad3d(1), (1, 1, 2, 3, 2)),
    "circular1d": (nn.CircularPad1d(2), (1, 2, 5)),
    "circular2d": (lambda x: F.pad(x, (1, 2, 2, 1), mode="circular"), (1, 2, 4, 5)),
    "pixel_shuffle": (nn.PixelShuffle(2), (1, 8, 4, 3)),
    "pixel_unshuffle": (nn.PixelUnshuffle(2), (2, 2, 4, 6)),
    "shuffle_roundtrip": (lambda x: F.pixel_shuffle(F.pixel_unshuffle(x, 3), 3), (1, 2, 6, 9)),
    "nearest2d_x2": (nn.Upsample(scale_factor=2), (1, 2, 4, 4)),
    "nearest1d_x3": (nn.Upsample(scale_factor=3), (1, 2, 5)),
    "nearest2d_size": (nn.Upsample(size=(6, 10)), (1, 2, 4, 5)),
    "nearest2d_down": (nn.Upsample(size=(2, 3)), (1, 2, 4, 6)),
    "nearest2d_mixed": (nn.Upsample(scale_factor=(2, 1.5)), (1, 2, 3, 4)),
    "nearest3d": (nn.Upsample(scale_factor=2), (1, 1, 2, 3, 2)),
    "local_response_norm": (nn.LocalResponseNorm(3), (1, 5, 4, 4)),
    "bilinear_x2": (nn.Upsample(scale_factor=2, mode="bilinear"), (1, 2, 4, 4)),
    "bilinear_align_corners": (nn.Upsample(size=(5, 7), mode="bilinear", align_corners=True),
                               (1, 2, 4, 4)),
    "bilinear_down": (nn.Upsample(size=(3, 5), mode="bilinear"), (1, 2, 7, 9)),
    "bilinear_fraction": (nn.Upsample(scale_factor=1.5, mode="bilinear"), (1, 2, 4, 6)),
    "bilinear_same_size": (nn.Upsample(size=(4, 6), mode="bilinear"), (1, 2, 4, 6)),
    "linear1d": (nn.Upsample(scale_factor=3, mode="linear"), (2, 2, 5)),
    # a scale factor whose output is not extent * scale: torch maps by 1/scale (pix2pixHD's
    # 0.5 on an odd size, 15 -> 7 reading 2o + 1/2)
    "bilinear_half_odd": (nn.Upsample(scale_factor=0.5, mode="bilinear"), (1, 2, 15, 9)),
    "bilinear_three_halves": (nn.Upsample(scale_factor=1.5, mode="bilinear"), (1, 2, 7, 5)),
    "nearest_half_odd": (nn.Upsample(scale_factor=0.5), (1, 2, 9, 15)),
    "nearest_fraction_down": (nn.Upsample(scale_factor=0.6), (1, 2, 9, 7)),
    "trilinear": (nn.Upsample(scale_factor=2, mode="trilinear"), (1, 1, 2, 3, 2)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager(check, name):
    module, shape = CASES[name]
    check(module, torch.randn(*shape))


def test_half_precision_padding_and_upsampling(check):
    x = torch.randn(1, 2, 4, 4).half()
    check(lambda t: (F.pad(t, (1, 1, 1, 1), mode="reflect"), F.interpolate(t, scale_factor=2),
                     F.interpolate(t, scale_factor=2, mode="bilinear")), x)


def test_integer_and_bool_padding_stays_exact(check):
    """An int64 above 2**24 padded with a constant (a census transform's codes) is not taken
    through float32; a float value pads an integer tensor truncated, as torch fills."""
    codes = torch.randint(0, 2 ** 40, (2, 16))
    check(lambda t: (F.pad(t, (1, 0)), F.pad(t, (0, 2), value=-1.7), F.pad(t > 2 ** 39, (1, 1),
                                                                          value=1)), codes)


def test_a_size_that_torch_indexes_by_float_rounding_is_refused():
    """6 -> 74: torch takes floor(37 * float32(6/74)) = 2 where 37*6/74 is exactly 3; emmy's
    integer index would disagree there, so it says so instead of computing something else."""
    from emmy.frontend.workload import load_expr
    from emmy.pipeline import compile_to

    x = torch.arange(6.0).reshape(1, 1, 6)
    assert F.interpolate(x, size=74)[0, 0, 37] == 2      # the float rounding, in torch itself
    with pytest.raises(UserError, match="exactly"):
        compile_to(load_expr("nn.Upsample(size=74)(torch.randn(1, 1, 6))"), "tensor")


@pytest.mark.parametrize("expr", [
    "nn.ReflectionPad2d((2, 1, 1, 2))(torch.randn(1, 2, 5, 6))",
    "nn.Sequential(nn.ZeroPad2d(1), nn.Conv2d(2, 3, 3))(torch.randn(1, 2, 6, 6))",
    "nn.Sequential(nn.Upsample(scale_factor=2), nn.PixelUnshuffle(2))(torch.randn(1, 2, 4, 4))",
    "nn.ReplicationPad1d(2)(torch.randn(2, 3, 7).half())",
    "nn.Upsample(scale_factor=2, mode='bilinear')(torch.randn(1, 2, 5, 4))",
])
def test_emitted_cuda_matches_eager(expr):
    assert_emitted_cuda_matches_eager(expr)

@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("size, factor", [
    ((6, 5), None), ((4, 3), None), ((7, 13), None), ((24, 20), None), ((1, 1), None),
    (None, 0.5), (None, 0.3), (None, 1.5),
])
def test_antialiased_resizing_matches_eager(check, mode, size, factor):
    """F.interpolate(..., antialias=True) (timm's position-embedding resampling, torchvision's
    Resize on tensors): down by whole and fractional factors, up, to one pixel, and a scale
    factor whose 1/factor is not the size ratio (torch's window centers follow the factor)."""
    check(lambda x: F.interpolate(x, size=size, scale_factor=factor, mode=mode, antialias=True),
          torch.randn(2, 3, 12, 10))


def test_antialiased_resizing_emitted_cuda_matches_eager():
    assert_emitted_cuda_matches_eager(
        "F.interpolate(torch.randn(1, 4, 16, 12), size=(6, 5), mode='bicubic', antialias=True)")
    assert_emitted_cuda_matches_eager(          # windows placed by a gather (below)
        "F.interpolate(torch.randn(1, 2, 7, 13), size=(3, 5), mode='bilinear', antialias=True)")


def test_every_antialiased_window_is_placed(check):
    """Every resizing between 1 and 13 pixels: where no ratio places torch's windows (7 -> 3,
    whose bounds f32 and f64 round apart), they are read through a gather of torch's starts."""
    for mode in ("bilinear", "bicubic"):
        for extent in range(1, 14):
            check(lambda x: tuple(F.interpolate(x, size=(n, 3), mode=mode, antialias=True)
                                  for n in range(1, 14)), torch.randn(1, 2, extent, 3))


def test_antialiased_resizing_with_align_corners_is_refused():
    from emmy.frontend.workload import load_expr
    from emmy.pipeline import compile_to

    with pytest.raises(UserError, match="align_corners=True"):
        compile_to(load_expr("F.interpolate(torch.randn(1, 1, 8, 8), size=(3, 3), "
                             "mode='bilinear', align_corners=True, antialias=True)"), "tensor")
