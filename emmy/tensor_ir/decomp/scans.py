"""Cumulative ops as Scans. `flip(cumsum(flip(x)))` becomes one reversed scan, and
`cumsum(x) - x` an exclusive one (both recognized by the Builder)."""

from __future__ import annotations

from emmy.tensor_ir.decomp.reductions import accumulating
from emmy.tensor_ir.decomp.table import Decomp, registrar
from emmy.tensor_ir.ir import ReduceOp as R

OPS: dict[str, Decomp] = {}
op = registrar(OPS)


@op("cumsum", opmath=True)
def lower_cumsum(b, x, dim, *, dtype=None):
    return b.scan(R.SUM, accumulating(b, x, dtype), dim)


@op("cumprod", opmath=True)
def lower_cumprod(b, x, dim, *, dtype=None):
    return b.scan(R.PROD, accumulating(b, x, dtype), dim)
