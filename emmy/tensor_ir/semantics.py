"""What each Tensor IR operation computes, on numpy arrays: the interpreters' shared tables."""

from __future__ import annotations

import math

import numpy as np

from emmy.dtypes import DType, to_numpy
from emmy.tensor_ir.ir import EwOp, ReduceOp

_ERF = np.frompyfunc(math.erf, 1, 1)


def _lgamma1(x: float) -> float:
    try:
        return math.lgamma(x)
    except ValueError:          # a pole (0, -1, -2, ...): +inf, as lgammaf and torch give
        return math.inf


_LGAMMA = np.frompyfunc(_lgamma1, 1, 1)


def _through_torch(name: str):
    """A special function numpy lacks, as torch computes it (in the array's own precision)."""
    def fn(x):
        import torch

        x = np.asarray(x)
        return getattr(torch.special, name)(torch.from_numpy(np.ascontiguousarray(x))).numpy()
    return fn


def _as_operand(result, x):
    """A np.frompyfunc result in `x`'s type: an array of objects, or one Python float where
    `x` is a scalar (a constant folded in Loop IR)."""
    return np.asarray(result).astype(np.asarray(x).dtype)[()]


UFUNC = {
    EwOp.NEG: np.negative, EwOp.ABS: np.abs, EwOp.EXP: np.exp, EwOp.LOG: np.log,
    EwOp.LOG1P: np.log1p, EwOp.EXPM1: np.expm1, EwOp.SQRT: np.sqrt,
    EwOp.RSQRT: lambda x: 1 / np.sqrt(x), EwOp.SIN: np.sin, EwOp.COS: np.cos,
    EwOp.TANH: np.tanh, EwOp.SIGMOID: lambda x: 1 / (1 + np.exp(-x)),
    EwOp.ERF: lambda x: _as_operand(_ERF(x), x),
    EwOp.FLOOR: np.floor, EwOp.CEIL: np.ceil, EwOp.ROUND: np.rint, EwOp.SIGN: lambda x: _sign(x),
    EwOp.TAN: np.tan, EwOp.ASIN: np.arcsin, EwOp.ACOS: np.arccos, EwOp.ATAN: np.arctan,
    EwOp.SINH: np.sinh, EwOp.COSH: np.cosh, EwOp.ASINH: np.arcsinh, EwOp.ACOSH: np.arccosh,
    EwOp.ATANH: np.arctanh, EwOp.ATAN2: np.arctan2, EwOp.FMOD: np.fmod,
    EwOp.LGAMMA: lambda x: _as_operand(_LGAMMA(x), x), EwOp.SIGNBIT: np.signbit,
    EwOp.DIGAMMA: _through_torch("digamma"), EwOp.ERFINV: _through_torch("erfinv"),
    EwOp.RECIPROCAL: lambda x: 1 / x, EwOp.NOT: np.logical_not,
    EwOp.ADD: np.add, EwOp.SUB: np.subtract, EwOp.MUL: np.multiply,
    EwOp.DIV: lambda a, b: _divide(a, b), EwOp.POW: lambda a, b: _power(a, b), EwOp.MAX: np.maximum, EwOp.MIN: np.minimum,
    EwOp.LT: np.less, EwOp.LE: np.less_equal, EwOp.GT: np.greater, EwOp.GE: np.greater_equal,
    EwOp.EQ: np.equal, EwOp.NE: np.not_equal, EwOp.AND: np.logical_and, EwOp.OR: np.logical_or,
    EwOp.BITAND: np.bitwise_and, EwOp.BITOR: np.bitwise_or, EwOp.BITXOR: np.bitwise_xor,
    EwOp.BITNOT: np.invert, EwOp.BITS: lambda x: _bits(x),
    EwOp.FLOAT_BITS: lambda x: _bits(x, as_float=True),
    EwOp.SHL: lambda a, b: _shift(a, b, left=True),
    EwOp.SHR: lambda a, b: _shift(a, b, left=False),
    EwOp.WHERE: np.where,
}


def _shift(a, b, *, left: bool):
    """a << b, a >> b as torch computes them on integers: a count outside [0, bits) gives 0
    (left) or the sign, 0 or -1 (right); a left shift drops the bits past the type's width."""
    a, b = np.asarray(a), np.asarray(b)
    dtype = np.result_type(a, b)
    a, b = a.astype(dtype), b.astype(dtype)
    bits = 8 * dtype.itemsize
    inside = (b >= 0) & (b < bits)
    count = np.where(inside, b, 0)
    if left:
        unsigned = np.dtype(f"u{dtype.itemsize}")
        moved = np.left_shift(a.astype(unsigned), count.astype(unsigned)).astype(dtype)
        return np.where(inside, moved, np.zeros_like(moved))
    return np.where(inside, np.right_shift(a, count), np.where(a < 0, -1, 0).astype(dtype))


def _bits(x, as_float: bool = False):
    """An f32 (f64) array's bits as i32 (i64); `as_float`, an i32 (i64) array's as f32 (f64)."""
    x = np.ascontiguousarray(x)
    if as_float:
        return x.view(np.float32 if x.dtype == np.int32 else np.float64)
    return x.view(np.int32 if x.dtype == np.float32 else np.int64)


def _divide(a, b):
    """a / b; on integers truncated, as C divides (by 0: 0; by -1 wrapping)."""
    a, b = np.asarray(a), np.asarray(b)
    dtype = np.result_type(a, b)
    if dtype.kind not in "iu":
        return np.divide(a, b)
    a, b = a.astype(dtype), b.astype(dtype)
    safe = np.where(b == 0, 1, b).astype(dtype)
    with np.errstate(over="ignore"):
        floor = a // safe
        q = floor + ((floor * safe != a) & ((a < 0) != (safe < 0))).astype(dtype)
    return np.where(b == 0, 0, q).astype(dtype)


def _power(a, b):
    """a ** b; on integers as torch computes them, wrapping at the type's width, and a negative
    exponent gives 1 for a base of 1, +-1 for -1 and 0 otherwise (numpy refuses it)."""
    a, b = np.asarray(a), np.asarray(b)
    dtype = np.result_type(a, b)
    if dtype.kind not in "iu":
        return np.power(a, b)
    a, b = a.astype(dtype), b.astype(dtype)
    negative = b < 0
    with np.errstate(over="ignore"):
        raised = np.power(a, np.where(negative, 0, b))
    odd = (b & 1) == 1
    small = np.where(a == 1, 1, np.where(a == -1, np.where(odd, -1, 1), 0)) if dtype.kind == "i" \
        else np.zeros_like(raised)
    return np.where(negative, small, raised).astype(dtype)


def _sign(x):
    """(x > 0) - (x < 0), as torch.sign and the CUDA helper compute it: 0 for NaN (numpy's
    sign gives NaN)."""
    x = np.asarray(x)
    return np.where(x != x, np.zeros_like(x), np.sign(x)) if x.dtype.kind == "f" else np.sign(x)


REDUCE = {ReduceOp.SUM: np.sum, ReduceOp.PROD: np.prod, ReduceOp.MAX: np.max,
           ReduceOp.MIN: np.min, ReduceOp.ARGMAX: np.max, ReduceOp.ARGMIN: np.min,
           ReduceOp.LOGADDEXP: np.logaddexp.reduce}
COMBINE = {ReduceOp.SUM: np.add, ReduceOp.PROD: np.multiply, ReduceOp.MAX: np.maximum,
            ReduceOp.MIN: np.minimum, ReduceOp.LOGADDEXP: np.logaddexp}
RUNNING = {ReduceOp.SUM: np.cumsum, ReduceOp.PROD: np.cumprod,
            ReduceOp.MAX: np.maximum.accumulate, ReduceOp.MIN: np.minimum.accumulate,
            ReduceOp.LOGADDEXP: np.logaddexp.accumulate}


def identity(op: ReduceOp, dtype: DType):
    """The value an accumulator starts from: 0 for add, -inf (or the least value) for max, …"""
    if op is ReduceOp.SUM:
        return 0
    if op is ReduceOp.PROD:
        return 1
    if op is ReduceOp.LOGADDEXP:
        return -math.inf
    high = op in (ReduceOp.MIN, ReduceOp.ARGMIN)
    if dtype is DType.BOOL:
        return high
    if dtype.is_float:
        return math.inf if high else -math.inf
    info = np.iinfo(to_numpy(dtype))
    return info.max if high else info.min


def as_numpy(value) -> np.ndarray:
    """A torch tensor or array-like as a numpy array (bf16 and 8-bit floats widened to float32,
    which numpy lacks; a complex one as its (real, imaginary) pairs, as emmy stores it)."""
    if hasattr(value, "detach"):
        from emmy.dtypes import as_stored

        value = as_stored(value.detach().cpu())
        if str(value.dtype) in ("torch.bfloat16", "torch.float8_e4m3fn", "torch.float8_e5m2"):
            value = value.float()
        return value.numpy()
    value = np.asarray(value)
    return np.stack([value.real, value.imag], -1) if np.iscomplexobj(value) else value
