"""Reductions: sum, mean, prod, max/min (values and indices), argmax/argmin, var/std, any/all,
and the k largest or smallest elements (topk) as k rounds of a max and an argmin, or past
TOPK_LIMIT (TOPK_SMALLEST_LIMIT) of them by selecting the k-th largest a bit of its key at a
time (_kth_key), by ranking every element (a count of the elements before it) or by sorting,
whichever costs less; kthvalue, median and nanmedian by rounds or selection; sort by rounds,
ranks or merging sorted runs (_merge_sorted); mode by counting; searchsorted as a count.

`dim=None` or an empty dim list means every dimension, as in torch.
"""

from __future__ import annotations

import math

from emmy.dtypes import DType
from emmy.symbolic import var
from emmy.tensor_ir.builder import Builder
from emmy.tensor_ir.decomp.layout import axes, cat, norm_dim, norm_dims, reshape, select, \
    slice_axis, unsqueeze
from emmy.tensor_ir.decomp.table import Decomp, Refused, registrar
from emmy.tensor_ir.ir import EwOp as E
from emmy.tensor_ir.ir import ReduceOp as R
from emmy.tensor_ir.ir import axis_var, gather_var

OPS: dict[str, Decomp] = {}
op = registrar(OPS)


def accumulating(b: Builder, x: str, dtype: DType | None) -> str:
    """The input of a sum or product: `dtype` if given; integers and booleans widen to i64."""
    if dtype is not None:
        return b.cast(x, dtype)
    return x if b.dtype(x).is_float else b.cast(x, DType.I64)


def total(b: Builder, x: str, dims=None, keepdim=False) -> str:
    """Sum over `dims`."""
    return b.reduce(R.SUM, x, norm_dims(dims, b.rank(x)), keepdim)


def count(b: Builder, x: str, dims=None) -> int:
    return math.prod(b.shape(x)[d] for d in norm_dims(dims, b.rank(x)))


def mean(b: Builder, x: str, dims=None, keepdim=False) -> str:
    """Sum, then divide by the number of elements summed."""
    return b.ew(E.DIV, total(b, x, dims, keepdim), float(count(b, x, dims)))


def variance(b: Builder, x: str, dims=None, correction=1, keepdim=False) -> str:
    """mean((x - mean(x))^2), with `correction` subtracted from the count (Bessel's when 1)."""
    centered = b.ew(E.SUB, x, mean(b, x, dims, keepdim=True))
    squares = total(b, b.ew(E.MUL, centered, centered), dims, keepdim)
    return b.ew(E.DIV, squares, float(max(count(b, x, dims) - correction, 0)))


def extreme(b: Builder, reduce_op: R, x: str, dims=None, keepdim=False) -> str:
    return b.reduce(reduce_op, x, norm_dims(dims, b.rank(x)), keepdim)


# ---- sums, means, products ---------------------------------------------------------------------

@op("sum", opmath=True)
def lower_sum_all(b, x, *, dtype=None):
    return total(b, accumulating(b, x, dtype))


@op("sum.dim_IntList", opmath=True)
def lower_sum(b, x, dim, keepdim=False, *, dtype=None):
    return total(b, accumulating(b, x, dtype), dim, keepdim)


@op("mean", opmath=True)
def lower_mean_all(b, x, *, dtype=None):
    return mean(b, b.cast(x, dtype) if dtype else x)


@op("mean.dim", opmath=True)
def lower_mean(b, x, dim, keepdim=False, *, dtype=None):
    return mean(b, b.cast(x, dtype) if dtype else x, dim, keepdim)


@op("prod", opmath=True)
def lower_prod_all(b, x, *, dtype=None):
    return b.reduce(R.PROD, accumulating(b, x, dtype), range(b.rank(x)))


@op("prod.dim_int", opmath=True)
def lower_prod(b, x, dim, keepdim=False, *, dtype=None):
    return b.reduce(R.PROD, accumulating(b, x, dtype), norm_dims(dim, b.rank(x)), keepdim)


# ---- variance ----------------------------------------------------------------------------------

_SEGMENT = {"sum": (R.SUM, 0.0), "mean": (R.SUM, 0.0), "prod": (R.PROD, 1.0),
            "max": (R.MAX, -math.inf), "min": (R.MIN, math.inf), "amax": (R.MAX, -math.inf),
            "amin": (R.MIN, math.inf)}


@op("segment_reduce", opmath=True)
def lower_segment_reduce(b, data, reduce, *, lengths=None, indices=None, offsets=None, axis=0,
                         unsafe=False, initial=None):
    """torch.segment_reduce (PyG's pooling over a graph batch's `ptr`): segment s of `data`
    along `axis` is its rows offsets[s] <= j < offsets[s + 1] (or the running sum of
    `lengths`), with a batch of offsets per leading index. The bounds are values: each
    segment reduces every row, the others masked to the reduction's identity (an empty
    segment gives it: 0, 1, -inf, inf; its mean 0 / 0 = NaN, as torch), so the work is
    segments x rows. `initial` takes part in each segment's reduction."""
    if reduce not in _SEGMENT or indices is not None or (lengths is None) == (offsets is None):
        raise Refused("segment_reduce takes sum, mean, prod, max, min, amax or amin, and "
                      "lengths or offsets")
    if initial is not None and reduce == "mean":
        raise Refused("segment_reduce's mean with an initial value")
    axis = norm_dim(axis, b.rank(data))
    shape = b.shape(data)
    bounds = offsets if offsets is not None else lengths
    if b.rank(bounds) != axis + 1 or b.shape(bounds)[:axis] != shape[:axis]:
        raise Refused(f"segment_reduce's {'offsets' if offsets is not None else 'lengths'} of "
                      f"shape {b.shape(bounds)} for data of shape {shape} along axis {axis}")
    if offsets is not None:
        segments = b.shape(offsets)[axis] - 1
        lead = [var(axis_var(i)) for i in range(axis + 1)]
        edge = shape[:axis] + (segments,)
        starts = b.index_map(offsets, edge, lead)
        ends = b.index_map(offsets, edge, lead[:-1] + [lead[-1] + 1])
    else:
        segments = b.shape(lengths)[axis]
        starts = b.scan(R.SUM, lengths, axis, exclusive=True)
        ends = b.ew(E.ADD, starts, lengths)
    rows, rest = shape[axis], shape[axis + 1:]
    big = shape[:axis] + (segments, rows) + rest
    spread = [var(axis_var(i)) for i in range(axis)] + \
        [var(axis_var(i + 1)) for i in range(axis, len(shape))]
    values = b.index_map(data, big, spread)
    edges = [var(axis_var(i)) for i in range(axis + 1)]
    position = b.iota(big, axis + 1)
    inside = b.ew(E.AND, b.ew(E.GE, position, b.index_map(starts, big, edges)),
                  b.ew(E.LT, position, b.index_map(ends, big, edges)))
    op_, identity = _SEGMENT[reduce]
    out = b.reduce(op_, b.ew(E.WHERE, inside, values, identity), [axis + 1])
    if reduce == "mean":
        size = b.cast(b.ew(E.SUB, ends, starts), b.dtype(out))
        return b.ew(E.DIV, out, b.index_map(size, b.shape(out), edges))
    if initial is not None:
        combine = {R.SUM: E.ADD, R.PROD: E.MUL, R.MAX: E.MAX, R.MIN: E.MIN}[op_]
        out = b.ew(combine, out, initial)
    return out


@op("var", "var.dim", opmath=True)
def lower_var(b, x, dim=None, unbiased=True, keepdim=False):
    if isinstance(dim, bool):  # var(x, unbiased)
        dim, unbiased = None, dim
    return variance(b, x, dim, int(unbiased), keepdim)


@op("var.correction", opmath=True)
def lower_var_correction(b, x, dim=None, *, correction=None, keepdim=False):
    return variance(b, x, dim, 1 if correction is None else correction, keepdim)


@op("std", "std.dim", opmath=True)
def lower_std(b, x, dim=None, unbiased=True, keepdim=False):
    return b.ew(E.SQRT, lower_var(b, x, dim, unbiased, keepdim))


@op("std.correction", opmath=True)
def lower_std_correction(b, x, dim=None, *, correction=None, keepdim=False):
    return b.ew(E.SQRT, lower_var_correction(b, x, dim, correction=correction, keepdim=keepdim))


@op("var_mean", "var_mean.dim", opmath=True)
def lower_var_mean(b, x, dim=None, unbiased=True, keepdim=False):
    if isinstance(dim, bool):  # var_mean(x, unbiased)
        dim, unbiased = None, dim
    return (variance(b, x, dim, int(unbiased), keepdim),
            mean(b, x, norm_dims(dim, b.rank(x)), keepdim))


@op("var_mean.correction", opmath=True)
def lower_var_mean_correction(b, x, dim=None, *, correction=None, keepdim=False):
    return (variance(b, x, dim, 1 if correction is None else correction, keepdim),
            mean(b, x, norm_dims(dim, b.rank(x)), keepdim))


@op("std_mean", "std_mean.dim", opmath=True)
def lower_std_mean(b, x, dim=None, unbiased=True, keepdim=False):
    var, avg = lower_var_mean(b, x, dim, unbiased, keepdim)
    return b.ew(E.SQRT, var), avg


@op("std_mean.correction", opmath=True)
def lower_std_mean_correction(b, x, dim=None, *, correction=None, keepdim=False):
    var, avg = lower_var_mean_correction(b, x, dim, correction=correction, keepdim=keepdim)
    return b.ew(E.SQRT, var), avg


# ---- max / min -----------------------------------------------------------------------------------

@op("amax")
def lower_amax(b, x, dim=(), keepdim=False):
    return extreme(b, R.MAX, x, dim, keepdim)


@op("amin")
def lower_amin(b, x, dim=(), keepdim=False):
    return extreme(b, R.MIN, x, dim, keepdim)


@op("max")
def lower_max_all(b, x):
    return extreme(b, R.MAX, x)


@op("min")
def lower_min_all(b, x):
    return extreme(b, R.MIN, x)


@op("max.dim")
def lower_max_dim(b, x, dim, keepdim=False):
    return extreme(b, R.MAX, x, dim, keepdim), extreme(b, R.ARGMAX, x, dim, keepdim)


@op("min.dim")
def lower_min_dim(b, x, dim, keepdim=False):
    return extreme(b, R.MIN, x, dim, keepdim), extreme(b, R.ARGMIN, x, dim, keepdim)


@op("max.other")
def lower_max_other(b, x, other):
    return b.ew(E.MAX, x, other)


@op("min.other")
def lower_min_other(b, x, other):
    return b.ew(E.MIN, x, other)


@op("argmax")
def lower_argmax(b, x, dim=None, keepdim=False):
    return extreme(b, R.ARGMAX, x, dim, keepdim)


@op("argmin")
def lower_argmin(b, x, dim=None, keepdim=False):
    return extreme(b, R.ARGMIN, x, dim, keepdim)


# ---- any / all -----------------------------------------------------------------------------------

@op("any", "any.dim", "any.dims")
def lower_any(b, x, dim=None, keepdim=False):
    return extreme(b, R.MAX, b.cast(x, DType.BOOL), dim, keepdim)


@op("all", "all.dim", "all.dims")
def lower_all(b, x, dim=None, keepdim=False):
    return extreme(b, R.MIN, b.cast(x, DType.BOOL), dim, keepdim)


# ---- the k largest (smallest) -------------------------------------------------------------------

# Rounds of topk unrolled into one program (each two or three row reductions): the most that
# fit one kernel under Loop IR's statement budget. Past them the rounds' candidate masks are
# stored between kernels (top 32 of 64 x 2,048 f32: 6 kernels, 79 us modeled against one
# kernel's 30 us at 28 rounds; selection takes 46 us). The smallest-first rounds carry NaN
# tests more and fit fewer (21 smallest: 2 kernels, 66 us; 20: one, 32 us).
TOPK_LIMIT = 28          # rounds taking the largest first
TOPK_SMALLEST_LIMIT = 20  # rounds taking the smallest first
RANK_LIMIT = 4096  # elements a row ranks by counting (n * n compares a row), past the rounds
MERGE_FROM = 1024  # past it, a sort merges (the model: 46 against 57 us at 8 x 2,048 f32)


def _round_limit(largest: bool) -> int:
    """The most topk rounds one program unrolls, taking the largest (smallest) first."""
    return TOPK_LIMIT if largest else TOPK_SMALLEST_LIMIT


def _pairs(b: Builder, x: str, dim: int, what: str) -> tuple[str, str]:
    """x against every element of its row along `dim`: (mine, other) over x's shape plus a
    last axis of the n elements, `other` the last axis's element; n * n compares a row, at
    most RANK_LIMIT elements (`what` names the op for the refusal)."""
    shape = b.shape(x)
    n = shape[dim]
    if n > RANK_LIMIT:
        raise Refused(f"{what} {n} elements along a dimension: emmy counts n * n comparisons "
                      f"a row, at most {RANK_LIMIT} elements")
    wide = shape + (n,)
    return b.index_map(x, wide, axes(len(shape))), _along_last(b, x, wide, dim)


def _along_last(b: Builder, t: str, wide, dim: int) -> str:
    """t (over wide's leading axes) read with its `dim` at wide's last axis."""
    last = len(wide) - 1
    return b.index_map(t, wide, [var(axis_var(last)) if a == dim else var(axis_var(a))
                                 for a in range(last)])


def _ranks(b: Builder, x: str, dim: int, descending: bool) -> str:
    """Each element's place along `dim` in a stable sort (0 first): how many elements come
    before it, counted over all n (n * n compares a row). NaN is the largest value (last
    ascending, first descending), NaNs and equal values in position order, as torch.sort with
    stable=True."""
    mine, other = _pairs(b, x, dim, "ranking")
    wide = b.shape(mine)
    rank = len(wide) - 1
    better = b.ew(E.GT if descending else E.LT, other, mine)
    tie = b.ew(E.EQ, other, mine)
    if b.dtype(x).is_float:
        nan_mine, nan_other = b.ew(E.NE, mine, mine), b.ew(E.NE, other, other)
        tie = b.ew(E.OR, tie, b.ew(E.AND, nan_mine, nan_other))
        better = b.ew(E.OR, better, b.ew(E.AND, nan_other, b.ew(E.NOT, nan_mine)) if descending
                      else b.ew(E.AND, b.ew(E.NOT, nan_other), nan_mine))
    earlier = b.ew(E.LT, b.iota(wide, rank), b.iota(wide, dim))
    before = b.ew(E.OR, better, b.ew(E.AND, tie, earlier))
    return b.reduce(R.SUM, b.cast(before, DType.I64), [rank])


def _at_ranks(b: Builder, x: str, dim: int, ranks: str, wanted: str) -> tuple[str, str]:
    """values, positions along `dim` of the elements whose rank (_ranks) is `wanted`'s: an
    integer tensor over x's shape with `dim` of any extent, each in [0, n)."""
    shape = b.shape(wanted)
    rank, n = len(shape), b.shape(x)[dim]
    wide = shape + (n,)          # the last axis: the candidate element
    hit = b.ew(E.EQ, _along_last(b, ranks, wide, dim), b.index_map(wanted, wide, axes(rank)))
    where = b.reduce(R.MAX, b.ew(E.WHERE, hit, b.iota(wide, rank), 0), [rank])
    return _read_at(b, x, dim, where), where


# ---- selection by the bits of an order key --------------------------------------------------

_LOW_ZEROS = {DType.F16: 13, DType.BF16: 16}   # f32 mantissa bits a 16-bit float leaves zero


def _key_width(dt: DType) -> int:
    """w: the bits of _order_keys' keys for `dt`, each in [-2^(w-1), 2^(w-1))."""
    if dt.is_float:
        return (64 if dt is DType.F64 else 32) - _LOW_ZEROS.get(dt, 0)
    lo, hi = dt.int_range
    return max((-1 - lo).bit_length(), hi.bit_length()) + 1


def _order_keys(b: Builder, x: str, largest: bool) -> str:
    """An i64 key per element of x, in [-2^(w-1), 2^(w-1)) (w: _key_width), ordered as x is
    (NaN above every number, -0.0 equal to +0.0), or the reverse when not `largest`. A float's
    key is its bits as f32 (f64) with a negative's magnitude bits flipped (a larger magnitude
    orders lower), less the low bits a 16-bit float leaves zero; an integer is its own key."""
    dt = b.dtype(x)
    w = _key_width(dt)
    if dt.is_float:
        v = b.cast(x, DType.F64 if dt is DType.F64 else DType.F32)
        bits = b.bits(b.ew(E.WHERE, b.ew(E.EQ, v, 0.0), 0.0, v))
        sign = 8 * b.dtype(bits).itemsize - 1
        key = b.ew(E.BITXOR, bits, b.ew(E.BITAND, b.ew(E.SHR, bits, sign), (1 << sign) - 1))
        key = b.cast(b.ew(E.SHR, key, _LOW_ZEROS[dt]) if dt in _LOW_ZEROS else key, DType.I64)
        key = b.ew(E.WHERE, b.ew(E.NE, v, v), (1 << (w - 1)) - 1, key)
    else:
        key = b.cast(x, DType.I64)
    return key if largest else b.ew(E.BITNOT, key)


def _kth_key(b: Builder, key: str, w: int, dim: int, k) -> str:
    """The k-th largest of `key` (_order_keys, w bits) along `dim`, kept as an extent-1 axis:
    decided a bit at a time from the top, each bit one count of the keys at or above the
    candidate (w row reductions, whatever k; k: an int, or an integer tensor over the kept
    shape, each in [1, n])."""
    prefix = -(1 << (w - 1))
    for bit in reversed(range(w)):
        # the first candidate is 0 (-2^(w-1) + 2^(w-1), which i64 holds only as a sum)
        cand = 0 if isinstance(prefix, int) else b.ew(E.ADD, prefix, 1 << bit)
        enough = b.reduce(R.SUM, b.cast(b.ew(E.GE, key, cand), DType.I64), (dim,), keepdim=True)
        prefix = b.ew(E.WHERE, b.ew(E.GE, enough, k), cand, prefix)
    return prefix


def _kth(b: Builder, x: str, dim: int, k, largest: bool) -> tuple[str, str]:
    """values, positions (dim kept, extent 1) of the k-th largest (smallest) along `dim`, at
    the first position holding it: _kth_key's w counts and one search."""
    key = _order_keys(b, x, largest)
    found = _kth_key(b, key, _key_width(b.dtype(x)), dim, k)
    pos = b.iota(b.shape(x), dim)
    where = b.reduce(R.MIN, b.ew(E.WHERE, b.ew(E.EQ, key, found), pos, b.shape(x)[dim]),
                     (dim,), keepdim=True)
    return _read_at(b, x, dim, where), where


def _read_at(b: Builder, x: str, dim: int, where: str) -> str:
    """x at positions `where` along `dim` (an integer tensor over x's shape with `dim` of any
    extent)."""
    at = [var(gather_var(0)) if a == dim else var(axis_var(a)) for a in range(b.rank(x))]
    return b.gather(x, b.shape(where), at, [where])


def _top_selected(b: Builder, x: str, k: int, dim: int, largest: bool) -> tuple[str, str]:
    """topk by selection: the k-th largest key (_kth_key), the keys above it and the first
    of its ties to make k, moved to k slots in position order (a running count, then each
    slot one count over the row: k * n compares), and those k ranked among themselves
    (k * k). (w + 3) * n + k * n + 2 * k * k operations a row against ranking's n * n."""
    shape, n = b.shape(x), b.shape(x)[dim]
    key = _order_keys(b, x, largest)
    kth = _kth_key(b, key, _key_width(b.dtype(x)), dim, k)
    above = b.ew(E.GT, key, kth)
    tie = b.ew(E.EQ, key, kth)
    short = b.ew(E.SUB, k, b.reduce(R.SUM, b.cast(above, DType.I64), (dim,), keepdim=True))
    ties_before = b.scan(R.SUM, b.cast(tie, DType.I64), dim, exclusive=True)
    chosen = b.ew(E.OR, above, b.ew(E.AND, tie, b.ew(E.LT, ties_before, short)))
    # slot s holds the (s + 1)-th chosen element: where the running count of them reaches s + 1,
    # the count of positions whose running count is at most s (it rises by one at each)
    running = b.scan(R.SUM, b.cast(chosen, DType.I64), dim)
    kept = shape[:dim] + (k,) + shape[dim + 1:]
    wide = kept + (n,)
    below = b.ew(E.LE, _along_last(b, running, wide, dim), b.iota(wide, dim))
    where = b.reduce(R.SUM, b.cast(below, DType.I64), [len(wide) - 1])
    ranks = _ranks(b, _read_at(b, key, dim, where), dim, descending=True)
    where = _at_ranks(b, where, dim, ranks, b.iota(kept, dim))[0]
    return _read_at(b, x, dim, where), where


def _merge_sorted(b: Builder, x: str, dim: int, descending: bool, what: str
                  ) -> tuple[str, str]:
    """values, positions of x sorted along `dim` by merging: each element's _order_keys key
    with its position in the low bits (every key distinct, so equal values keep their order),
    the row padded to a power of two with keys above all, then sorted runs of 1, 2, 4, ...
    merged pairwise. Output position t of a merged pair of runs A, B of s keys takes its key
    from where t's split falls (how many of the first t come from A: a binary search over A's
    keys against B's, bit_length(s) rounds of two gathers); log2(n) merges, each a kernel
    reading the last. About n log2(n)^2 gathers a row against ranking's n * n compares."""
    shape, n = b.shape(x), b.shape(x)[dim]
    low = max(1, (n - 1).bit_length())                    # bits of a position
    if _key_width(b.dtype(x)) + low > 63:
        raise Refused(f"{what} {n} elements of 64-bit {b.dtype(x)} along a dimension: emmy "
                      f"sorts rows past {RANK_LIMIT} elements by merging keys of at most 32 "
                      f"bits")
    key = b.ew(E.ADD, b.ew(E.MUL, _order_keys(b, x, not descending), 1 << low),
               b.iota(shape, dim))
    wide = 1 << low
    if wide > n:
        rest = shape[:dim] + (wide - n,) + shape[dim + 1:]
        key = cat(b, [key, b.full(rest, (1 << 63) - 1, DType.I64)], dim)
    at = b.iota(b.shape(key), dim)
    s = 1
    while s < wide:
        t = b.ew(E.BITAND, at, 2 * s - 1)                  # t-th of the merged pair's 2s
        base = b.ew(E.SUB, at, t)
        lo, hi = b.ew(E.MAX, b.ew(E.SUB, t, s), 0), b.ew(E.MIN, t, s)

        def heads(i, j):
            """A's key i and B's key j (clamped into the runs)."""
            a = _read_at(b, key, dim, b.ew(E.ADD, base, b.ew(E.MIN, i, s - 1)))
            j = b.ew(E.MAX, b.ew(E.MIN, j, s - 1), 0)
            return a, _read_at(b, key, dim, b.ew(E.ADD, b.ew(E.ADD, base, s), j))

        for _ in range(s.bit_length()):    # the first i in [lo, hi) with A[i] > B[t - i - 1]
            active = b.ew(E.LT, lo, hi)
            mid = b.ew(E.SHR, b.ew(E.ADD, lo, hi), 1)
            a, other = heads(mid, b.ew(E.SUB, b.ew(E.SUB, t, mid), 1))
            less = b.ew(E.LT, a, other)
            lo = b.ew(E.WHERE, b.ew(E.AND, active, less), b.ew(E.ADD, mid, 1), lo)
            hi = b.ew(E.WHERE, b.ew(E.AND, active, b.ew(E.NOT, less)), mid, hi)
        j = b.ew(E.SUB, t, lo)
        a, other = heads(lo, j)
        from_a = b.ew(E.OR, b.ew(E.GE, j, s), b.ew(E.AND, b.ew(E.LT, lo, s),
                                                   b.ew(E.LT, a, other)))
        key = b.ew(E.WHERE, from_a, a, other)
        s *= 2
    where = b.ew(E.BITAND, b.index_map(key, shape, axes(len(shape))), (1 << low) - 1)
    return _read_at(b, x, dim, where), where


def _merges(n: int, dt: DType) -> bool:
    """Whether a sort of n elements of `dt` merges runs (_merge_sorted) rather than ranking
    them: past MERGE_FROM, where its keys hold a position (keys of 32 bits at most), and past
    RANK_LIMIT always (64-bit keys refused there)."""
    return n > RANK_LIMIT or (n > MERGE_FROM and _key_width(dt) <= 32)


def _selecting_pays(n: int, k: int, dt: DType) -> bool:
    """Whether _top_selected costs fewer operations a row than ranking all n elements, or
    ranking is out of reach (past RANK_LIMIT)."""
    return n > RANK_LIMIT or (_key_width(dt) + 3) * n + k * n + 2 * k * k < n * n


@op("sort", "sort.stable")
def lower_sort(b, x, dim=-1, descending=False, *, stable=None):
    """values, positions in order along `dim`: the top n, largest or smallest first; past
    _round_limit elements each output position the element ranked there (_ranks), past
    MERGE_FROM sorted runs merged (_merge_sorted). Stable whether asked or not (equal values
    keep their order; torch leaves it unspecified without stable=True), NaN last ascending,
    first descending."""
    if b.rank(x) == 0:
        return x, b.full((), 0, DType.I64)
    dim = norm_dim(dim, b.rank(x))
    n = b.shape(x)[dim]
    if _merges(n, b.dtype(x)):
        return _merge_sorted(b, x, dim, descending, "sorting")
    if n > _round_limit(descending):
        return _at_ranks(b, x, dim, _ranks(b, x, dim, descending), b.iota(b.shape(x), dim))
    return lower_topk(b, x, n, dim, largest=descending)


@op("argsort", "argsort.stable")
def lower_argsort(b, x, dim=-1, descending=False, *, stable=None):
    return lower_sort(b, x, dim, descending)[1]


@op("topk")
def lower_topk(b, x, k, dim=-1, largest=True, sorted=True):
    """values, indices of the k largest (smallest) elements along `dim`, in order: round j takes
    the extreme of the elements after round j-1's pick in that order (an O(1) test against
    the last pick), then the first position holding it. Past _round_limit rounds, the k selected
    (_top_selected), or, where that costs more, the first k of the row sorted (_merge_sorted)
    or ranked (_ranks).

    As torch orders them: NaN above every number (first when largest, last when smallest); among
    equal values the lower position first (torch leaves that order unspecified; the check's
    reference breaks ties the same way, emmy.selections). `sorted=False` gives them sorted
    too (any order is allowed)."""
    if b.rank(x) == 0:
        raise Refused("topk of a 0-d tensor: give it at least one dimension")
    dt = b.dtype(x)
    if dt is DType.BOOL:
        raise Refused("topk of a bool tensor (torch refuses it too)")
    dim = norm_dim(dim, b.rank(x))
    n = b.shape(x)[dim]
    if k < 1:
        raise Refused(f"k={k} selects nothing (empty outputs); give k >= 1")
    if k > n:
        raise Refused(f"k={k} out of range: dimension {dim} has {n} elements")
    if k > _round_limit(largest):
        if _selecting_pays(n, k, dt) and k <= RANK_LIMIT:
            return _top_selected(b, x, k, dim, largest)
        if _merges(n, dt):
            return tuple(slice_axis(b, v, dim, 0, k)
                         for v in _merge_sorted(b, x, dim, largest, f"topk with k={k} of"))
        taken = b.iota(b.shape(x)[:dim] + (k,) + b.shape(x)[dim + 1:], dim)
        return _at_ranks(b, x, dim, _ranks(b, x, dim, descending=largest), taken)
    pos = b.iota(b.shape(x), dim)
    nan = b.ew(E.NE, x, x) if dt.is_float else None
    # what a non-candidate (or, taking the smallest, a NaN) reads as: no better than any
    far = (float("-inf") if largest else float("inf")) if dt.is_float else \
        dt.int_range[0 if largest else 1]
    pick = R.MAX if largest else R.MIN

    def after(v, i):
        """The elements after the pick (v, i) in topk's order: a round's candidates, known from
        the last pick alone (each round takes the next in that order), not from a mask of
        everything taken so far."""
        later = b.ew(E.GT, pos, i)
        beyond = b.ew(E.OR, b.ew(E.LT if largest else E.GT, x, v),
                      b.ew(E.AND, b.ew(E.EQ, x, v), later))     # NaN x: neither
        if nan is None:
            return beyond
        if largest:     # NaN first: after a NaN, the later NaNs and every number
            after_nan = b.ew(E.OR, b.ew(E.NOT, nan), b.ew(E.AND, nan, later))
        else:           # NaN last: after a NaN, the later NaNs; after a number, every NaN too
            after_nan = b.ew(E.AND, nan, later)
            beyond = b.ew(E.OR, beyond, nan)
        return b.ew(E.WHERE, b.ew(E.NE, v, v), after_nan, beyond)

    def among(mask, cond):                      # cond where the element is a candidate
        return cond if mask is None else (mask if cond is None else b.ew(E.AND, mask, cond))

    rest, values, indices = None, [], []      # rest: the candidates (None: all of them)
    for _ in range(k):
        # taking the smallest, NaN comes after +inf: leave it out of the extreme
        candidates = among(rest, b.ew(E.NOT, nan) if nan is not None and not largest else None)
        v = b.reduce(pick, x if candidates is None else b.ew(E.WHERE, candidates, x, far),
                     (dim,), keepdim=True)
        hit = b.ew(E.EQ, x, v)
        if nan is not None and largest:
            hit = b.ew(E.OR, hit, nan)          # the max is NaN exactly when a NaN is a candidate
        i = b.reduce(R.MIN, b.ew(E.WHERE, among(rest, hit), pos, n), (dim,), keepdim=True)
        if nan is not None and not largest:     # no number left (only NaNs): the first NaN
            i_nan = b.reduce(R.MIN, b.ew(E.WHERE, among(rest, nan), pos, n), (dim,),
                             keepdim=True)
            number = b.ew(E.LT, i, n)
            v = b.ew(E.WHERE, number, v, float("nan"))
            i = b.ew(E.WHERE, number, i, i_nan)
        values.append(v)
        indices.append(i)
        rest = after(v, i)
    return cat(b, values, dim), cat(b, indices, dim)


@op("kthvalue")
def lower_kthvalue(b, x, k, dim=-1, keepdim=False):
    """values, positions of the k-th smallest along `dim` (NaN the largest): the last of the k
    smallest, or of the n - k + 1 largest, whichever takes fewer rounds of topk, or selected
    (_kth) where its w counts are fewer than the rounds' reductions."""
    if b.rank(x) == 0:
        if k != 1:
            raise Refused(f"k={k} out of range: a 0-d tensor has one element")
        return x, b.full((), 0, DType.I64)
    dim = norm_dim(dim, b.rank(x))
    n = b.shape(x)[dim]
    if not 1 <= k <= n:
        raise Refused(f"k={k} out of range: dimension {dim} has {n} elements")
    rounds = min(k, n - k + 1)
    # topk's rounds: two reductions each, and no more than one program unrolls
    if 2 * rounds > _key_width(b.dtype(x)) + 1 or rounds > _round_limit(k > n - k + 1):
        found = _kth(b, x, dim, k, largest=False)
        return found if keepdim else tuple(select(b, v, dim, 0) for v in found)
    values, indices = lower_topk(b, x, rounds, dim, largest=k > n - k + 1)
    last = [select(b, v, dim, rounds - 1) for v in (values, indices)]
    return tuple(unsqueeze(b, v, dim) for v in last) if keepdim else tuple(last)


@op("median.dim")
def lower_median_dim(b, x, dim, keepdim=False):
    """The lower median along `dim` (the ((n + 1) // 2)-th smallest) and its position; NaN,
    at the first NaN's position, where the row holds one (as torch)."""
    if b.rank(x) == 0:
        return x, b.full((), 0, DType.I64)
    d = norm_dim(dim, b.rank(x))
    n = b.shape(x)[d]
    value, index = lower_kthvalue(b, x, (n + 1) // 2, d, keepdim)
    if not b.dtype(x).is_float:
        return value, index
    nan = b.ew(E.NE, x, x)
    first = b.reduce(R.MIN, b.ew(E.WHERE, nan, b.iota(b.shape(x), d), n), (d,), keepdim=keepdim)
    some = b.ew(E.LT, first, n)
    return b.ew(E.WHERE, some, float("nan"), value), b.ew(E.WHERE, some, first, index)


@op("median")
def lower_median_all(b, x):
    """The lower median of all elements (NaN if any is)."""
    return lower_median_dim(b, reshape(b, x, [-1]) if b.rank(x) > 1 else x, 0)[0]


@op("nanmedian.dim")
def lower_nanmedian_dim(b, x, dim, keepdim=False):
    """The lower median of the numbers along `dim`, NaNs left out (NaN where a row holds only
    NaN), and its position: the ((c - 1) // 2 + 1)-th smallest of the c numbers, NaN being
    the largest (_kth: k a tensor, one a row)."""
    if b.rank(x) == 0 or not b.dtype(x).is_float:
        return lower_median_dim(b, x, dim, keepdim)
    d = norm_dim(dim, b.rank(x))
    numbers = b.reduce(R.SUM, b.cast(b.ew(E.EQ, x, x), DType.I64), (d,), keepdim=True)
    middle = b.ew(E.ADD, b.ew(E.DIV, b.ew(E.MAX, b.ew(E.SUB, numbers, 1), 0), 2), 1)
    found = _kth(b, x, d, middle, largest=False)
    return found if keepdim else tuple(select(b, v, d, 0) for v in found)


@op("nanmedian")
def lower_nanmedian_all(b, x):
    return lower_nanmedian_dim(b, reshape(b, x, [-1]) if b.rank(x) > 1 else x, 0)[0]


@op("mode")
def lower_mode(b, x, dim=-1, keepdim=False):
    """The most frequent value along `dim` (the smallest of those equally frequent) and its
    last position, by counting each element's equals (n * n compares a row), or past
    MERGE_FROM elements from the sorted row (_sorted_counts). A NaN equals nothing, so it is
    the mode only of a row of NaNs (eager's answer for a row holding NaNs depends on where
    they sit: [nan, nan, 1] gives nan, [1, nan, nan] gives 1)."""
    if b.rank(x) == 0:
        return x, b.full((), 0, DType.I64)
    d = norm_dim(dim, b.rank(x))
    shape, dt, given = b.shape(x), b.dtype(x), x
    if _merges(shape[d], dt):
        x, counts = _sorted_counts(b, x, d)
    else:
        mine, other = _pairs(b, x, d, "the mode of")
        counts = b.reduce(R.SUM, b.cast(b.ew(E.EQ, other, mine), DType.I64), [len(shape)])
    top = b.ew(E.EQ, counts, b.reduce(R.MAX, counts, (d,), keepdim=True))
    pos = b.iota(shape, d)
    if dt.is_float:
        number = b.ew(E.EQ, x, x)
        value = b.reduce(R.MIN, b.ew(E.WHERE, b.ew(E.AND, top, number), x, float("inf")),
                         (d,), keepdim=True)
        only_nan = b.reduce(R.MIN, b.ew(E.NOT, number), (d,), keepdim=True)
        value = b.ew(E.WHERE, only_nan, float("nan"), value)
    else:
        far = True if dt is DType.BOOL else dt.int_range[1]
        value = b.reduce(R.MIN, b.ew(E.WHERE, top, x, far), (d,), keepdim=True)
        only_nan = None
    where = b.reduce(R.MAX, b.ew(E.WHERE, b.ew(E.EQ, given, value), pos, -1), (d,),
                     keepdim=True)
    if only_nan is not None:        # a row of NaNs: its first
        where = b.ew(E.WHERE, only_nan, 0, where)
    value = b.cast(value, dt)
    return (value, where) if keepdim else (select(b, value, d, 0), select(b, where, d, 0))


def _sorted_counts(b: Builder, x: str, dim: int) -> tuple[str, str]:
    """x sorted along `dim` (_merge_sorted), and at each of its elements how many before it
    equal it, itself included (a run's last element counts the run): a run starts where the
    value differs from the one before (a NaN always: it equals nothing, so NaNs count 0), its
    start carried by a running max."""
    shape = b.shape(x)
    ordered = _merge_sorted(b, x, dim, False, "the mode of")[0]
    t = b.iota(shape, dim)
    before = _read_at(b, ordered, dim, b.ew(E.MAX, b.ew(E.SUB, t, 1), 0))
    starts = b.ew(E.OR, b.ew(E.EQ, t, 0), b.ew(E.NE, ordered, before))
    start = b.scan(R.MAX, b.ew(E.WHERE, starts, t, 0), dim)
    counts = b.ew(E.ADD, b.ew(E.SUB, t, start), 1)
    if b.dtype(x).is_float:
        counts = b.ew(E.WHERE, b.ew(E.EQ, ordered, ordered), counts, 0)
    return ordered, counts


@op("searchsorted.Tensor", "searchsorted.Scalar")
def lower_searchsorted(b, sorted_sequence, x, *, out_int32=False, right=False, side=None,
                       sorter=None):
    """For each value, how many elements of its row of `sorted_sequence` come before it (are
    smaller; with right=True, not larger): a count, one pass over the row, rather than a
    binary search; NaN goes last, as in torch. (The two differ only where the boundaries hold
    NaN, which sorts last but breaks a count.)"""
    if sorter is not None:
        raise Refused("searchsorted with a sorter (the positions that sort the sequence)")
    right = right or side == "right"
    seq = sorted_sequence
    if not isinstance(x, str):
        x = b.full((), x, b.dtype(seq))
    lead, n = b.shape(seq)[:-1], b.shape(seq)[-1]
    if lead and tuple(lead) != tuple(b.shape(x)[:-1]):
        raise Refused(f"boundaries of shape {b.shape(seq)} for values of shape {b.shape(x)}: "
                      "one row, or a row per row of values")
    shape = (*b.shape(x), n)
    r = len(shape)
    rows = [var(axis_var(i)) for i in range(r - 2)] if lead else []
    bounds = b.index_map(seq, shape, rows + [var(axis_var(r - 1))])
    values = b.index_map(x, shape, [var(axis_var(i)) for i in range(r - 1)])
    before = b.ew(E.LE if right else E.LT, bounds, values)
    count = b.reduce(R.SUM, b.cast(before, DType.I64), (r - 1,))
    if b.dtype(x).is_float:
        count = b.ew(E.WHERE, b.ew(E.NE, x, x), n, count)
    return b.cast(count, DType.I32 if out_int32 else DType.I64)


HISTC_LIMIT = 1 << 16   # bins: each counts every element (bins * n compares)


@op("histc")
def lower_histc(b, x, bins=100, min=0, max=0):
    """torch.histc: how many elements fall in each of `bins` equal bins over [min, max] (the
    data's own smallest and largest where min == max, widened by 1 each way where those are
    equal); an element at max counts in the last bin, one outside the range or NaN in none.
    Each bin counts every element (bins * n compares), with eager's bin of an element,
    trunc((x - min) * bins / (max - min)), each step rounded to the element type as eager
    does. Bounds given as 0-d tensors (torch.ao's HistogramObserver: the batch's aminmax) are
    read when the program runs."""
    dt = b.dtype(x)
    if not dt.is_float:
        raise Refused(f"histc of {dt.value} (torch takes floating tensors only)")
    if not 0 < bins <= HISTC_LIMIT:
        raise Refused(f"bins={bins}: histc takes 1 to {HISTC_LIMIT} bins")
    given = isinstance(min, str) or isinstance(max, str)   # 0-d tensors (torch.ao's observer)
    if not given and min > max:
        raise Refused(f"min={min} above max={max}")
    flat = reshape(b, x, [-1])
    n = b.shape(flat)[0]
    work = DType.F64 if dt is DType.F64 else DType.F32

    def step(v):                 # eager rounds each step to the element type
        return b.cast(b.cast(v, dt), work) if dt in (DType.F16, DType.BF16) else v

    values = b.cast(flat, work)
    if given or min == max:
        if given:        # bounds known when it runs: the data's own where they are equal
            lo, hi = (b.cast(v, work) if isinstance(v, str) else b.full((), float(v), work)
                      for v in (min, max))
            own = b.ew(E.EQ, lo, hi)
            lo = b.ew(E.WHERE, own, b.reduce(R.MIN, values, (0,)), step(lo))
            hi = b.ew(E.WHERE, own, b.reduce(R.MAX, values, (0,)), step(hi))
        else:
            lo, hi = (b.reduce(op, values, (0,)) for op in (R.MIN, R.MAX))
        same = b.ew(E.EQ, lo, hi)
        lo, hi = b.ew(E.WHERE, same, step(b.ew(E.SUB, lo, 1)), lo), \
            b.ew(E.WHERE, same, step(b.ew(E.ADD, hi, 1)), hi)
    else:
        lo, hi = (step(b.full((), float(v), work)) for v in (min, max))
    scaled = step(b.ew(E.DIV, step(b.ew(E.MUL, step(b.ew(E.SUB, values, lo)), float(bins))),
                       step(b.ew(E.SUB, hi, lo))))
    at = b.ew(E.MIN, b.cast(scaled, DType.I64), bins - 1)
    inside = b.ew(E.AND, b.ew(E.GE, values, lo), b.ew(E.LE, values, hi))
    at = b.ew(E.WHERE, inside, at, -1)
    wide = (bins, n)
    hit = b.ew(E.EQ, b.index_map(at, wide, [var(axis_var(1))]), b.iota(wide, 0))
    return b.cast(b.reduce(R.SUM, b.cast(hit, DType.I64), (1,)), dt)
