"""Pooling: max and average pools over 1, 2 or 3 trailing spatial dimensions (stride, padding,
dilation, ceil_mode, count_include_pad, divisor_override) and adaptive average and max pools.

A pool is a window view and a reduction. The view is one IndexMap to a tensor with the
window's axes appended (out[..., o1, o2, j1, j2] = x[..., o1*s1 + j1*d1 - p1, ...]); where a
window reaches into padding (or past the input, with ceil_mode or an adaptive pool's shorter
windows) the position is wrapped into range by a modulo, so the view stays in bounds, and a
`where` over the positions (Iota arithmetic) puts the reduction's identity there: -inf for max,
0 for a sum. An average divides by the window's count as torch counts it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from emmy.dtypes import DType
from emmy.symbolic import Lin, floordiv, mod, var
from emmy.tensor_ir.builder import Builder
from emmy.tensor_ir.decomp.table import Decomp, Refused, registrar
from emmy.tensor_ir.ir import EwOp as E
from emmy.tensor_ir.ir import ReduceOp as R
from emmy.tensor_ir.ir import axis_var

OPS: dict[str, Decomp] = {}
op = registrar(OPS)


@dataclass(frozen=True)
class _Dim:
    """One spatial dimension of a pool: input extent, output extent, window extent, and the
    window's first input position for output o as start(o) = (o*num) // den - pad (a regular
    pool: num = stride, den = 1; an adaptive one: num = extent, den = output extent)."""

    extent: int
    out: int
    window: int
    num: int
    den: int = 1
    pad: int = 0
    dilation: int = 1

    def start(self, o: Lin, bounds) -> Lin:
        return floordiv(o * self.num, self.den, bounds) - self.pad

    def begin(self, b: Builder, o: str) -> str:
        """Start of output o's adaptive window: floor(o*extent / out)."""
        return floor_div(b, b.ew(E.MUL, o, self.extent), self.out)

    def end(self, b: Builder, o: str) -> str:
        """End (exclusive) of output o's adaptive window: ceil((o+1)*extent / out)."""
        return floor_div(b, b.ew(E.ADD, b.ew(E.MUL, b.ew(E.ADD, o, 1), self.extent), self.out - 1),
                     self.out)

    @property
    def exact(self) -> bool:
        """Every window lies inside the input: no position needs a mask."""
        if self.den != 1:
            return self.extent % self.out == 0
        last = (self.out - 1) * self.num + (self.window - 1) * self.dilation - self.pad
        return self.pad == 0 and last < self.extent


def combine(b: Builder, op: E, xs: list[str]) -> str:
    """xs[0] op xs[1] op ...: the masks of several axes and-ed, their counts multiplied."""
    out = xs[0]
    for x in xs[1:]:
        out = b.ew(op, out, x)
    return out


def floor_div(b: Builder, x: str, d: int) -> str:
    """Floor division of a non-negative integer tensor by a positive constant, in integers
    (through float32: exact below 2**24, far beyond any index here)."""
    return b.cast(b.ew(E.FLOOR, b.ew(E.DIV, b.cast(x, DType.F32), float(d))), DType.I64)


def _window(b: Builder, x: str, dims: list[_Dim], fill) -> str:
    """x viewed as [..., outputs..., windows...], `fill` where a window leaves the input (or,
    for an adaptive pool, past the end of output o's window)."""
    shape = b.shape(x)
    batch = len(shape) - len(dims)
    out_shape = (*shape[:batch], *(d.out for d in dims), *(d.window for d in dims))
    spatial = range(batch, batch + len(dims))
    return window_view(b, x, out_shape, [var(axis_var(i)) for i in range(batch)], dims,
                       list(spatial), [i + len(dims) for i in spatial], fill)


def window_view(b: Builder, x: str, out_shape, lead: list[Lin], dims: list[_Dim],
                o_axes: list[int], k_axes: list[int], fill) -> str:
    """out[...] = x[*lead, p_1, ..., p_n]: x's leading axes at `lead` (expressions over the
    output's axes), its trailing spatial axis i at output o_i's window start plus window
    position k_i (axes o_axes[i], k_axes[i] of `out_shape`) times the dilation; `fill` where
    that position is outside x (padding), or past output o's window in an adaptive pool."""
    bounds = {axis_var(i): n for i, n in enumerate(out_shape)}
    index = list(lead)
    for d, oa, ka in zip(dims, o_axes, k_axes):
        pos = d.start(var(axis_var(oa)), bounds) + var(axis_var(ka)) * d.dilation
        if not d.exact:      # wrapped into range; the mask below hides the wrapped positions
            pos = mod(pos, d.extent, bounds)
        index.append(pos)
    view = b.index_map(x, out_shape, index)
    masks = []
    for d, oa, ka in zip(dims, o_axes, k_axes):
        if d.exact:
            continue
        o, j = b.iota(out_shape, oa), b.iota(out_shape, ka)
        if d.den != 1:                                    # adaptive: j < end(o) - start(o)
            start = d.begin(b, o)
            masks.append(b.ew(E.LT, j, b.ew(E.SUB, d.end(b, o), start)))
            continue
        pos = b.ew(E.SUB, b.ew(E.ADD, b.ew(E.MUL, o, d.num), b.ew(E.MUL, j, d.dilation)), d.pad)
        masks.append(b.ew(E.AND, b.ew(E.GE, pos, 0), b.ew(E.LT, pos, d.extent)))
    return b.ew(E.WHERE, combine(b, E.AND, masks), view, fill) if masks else view


def _window_axes(b: Builder, x: str, dims: list[_Dim]) -> tuple[int, ...]:
    rank = b.rank(x)
    return tuple(range(rank - len(dims), rank))


def _spatial(x_rank: int, n: int, name: str) -> None:
    if x_rank not in (n + 1, n + 2):
        raise Refused(f"{name} takes a ({'N, ' if n else ''}C, spatial...) input of rank "
                      f"{n + 1} or {n + 2}, got rank {x_rank}")


def _ints(value, n: int, what: str, default=None) -> tuple[int, ...]:
    if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
        if default is None:
            raise Refused(f"{what} is required")
        return default
    if isinstance(value, int):
        return (value,) * n
    value = tuple(int(v) for v in value)
    if len(value) == 1:
        return value * n
    if len(value) != n:
        raise Refused(f"{what} has {len(value)} values for {n} spatial dimension(s)")
    return value


def _out_extent(extent: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """torch's pooling output size (with its rule that the last window starts inside)."""
    span = extent + 2 * p - d * (k - 1) - 1
    out = (span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= extent + p:
        out -= 1
    return out


def _dims(b: Builder, x: str, n: int, name: str, kernel_size, stride, padding, dilation,
          ceil_mode) -> list[_Dim]:
    _spatial(b.rank(x), n, name)
    k = _ints(kernel_size, n, "kernel_size")
    s = _ints(stride, n, "stride", default=k)
    p = _ints(padding, n, "padding")
    d = _ints(dilation, n, "dilation")
    extents = b.shape(x)[-n:]
    dims = []
    for extent, ki, si, pi, di in zip(extents, k, s, p, d):
        if ki <= 0 or si <= 0 or di <= 0 or pi < 0 or 2 * pi > ki:
            raise Refused(f"{name}: kernel {ki}, stride {si}, padding {pi}, dilation {di} "
                          "(padding must be at most half the kernel, the rest positive)")
        out = _out_extent(extent, ki, si, pi, di, bool(ceil_mode))
        if out <= 0:
            raise Refused(f"{name}: a window of {ki} (dilation {di}) does not fit an input of "
                          f"{extent} with padding {pi}")
        dims.append(_Dim(extent, out, ki, si, 1, pi, di))
    return dims


def max_pool(b: Builder, x: str, n: int, name: str, kernel_size, stride=(), padding=0,
             dilation=1, ceil_mode=False) -> str:
    dims = _dims(b, x, n, name, kernel_size, stride, padding, dilation, ceil_mode)
    view = _window(b, x, dims, _lowest(b.dtype(x)))
    return b.reduce(R.MAX, view, _window_axes(b, view, dims))


def _lowest(dtype: DType) -> float | int:
    """What a max pool's padding reads as: no value of the type is below it."""
    return -math.inf if dtype.is_float else dtype.int_range[0]


def avg_pool(b: Builder, x: str, n: int, name: str, kernel_size, stride=(), padding=0,
             ceil_mode=False, count_include_pad=True, divisor_override=None) -> str:
    dims = _dims(b, x, n, name, kernel_size, stride, padding, 1, ceil_mode)
    view = _window(b, x, dims, 0)
    total = b.reduce(R.SUM, view, _window_axes(b, view, dims))
    if divisor_override:
        return b.ew(E.DIV, total, float(divisor_override))
    return b.ew(E.DIV, total, _count(b, b.shape(total), dims, bool(count_include_pad)))


def _count(b: Builder, shape: tuple[int, ...], dims: list[_Dim], include_pad: bool):
    """How many positions torch divides output o's window sum by: the window clipped to the
    padded input (count_include_pad) or to the input; a number when it is the same for every
    output, else a tensor of `shape`."""
    per_dim = []
    for d in dims:
        sizes = []
        for o in range(d.out):
            start = o * d.num - d.pad
            end = min(start + d.window, d.extent + d.pad)
            if not include_pad:
                start, end = max(start, 0), min(end, d.extent)
            sizes.append(end - start)
        per_dim.append(sizes)
    if all(len(set(sizes)) == 1 for sizes in per_dim):
        return float(math.prod(sizes[0] for sizes in per_dim))
    batch = len(shape) - len(dims)
    sizes = []
    for i, d in enumerate(dims):
        o = b.iota(shape, batch + i)
        start = b.ew(E.SUB, b.ew(E.MUL, o, d.num), d.pad)
        end = b.ew(E.MIN, b.ew(E.ADD, start, d.window), d.extent + d.pad)
        if not include_pad:
            start, end = b.ew(E.MAX, start, 0), b.ew(E.MIN, end, d.extent)
        sizes.append(b.ew(E.SUB, end, start))
    return b.cast(combine(b, E.MUL, sizes), DType.F32)


def adaptive_dims(b: Builder, x: str, n: int, name: str, output_size) -> list[_Dim]:
    _spatial(b.rank(x), n, name)
    extents = b.shape(x)[-n:]
    outs = [e if o is None else int(o) for e, o in
            zip(extents, output_size if isinstance(output_size, (list, tuple))
                else (output_size,) * n)]
    if len(outs) == 1 and n > 1:
        outs *= n
    dims = []
    for extent, out in zip(extents, outs):
        if out <= 0:
            raise Refused(f"{name}: output size {out}")
        # output o pools [floor(o*E/O), ceil((o+1)*E/O)): at most this many positions
        window = max(-(-(o + 1) * extent // out) - (o * extent // out) for o in range(out))
        dims.append(_Dim(extent, out, window, extent, out))
    return dims


def adaptive_avg(b: Builder, x: str, n: int, name: str, output_size) -> str:
    dims = adaptive_dims(b, x, n, name, output_size)
    view = _window(b, x, dims, 0)
    total = b.reduce(R.SUM, view, _window_axes(b, view, dims))
    if all(d.exact for d in dims):
        return b.ew(E.DIV, total, float(math.prod(d.window for d in dims)))
    shape, batch = b.shape(total), b.rank(total) - len(dims)
    sizes = []
    for i, d in enumerate(dims):
        o = b.iota(shape, batch + i)
        sizes.append(b.ew(E.SUB, d.end(b, o), d.begin(b, o)))
    return b.ew(E.DIV, total, b.cast(combine(b, E.MUL, sizes), DType.F32))


def adaptive_max(b: Builder, x: str, n: int, name: str, output_size) -> tuple[str, str]:
    """The largest value of each adaptive window and its input position, flat over the
    spatial dimensions (h * W + w), the first one where several tie; NaN wins, as in torch."""
    dims = adaptive_dims(b, x, n, name, output_size)
    view = _window(b, x, dims, _lowest(b.dtype(x)))
    axes = _window_axes(b, view, dims)
    values = b.reduce(R.MAX, view, axes)
    j = b.reduce(R.ARGMAX, view, axes)            # row-major over the window's axes
    shape, batch = b.shape(values), b.rank(values) - n
    index, inner = None, math.prod(d.window for d in dims)
    for i, d in enumerate(dims):
        inner //= d.window
        o = b.iota(shape, batch + i)
        start = d.begin(b, o)
        step = b.ew(E.SUB, floor_div(b, j, inner), b.ew(E.MUL, floor_div(b, j, inner * d.window),
                                                         d.window))
        pos = b.ew(E.ADD, start, step)
        index = pos if index is None else b.ew(E.ADD, b.ew(E.MUL, index, d.extent), pos)
    return values, index


# ---- the table ---------------------------------------------------------------------------------

def _register(n: int) -> None:
    @op(f"max_pool{n}d")
    def lower_max_pool(b, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        return max_pool(b, x, n, f"max_pool{n}d", kernel_size, stride, padding, dilation,
                        ceil_mode)

    @op(f"avg_pool{n}d", opmath=True)
    def lower_avg_pool(b, x, kernel_size, stride=(), padding=0, ceil_mode=False,
                       count_include_pad=True, divisor_override=None):
        return avg_pool(b, x, n, f"avg_pool{n}d", kernel_size, stride, padding, ceil_mode,
                        count_include_pad, divisor_override)

    @op(f"adaptive_avg_pool{n}d", opmath=True)
    def lower_adaptive_avg_pool(b, x, output_size):
        return adaptive_avg(b, x, n, f"adaptive_avg_pool{n}d", output_size)

    if n > 1:   # torch's adaptive_max_pool1d is the 2-d one over a unit height
        @op(f"adaptive_max_pool{n}d")
        def lower_adaptive_max_pool(b, x, output_size):
            return adaptive_max(b, x, n, f"adaptive_max_pool{n}d", output_size)


for _n in (1, 2, 3):
    _register(_n)
