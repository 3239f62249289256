"""Loss functions: a pointwise loss, then torch's reduction (0 none, 1 mean, 2 sum).

Class-index targets (cross_entropy, nll_loss) pick a logit with a one-hot sum over
`iota == target`: no gather.
"""

from __future__ import annotations

import math

from emmy.dtypes import DType
from emmy.symbolic import var
from emmy.tensor_ir.builder import Builder
from emmy.tensor_ir.decomp.layout import along, axes, reshape, unsqueeze
from emmy.tensor_ir.decomp.norms import vector_norm
from emmy.tensor_ir.decomp.reductions import mean, total
from emmy.tensor_ir.decomp.softmax import log_softmax
from emmy.tensor_ir.decomp.table import Decomp, Refused, registrar
from emmy.tensor_ir.ir import EwOp as E
from emmy.tensor_ir.ir import ReduceOp as R
from emmy.tensor_ir.ir import axis_var

OPS: dict[str, Decomp] = {}
op = registrar(OPS)

NONE, MEAN, SUM = 0, 1, 2


def reduce_loss(b: Builder, loss: str, reduction: int) -> str:
    if reduction == NONE:
        return loss
    return mean(b, loss) if reduction == MEAN else total(b, loss)


def _difference(b: Builder, x: str, y: str) -> str:
    return b.ew(E.ABS, b.ew(E.SUB, x, y))


@op("mse_loss", opmath=True)
def lower_mse_loss(b, x, y, reduction=MEAN):
    d = b.ew(E.SUB, x, y)
    return reduce_loss(b, b.ew(E.MUL, d, d), reduction)


@op("l1_loss", opmath=True)
def lower_l1_loss(b, x, y, reduction=MEAN):
    return reduce_loss(b, _difference(b, x, y), reduction)


@op("huber_loss", opmath=True)
def lower_huber_loss(b, x, y, reduction=MEAN, delta=1.0):
    """0.5 d^2 where d < delta, else delta (d - 0.5 delta), with d = |x - y|."""
    d = _difference(b, x, y)
    quadratic = b.ew(E.MUL, b.ew(E.MUL, d, d), 0.5)
    linear = b.ew(E.MUL, b.ew(E.SUB, d, 0.5 * delta), delta)
    return reduce_loss(b, b.ew(E.WHERE, b.ew(E.LT, d, delta), quadratic, linear), reduction)


@op("smooth_l1_loss", opmath=True)
def lower_smooth_l1_loss(b, x, y, reduction=MEAN, beta=1.0):
    """0.5 d^2 / beta where d < beta, else d - 0.5 beta."""
    d = _difference(b, x, y)
    if beta == 0:
        return reduce_loss(b, d, reduction)
    quadratic = b.ew(E.DIV, b.ew(E.MUL, b.ew(E.MUL, d, d), 0.5), beta)
    linear = b.ew(E.SUB, d, 0.5 * beta)
    return reduce_loss(b, b.ew(E.WHERE, b.ew(E.LT, d, beta), quadratic, linear), reduction)


@op("hinge_embedding_loss", opmath=True)
def lower_hinge_embedding_loss(b, x, target, margin=1.0, reduction=MEAN):
    """x where target is 1, max(0, margin - x) where it is -1."""
    margin_part = b.ew(E.WHERE, b.ew(E.NE, target, 1), b.ew(E.MAX, b.ew(E.SUB, margin, x), 0), 0)
    self_part = b.ew(E.WHERE, b.ew(E.NE, target, -1), x, 0)
    return reduce_loss(b, b.ew(E.ADD, margin_part, self_part), reduction)


@op("kl_div", opmath=True)
def lower_kl_div(b, x, target, reduction=MEAN, log_target=False):
    """target * (log target - x), 0 where target is 0; exp(target) * (target - x) for log targets."""
    if log_target:
        loss = b.ew(E.MUL, b.ew(E.EXP, target), b.ew(E.SUB, target, x))
    else:
        xlogy = b.ew(E.WHERE, b.ew(E.EQ, target, 0), 0, b.ew(E.MUL, target, b.ew(E.LOG, target)))
        loss = b.ew(E.SUB, xlogy, b.ew(E.MUL, target, x))
    return reduce_loss(b, loss, reduction)


@op("margin_ranking_loss", opmath=True)
def lower_margin_ranking_loss(b, x1, x2, target, margin=0.0, reduction=MEAN):
    """max(0, -target (x1 - x2) + margin)"""
    loss = b.ew(E.ADD, b.ew(E.MUL, b.ew(E.NEG, target), b.ew(E.SUB, x1, x2)), margin)
    return reduce_loss(b, b.ew(E.MAX, loss, 0), reduction)


@op("multilabel_margin_loss", opmath=True)
def lower_multilabel_margin_loss(b, x, target, reduction=MEAN):
    """For each sample, the classes its target row lists before the first -1 (slots j) against
    every class i not listed: sum over j, i of max(0, 1 - x[t_j] + x[i]) / classes. Not
    torch's decomposition, which counts the slots after the first -1 too (as class 0)."""
    if b.rank(x) not in (1, 2):
        raise Refused(f"an input of rank {b.rank(x)}; a vector or a matrix, as torch")
    rows = reshape(b, x, (1, -1)) if b.rank(x) == 1 else x
    n, c = b.shape(rows)
    target = reshape(b, target, (n, c))
    slot = b.iota((n, c), 1)
    end = b.reduce(R.MIN, b.ew(E.WHERE, b.ew(E.EQ, target, -1), slot, c), (1,), keepdim=True)
    listed = b.ew(E.LT, slot, end)                                      # (n, slot)
    cls = b.ew(E.WHERE, listed, target, -1)                             # -1: no class
    cube = (n, c, c)                                                    # (n, slot j, class i)
    per_class = [var(axis_var(0)), var(axis_var(2))]                    # (n, i) over the cube
    x_i = b.index_map(rows, cube, per_class)
    hit = b.ew(E.EQ, b.iota(cube, 2), b.index_map(cls, cube, axes(2)))
    picked = total(b, b.ew(E.WHERE, hit, x_i, 0.0), 2)                  # x[t_j]: (n, slot)
    is_target = b.ew(E.GT, total(b, b.cast(hit, DType.I32), 1), 0)     # (n, class)
    margin = b.ew(E.ADD, b.ew(E.SUB, 1.0, b.index_map(picked, cube, axes(2))), x_i)
    counted = b.ew(E.AND, b.index_map(listed, cube, axes(2)),
                   b.ew(E.NOT, b.index_map(is_target, cube, per_class)))
    terms = b.ew(E.WHERE, counted, b.ew(E.DIV, b.ew(E.MAX, margin, 0.0), float(c)), 0.0)
    # a vector's unreduced loss: (1,), as torch's meta function has it (its CPU kernel: ())
    return reduce_loss(b, total(b, terms, (1, 2)), reduction)


@op("soft_margin_loss", opmath=True)
def lower_soft_margin_loss(b, x, y, reduction=MEAN):
    """log(1 + exp(-y x))"""
    return reduce_loss(b, b.ew(E.LOG1P, b.ew(E.EXP, b.ew(E.NEG, b.ew(E.MUL, y, x)))), reduction)


@op("binary_cross_entropy", opmath=True)
def lower_binary_cross_entropy(b, x, y, weight=None, reduction=MEAN):
    """-(y log x + (1 - y) log(1 - x)), each log clamped at -100 as torch does."""
    log_x = b.ew(E.MAX, b.ew(E.LOG, x), -100.0)
    log_1mx = b.ew(E.MAX, b.ew(E.LOG, b.ew(E.SUB, 1.0, x)), -100.0)
    loss = b.ew(E.NEG, b.ew(E.ADD, b.ew(E.MUL, y, log_x),
                             b.ew(E.MUL, b.ew(E.SUB, 1.0, y), log_1mx)))
    return reduce_loss(b, loss if weight is None else b.ew(E.MUL, loss, weight), reduction)


@op("binary_cross_entropy_with_logits", opmath=True)
def lower_bce_with_logits(b, x, y, weight=None, pos_weight=None, reduction=MEAN):
    """(1 - y) x + (1 + (pos_weight - 1) y) (log1p(exp(-|x|)) + max(-x, 0))"""
    softplus_neg = b.ew(E.ADD, b.ew(E.LOG1P, b.ew(E.EXP, b.ew(E.NEG, b.ew(E.ABS, x)))),
                        b.ew(E.MAX, b.ew(E.NEG, x), 0))
    if pos_weight is not None:
        softplus_neg = b.ew(E.MUL, softplus_neg,
                            b.ew(E.ADD, b.ew(E.MUL, b.ew(E.SUB, pos_weight, 1), y), 1))
    loss = b.ew(E.ADD, b.ew(E.MUL, b.ew(E.SUB, 1.0, y), x), softplus_neg)
    return reduce_loss(b, loss if weight is None else b.ew(E.MUL, loss, weight), reduction)


@op("cosine_embedding_loss", opmath=True)
def lower_cosine_embedding_loss(b, x1, x2, target, margin=0.0, reduction=MEAN):
    """1 - cos where target is 1, max(0, cos - margin) where it is -1."""
    dim = b.rank(x1) - 1
    dot = total(b, b.ew(E.MUL, x1, x2), dim)
    sq1 = b.ew(E.ADD, total(b, b.ew(E.MUL, x1, x1), dim), 1e-12)
    sq2 = b.ew(E.ADD, total(b, b.ew(E.MUL, x2, x2), dim), 1e-12)
    cos = b.ew(E.DIV, dot, b.ew(E.SQRT, b.ew(E.MUL, sq1, sq2)))
    positive = b.ew(E.WHERE, b.ew(E.EQ, target, 1), b.ew(E.SUB, 1.0, cos), 0)
    negative = b.ew(E.WHERE, b.ew(E.EQ, target, -1), b.ew(E.MAX, b.ew(E.SUB, cos, margin), 0), 0)
    return reduce_loss(b, b.ew(E.ADD, positive, negative), reduction)


@op("triplet_margin_loss", opmath=True)
def lower_triplet_margin_loss(b, anchor, positive, negative, margin=1.0, p=2, eps=1e-6,
                              swap=False, reduction=MEAN):
    """max(0, margin + d(anchor, positive) - d(anchor, negative)), d the p-norm distance."""
    def distance(u, v):
        return vector_norm(b, b.ew(E.ADD, b.ew(E.SUB, u, v), eps), p, b.rank(u) - 1, False)

    d_neg = distance(anchor, negative)
    if swap:
        d_neg = b.ew(E.MIN, d_neg, distance(positive, negative))
    loss = b.ew(E.MAX, b.ew(E.SUB, b.ew(E.ADD, distance(anchor, positive), margin), d_neg), 0)
    return reduce_loss(b, loss, reduction)


# ---- class-index targets ---------------------------------------------------------------------

def _class_axis(b: Builder, x: str) -> int:
    return 0 if b.rank(x) == 1 else 1


def _nll(b: Builder, logp: str, target: str, weight, reduction: int, ignore_index: int,
         smoothing: float = 0.0) -> str:
    """-w[t] logp[t] per sample (plus label smoothing), masked where t == ignore_index."""
    axis = _class_axis(b, logp)
    shape = b.shape(logp)
    classes = shape[axis]
    onehot = b.ew(E.EQ, b.iota(shape, axis), unsqueeze(b, target, axis))
    weighted = logp if weight is None else b.ew(E.MUL, logp, along(b, weight, shape, axis))
    loss = b.ew(E.NEG, total(b, b.ew(E.WHERE, onehot, weighted, 0.0), axis))
    if smoothing:
        smooth = b.ew(E.NEG, total(b, weighted, axis))
        loss = b.ew(E.ADD, b.ew(E.MUL, loss, 1.0 - smoothing),
                    b.ew(E.MUL, smooth, smoothing / classes))
    valid = b.ew(E.NE, target, ignore_index)
    loss = b.ew(E.WHERE, valid, loss, 0.0)
    if reduction != MEAN:
        return reduce_loss(b, loss, reduction)
    if weight is None:
        denominator = total(b, b.cast(valid, b.dtype(loss)))
    else:
        picked = total(b, b.ew(E.WHERE, onehot, along(b, weight, shape, axis), 0.0), axis)
        denominator = total(b, b.ew(E.WHERE, valid, picked, 0.0))
    return b.ew(E.DIV, total(b, loss), denominator)


def _soft_targets(b: Builder, logp: str, target: str, weight, reduction: int,
                  smoothing: float) -> str:
    """Class probabilities as targets: -sum(w * target * logp) over the classes."""
    axis = _class_axis(b, logp)
    classes = b.shape(logp)[axis]
    if smoothing:
        target = b.ew(E.ADD, b.ew(E.MUL, target, 1.0 - smoothing), smoothing / classes)
    terms = b.ew(E.MUL, logp, target)
    if weight is not None:
        terms = b.ew(E.MUL, terms, along(b, weight, b.shape(logp), axis))
    loss = b.ew(E.NEG, total(b, terms, axis))
    if reduction == MEAN:
        return b.ew(E.DIV, total(b, loss), float(math.prod(b.shape(logp)) // classes))
    return reduce_loss(b, loss, reduction)


@op("cross_entropy_loss", opmath=True)
def lower_cross_entropy(b, x, target, weight=None, reduction=MEAN, ignore_index=-100,
                        label_smoothing=0.0):
    logp = log_softmax(b, x, _class_axis(b, x))
    if b.dtype(target).is_float:
        return _soft_targets(b, logp, target, weight, reduction, label_smoothing)
    return _nll(b, logp, target, weight, reduction, ignore_index, label_smoothing)


@op("nll_loss", "nll_loss_nd", "nll_loss2d", opmath=True)
def lower_nll_loss(b, logp, target, weight=None, reduction=MEAN, ignore_index=-100):
    if b.dtype(target) not in (DType.I64, DType.I32):
        raise Refused("targets must be class indices")
    return _nll(b, logp, target, weight, reduction, ignore_index)
