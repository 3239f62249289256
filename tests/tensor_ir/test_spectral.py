"""Fourier transforms (torch.fft, torch.stft) as sums of products against the DFT basis, and
the window functions (emmy/tensor_ir/decomp/spectral.py, creation.py): each against eager on
random signals of lengths that are powers of two, odd and prime, through the Tensor IR
interpreter, and a sample through the emitted CUDA on the emulator."""

import pytest
import torch

from emmy.errors import UnsupportedOp
from tests.tensor_ir.emitted import assert_emitted_cuda_matches_eager


def _sizes_and_norms():
    for n in (1, 2, 7, 16, 33):
        for norm in (None, "ortho", "forward"):
            yield n, norm


@pytest.mark.parametrize("n, norm", list(_sizes_and_norms()))
def test_one_axis_transforms_match_eager(check, n, norm):
    x = torch.randn(3, n)
    z = torch.randn(3, n, dtype=torch.complex64)
    check(lambda x, z: (torch.fft.rfft(x, norm=norm), torch.fft.fft(z, norm=norm),
                        torch.fft.ifft(x, norm=norm), torch.fft.irfft(z, n=n + 3, norm=norm),
                        torch.fft.irfft(z, norm=norm) if n > 1 else x), x, z)


@pytest.mark.parametrize("fn", [
    lambda x: torch.fft.rfft(x, n=12, dim=1),                       # padded with zeros
    lambda x: torch.fft.fft(x, n=3, dim=0),                         # cut
    lambda x: torch.fft.irfft(torch.fft.rfft(x), n=x.shape[-1]),    # the round trip
    lambda x: torch.fft.rfft2(x),
    lambda x: torch.fft.irfft2(torch.fft.rfft2(x), s=x.shape[-2:]),
    lambda x: torch.fft.fftn(x, s=(4, 6), dim=(0, 2)),
    lambda x: torch.fft.ifftn(x),
    lambda x: torch.fft.rfftn(x, dim=(0, 1)),
    lambda x: torch.fft.irfftn(torch.fft.rfftn(x)),
    lambda x: torch.fft.rfft(x).abs().pow(2),                       # a power spectrum
])
def test_transforms_along_several_axes_match_eager(check, fn):
    check(fn, torch.randn(3, 5, 9))


@pytest.mark.parametrize("kwargs", [
    dict(n_fft=16, hop_length=4),
    dict(n_fft=16, hop_length=4, window="hann"),
    dict(n_fft=15, hop_length=3, win_length=8, window="hann", normalized=True),
    dict(n_fft=16, center=False, onesided=False),
    dict(n_fft=12, win_length=7, pad_mode="constant"),
])
def test_stft_matches_eager(check, kwargs):
    kwargs = dict(kwargs)
    win = kwargs.pop("window", None)
    window = torch.hann_window(kwargs.get("win_length", kwargs["n_fft"])) if win else None
    check(lambda x: torch.stft(x, window=window, return_complex=True, **kwargs),
          torch.randn(2, 90))


def test_phases_of_real_frequencies_are_exact(check):
    """Frequency 0 and n/2 of a real signal are real: their phase is 0 or pi exactly, as the
    FFT's, not -pi by the sign of a rounding."""
    x = torch.randn(4, 64) - 3
    check(lambda x: (torch.fft.rfft(x).angle(),
                     torch.stft(x, 16, return_complex=True, center=False).angle()), x)


@pytest.mark.parametrize("window", ["hann", "hamming", "blackman", "bartlett"])
@pytest.mark.parametrize("length, periodic", [(1, True), (2, False), (16, True), (9, False)])
def test_windows_match_eager(check, window, length, periodic):
    make = getattr(torch, f"{window}_window")
    check(lambda x: x * make(length, periodic=periodic), torch.randn(3, length))


@pytest.mark.parametrize("expr", [
    "torch.fft.rfft(torch.randn(2, 37)).abs()",
    "torch.fft.irfft(torch.fft.rfft(torch.randn(4, 32)) * torch.randn(4, 17), n=32)",
    "torch.stft(torch.randn(2, 100), 16, hop_length=4, window=torch.hann_window(16), "
    "return_complex=True).abs()",
])
def test_emitted_cuda_matches_eager(expr):
    assert_emitted_cuda_matches_eager(expr)


@pytest.mark.parametrize("fn, message", [
    (lambda x: torch.fft.rfft(x, n=5003), "length 5003: its phases"),
    (lambda x: torch.stft(x.to(torch.complex64), 8, return_complex=True),
     "of a complex signal"),
])
def test_transforms_emmy_cannot_compute_exactly_are_refused(check, fn, message):
    with pytest.raises(UnsupportedOp, match=message):
        check(fn, torch.randn(2, 64))
