"""softmax, log_softmax and logsumexp, numerically stable: the row max is subtracted first."""

from __future__ import annotations

from emmy.tensor_ir.builder import Builder
from emmy.tensor_ir.decomp.layout import squeeze
from emmy.tensor_ir.decomp.reductions import total
from emmy.tensor_ir.decomp.table import Decomp, registrar
from emmy.tensor_ir.ir import EwOp as E
from emmy.tensor_ir.ir import ReduceOp as R

OPS: dict[str, Decomp] = {}
op = registrar(OPS)


def shifted(b: Builder, x: str, dim: int) -> str:
    """x - max(x) along `dim`: every value <= 0, so exp cannot overflow."""
    return b.ew(E.SUB, x, b.reduce(R.MAX, x, (dim,), keepdim=True))


def softmax(b: Builder, x: str, dim: int) -> str:
    e = b.ew(E.EXP, shifted(b, x, dim))
    return b.ew(E.DIV, e, total(b, e, dim, keepdim=True))


def log_softmax(b: Builder, x: str, dim: int) -> str:
    s = shifted(b, x, dim)
    return b.ew(E.SUB, s, b.ew(E.LOG, total(b, b.ew(E.EXP, s), dim, keepdim=True)))


def logsumexp(b: Builder, x: str, dims, keepdim: bool = False) -> str:
    """max + log(sum(exp(x - max))); an infinite max is replaced by 0 inside the sum."""
    m = b.reduce(R.MAX, x, dims, keepdim=True)
    m = b.ew(E.WHERE, b.ew(E.EQ, b.ew(E.ABS, m), float("inf")), 0.0, m)
    s = total(b, b.ew(E.EXP, b.ew(E.SUB, x, m)), dims, keepdim)
    return b.ew(E.ADD, b.ew(E.LOG, s), m if keepdim else squeeze(b, m, dims))


def _dim(b: Builder, x: str, dim: int) -> int:
    return dim % b.rank(x) if b.rank(x) else 0


@op("softmax.int", opmath=True)
def lower_softmax(b, x, dim, dtype=None):
    return softmax(b, b.cast(x, dtype) if dtype else x, _dim(b, x, dim))


@op("_softmax", opmath=True)
def lower__softmax(b, x, dim, half_to_float=False):
    return softmax(b, x, _dim(b, x, dim))


@op("log_softmax.int", opmath=True)
def lower_log_softmax(b, x, dim, dtype=None):
    return log_softmax(b, b.cast(x, dtype) if dtype else x, _dim(b, x, dim))


@op("_log_softmax", opmath=True)
def lower__log_softmax(b, x, dim, half_to_float=False):
    return log_softmax(b, x, _dim(b, x, dim))


@op("logsumexp", opmath=True)
def lower_logsumexp(b, x, dim, keepdim=False):
    rank = b.rank(x)
    dims = tuple(sorted({d % rank for d in dim})) if rank and dim else tuple(range(rank))
    return logsumexp(b, x, dims, keepdim)
