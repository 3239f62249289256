"""Padding (constant, reflect, replicate, circular; negative pads crop), pixel shuffle and
unshuffle, and nearest-neighbour upsampling: index maps, with a `where` over the position for
the pieces of a padded axis. Linear, bilinear and trilinear resizing: two taps per axis read
through an index map and weighted as torch weights them (a tap at an edge weighs 0).
Antialiased bilinear and bicubic resizing: a window of taps per axis, each weighted by the
filter stretched by the downsampling factor and normalized, as torch (and PIL) weight them.

A padded axis reads x at q = p - left. Constant padding reads x[q mod E] and puts `value` where
q is outside [0, E); reflect, replicate and circular read x at a position that is a different
linear function of p on each side (E-1-... mirrored, the edge, q mod E) and pick by p.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from emmy.dtypes import DType
from emmy.symbolic import Lin, floordiv, mod, var
from emmy.tensor_ir.builder import Builder
from emmy.tensor_ir.decomp.layout import axes
from emmy.tensor_ir.decomp.pooling import combine, floor_div
from emmy.tensor_ir.decomp.table import Decomp, Refused, registrar
from emmy.tensor_ir.ir import EwOp as E
from emmy.tensor_ir.ir import ReduceOp as R
from emmy.tensor_ir.ir import axis_var, gather_var

OPS: dict[str, Decomp] = {}
op = registrar(OPS)


def _fill(dtype, value):
    """The pad value in the tensor's type, as constant_pad_nd fills: an integer tensor's
    stays integer (an int64 of 2**30 through float32 came back rounded)."""
    value = 0 if value is None else value
    if dtype is DType.BOOL:
        return bool(value)
    return value if dtype.is_float or dtype.is_complex else int(value)


def _pad_axis(b: Builder, x: str, dim: int, left: int, right: int, mode: str, value) -> str:
    shape = list(b.shape(x))
    extent = shape[dim]
    shape[dim] = extent + left + right
    if shape[dim] <= 0:
        raise Refused(f"pad: ({left}, {right}) leaves nothing of a dimension of {extent}")
    if left == right == 0:
        return x
    bounds = {axis_var(i): n for i, n in enumerate(shape)}
    p = var(axis_var(dim))

    def at(position: Lin) -> str:
        index = axes(len(shape))
        index[dim] = mod(position, extent, bounds)
        return b.index_map(x, shape, index)

    q = p - left
    if mode == "circular":
        if left > extent or right > extent:
            raise Refused(f"pad: circular padding ({left}, {right}) is wider than the "
                          f"dimension ({extent})")
        return at(q)
    if left <= 0 and right <= 0:                  # only cropping: no position leaves x
        index = axes(len(shape))
        index[dim] = q
        return b.index_map(x, shape, index)
    pos = b.iota(shape, dim)
    if mode == "constant":
        inside = b.ew(E.AND, b.ew(E.GE, pos, left), b.ew(E.LT, pos, left + extent))
        return b.ew(E.WHERE, inside, at(q), _fill(b.dtype(x), value))
    if mode == "reflect":
        if left >= extent or right >= extent:
            raise Refused(f"pad: reflect padding ({left}, {right}) must be narrower than the "
                          f"dimension ({extent})")
        low, high = at(q * -1), at(q * -1 + 2 * (extent - 1))
    elif mode == "replicate":
        low, high = at(Lin()), at(Lin() + (extent - 1))
    else:
        raise Refused(f"pad: mode {mode!r} (constant, reflect, replicate or circular)")
    out = b.ew(E.WHERE, b.ew(E.LT, pos, left), low, at(q))
    return b.ew(E.WHERE, b.ew(E.GE, pos, left + extent), high, out)


@op("constant_pad_nd")
def lower_constant_pad_nd(b, x, pad, value=0):
    """aten's own constant pad: the value comes third (F.pad's third is the mode)."""
    return lower_pad(b, x, pad, "constant", value)


@op("pad")
def lower_pad(b, x, pad, mode="constant", value=None):
    pad = list(pad)
    if len(pad) % 2 or len(pad) // 2 > b.rank(x):
        raise Refused(f"pad: {len(pad)} values for a tensor of rank {b.rank(x)}")
    for i in range(len(pad) // 2):               # (left, right) of the last dim first
        x = _pad_axis(b, x, b.rank(x) - 1 - i, pad[2 * i], pad[2 * i + 1], mode, value)
    return x


@op("reflection_pad1d", "reflection_pad2d", "reflection_pad3d")
def lower_reflection_pad(b, x, padding):
    return lower_pad(b, x, padding, "reflect")


@op("replication_pad1d", "replication_pad2d", "replication_pad3d")
def lower_replication_pad(b, x, padding):
    return lower_pad(b, x, padding, "replicate")


@op("pixel_shuffle")
def lower_pixel_shuffle(b, x, upscale_factor):
    r = int(upscale_factor)
    *lead, c, h, w = b.shape(x)
    if c % (r * r):
        raise Refused(f"pixel_shuffle: {c} channels are not a multiple of {r}x{r}")
    shape = (*lead, c // (r * r), h * r, w * r)
    bounds = {axis_var(i): n for i, n in enumerate(shape)}
    n = len(lead)
    ci, hi, wi = (var(axis_var(n + i)) for i in range(3))
    channel = ci * (r * r) + mod(hi, r, bounds) * r + mod(wi, r, bounds)
    return b.index_map(x, shape, [*axes(n), channel, floordiv(hi, r, bounds),
                                  floordiv(wi, r, bounds)])


@op("pixel_unshuffle")
def lower_pixel_unshuffle(b, x, downscale_factor):
    r = int(downscale_factor)
    *lead, c, h, w = b.shape(x)
    if h % r or w % r:
        raise Refused(f"pixel_unshuffle: {h}x{w} is not a multiple of {r}")
    shape = (*lead, c * r * r, h // r, w // r)
    bounds = {axis_var(i): n for i, n in enumerate(shape)}
    n = len(lead)
    ci, hi, wi = (var(axis_var(n + i)) for i in range(3))
    return b.index_map(x, shape, [*axes(n), floordiv(ci, r * r, bounds),
                                  hi * r + mod(floordiv(ci, r, bounds), r, bounds),
                                  wi * r + mod(ci, r, bounds)])


def _sizes(b: Builder, x: str, n: int, output_size,
           scales) -> list[tuple[int, int, float | None]]:
    """(input extent, output extent, scale factor or None) of each resized axis."""
    extents = b.shape(x)[-n:]
    if output_size is not None and len(output_size):
        outs = [int(o) for o in output_size]
        scales = [None] * n if not scales else list(scales)
    elif scales:
        scales = list(scales) * (n if len(scales) == 1 else 1)
        outs = [int(math.floor(e * s)) for e, s in zip(extents, scales)]
    else:
        raise Refused("upsample_nearest: neither an output size nor scale factors")
    return [(e, o, s) for e, o, s in zip(extents, outs, scales)]


def _nearest_index(extent: int, out: int, scale: float | None, bounds, o: Lin, name: str) -> Lin:
    """torch's source position floor(o * s) (s = 1/scale, or extent/out), clipped to the input,
    as an integer expression; refused where float rounding would make torch's differ."""
    s = np.float32(1.0 / scale) if scale else np.float32(extent) / np.float32(out)
    dst = np.arange(out, dtype=np.float32)
    want = np.minimum(np.floor(dst * s).astype(np.int64), extent - 1)
    num, den = _ratio(s, extent, out, scale)           # o * num // den
    if not np.array_equal(want, np.minimum(np.arange(out) * num // den, extent - 1)):
        raise Refused(f"{name}: scale {scale or out / extent:g} from {extent} to {out} is not a "
                      "ratio emmy can index exactly")
    return mod(floordiv(o * num, den, bounds), extent, bounds)


def _ratio(s: np.float32, extent: int, out: int, scale) -> tuple[int, int]:
    """The source-position scale as a ratio of integers (num, den): 1/scale where a scale factor
    was given (torch maps with it, not with extent/out: 0.5 on 15 is 2 from 7 outputs), else
    extent/out; the callers check it against torch's float computation."""
    if not scale:
        return extent, out
    ratio = Fraction(float(s)).limit_denominator(1 << 16)
    return ratio.numerator, ratio.denominator


def _register(n: int) -> None:
    name = f"upsample_nearest{n}d"

    def lower(b, x, output_size, scales):
        sizes = _sizes(b, x, n, output_size, scales)
        shape = (*b.shape(x)[:-n], *(o for _, o, _ in sizes))
        bounds = {axis_var(i): m for i, m in enumerate(shape)}
        lead = len(shape) - n
        index = [*axes(lead), *(_nearest_index(e, o, s, bounds, var(axis_var(lead + i)), name)
                                for i, (e, o, s) in enumerate(sizes))]
        return b.index_map(x, shape, index)

    @op(f"{name}.vec")
    def lower_vec(b, x, output_size=None, scale_factors=None):
        return lower(b, x, output_size, scale_factors)

    @op(name)
    def lower_sizes(b, x, output_size, *scales):
        given = [s for s in scales if s is not None]
        return lower(b, x, output_size, given or None)


for _n in (1, 2, 3):
    _register(_n)


# ---- linear interpolation (linear1d, bilinear2d, trilinear3d) ----------------------------------

def _linear_source(extent: int, out: int, align_corners: bool, scale) -> np.float32:
    """torch's source-position scale (area_pixel_compute_scale), in float32 as it computes."""
    if align_corners:
        return np.float32((extent - 1) / (out - 1)) if out > 1 else np.float32(0)
    return np.float32(1.0 / scale) if scale else np.float32(extent) / np.float32(out)


def _linear_taps(extent: int, out: int, align_corners: bool, s: np.float32, name: str,
                 scale=None):
    """(num, den, shift): the first of the two positions each output reads, as
    (o*num + shift) // den - 1, checked to cover the positions torch interpolates between."""
    o = np.arange(out)
    if align_corners:
        num, den, shift = extent - 1, max(out - 1, 1), max(out - 1, 1)
    else:             # floor((o + 1/2) * p/q - 1/2), one below where that is negative
        p, q = _ratio(s, extent, out, scale)
        num, den, shift = 2 * p, 2 * q, p + q
    first = (o * num + shift) // den - 1
    real = (s * (o.astype(np.float32) + np.float32(0.5)) - np.float32(0.5)) if not align_corners \
        else s * o.astype(np.float32)
    real = np.maximum(real, np.float32(0))
    i0 = np.floor(real).astype(np.int64)
    i1 = np.minimum(i0 + 1, extent - 1)
    lam = np.clip(real - i0, 0, 1)
    covered = ((i0 == first) | (i0 == first + 1)) & ((lam == 0) | (i1 == first) | (i1 == first + 1))
    if not covered.all():
        raise Refused(f"{name}: resizing {extent} to {out} reads positions emmy cannot index "
                      "exactly as torch rounds them")
    return num, den, shift


def linear_resize(b: Builder, x: str, n: int, name: str, output_size, align_corners,
                  scales) -> str:
    """out = the sum over 2^n taps of x at (first + t) times the tap's weight: torch's
    (1 - lambda, lambda) on the positions it reads, 0 on a tap it does not (an edge)."""
    sizes = _sizes(b, x, n, output_size, scales)
    lead = b.rank(x) - n
    shape = (*b.shape(x)[:lead], *(o for _, o, _ in sizes), *(2,) * n)
    bounds = {axis_var(i): m for i, m in enumerate(shape)}
    index = axes(lead)
    weights = []
    for i, (extent, out, scale) in enumerate(sizes):
        s = _linear_source(extent, out, bool(align_corners), scale)
        num, den, shift = _linear_taps(extent, out, bool(align_corners), s, name, scale)
        o, t = var(axis_var(lead + i)), var(axis_var(lead + n + i))
        index.append(mod(floordiv(o * num + shift, den, bounds) - 1 + t, extent, bounds))
        # the tap's weight, from the positions as values
        ov, tv = b.iota(shape, lead + i), b.iota(shape, lead + n + i)
        first = b.ew(E.SUB, floor_div(b, b.ew(E.ADD, b.ew(E.MUL, ov, num), shift), den), 1)
        at = b.ew(E.ADD, first, tv)
        of = b.cast(ov, DType.F32)
        real = (b.ew(E.MUL, of, float(s)) if align_corners else
                b.ew(E.MAX, b.ew(E.SUB, b.ew(E.MUL, b.ew(E.ADD, of, 0.5), float(s)), 0.5), 0.0))
        i0 = b.ew(E.FLOOR, real)
        lam = b.ew(E.MIN, b.ew(E.MAX, b.ew(E.SUB, real, i0), 0.0), 1.0)
        i0 = b.cast(i0, DType.I64)
        i1 = b.ew(E.MIN, b.ew(E.ADD, i0, 1), extent - 1)
        weights.append(b.ew(E.ADD, b.ew(E.WHERE, b.ew(E.EQ, at, i0), b.ew(E.SUB, 1.0, lam), 0.0),
                            b.ew(E.WHERE, b.ew(E.EQ, at, i1), lam, 0.0)))
    taps = b.index_map(x, shape, index)
    return b.reduce(R.SUM, b.ew(E.MUL, taps, combine(b, E.MUL, weights)),
                    range(lead + n, lead + 2 * n))


def _register_linear(n: int, name: str) -> None:
    @op(f"{name}.vec", opmath=True)
    def lower_vec(b, x, output_size, align_corners, scale_factors=None):
        return linear_resize(b, x, n, name, output_size, align_corners, scale_factors)

    @op(name, opmath=True)
    def lower_sizes(b, x, output_size, align_corners, *scales):
        given = [s for s in scales if s is not None]
        return linear_resize(b, x, n, name, output_size, align_corners, given or None)


for _n, _name in ((1, "upsample_linear1d"), (2, "upsample_bilinear2d"),
                  (3, "upsample_trilinear3d")):
    _register_linear(_n, _name)


# ---- antialiased bilinear and bicubic resizing (F.interpolate(..., antialias=True)) ------------

def _aa_bilinear(b: Builder, x: str) -> str:
    """The triangle filter: max(0, 1 - |x|)."""
    return b.ew(E.MAX, b.ew(E.SUB, 1.0, b.ew(E.ABS, x)), 0.0)


def _aa_bicubic(b: Builder, x: str) -> str:
    """Keys' cubic with a = -0.5 (PIL's, and torch's antialiased bicubic)."""
    a = -0.5
    x = b.ew(E.ABS, x)
    near = b.ew(E.ADD, b.ew(E.MUL, b.ew(E.MUL, b.ew(E.SUB, b.ew(E.MUL, x, a + 2), a + 3), x), x),
                1.0)
    far = b.ew(E.MUL, b.ew(E.SUB, b.ew(E.MUL, b.ew(E.ADD, b.ew(E.MUL, b.ew(E.SUB, x, 5.0), x),
                                                   8.0), x), 4.0), a)
    return b.ew(E.WHERE, b.ew(E.LT, x, 1.0), near, b.ew(E.WHERE, b.ew(E.LT, x, 2.0), far, 0.0))


_AA = {"_upsample_bilinear2d_aa": (2, _aa_bilinear), "_upsample_bicubic2d_aa": (4, _aa_bicubic)}


def _aa_window(extent: int, out: int, scale: float, interp: int):
    """Output o reads x[start(o) + t] for t < taps, start(o) = (o*num + shift) // den, the
    unclamped start of torch's window [max(trunc(center - support + 1/2), 0),
    min(trunc(center + support + 1/2), extent)), center = scale (o + 1/2), which is checked to
    lie within the taps; (num, den, shift, taps). Where no such ratio places every window
    (7 -> 3: a bound f32 and f64 round apart), (None, None, None, taps): the windows' starts
    are then computed as torch computes them, in f32, and read through a gather."""
    support = interp / 2 * scale if scale >= 1 else interp / 2
    o = np.arange(out)
    bounds = []
    for dtype in (np.float32, np.float64):      # torch's, in either precision
        center = dtype(scale) * (o.astype(dtype) + dtype(0.5))
        lo = np.maximum((center - dtype(support) + dtype(0.5)).astype(np.int64), 0)
        hi = np.minimum((center + dtype(support) + dtype(0.5)).astype(np.int64), extent)
        bounds.append((lo, hi))
    (lo, hi), (lo64, hi64) = bounds
    # the window's start as a ratio of integers: scale (o + 1/2) - support + 1/2, support
    # interp/2 * scale (downsampling) or interp/2, scale = p/q (extent/out, or near 1/factor)
    ratio = Fraction(extent, out) if math.isclose(scale, extent / out, rel_tol=1e-9) else \
        Fraction(scale).limit_denominator(4096)
    p, q = ratio.numerator, ratio.denominator
    num, den = 2 * p, 2 * q
    shift = p - interp * p + q if scale >= 1 else p + q - interp * q
    start = (o * num + shift) // den
    if not (np.array_equal(lo, lo64) and np.array_equal(hi, hi64) and np.all(start <= lo)):
        # a bound that f32 and f64 round apart sits where the filter is 0 (its support's edge)
        return None, None, None, int(max((hi - lo).max(), (hi64 - lo64).max()))
    return num, den, shift, int((hi - start).max())


def aa_resize(b: Builder, x: str, name: str, output_size, align_corners, scales) -> str:
    """Antialiased resizing, as torch and PIL compute it: output o along each axis is the
    filter-weighted sum of the inputs in a window around its center, the filter stretched by
    the downsampling factor (so every input contributes), the weights normalized to sum 1.
    One axis at a time, the last first, as torch does: a window of taps read through an index
    map, the weights computed from positions; K + K taps an output instead of K x K."""
    if align_corners:
        raise Refused(f"{name} with align_corners=True")
    interp, kernel = _AA[name]
    sizes = _sizes(b, x, 2, output_size, scales)
    lead = b.rank(x) - 2
    dtype = b.dtype(x) if b.dtype(x) in (DType.F32, DType.F64) else DType.F32
    out = b.cast(x, dtype)
    for i in (1, 0):
        extent, size, factor = sizes[i]
        scale = 1.0 / factor if factor else extent / size
        num, den, shift, taps = _aa_window(extent, size, scale, interp)
        axis = lead + i
        shape = list(b.shape(out))
        shape[axis] = size
        shape = (*shape, taps)
        bounds = {axis_var(j): m for j, m in enumerate(shape)}
        o, t = var(axis_var(axis)), var(axis_var(len(shape) - 1))
        lift = -(-max(-shift, 0) // den) if den else 0  # whole windows keep the floor positive
        weights, at = _aa_weights(b, extent, size, scale, interp, kernel, num, den, shift, lift,
                                  taps, dtype)
        index = axes(len(shape) - 1)
        if den is None:             # each window's start as torch computes it: a gather
            index[axis] = var(gather_var(0))
            values = b.gather(out, shape, index, [b.index_map(at, shape, [o, t])])
        else:
            index[axis] = mod(floordiv(o * num + shift + lift * den, den, bounds) - lift + t,
                              extent, bounds)
            values = b.index_map(out, shape, index)
        out = b.reduce(R.SUM, b.ew(E.MUL, values, b.index_map(weights, shape, [o, t])),
                       (len(shape) - 1,))
    return out


def _aa_weights(b: Builder, extent: int, out: int, scale: float, interp: int, kernel,
                num: int | None, den: int | None, shift: int | None, lift: int, taps: int,
                dtype: DType) -> tuple[str, str]:
    """(out, taps): tap t of output o's weight, 0 outside torch's window, normalized; and the
    position it reads (clamped into the axis), from (o*num + shift) // den or, without `den`,
    from torch's window start."""
    support = interp / 2 * scale if scale >= 1 else interp / 2
    invscale = 1.0 / scale if scale >= 1 else 1.0
    shape = (out, taps)
    ov, tv = b.iota(shape, 0), b.iota(shape, 1)
    center = b.ew(E.MUL, b.ew(E.ADD, b.cast(ov, dtype), 0.5), scale)
    lo = b.ew(E.MAX, b.cast(b.ew(E.FLOOR, b.ew(E.ADD, b.ew(E.SUB, center, support), 0.5)),
                            DType.I64), 0)
    hi = b.ew(E.MIN, b.cast(b.ew(E.FLOOR, b.ew(E.ADD, b.ew(E.ADD, center, support), 0.5)),
                            DType.I64), extent)
    start = lo if den is None else b.ew(
        E.SUB, floor_div(b, b.ew(E.ADD, b.ew(E.MUL, ov, num), shift + lift * den), den), lift)
    at = b.ew(E.ADD, start, tv)
    inside = b.ew(E.AND, b.ew(E.GE, at, lo), b.ew(E.LT, at, hi))
    arg = b.ew(E.MUL, b.ew(E.ADD, b.ew(E.SUB, b.cast(at, dtype), center), 0.5), invscale)
    w = b.ew(E.WHERE, inside, kernel(b, arg), 0.0)
    total = b.reduce(R.SUM, w, (1,), keepdim=True)
    return (b.ew(E.WHERE, b.ew(E.EQ, total, 0.0), 0.0, b.ew(E.DIV, w, total)),
            b.ew(E.MIN, at, extent - 1))


def _register_aa(name: str) -> None:
    @op(f"{name}.vec", opmath=True)
    def lower_vec(b, x, output_size, align_corners, scale_factors=None):
        return aa_resize(b, x, name, output_size, align_corners, scale_factors)

    @op(name, opmath=True)
    def lower_sizes(b, x, output_size, align_corners, *scales):
        given = [s for s in scales if s is not None]
        return aa_resize(b, x, name, output_size, align_corners, given or None)


for _name in _AA:
    _register_aa(_name)
