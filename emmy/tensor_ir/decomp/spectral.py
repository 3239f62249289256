"""Discrete Fourier transforms as sums of products against the DFT basis (torch.fft's
transforms, and torch.stft of a real signal: its frames, windowed, transformed along the frame;
its center padding is a separate reflect pad in the exported graph): X[k] = sum_m x[m]
(cos - i sin)(2 pi k m / n). The phase k*m is reduced modulo n in integers first, so the angle
is below 2 pi and its cosine as exact as one float32 rounding allows (2 pi k m / n itself
reaches thousands of radians, where float32 keeps three decimals)."""

from __future__ import annotations

import math

from emmy.dtypes import DType
from emmy.symbolic import mod, var
from emmy.tensor_ir.builder import Builder
from emmy.tensor_ir.decomp.layout import axes
from emmy.tensor_ir.decomp.pooling import floor_div
from emmy.tensor_ir.decomp.table import Decomp, Refused, registrar
from emmy.tensor_ir.ir import EwOp as E
from emmy.tensor_ir.ir import ReduceOp as R
from emmy.tensor_ir.ir import axis_var

OPS: dict[str, Decomp] = {}
op = registrar(OPS)


@op("stft")
def lower_stft(b, x, n_fft, hop_length=None, win_length=None, window=None, normalized=False,
               onesided=None, return_complex=None, align_to_window=None):
    """return_complex=False: the (real, imaginary) pairs along a last axis (a complex result
    lowers through emmy.tensor_ir.complex, which calls stft_parts itself)."""
    from emmy.tensor_ir.decomp.layout import lower_stack

    dtype = b.dtype(x) if b.dtype(x).is_float else DType.F32
    re, im = stft_parts(b, x, dtype, n_fft, hop_length, win_length, window, normalized,
                        onesided, align_to_window)
    return lower_stack(b, [re, im], -1)


def stft_parts(b: Builder, x: str, dtype: DType, n_fft: int, hop: int | None,
               win_length: int | None, window: str | None, normalized: bool,
               onesided: bool | None, align_to_window: bool | None = None) -> tuple[str, str]:
    """(real part, imaginary part) of stft(x) in `dtype`, each [..., frequencies, frames]."""
    n = int(n_fft)
    hop = int(hop) if hop else n // 4
    win = int(win_length) if win_length else n
    shape = b.shape(x)
    if len(shape) not in (1, 2) or shape[-1] < n or not 0 < win <= n or hop <= 0:
        raise Refused(f"a signal of shape {shape} with n_fft {n}, hop {hop} and window length "
                      f"{win} (torch.stft takes 1 or 2 axes, at least n_fft samples)")
    if align_to_window and win < n:
        raise Refused("align_to_window with a window shorter than n_fft")
    freqs = n // 2 + 1 if onesided is None or onesided else n
    lead = len(shape) - 1
    frames = 1 + (shape[-1] - n) // hop
    framed = (*shape[:-1], frames, n)                     # [..., t, m]: frame t's samples
    t, m = var(axis_var(lead)), var(axis_var(lead + 1))
    taps = b.index_map(b.cast(x, dtype), framed, [*axes(lead), t * hop + m])
    weights = _window(b, window, win, n, dtype)
    if weights is not None:
        taps = b.ew(E.MUL, taps, b.index_map(weights, framed, [m]))
    scale = 1 / math.sqrt(n) if normalized else 1.0
    re, im = dft(b, taps, None, lead + 1, n, freqs, inverse=False, scale=scale, dtype=dtype)
    spectrum = (*shape[:-1], freqs, frames)               # torch's order: frequency, frame
    order = [*axes(lead), var(axis_var(lead + 1)), var(axis_var(lead))]
    return b.index_map(re, spectrum, order), b.index_map(im, spectrum, order)


def _real_bins(b: Builder, im: str, k_axis: int, n: int) -> str:
    """The imaginary parts of a real signal's spectrum with those of frequency 0 and n/2 0
    exactly, as an FFT has them (a float sin(pi) is not 0: the phase of a negative real part
    would be -pi or pi by the sign of a rounding)."""
    k = b.iota(b.shape(im), k_axis)
    return b.ew(E.WHERE, b.ew(E.OR, b.ew(E.EQ, k, 0), b.ew(E.EQ, b.ew(E.MUL, k, 2), n)), 0.0,
                im)


def _angle(b: Builder, shape, k_axis: int, m_axis: int, n: int, dtype: DType) -> str:
    """2 pi (k m mod n) / n over `shape`, k and m the positions along two of its axes: the
    product reduced modulo n in integers, so the angle stays below 2 pi."""
    if n & (n - 1) and (n - 1) ** 2 >= 2 ** 24:     # reduced through float32 below
        raise Refused(f"a transform of length {n}: its phases k*m reach past 2**24")
    phase = b.ew(E.MUL, b.iota(shape, k_axis), b.iota(shape, m_axis))
    if n & (n - 1) == 0:
        phase = b.ew(E.BITAND, phase, n - 1)
    else:
        phase = b.ew(E.SUB, phase, b.ew(E.MUL, floor_div(b, phase, n), n))
    return b.ew(E.MUL, b.cast(phase, dtype), 2 * math.pi / n)


def dft(b: Builder, re: str, im: str | None, axis: int, n: int, bins: int, *,
        inverse: bool, scale: float, dtype: DType) -> tuple[str, str]:
    """The discrete Fourier transform of length n along `axis` of re + i im (im None: a real
    signal), its first `bins` frequencies: X[k] = scale sum_m x[m] e^(-+2 pi i k m / n), the
    signal cut to n or padded with zeros (the terms it lacks). O(n bins) products: a sum of
    products a matrix unit can run, not an FFT."""
    shape = b.shape(re)
    taps = min(shape[axis], n)
    out = (*shape[:axis], bins, *shape[axis + 1:])
    full = (*out, taps)                                    # summed over the last axis
    index = axes(len(out))
    index[axis] = var(axis_var(len(out)))

    def read(x):
        return b.index_map(b.cast(x, dtype), full, index)
    angle = _angle(b, full, axis, len(out), n, dtype)
    cos, sin = b.ew(E.COS, angle), b.ew(E.SIN, angle)
    xr = read(re)
    sign = 1.0 if inverse else -1.0

    def total(x):
        return b.ew(E.MUL, b.reduce(R.SUM, x, (len(out),)), scale)
    real = b.ew(E.MUL, xr, cos)
    imag = b.ew(E.MUL, b.ew(E.MUL, xr, sin), sign)
    if im is None:
        return total(real), _real_bins(b, total(imag), axis, n)
    xi = read(im)
    real = b.ew(E.SUB, real, b.ew(E.MUL, b.ew(E.MUL, xi, sin), sign))
    imag = b.ew(E.ADD, imag, b.ew(E.MUL, xi, cos))
    return total(real), total(imag)


def hermitian_inverse(b: Builder, re: str, im: str, axis: int, n: int, *, scale: float,
                      dtype: DType) -> str:
    """irfft: the real signal of length n whose spectrum's first half is re + i im along
    `axis`: x[m] = scale sum_k c_k (re_k cos - im_k sin)(2 pi k m / n), c_k 2 but for
    frequency 0 and n/2 (1, their imaginary parts ignored, as torch does)."""
    shape = b.shape(re)
    bins = min(shape[axis], n // 2 + 1)
    out = (*shape[:axis], n, *shape[axis + 1:])
    full = (*out, bins)
    index = axes(len(out))
    index[axis] = var(axis_var(len(out)))
    angle = _angle(b, full, len(out), axis, n, dtype)
    k = b.iota(full, len(out))
    edge = b.ew(E.OR, b.ew(E.EQ, k, 0), b.ew(E.EQ, b.ew(E.MUL, k, 2), n))
    xr = b.index_map(b.cast(re, dtype), full, index)
    xi = b.ew(E.WHERE, edge, 0.0, b.index_map(b.cast(im, dtype), full, index))
    term = b.ew(E.SUB, b.ew(E.MUL, xr, b.ew(E.COS, angle)), b.ew(E.MUL, xi, b.ew(E.SIN, angle)))
    term = b.ew(E.MUL, term, b.ew(E.WHERE, edge, 1.0, 2.0))
    return b.ew(E.MUL, b.reduce(R.SUM, term, (len(out),)), scale)


def norm_scale(norm: str | None, n: int, *, inverse: bool) -> float:
    """torch.fft's scaling: "backward" (the default) divides the inverse by n, "forward" the
    forward transform, "ortho" both by sqrt(n)."""
    norm = norm or "backward"
    if norm == "ortho":
        return 1 / math.sqrt(n)
    if norm not in ("backward", "forward"):
        raise Refused(f"norm={norm!r}")
    return 1 / n if (norm == "backward") == inverse else 1.0


def _window(b: Builder, window: str | None, win: int, n: int, dtype: DType) -> str | None:
    """The window over the n taps: `window` (or ones over win_length) in the middle, zeros on
    either side (torch centers a shorter window in the frame)."""
    if window is None and win == n:
        return None
    w = b.cast(window, dtype) if window is not None else b.full((win,), 1.0, dtype)
    if b.shape(w) != (win,):
        raise Refused(f"a window of shape {b.shape(w)} for window length {win}")
    if win == n:
        return w
    left = (n - win) // 2
    inside = b.index_map(w, (n,), [mod(var(axis_var(0)) - left, win, {axis_var(0): n})])
    at = b.iota((n,), 0)
    keep = b.ew(E.AND, b.ew(E.GE, at, left), b.ew(E.LT, at, left + win))
    return b.ew(E.WHERE, keep, inside, 0.0)
