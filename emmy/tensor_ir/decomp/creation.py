"""Tensors made from nothing but a shape: constants, ranges, triangular masks, identity
matrices; and one-hot encodings of an index tensor."""

from __future__ import annotations

import math

from emmy.dtypes import DType
from emmy.tensor_ir.builder import Builder
from emmy.tensor_ir.decomp.table import Decomp, Refused, registrar
from emmy.tensor_ir.ir import EwOp as E

OPS: dict[str, Decomp] = {}
op = registrar(OPS)


def _default_dtype(b: Builder, value) -> DType:
    if isinstance(value, str):          # a number read off a tensor (`t.item()`): its kind
        kind = b.dtype(value)
        return kind if kind in (DType.BOOL, DType.I64) else \
            DType.I64 if not kind.is_float else DType.F32
    return DType.BOOL if isinstance(value, bool) else DType.I64 if isinstance(value, int) \
        else DType.F32


def filled(b: Builder, shape, value, dtype: DType) -> str:
    """`shape` filled with `value`: a literal, or a number read off a tensor (a 0-d tensor
    here: `torch.full((3,), t.item())`, `torch.tensor(x.max().item())`)."""
    if isinstance(value, str):
        return b.broadcast_to(b.cast(value, dtype), tuple(shape))
    return b.full(shape, value, dtype)


@op("full")
def lower_full(b, size, fill_value, *, dtype=None, **placement):
    return filled(b, size, fill_value, dtype or _default_dtype(b, fill_value))


@op("zeros")
def lower_zeros(b, size, *, dtype=None, **placement):
    return b.full(size, 0, dtype or DType.F32)


@op("ones")
def lower_ones(b, size, *, dtype=None, **placement):
    return b.full(size, 1, dtype or DType.F32)


@op("empty.memory_format", "empty_strided", "empty_permuted", "new_empty", "empty_like",
    "new_empty_strided")
def lower_empty(b, *args, dtype=None, **placement):
    """A tensor whose elements are whatever its memory held (`torch.empty(n).fill_(v)`, before
    the fill): zeros, which are as good as any value; a program that reads one before writing
    it has no defined result in eager either."""
    like = isinstance(args[0], str)              # empty_like(x), new_empty(x, size), ...
    shape = b.shape(args[0]) if like and len(args) == 1 else args[1] if like else args[0]
    return b.full(tuple(shape), 0, dtype or (b.dtype(args[0]) if like else DType.F32))


@op("eye", "eye.m")
def lower_eye(b, n, m=None, *, dtype=None, **placement):
    """Ones where the row equals the column."""
    shape = (n, n if m is None else m)
    ones = b.ew(E.EQ, b.iota(shape, 0), b.iota(shape, 1))
    return b.cast(ones, dtype or DType.F32)


@op("one_hot")
def lower_one_hot(b, x, num_classes=-1):
    """1 where the new last axis equals x's value (i64, as torch gives it)."""
    from emmy.symbolic import var
    from emmy.tensor_ir.ir import axis_var

    if num_classes < 0:
        raise Refused("one_hot without num_classes takes its size from the data (max + 1); "
                      "give num_classes")
    shape = (*b.shape(x), num_classes)
    spread = b.index_map(x, shape, [var(axis_var(i)) for i in range(b.rank(x))])
    return b.cast(b.ew(E.EQ, spread, b.iota(shape, len(shape) - 1)), DType.I64)


@op("scalar_tensor")
def lower_scalar_tensor(b, value, *, dtype=None, **placement):
    return filled(b, (), value, dtype or DType.F32)


@op("full_like")
def lower_full_like(b, x, fill_value, *, dtype=None, **placement):
    return filled(b, b.shape(x), fill_value, dtype or b.dtype(x))


@op("zeros_like")
def lower_zeros_like(b, x, *, dtype=None, **placement):
    return b.full(b.shape(x), 0, dtype or b.dtype(x))


@op("ones_like")
def lower_ones_like(b, x, *, dtype=None, **placement):
    return b.full(b.shape(x), 1, dtype or b.dtype(x))


@op("new_zeros")
def lower_new_zeros(b, x, size, *, dtype=None, **placement):
    return b.full(size, 0, dtype or b.dtype(x))


@op("new_ones")
def lower_new_ones(b, x, size, *, dtype=None, **placement):
    return b.full(size, 1, dtype or b.dtype(x))


@op("arange", "arange.start", "arange.start_step")
def lower_arange(b, *bounds, dtype=None, **placement):
    """start + step * iota, in i64 for integer bounds and f32 otherwise."""
    start, end, step = (0, bounds[0], 1) if len(bounds) == 1 else (*bounds, 1)[:3]
    dtype = dtype or (DType.I64 if all(isinstance(v, int) for v in (start, end, step))
                      else DType.F32)
    n = max(0, math.ceil((end - start) / step))
    positions = b.iota((n,), 0, DType.I64 if not dtype.is_float else dtype)
    return b.cast(b.ew(E.ADD, b.ew(E.MUL, positions, step), start), dtype)


def _window(b: Builder, length: int, periodic: bool, dtype, terms) -> str:
    """A window of `length` samples: terms(phase), phase = 2 pi n / (N - 1), N = length + 1
    where periodic (torch computes the symmetric window one longer and drops its last), in the
    window's float type as torch computes it."""
    dtype = dtype or DType.F32
    if not dtype.is_float:
        raise Refused(f"a window of type {dtype}")
    if length <= 1:
        return b.full((max(length, 0),), 1.0, dtype)
    n = length + 1 if periodic else length
    phase = b.ew(E.MUL, b.iota((length,), 0, dtype), 2 * math.pi / (n - 1))
    return b.cast(terms(phase), dtype)


def _cosines(b: Builder, phase: str, *coefs: float) -> str:
    """coefs[0] - coefs[1] cos(phase) + coefs[2] cos(2 phase) - ..."""
    out = coefs[0]
    for k, c in enumerate(coefs[1:], 1):
        wave = b.ew(E.COS, b.ew(E.MUL, phase, float(k)) if k > 1 else phase)
        out = b.ew(E.ADD, b.ew(E.MUL, wave, c * (-1) ** k), out)
    return out


@op("hamming_window", "hamming_window.periodic", "hamming_window.periodic_alpha",
    "hamming_window.periodic_alpha_beta")
def lower_hamming_window(b, length, periodic=True, alpha=0.54, beta=0.46, *, dtype=None,
                         **placement):
    return _window(b, length, periodic, dtype, lambda ph: _cosines(b, ph, alpha, beta))


@op("hann_window", "hann_window.periodic")
def lower_hann_window(b, length, periodic=True, *, dtype=None, **placement):
    return _window(b, length, periodic, dtype, lambda ph: _cosines(b, ph, 0.5, 0.5))


@op("blackman_window", "blackman_window.periodic")
def lower_blackman_window(b, length, periodic=True, *, dtype=None, **placement):
    return _window(b, length, periodic, dtype, lambda ph: _cosines(b, ph, 0.42, 0.5, 0.08))


@op("bartlett_window", "bartlett_window.periodic")
def lower_bartlett_window(b, length, periodic=True, *, dtype=None, **placement):
    """1 - |2n / (N - 1) - 1| (the phase over pi, less one)."""
    return _window(b, length, periodic, dtype, lambda ph: b.ew(
        E.SUB, 1.0, b.ew(E.ABS, b.ew(E.SUB, b.ew(E.MUL, ph, 1 / math.pi), 1.0))))


@op("kaiser_window", "kaiser_window.periodic", "kaiser_window.beta")
def lower_kaiser_window(b, length, periodic=True, beta=12.0, *, dtype=None, **placement):
    """I0(beta sqrt(1 - ((n - a) / a)^2)) / I0(beta), a = (N - 1) / 2, (n - a) / a the phase
    over pi, less one (I0: emmy.tensor_ir.decomp.elementwise.lower_i0)."""
    from emmy.tensor_ir.decomp.elementwise import lower_i0

    def terms(phase):
        ratio = b.ew(E.SUB, b.ew(E.MUL, phase, 1 / math.pi), 1.0)
        arg = b.ew(E.MUL, b.ew(E.SQRT, b.ew(E.ABS, b.ew(E.SUB, 1.0, b.ew(E.MUL, ratio, ratio)))),
                   float(beta))
        return b.ew(E.DIV, lower_i0(b, arg), lower_i0(b, b.full((), float(beta), b.dtype(arg))))
    return _window(b, length, periodic, dtype, terms)


@op("linspace")
def lower_linspace(b, start, end, steps, *, dtype=None, **placement):
    """torch's CPU form: start + step * i in the first half, end - step * (steps - 1 - i) in
    the second (each end exact), step = (end - start) / (steps - 1), in the result's float
    type; a float32 one rounded once from each product and sum, as torch's kernels compute it
    (a fused multiply-add on the CPU and the GPU alike: -2.98e-08 in the middle of
    linspace(-1, 1, 7), not 0), here in float64, where they are exact."""
    dtype = dtype or DType.F32
    if not dtype.is_float or not all(isinstance(v, (int, float)) for v in (start, end)):
        raise Refused("linspace between two numbers into a float type (a tensor bound or an "
                      "integer result is not supported)")
    if steps < 1:
        raise Refused(f"steps={steps}: an empty linspace")
    if steps == 1:
        return b.full((1,), start, dtype)
    step = (float(end) - float(start)) / (steps - 1)
    if dtype is not DType.F64:                  # in f32, as torch computes a float's step
        import numpy as np

        step = float((np.float32(end) - np.float32(start)) / np.float32(steps - 1))
    exact = dtype is DType.F32 and steps < 2 ** 24
    i = b.iota((steps,), 0, DType.F64 if exact else dtype)
    if exact:                                   # the ends as the float32 values torch has
        import numpy as np

        start, end = float(np.float32(start)), float(np.float32(end))
    first = b.ew(E.ADD, b.ew(E.MUL, i, step), float(start))
    second = b.ew(E.SUB, float(end), b.ew(E.MUL, b.ew(E.SUB, float(steps - 1), i), step))
    out = b.ew(E.WHERE, b.ew(E.LT, i, float(steps // 2)), first, second)
    return b.cast(out, dtype) if exact else out


def triangle(b: Builder, x: str, diagonal: int, keep: E) -> str:
    """Keep x[..., i, j] where (j - i) `keep` diagonal, zero elsewhere."""
    rank = b.rank(x)
    shape = b.shape(x)
    offset = b.ew(E.SUB, b.iota(shape, rank - 1), b.iota(shape, rank - 2))
    return b.cast(b.ew(E.WHERE, b.ew(keep, offset, diagonal), x, 0), b.dtype(x))


@op("tril")
def lower_tril(b, x, diagonal=0):
    return triangle(b, x, diagonal, E.LE)


@op("triu")
def lower_triu(b, x, diagonal=0):
    return triangle(b, x, diagonal, E.GE)


def _frequencies(real: bool):
    """torch.fft.fftfreq (rfftfreq with `real`): the sample frequencies of an n-point
    transform, as torch computes them: k (0, 1, ..., then -(n // 2), ..., -1; for rfftfreq
    0 .. n // 2) times 1 / (n d)."""
    def lower(b, n, d=1.0, *, dtype=None, **placement):
        kind = dtype or DType.F32
        count = n // 2 + 1 if real else n
        k = b.iota((count,), 0)
        if not real:        # the upper half counts from -(n // 2)
            k = b.ew(E.WHERE, b.ew(E.LT, k, (n + 1) // 2), k, b.ew(E.SUB, k, n))
        return b.ew(E.MUL, b.cast(k, kind), 1.0 / (n * d))
    return lower


op("fft_fftfreq")(_frequencies(real=False))
op("fft_rfftfreq")(_frequencies(real=True))


@op("resize", "resize_as")
def lower_resize(b, x, size, *, memory_format=None):
    """`x.new().resize_(shape)` and `.resize_as_(other)` (a legacy way to make a tensor, filled
    next): a tensor of no elements resized holds whatever memory held, zeros here (as
    `torch.empty`); one resized to as many elements or fewer keeps its first ones in order."""
    from emmy.tensor_ir.decomp.layout import reshape, slice_axis

    shape = b.shape(size) if isinstance(size, str) else tuple(size)
    count, have = math.prod(shape), math.prod(b.shape(x))
    if have == 0:
        return b.full(shape, 0, b.dtype(x))
    if count > have:
        raise Refused(f"resizing {have} elements to {count}: the new ones are memory torch "
                      "leaves as it was")
    return reshape(b, slice_axis(b, reshape(b, x, [have]), 0, 0, count), list(shape))
