"""Matrix products, always in one form: index-map both operands to the product shape
[batch..., m, n, k] (the contracted axis last), multiply elementwise, sum over the last axis.

So `nn.Linear(3, 2, bias=False)(x)`, `x @ w.t()` and `torch.matmul(x, w.T)` reach the same
Tensor IR. Half inputs are multiplied and summed in f32 (opmath), then cast back.
"""

from __future__ import annotations

import math
import string

from emmy.dtypes import DType
from emmy.symbolic import Lin, var
from emmy.tensor_ir.builder import Builder, broadcast_shapes
from emmy.tensor_ir.decomp.layout import reshape, transpose
from emmy.tensor_ir.decomp.table import Decomp, Refused, registrar
from emmy.tensor_ir.ir import EwOp as E
from emmy.tensor_ir.ir import ReduceOp as R
from emmy.tensor_ir.ir import axis_var, gather_var

OPS: dict[str, Decomp] = {}
op = registrar(OPS)


def matmul(b: Builder, x: str, y: str) -> str:
    """torch.matmul: x [..., m, k] or [k], y [..., k, n] or [k]; batch dimensions broadcast."""
    xs, ys = b.shape(x), b.shape(y)
    batch = broadcast_shapes(xs[:-2], ys[:-2])
    m = xs[-2:-1] if len(xs) >= 2 else ()
    n = ys[-1:] if len(ys) >= 2 else ()
    shape = batch + m + n + xs[-1:]
    k = _axis(len(shape) - 1)
    x_index = _batch_index(xs[:-2], len(batch)) + [_axis(len(batch))] * len(m) + [k]
    y_index = _batch_index(ys[:-2], len(batch)) + [k] + [_axis(len(batch) + len(m))] * len(n)
    product = b.ew(E.MUL, b.index_map(x, shape, x_index), b.index_map(y, shape, y_index))
    return b.reduce(R.SUM, product, (len(shape) - 1,))


def _axis(i: int) -> Lin:
    return var(axis_var(i))


def _batch_index(dims, rank: int) -> list:
    """Right-aligned batch axes of an operand inside `rank` broadcast batch axes."""
    lead = rank - len(dims)
    return [_axis(lead + j) if n != 1 else 0 for j, n in enumerate(dims)]


def scaled(b: Builder, x: str, factor) -> str:
    return b.ew(E.MUL, x, factor)


@op("mm", "bmm", "matmul", "mv", "dot", opmath=True)
def lower_matmul(b, x, y):
    return matmul(b, x, y)


@op("_scaled_mm")
def lower_scaled_mm(b, x, y, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
                    use_fast_accum=False):
    """torch._scaled_mm, the fp8 product of torchao's float8 layers and Transformer Engine:
    x @ y accumulated in f32, times scale_a (one, or one per row of x) and scale_b (one, or one
    per column of y), plus bias, in out_dtype (x's type by default). An 8-bit float is exactly
    a bf16 (fewer mantissa bits, its exponents within bf16's), so the operands widen through
    bf16 and the product takes bf16 tensor cores with f32 accumulation: exact operands, not
    Hopper's fp8 instructions."""
    if scale_result is not None:
        raise Refused("_scaled_mm with scale_result")

    def wide(t):
        if b.dtype(t) in (DType.F8E4M3, DType.F8E5M2):
            t = b.cast(t, DType.BF16)
        return b.cast(t, DType.F32)

    out = matmul(b, wide(x), wide(y))
    out = b.ew(E.MUL, b.ew(E.MUL, out, b.cast(scale_a, DType.F32)), b.cast(scale_b, DType.F32))
    if bias is not None:
        out = b.ew(E.ADD, out, b.cast(bias, DType.F32))
    return b.cast(out, out_dtype or b.dtype(x))


@op("inner", opmath=True)
def lower_inner(b, x, y):
    """torch.inner: x [..a, k] and y [..b, k] to [..a, ..b], summed over their last axes (not
    matmul's: y's last axis, not its second to last, is contracted); a 0-d operand scales."""
    xs, ys = b.shape(x), b.shape(y)
    if not xs or not ys:
        return b.ew(E.MUL, x, y)
    shape = xs[:-1] + ys[:-1] + xs[-1:]
    k = _axis(len(shape) - 1)
    xi = [_axis(i) for i in range(len(xs) - 1)] + [k]
    yi = [_axis(len(xs) - 1 + i) for i in range(len(ys) - 1)] + [k]
    product = b.ew(E.MUL, b.index_map(x, shape, xi), b.index_map(y, shape, yi))
    return b.reduce(R.SUM, product, (len(shape) - 1,))


@op("linear", opmath=True)
def lower_linear(b, x, weight, bias=None):
    """x @ weight.T (+ bias): torch stores the weight as [out, in]."""
    out = matmul(b, x, transpose(b, weight, 0, 1) if b.rank(weight) == 2 else weight)
    return out if bias is None else b.ew(E.ADD, out, bias)


@op("addmm", "baddbmm", "addmv", opmath=True)
def lower_addmm(b, bias, x, y, *, beta=1, alpha=1):
    """alpha * (x @ y) + beta * bias"""
    return b.ew(E.ADD, scaled(b, matmul(b, x, y), alpha), scaled(b, bias, beta))


@op("addbmm", opmath=True)
def lower_addbmm(b, bias, x, y, *, beta=1, alpha=1):
    """alpha * (the sum over the batch of x[i] @ y[i]) + beta * bias"""
    return b.ew(E.ADD, scaled(b, lower_einsum(b, "bij,bjk->ik", (x, y)), alpha),
                scaled(b, bias, beta))


@op("bilinear", opmath=True)
def lower_bilinear(b, x1, x2, weight, bias=None):
    """out[..., o] = x1[..., i] weight[o, i, j] x2[..., j] (+ bias[o]), one product over i and
    j (nn.Bilinear)."""
    lead = broadcast_shapes(b.shape(x1)[:-1], b.shape(x2)[:-1])
    rows = math.prod(lead)
    flat = [reshape(b, b.broadcast_to(x, (*lead, b.shape(x)[-1])), (rows, b.shape(x)[-1]))
            for x in (x1, x2)]
    out = reshape(b, lower_einsum(b, "ni,oij,nj->no", (flat[0], weight, flat[1])),
                  (*lead, b.shape(weight)[0]))
    return out if bias is None else b.ew(E.ADD, out, bias)


@op("cdist", opmath=True)
def lower_cdist(b, x1, x2, p=2.0, compute_mode=None):
    """The p-norm distance between each row of x1 (.., P, M) and each of x2 (.., R, M):
    (.., P, R), from the differences themselves (torch may use a product for p = 2, which
    loses digits where points are close). p = 0 counts the coordinates that differ, p = inf
    takes the largest."""
    lead = broadcast_shapes(b.shape(x1)[:-2], b.shape(x2)[:-2])
    (p1, m), (r2, _) = b.shape(x1)[-2:], b.shape(x2)[-2:]
    shape = (*lead, p1, r2, m)
    batch = [var(axis_var(i)) for i in range(len(lead))]
    i, j, k = (var(axis_var(len(lead) + t)) for t in range(3))
    a = b.index_map(b.broadcast_to(x1, (*lead, p1, m)), shape, [*batch, i, k])
    c = b.index_map(b.broadcast_to(x2, (*lead, r2, m)), shape, [*batch, j, k])
    return _distance(b, a, c, p)


def _distance(b: Builder, a: str, c: str, p: float) -> str:
    """The p-norm of a - c over their last axis, from the differences."""
    diff = b.ew(E.ABS, b.ew(E.SUB, a, c))
    last = (b.rank(diff) - 1,)
    if p == 0:
        return b.reduce(R.SUM, b.cast(b.ew(E.NE, diff, 0.0), b.dtype(diff)), last)
    if p == float("inf"):
        return b.reduce(R.MAX, diff, last)
    if p == 1:
        return b.reduce(R.SUM, diff, last)
    if p == 2:
        return b.ew(E.SQRT, b.reduce(R.SUM, b.ew(E.MUL, diff, diff), last))
    return b.ew(E.POW, b.reduce(R.SUM, b.ew(E.POW, diff, float(p)), last), 1.0 / p)


@op("_pdist_forward")
def lower_pdist(b, x, p=2.0):
    """F.pdist: the p-norm distance of each pair of rows i < j of x (n, M), pairs in row-major
    order of the upper triangle: n (n - 1) / 2 of them. Pair k's first row i is the count of
    rows r >= 1 whose pairs start at or before k (row r's start at r n - r (r + 1) / 2), its
    second j = k - start(i) + i + 1; both rows are gathered, and the distance taken from their
    differences as cdist's."""
    if b.rank(x) != 2:
        raise Refused(f"pdist of a {b.rank(x)}-d tensor (torch takes 2-d)")
    if p < 0:
        raise Refused(f"p={p}: pdist takes p >= 0")
    n, m = b.shape(x)
    pairs = n * (n - 1) // 2
    if pairs == 0:
        return b.full((0,), 0, b.dtype(x))

    def start(r):                    # the first pair of row r
        return b.ew(E.SUB, b.ew(E.MUL, r, n), b.ew(E.DIV, b.ew(E.MUL, r, b.ew(E.ADD, r, 1)), 2))

    wide = (pairs, n)
    r, k = b.iota(wide, 1), b.iota(wide, 0)
    counted = b.ew(E.AND, b.ew(E.GE, r, 1), b.ew(E.LE, start(r), k))
    i = b.reduce(R.SUM, b.cast(counted, DType.I64), (1,))
    j = b.ew(E.ADD, b.ew(E.ADD, b.ew(E.SUB, b.iota((pairs,), 0), start(i)), i), 1)
    rows = [b.gather(x, (pairs, m), [var(gather_var(0)), var(axis_var(1))],
                     [b.index_map(at, (pairs, m), [var(axis_var(0))])]) for at in (i, j)]
    return _distance(b, *rows, p)


@op("einsum", opmath=True)
def lower_einsum(b, equation, tensors, path=None):
    """One product over every index letter (output letters first, contracted ones last); an
    ellipsis stands for the leading axes it covers (the ranks are static), broadcast across
    the operands as torch broadcasts them, and so does an axis of extent 1."""
    inputs, output = _parse_einsum(equation, [b.rank(t) for t in tensors])
    if len(inputs) != len(tensors):
        raise Refused(f"{equation!r} names {len(inputs)} operands")
    extent: dict[str, int] = {}
    for subs, t in zip(inputs, tensors):
        if len(subs) != b.rank(t):
            raise Refused(f"{equation!r}: {subs!r} for an operand of rank {b.rank(t)}")
        for letter, n in zip(subs, b.shape(t)):
            if extent.setdefault(letter, n) != n and 1 not in (extent[letter], n):
                raise Refused(f"{equation!r}: extents {extent[letter]} and {n} of {letter!r}")
            extent[letter] = max(extent[letter], n)
    contracted = [c for c in dict.fromkeys("".join(inputs)) if c not in output]
    letters = list(output) + contracted
    shape = [extent[c] for c in letters]
    mapped = [b.index_map(t, shape, [_axis(letters.index(c)) if n == extent[c] else 0
                                     for c, n in zip(subs, b.shape(t))])
              for subs, t in zip(inputs, tensors)]
    product = mapped[0]
    for other in mapped[1:]:
        product = b.ew(E.MUL, product, other)
    return b.reduce(R.SUM, product, range(len(output), len(letters)))


def _parse_einsum(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """(each operand's letters, the output's), an ellipsis written out as letters the
    equation does not use, right-aligned across the operands."""
    equation = equation.replace(" ", "")
    lhs, arrow, out = equation.partition("->")
    inputs = lhs.split(",")
    if any(c not in string.ascii_letters + "." for c in "".join(inputs) + out) or \
            any(x.count("...") != x.count(".") / 3 or x.count("...") > 1 for x in inputs + [out]):
        raise Refused(f"cannot parse {equation!r}")
    spare = [c for c in string.ascii_letters if c not in equation]
    covered = [r - (len(x) - 3) if "..." in x else 0 for x, r in zip(inputs, ranks)]
    width = max(covered, default=0)
    if any(n < 0 for n in covered) or width > len(spare):
        raise Refused(f"cannot parse {equation!r} for operands of ranks {ranks}")
    dots = "".join(spare[:width])
    inputs = [x.replace("...", dots[width - n:]) for x, n in zip(inputs, covered)]
    if not arrow:  # implicit output: the ellipsis, then the letters used once, in order
        letters = "".join(inputs)
        out = dots + "".join(c for c in sorted(set(letters))
                             if letters.count(c) == 1 and c not in dots)
    else:
        out = out.replace("...", dots)
    return inputs, out
