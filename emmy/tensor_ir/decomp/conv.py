"""Convolutions over 1, 2 or 3 spatial dimensions (stride, padding as numbers or 'same' /
'valid', dilation, groups, bias, unbatched inputs) and transposed convolutions.

A convolution is a window view of the input and a sum of products with the weight:

    out[n, co, o...] = sum over c, k... of x[n, g(co)*Cg + c, o*s + k*d - p] * w[co, c, k...]

with g(co) = co // (Cout / groups). The view is one IndexMap (pooling's window view, with the
channel of the output's group), padding a `where` that puts 0 outside the input. A transposed
convolution gathers instead of scattering: input position i contributes to output o through
window position k when o + p - k*d = i*s, so its view reads x at (o + p - k*d) / s where that
divides and lies inside the input, and 0 elsewhere. nn.Fold (col2im) is the same view with
the channel of each window position for a weight.
"""

from __future__ import annotations

from emmy.symbolic import Lin, floordiv, mod, var
from emmy.tensor_ir.builder import Builder
from emmy.tensor_ir.decomp.layout import along, squeeze, unsqueeze
from emmy.tensor_ir.decomp.pooling import _Dim, _ints, combine, floor_div, window_view
from emmy.tensor_ir.decomp.table import Decomp, Refused, registrar
from emmy.tensor_ir.ir import EwOp as E
from emmy.tensor_ir.ir import ReduceOp as R
from emmy.tensor_ir.ir import axis_var

OPS: dict[str, Decomp] = {}
op = registrar(OPS)


def _batched(b: Builder, x: str, n: int, name: str) -> tuple[str, bool]:
    """x with a batch axis (added for an unbatched (C, spatial...) input), and whether one was."""
    rank = b.rank(x)
    if rank == n + 2:
        return x, False
    if rank == n + 1:
        return unsqueeze(b, x, 0), True
    raise Refused(f"{name} takes an (N, C, spatial...) or (C, spatial...) input of rank {n + 2} "
                  f"or {n + 1}, got rank {rank}")


def _sum_of_products(b: Builder, view: str, weight: str, c_axis: int, bias, added: bool) -> str:
    """The output from the product's axes (n, co, o..., c, k...): the sum over c and k of
    view * weight, plus the bias per output channel, without the batch axis `_batched` added."""
    out = b.reduce(R.SUM, b.ew(E.MUL, view, weight), range(c_axis, b.rank(view)))
    if bias is not None:
        out = b.ew(E.ADD, out, along(b, bias, b.shape(out), 1))
    return squeeze(b, out, 0) if added else out


def _padding(padding, n: int, kernel, dilation, stride, name: str) -> list[tuple[int, int]]:
    """(left, right) padding per spatial dimension."""
    if isinstance(padding, str):
        if padding == "valid":
            return [(0, 0)] * n
        if padding != "same":
            raise Refused(f"{name}: padding {padding!r} (numbers, 'same' or 'valid')")
        if any(s != 1 for s in stride):
            raise Refused(f"{name}: padding='same' needs stride 1")
        # torch pads (d*(k-1)) // 2 on the left and the rest on the right
        return [(d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2)
                for k, d in zip(kernel, dilation)]
    return [(p, p) for p in _ints(padding, n, "padding")]


def conv(b: Builder, x: str, w: str, bias, n: int, name: str, stride=1, padding=0, dilation=1,
         groups=1) -> str:
    x, added = _batched(b, x, n, name)
    batch, cin, *extents = b.shape(x)
    cout, cg, *kernel = b.shape(w)
    if len(kernel) != n or groups <= 0 or cin != cg * groups or cout % groups:
        raise Refused(f"{name}: weight {list(b.shape(w))} with groups={groups} does not fit an "
                      f"input of {cin} channels")
    s = _ints(stride, n, "stride")
    d = _ints(dilation, n, "dilation")
    dims = []
    for extent, k, si, di, (left, right) in zip(extents, kernel, s, d,
                                                _padding(padding, n, kernel, d, s, name)):
        out = (extent + left + right - di * (k - 1) - 1) // si + 1
        if out <= 0:
            raise Refused(f"{name}: a kernel of {k} (dilation {di}) does not fit an input of "
                          f"{extent} with padding {left}+{right}")
        dims.append(_Dim(extent, out, k, si, 1, left, di))
    og = cout // groups
    # the product's axes: n, co, o_1..o_n, c, k_1..k_n
    shape = (batch, cout, *(dm.out for dm in dims), cg, *kernel)
    bounds = {axis_var(i): e for i, e in enumerate(shape)}
    c_axis = 2 + n
    channel = floordiv(var(axis_var(1)), og, bounds) * cg + var(axis_var(c_axis))
    view = window_view(b, x, shape, [var(axis_var(0)), channel], dims,
                       list(range(2, 2 + n)), list(range(c_axis + 1, c_axis + 1 + n)), 0)
    weight = b.index_map(w, shape, [var(axis_var(i)) for i in (1, c_axis,
                                                               *range(c_axis + 1, len(shape)))])
    return _sum_of_products(b, view, weight, c_axis, bias, added)


def _transposed_taps(b: Builder, shape, out_axis: int, window_axis: int, extents, s, p, d,
                     kernel) -> tuple[list[Lin], str]:
    """A transposed convolution's reads, over `shape` whose spatial output axes start at
    `out_axis` and window axes at `window_axis`: per spatial dimension the input position
    (o + p - k*d) / s, window axis j running over k = K-1-j; and the mask of where every one
    divides and lies inside the input."""
    bounds = {axis_var(i): e for i, e in enumerate(shape)}
    index: list[Lin] = []
    masks = []
    for i, (e, si, pi, di, k) in enumerate(zip(extents, s, p, d, kernel)):
        # k = K-1-j (flipped, so every coefficient below is positive: the emitted // and %
        # only see non-negative numbers); t = o + p - k*d, shifted by a multiple of s so that
        # it is never negative
        o, j = var(axis_var(out_axis + i)), var(axis_var(window_axis + i))
        shift = si * -(-(di * (k - 1)) // si)
        base = pi + shift - di * (k - 1)
        t = o + j * di + base
        index.append(mod(floordiv(t, si, bounds) - shift // si, e, bounds))
        ot, jt = b.iota(shape, out_axis + i), b.iota(shape, window_axis + i)
        tv = b.ew(E.ADD, b.ew(E.ADD, ot, b.ew(E.MUL, jt, di)), base)
        whole = floor_div(b, tv, si)
        q = b.ew(E.SUB, whole, shift // si)
        divides = b.ew(E.EQ, b.ew(E.SUB, tv, b.ew(E.MUL, whole, si)), 0)
        masks.append(b.ew(E.AND, divides, b.ew(E.AND, b.ew(E.GE, q, 0), b.ew(E.LT, q, e))))
    return index, combine(b, E.AND, masks)


@op("col2im")
def lower_col2im(b, x, output_size, kernel_size, dilation, padding, stride):
    """nn.Fold: each block's column of (C * kernel) values added back into the image, where
    blocks overlap summed: a transposed convolution whose weight picks channel (c, k...)."""
    x, added = _batched(b, x, 1, "col2im (nn.Fold)")
    n = 2
    size, kernel = _ints(output_size, n, "output_size"), _ints(kernel_size, n, "kernel_size")
    d, p, s = (_ints(v, n, name) for v, name in ((dilation, "dilation"), (padding, "padding"),
                                                 (stride, "stride")))
    batch, ck, blocks = b.shape(x)
    taps = kernel[0] * kernel[1]
    extents = [(o + 2 * pi - di * (k - 1) - 1) // si + 1
               for o, pi, di, k, si in zip(size, p, d, kernel, s)]
    if ck % taps or extents[0] * extents[1] != blocks or min(extents) <= 0:
        raise Refused(f"col2im: an input of {list(b.shape(x))} does not hold the blocks of "
                      f"kernel {kernel} over {size} (stride {s}, padding {p}, dilation {d})")
    c = ck // taps
    blocked = b.index_map(x, (batch, ck, *extents),
                          [var(axis_var(0)), var(axis_var(1)),
                           var(axis_var(2)) * extents[1] + var(axis_var(3))])
    shape = (batch, c, *size, *kernel)      # n, c, y, x, j_0, j_1
    index, inside = _transposed_taps(b, shape, 2, 4, extents, s, p, d, kernel)
    channel = var(axis_var(1)) * taps + (var(axis_var(4)) * -1 + (kernel[0] - 1)) * kernel[1] \
        + var(axis_var(5)) * -1 + (kernel[1] - 1)
    view = b.ew(E.WHERE, inside, b.index_map(blocked, shape, [var(axis_var(0)), channel,
                                                              *index]), 0)
    out = b.reduce(R.SUM, view, (4, 5))
    return squeeze(b, out, 0) if added else out


def conv_transpose(b: Builder, x: str, w: str, bias, n: int, name: str, stride=1, padding=0,
                   output_padding=0, groups=1, dilation=1) -> str:
    x, added = _batched(b, x, n, name)
    batch, cin, *extents = b.shape(x)
    wcin, og, *kernel = b.shape(w)
    if len(kernel) != n or groups <= 0 or wcin != cin or cin % groups:
        raise Refused(f"{name}: weight {list(b.shape(w))} with groups={groups} does not fit an "
                      f"input of {cin} channels")
    s = _ints(stride, n, "stride")
    p = _ints(padding, n, "padding")
    op_ = _ints(output_padding, n, "output_padding")
    d = _ints(dilation, n, "dilation")
    outs = [(e - 1) * si - 2 * pi + di * (k - 1) + oi + 1
            for e, si, pi, di, k, oi in zip(extents, s, p, d, kernel, op_)]
    if any(o <= 0 for o in outs) or any(oi >= max(si, di) for oi, si, di in zip(op_, s, d)):
        raise Refused(f"{name}: output size {outs} (output_padding must be below stride or "
                      "dilation)")
    cg, cout = cin // groups, og * groups
    # the product's axes: n, co, o_1..o_n, c, k_1..k_n
    shape = (batch, cout, *outs, cg, *kernel)
    bounds = {axis_var(i): e for i, e in enumerate(shape)}
    c_axis = 2 + n
    group = floordiv(var(axis_var(1)), og, bounds)
    taps, inside = _transposed_taps(b, shape, 2, c_axis + 1, extents, s, p, d, kernel)
    view = b.ew(E.WHERE, inside, b.index_map(x, shape, [var(axis_var(0)),
                                                        group * cg + var(axis_var(c_axis)),
                                                        *taps]), 0)
    # weight[c_in, co % og, K-1-j...] with c_in = group * cg + c
    weight = b.index_map(w, shape, [group * cg + var(axis_var(c_axis)),
                                    mod(var(axis_var(1)), og, bounds),
                                    *(var(axis_var(c_axis + 1 + i)) * -1 + (k - 1)
                                      for i, k in enumerate(kernel))])
    return _sum_of_products(b, view, weight, c_axis, bias, added)


# ---- the table ---------------------------------------------------------------------------------

def _register(n: int) -> None:
    @op(f"conv{n}d", f"conv{n}d.padding", opmath=True)
    def lower_conv(b, x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        return conv(b, x, weight, bias, n, f"conv{n}d", stride, padding, dilation, groups)

    @op(f"conv_transpose{n}d", f"conv_transpose{n}d.input", opmath=True)
    def lower_conv_transpose(b, x, weight, bias=None, stride=1, padding=0, output_padding=0,
                             groups=1, dilation=1):
        return conv_transpose(b, x, weight, bias, n, f"conv_transpose{n}d", stride, padding,
                              output_padding, groups, dilation)


for _n in (1, 2, 3):
    _register(_n)
