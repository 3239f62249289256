"""scaled_dot_product_attention: softmax(q k^T * scale + mask) v, as two matmuls and a softmax."""

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
    if attn_mask is not None:
        scores = (b.ew(E.WHERE, attn_mask, scores, -math.inf) if b.dtype(attn_mask) is DType.BOOL
                  else b.ew(E.ADD, scores, attn_mask))
    return matmul(b, softmax(b, scores, b.rank(scores) - 1), v)
