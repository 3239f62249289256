"""scaled_dot_product_attention: softmax(q k^T * scale + mask) v, as two matmuls and a softmax
(with a mask, one that gives 0 for a row the mask hides wholly, as torch does)."""

from __future__ import annotations

import math

from emmy.dtypes import DType

from emmy.symbolic import floordiv, var
from emmy.tensor_ir.builder import Builder
from emmy.tensor_ir.decomp.layout import transpose
from emmy.tensor_ir.decomp.matmul import matmul
from emmy.tensor_ir.decomp.softmax import softmax
from emmy.tensor_ir.decomp.table import Decomp, Refused, registrar
from emmy.tensor_ir.ir import EwOp as E
from emmy.tensor_ir.ir import ReduceOp as R
from emmy.tensor_ir.ir import axis_var

OPS: dict[str, Decomp] = {}
op = registrar(OPS)


def causal_mask(b: Builder, shape) -> str:
    """True where key position <= query position (the lower triangle, top-left aligned)."""
    rank = len(shape)
    return b.ew(E.LE, b.iota(shape, rank - 1), b.iota(shape, rank - 2))


def repeat_heads(b: Builder, kv: str, heads: int) -> str:
    """Grouped-query attention: query head h reads key/value head h // (heads / kv_heads)."""
    shape = list(b.shape(kv))
    group = heads // shape[-3]
    shape[-3] = heads
    bounds = {axis_var(i): n for i, n in enumerate(shape)}
    index = [var(axis_var(i)) for i in range(len(shape))]
    index[-3] = floordiv(index[-3], group, bounds)
    return b.index_map(kv, shape, index)


@op("scaled_dot_product_attention", opmath=True)
def lower_sdpa(b, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
               enable_gqa=False):
    if dropout_p:
        raise Refused("dropout_p > 0")
    if enable_gqa and b.shape(k)[-3] != b.shape(q)[-3]:
        k, v = repeat_heads(b, k, b.shape(q)[-3]), repeat_heads(b, v, b.shape(q)[-3])
    scale = 1 / math.sqrt(b.shape(q)[-1]) if scale is None else scale
    scores = b.ew(E.MUL, matmul(b, q, transpose(b, k, -2, -1)), scale)
    if is_causal:
        scores = b.ew(E.WHERE, causal_mask(b, b.shape(scores)), scores, -math.inf)
    if attn_mask is None:
        return matmul(b, softmax(b, scores, b.rank(scores) - 1), v)
    scores = (b.ew(E.WHERE, attn_mask, scores, -math.inf) if b.dtype(attn_mask) is DType.BOOL
              else b.ew(E.ADD, scores, attn_mask))
    return matmul(b, masked_softmax(b, scores, b.rank(scores) - 1), v)


def masked_softmax(b: Builder, x: str, dim: int) -> str:
    """softmax, with 0 for a row whose every score is -inf (a mask that hides every key), as
    torch's scaled_dot_product_attention gives (softmax itself gives 0 / 0 = NaN): such a
    row's max is taken as 0 (every exp is 0) and its sum as 1. Elsewhere the same: the sum of
    exps after subtracting the max is at least 1 (the max's own exp(0))."""
    m = b.reduce(R.MAX, x, (dim,), keepdim=True)
    m = b.ew(E.WHERE, b.ew(E.EQ, m, -math.inf), 0.0, m)
    e = b.ew(E.EXP, b.ew(E.SUB, x, m))
    return b.ew(E.DIV, e, b.ew(E.MAX, b.reduce(R.SUM, e, (dim,), keepdim=True), 1.0))
