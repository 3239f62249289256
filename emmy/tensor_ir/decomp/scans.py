"""Cumulative ops as Scans (cumsum, cumprod, cummax, cummin, logcumsumexp).
`flip(cumsum(flip(x)))` becomes one reversed scan, and `cumsum(x) - x` an exclusive one (both
recognized by the Builder)."""

from __future__ import annotations

from emmy.tensor_ir.decomp.reductions import accumulating
from emmy.tensor_ir.decomp.table import Decomp, Refused, registrar
from emmy.tensor_ir.ir import ReduceOp as R

OPS: dict[str, Decomp] = {}
op = registrar(OPS)


@op("cumsum", opmath=True)
def lower_cumsum(b, x, dim, *, dtype=None):
    return b.scan(R.SUM, accumulating(b, x, dtype), dim)


@op("cumprod", opmath=True)
def lower_cumprod(b, x, dim, *, dtype=None):
    return b.scan(R.PROD, accumulating(b, x, dtype), dim)


@op("logcumsumexp", opmath=True)
def lower_logcumsumexp(b, x, dim):
    """log(cumsum(exp(x))) as one scan whose combine is log(exp(a) + exp(b)), computed from the
    larger of the two (no exp overflows, and a value far below the running total still
    counts where a shift by the row's maximum would lose it)."""
    if not b.dtype(x).is_float:
        raise Refused(f"logcumsumexp of {b.dtype(x)}: floats only, as torch")
    return b.scan(R.LOGADDEXP, x, dim)


def _running_extreme(b, x, dim, op: R):
    """(values, positions) of cummax / cummin: the running extreme, and where it was last
    taken, as torch's loop has it (a value equal to the running one, or NaN, takes its place;
    after a NaN the values stay NaN and the position stays there)."""
    from emmy.dtypes import DType
    from emmy.tensor_ir.ir import EwOp as E

    dim = dim % max(b.rank(x), 1)
    values = b.scan(op, x, dim)
    taken = b.ew(E.EQ, x, values)
    if b.dtype(x).is_float:
        taken = b.ew(E.OR, taken, b.ew(E.NE, x, x))
    pos = b.iota(b.shape(x), dim, DType.I64)
    return values, b.scan(R.MAX, b.ew(E.WHERE, taken, pos, -1), dim)


@op("cummax")
def lower_cummax(b, x, dim):
    return _running_extreme(b, x, dim, R.MAX)


@op("cummin")
def lower_cummin(b, x, dim):
    return _running_extreme(b, x, dim, R.MIN)
