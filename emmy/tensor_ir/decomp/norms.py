"""Normalizations (rms, layer, batch, instance, group) and vector norms, in f32 for half inputs."""

from __future__ import annotations

import math

from emmy.dtypes import DType

from emmy.tensor_ir.builder import Builder, broadcast_shapes
from emmy.tensor_ir.decomp.layout import along, norm_dims, reshape
from emmy.tensor_ir.decomp.reductions import mean, total
from emmy.tensor_ir.decomp.table import Decomp, Refused, registrar
from emmy.tensor_ir.ir import EwOp as E
from emmy.tensor_ir.ir import ReduceOp as R

OPS: dict[str, Decomp] = {}
op = registrar(OPS)

_EPS = {DType.F64: 2.220446049250313e-16, DType.F32: 1.1920928955078125e-07}


def standardize(b: Builder, x: str, dims, eps: float) -> str:
    """(x - mean) / sqrt(var + eps) over `dims`, with the biased variance."""
    centered = b.ew(E.SUB, x, mean(b, x, dims, keepdim=True))
    var = mean(b, b.ew(E.MUL, centered, centered), dims, keepdim=True)
    return b.ew(E.MUL, centered, b.ew(E.RSQRT, b.ew(E.ADD, var, eps)))


def affine(b: Builder, x: str, weight: str | None, bias: str | None, axis: int | None = None) -> str:
    """x * weight + bias; with `axis`, the (C,) weight and bias run along that axis of x."""
    def spread(v):
        return along(b, v, b.shape(x), axis) if axis is not None else v

    if weight is not None:
        x = b.ew(E.MUL, x, spread(weight))
    if bias is not None:
        x = b.ew(E.ADD, x, spread(bias))
    return x


def trailing(b: Builder, x: str, normalized_shape) -> tuple[int, ...]:
    rank = b.rank(x)
    return tuple(range(rank - len(normalized_shape), rank))


@op("rms_norm", opmath=True)
def lower_rms_norm(b, x, normalized_shape, weight=None, eps=None):
    """x * rsqrt(mean(x^2) + eps) * weight"""
    eps = _EPS.get(b.dtype(x), _EPS[DType.F32]) if eps is None else eps
    dims = trailing(b, x, normalized_shape)
    ms = mean(b, b.ew(E.MUL, x, x), dims, keepdim=True)
    return affine(b, b.ew(E.MUL, x, b.ew(E.RSQRT, b.ew(E.ADD, ms, eps))), weight, None)


@op("layer_norm", opmath=True)
def lower_layer_norm(b, x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    return affine(b, standardize(b, x, trailing(b, x, normalized_shape), eps), weight, bias)


def _running(b: Builder, x: str, running_mean: str, running_var: str, eps: float) -> str:
    """(x - running_mean) * rsqrt(running_var + eps), per channel (axis 1)."""
    scale = b.ew(E.RSQRT, b.ew(E.ADD, running_var, eps))
    centered = b.ew(E.SUB, x, along(b, running_mean, b.shape(x), 1))
    return b.ew(E.MUL, centered, along(b, scale, b.shape(x), 1))


@op("batch_norm", opmath=True)
def lower_batch_norm(b, x, weight, bias, running_mean, running_var, training, momentum, eps,
                     cudnn_enabled=True):
    """Inference uses the running statistics; training mode the batch's (output only)."""
    if training or running_mean is None:
        y = standardize(b, x, [d for d in range(b.rank(x)) if d != 1], eps)
    else:
        y = _running(b, x, running_mean, running_var, eps)
    return affine(b, y, weight, bias, axis=1)


@op("_native_batch_norm_legit_no_training", opmath=True)
def lower_batch_norm_no_training(b, x, weight, bias, running_mean, running_var, momentum, eps):
    """batch_norm in inference as torch's decompositions leave it (a functionalized program):
    the output, and the saved mean and inverse deviation, which inference leaves empty."""
    out = affine(b, _running(b, x, running_mean, running_var, eps), weight, bias, axis=1)
    empty = b.full((0,), 0, b.dtype(out))
    return out, empty, empty


@op("instance_norm", opmath=True)
def lower_instance_norm(b, x, weight, bias, running_mean, running_var, use_input_stats, momentum,
                        eps, cudnn_enabled=True):
    if use_input_stats or running_mean is None:
        y = standardize(b, x, range(2, b.rank(x)), eps)
    else:
        y = _running(b, x, running_mean, running_var, eps)
    return affine(b, y, weight, bias, axis=1)


@op("group_norm", opmath=True)
def lower_group_norm(b, x, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
    """Standardize each (sample, group) over its channels and positions, then scale per channel."""
    shape = b.shape(x)
    grouped = reshape(b, x, (shape[0], num_groups, math.prod(shape[1:]) // num_groups))
    y = reshape(b, standardize(b, grouped, (2,), eps), shape)
    return affine(b, y, weight, bias, axis=1)


# ---- vector norms ------------------------------------------------------------------------------

# ord -> the norm of x over dims, for the orders that need no pow
_NORMS = {
    2: lambda b, x, d, k: b.ew(E.SQRT, total(b, b.ew(E.MUL, x, x), d, k)),
    1: lambda b, x, d, k: total(b, b.ew(E.ABS, x), d, k),
    math.inf: lambda b, x, d, k: b.reduce(R.MAX, b.ew(E.ABS, x), norm_dims(d, b.rank(x)), k),
    -math.inf: lambda b, x, d, k: b.reduce(R.MIN, b.ew(E.ABS, x), norm_dims(d, b.rank(x)), k),
    0: lambda b, x, d, k: total(b, b.cast(b.ew(E.NE, x, 0), b.dtype(x)), d, k),
}


def vector_norm(b: Builder, x: str, ord: float, dims, keepdim: bool) -> str:
    """(sum |x|^ord)^(1/ord) over `dims`."""
    if ord in _NORMS:
        return _NORMS[ord](b, x, dims, keepdim)
    powered = total(b, b.ew(E.POW, b.ew(E.ABS, x), float(ord)), dims, keepdim)
    return b.ew(E.POW, powered, 1.0 / ord)


@op("linalg_vector_norm", opmath=True)
def lower_linalg_vector_norm(b, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    return vector_norm(b, b.cast(x, dtype) if dtype else x, ord, dim, keepdim)


@op("norm.ScalarOpt_dim", opmath=True)
def lower_norm_dim(b, x, p, dim, keepdim=False):
    if isinstance(p, str):
        if p != "fro":
            raise Refused(f"p={p!r} (vector norms and 'fro' are supported)")
        p = 2
    return vector_norm(b, x, 2 if p is None else p, dim, keepdim)


@op("norm.Scalar", opmath=True)
def lower_norm(b, x, p=2):
    return vector_norm(b, x, p, None, False)


@op("cosine_similarity", opmath=True)
def lower_cosine_similarity(b, x1, x2, dim=1, eps=1e-8):
    """sum((x1 / max(|x1|, eps)) * (x2 / max(|x2|, eps))) along `dim`."""
    shape = broadcast_shapes(b.shape(x1), b.shape(x2))
    x1, x2 = b.broadcast_to(x1, shape), b.broadcast_to(x2, shape)

    def unit(v):
        return b.ew(E.DIV, v, b.ew(E.MAX, vector_norm(b, v, 2, dim, True), eps))

    return total(b, b.ew(E.MUL, unit(x1), unit(x2)), dim)
