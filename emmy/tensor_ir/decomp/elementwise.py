"""Elementwise ops: arithmetic, comparisons, selection, clamps, casts.

Ops that are one EwOp come from tables; each composite op is one small function.
Activation functions live in `activations.py`.
"""

from __future__ import annotations

import math

import numpy as np

from emmy.dtypes import DType
from emmy.tensor_ir.builder import Builder
from emmy.tensor_ir.decomp.table import Decomp, Refused, registrar
from emmy.tensor_ir.ir import EwOp

OPS: dict[str, Decomp] = {}
op = registrar(OPS)

E = EwOp

# torch op -> the one EwOp it is (unary ops of floats)
UNARY = {
    "neg": E.NEG, "abs": E.ABS, "exp": E.EXP, "log": E.LOG, "log1p": E.LOG1P, "expm1": E.EXPM1,
    "sqrt": E.SQRT, "rsqrt": E.RSQRT, "sin": E.SIN, "cos": E.COS, "tanh": E.TANH,
    "sigmoid": E.SIGMOID, "erf": E.ERF, "floor": E.FLOOR, "ceil": E.CEIL, "sign": E.SIGN,
    "sgn": E.SIGN, "reciprocal": E.RECIPROCAL, "tan": E.TAN, "asin": E.ASIN, "acos": E.ACOS,
    "atan": E.ATAN, "sinh": E.SINH, "cosh": E.COSH, "asinh": E.ASINH, "acosh": E.ACOSH,
    "atanh": E.ATANH,
    "sym_neg": E.NEG,       # of a number read off a tensor (`-t.item()`): below
    "sym_sqrt": E.SQRT,     # math.sqrt of one
}
# ops whose integer inputs compute as floats (torch promotes them to the default float type)
_FLOAT_ONLY = {E.EXP, E.LOG, E.LOG1P, E.EXPM1, E.SQRT, E.RSQRT, E.SIN, E.COS, E.TANH,
               E.SIGMOID, E.ERF, E.RECIPROCAL, E.TAN, E.ASIN, E.ACOS, E.ATAN, E.SINH, E.COSH,
               E.ASINH, E.ACOSH, E.ATANH}

# torch op -> the one EwOp it is (binary): mul and the comparisons come as .Tensor and .Scalar
BINARY = {
    **{f"{name}.{overload}": ew_op
       for name, ew_op in {"mul": E.MUL, "eq": E.EQ, "ne": E.NE, "lt": E.LT, "le": E.LE,
                           "gt": E.GT, "ge": E.GE}.items()
       for overload in ("Tensor", "Scalar")},
    "maximum": E.MAX, "minimum": E.MIN,
    # arithmetic on numbers read off a tensor (`p = t.item()`, torch.export's symbolic
    # integers): `item` gives a 0-d tensor (emmy.tensor_ir.decomp.indexing), so `p + 3` is
    # arithmetic on that tensor, and a slice or select at it reads the position it holds
    **{f"sym_{name}": ew_op for name, ew_op in {
        "add": E.ADD, "sub": E.SUB, "mul": E.MUL, "max": E.MAX, "min": E.MIN, "ge": E.GE,
        "gt": E.GT, "le": E.LE, "lt": E.LT, "eq": E.EQ, "ne": E.NE, "and": E.AND,
        "or": E.OR}.items()},
}
# logical ops read their operands as booleans; bitwise ones on booleans are the same ops, and
# on integers they work on the bits
LOGICAL = {
    "logical_and": E.AND, "logical_or": E.OR, "logical_xor": E.NE,
    **{f"{name}.{overload}": ew_op
       for name, ew_op in {"bitwise_and": E.AND, "bitwise_or": E.OR, "bitwise_xor": E.NE,
                           "__and__": E.AND, "__or__": E.OR, "__xor__": E.NE}.items()
       for overload in ("Tensor", "Scalar")},
    **{f"bitwise_{name}.Scalar_Tensor": ew_op
       for name, ew_op in {"and": E.AND, "or": E.OR, "xor": E.NE}.items()},
}


def to_float(b: Builder, x: str) -> str:
    """Integers and booleans become f32, as torch does for float-only math."""
    return x if b.dtype(x).is_float else b.cast(x, DType.F32)


def _unary(ew_op: EwOp):
    def lower(b, x):
        return b.ew(ew_op, to_float(b, x) if ew_op in _FLOAT_ONLY else x)

    return lower


def _binary(ew_op: EwOp):
    def lower(b, x, y):
        return b.ew(ew_op, x, y)

    return lower


_ON_BITS = {E.AND: E.BITAND, E.OR: E.BITOR, E.NE: E.BITXOR}


def _logical(ew_op: EwOp, name: str):
    def lower(b, x, y):
        if not name.startswith("logical") and _integers(b, x, y) is not DType.BOOL:
            return b.ew(_ON_BITS[ew_op], x, y)
        return b.ew(ew_op, _as_bool(b, x), _as_bool(b, y))

    return lower


def _integers(b: Builder, *values) -> DType:
    """The operands' type, an integer or bool one (a bitwise op's)."""
    dtype = b.result_type(*values)
    if dtype.is_float:
        raise Refused(f"bitwise ops on {dtype} (torch takes integers and booleans)")
    return dtype


def _as_bool(b: Builder, x):
    return b.cast(x, DType.BOOL) if isinstance(x, str) else bool(x)


for _name, _op in UNARY.items():
    op(_name)(_unary(_op))
for _name, _op in BINARY.items():
    op(_name)(_binary(_op))
for _name, _op in LOGICAL.items():
    op(_name)(_logical(_op, _name))


# ---- arithmetic ----------------------------------------------------------------------------------

@op("add.Tensor", "add.Scalar")
def lower_add(b, x, y, alpha=1):
    return b.ew(E.ADD, x, b.ew(E.MUL, y, alpha) if alpha != 1 else y)


@op("sub.Tensor", "sub.Scalar")
def lower_sub(b, x, y, alpha=1):
    return b.ew(E.SUB, x, b.ew(E.MUL, y, alpha) if alpha != 1 else y)


@op("rsub.Tensor", "rsub.Scalar")
def lower_rsub(b, x, y, alpha=1):
    return lower_sub(b, y, x, alpha)


@op("div.Tensor", "div.Scalar", "true_divide.Tensor", "sym_truediv")
def lower_div(b, x, y):
    return true_divide(b, x, y)


def true_divide(b: Builder, x, y) -> str:
    """x / y as floats, also for integer operands."""
    if not b.result_type(x, y).is_float:
        x = b.cast(x, DType.F32) if isinstance(x, str) else float(x)
    return b.ew(E.DIV, x, y)


# rounding_mode -> how to round the true quotient
_ROUND = {"floor": lambda b, q: b.ew(E.FLOOR, q), "trunc": lambda b, q: trunc(b, q)}


@op("div.Tensor_mode", "div.Scalar_mode")
def lower_div_mode(b, x, y, *, rounding_mode=None):
    if rounding_mode is None:
        return true_divide(b, x, y)
    kind = b.result_type(x, y)
    if not kind.is_float:     # in integers: exact where a float quotient rounds past 2^24
        x, y = (b.cast(v, kind) if isinstance(v, str) else v for v in (x, y))
        q = b.ew(E.DIV, x, y)                                   # truncated
        if rounding_mode == "trunc":
            return q
        # floor: one less where the division was inexact and the signs differ
        r = b.ew(E.SUB, x, b.ew(E.MUL, q, y))
        down = b.ew(E.AND, b.ew(E.NE, r, 0), b.ew(E.NE, b.ew(E.LT, r, 0), b.ew(E.LT, y, 0)))
        return b.cast(b.ew(E.SUB, q, b.cast(down, kind)), kind)
    if rounding_mode == "floor":
        return _floor_divide_floats(b, x, y)
    q = _ROUND[rounding_mode](b, true_divide(b, x, y))
    return b.cast(q, b.result_type(x, y))  # integer operands give an integer quotient


def _float_operands(b: Builder, x, y, numbers_rounded: bool = True):
    """x and y in their common float type, 16-bit ones widened to f32 (torch computes these
    ops on them in f32, a number rounded to their type first where `numbers_rounded`); and
    that common type."""
    from emmy.dtypes import rounded

    kind = b.result_type(x, y)
    wide = DType.F32 if kind in (DType.F16, DType.BF16) else kind
    narrow = wide is not kind and numbers_rounded
    return tuple(b.cast(v, wide) if isinstance(v, str) else
                 float(rounded(np.array([v], np.float32), kind)[0]) if narrow else float(v)
                 for v in (x, y)) + (kind,)


def _floor_divide_floats(b: Builder, x, y) -> str:
    """torch's floor division of floats (as Python's): from the exact remainder fmod(x, y), not
    from the rounded quotient (1.0 // 0.1 is 9: 0.1 is a little more than a tenth), the result
    rounded to the nearest integer to undo the division's rounding; by zero, x / y. 16-bit
    types in f32, a number as it is (as torch computes it)."""
    x, y, kind = _float_operands(b, x, y, numbers_rounded=False)
    mod = b.ew(E.FMOD, x, y)
    div = b.ew(E.DIV, b.ew(E.SUB, x, mod), y)
    apart = b.ew(E.AND, b.ew(E.NE, mod, 0.0), b.ew(E.NE, b.ew(E.LT, y, 0.0), b.ew(E.LT, mod, 0.0)))
    div = b.ew(E.WHERE, apart, b.ew(E.SUB, div, 1.0), div)
    floor = b.ew(E.FLOOR, div)
    floor = b.ew(E.WHERE, b.ew(E.GT, b.ew(E.SUB, div, floor), 0.5), b.ew(E.ADD, floor, 1.0), floor)
    q = b.ew(E.DIV, x, y)
    out = b.ew(E.WHERE, b.ew(E.EQ, div, 0.0), b.ew(E.MUL, q, 0.0), floor)   # 0 signed as x / y
    return b.cast(b.ew(E.WHERE, b.ew(E.EQ, y, 0.0), q, out), kind)


@op("floor_divide", "floor_divide.Scalar", "sym_floordiv")
def lower_floor_divide(b, x, y):
    return lower_div_mode(b, x, y, rounding_mode="floor")


@op("remainder.Tensor", "remainder.Scalar", "sym_mod")
def lower_remainder(b, x, y):
    """The sign follows the divisor: in integers x - floor(x / y) * y, in floats fmod(x, y),
    plus y where their signs differ (torch's, exact)."""
    if b.result_type(x, y).is_float:
        x, y, kind = _float_operands(b, x, y)
        mod = b.ew(E.FMOD, x, y)
        apart = b.ew(E.AND, b.ew(E.NE, mod, 0.0),
                     b.ew(E.NE, b.ew(E.LT, y, 0.0), b.ew(E.LT, mod, 0.0)))
        return b.cast(b.ew(E.WHERE, apart, b.ew(E.ADD, mod, y), mod), kind)
    return b.ew(E.SUB, x, b.ew(E.MUL, lower_floor_divide(b, x, y), y))


@op("fmod.Tensor", "fmod.Scalar")
def lower_fmod(b, x, y):
    """The sign follows the dividend: C's fmod in floats (exact), in integers
    x - trunc(x / y) * y."""
    if b.result_type(x, y).is_float:
        x, y, kind = _float_operands(b, x, y)
        return b.cast(b.ew(E.FMOD, x, y), kind)
    return b.ew(E.SUB, x, b.ew(E.MUL, lower_div_mode(b, x, y, rounding_mode="trunc"), y))


def trunc(b: Builder, x: str) -> str:
    return b.ew(E.WHERE, b.ew(E.LT, x, 0), b.ew(E.CEIL, x), b.ew(E.FLOOR, x))


@op("trunc")
def lower_trunc(b, x):
    return trunc(b, x)


@op("frac")
def lower_frac(b, x):
    return b.ew(E.SUB, x, trunc(b, x))


@op("round")
def lower_round(b, x):
    """To the nearest integer, halves to even; integers as they are."""
    return b.ew(E.ROUND, x) if b.dtype(x).is_float else x


@op("round.decimals", opmath=True)
def lower_round_decimals(b, x, *, decimals=0):
    """torch's: rint(x * 10^d) / 10^d, or rint(x / 10^-d) * 10^-d for d < 0 (in f32 for
    16-bit x)."""
    if not b.dtype(x).is_float or decimals == 0:
        return lower_round(b, x)
    if decimals > 0:
        scale = 10.0 ** decimals
        return b.ew(E.DIV, b.ew(E.ROUND, b.ew(E.MUL, x, scale)), scale)
    scale = 10.0 ** -decimals
    return b.ew(E.MUL, b.ew(E.ROUND, b.ew(E.DIV, x, scale)), scale)


@op("lerp.Scalar", "lerp.Tensor", opmath=True)
def lower_lerp(b, start, end, weight):
    """torch's two-sided form, exact at both ends: start + w (end - start) for w < 0.5, else
    end - (end - start)(1 - w)."""
    diff = b.ew(E.SUB, end, start)
    low = b.ew(E.ADD, start, b.ew(E.MUL, weight, diff))
    high = b.ew(E.SUB, end, b.ew(E.MUL, diff, b.ew(E.SUB, 1.0, weight)))
    if not isinstance(weight, str):
        return low if abs(weight) < 0.5 else high
    return b.ew(E.WHERE, b.ew(E.LT, b.ew(E.ABS, weight), 0.5), low, high)


@op("addcmul", opmath=True)
def lower_addcmul(b, x, t1, t2, *, value=1):
    return b.ew(E.ADD, x, b.ew(E.MUL, b.ew(E.MUL, t1, t2), value))


@op("addcdiv", opmath=True)
def lower_addcdiv(b, x, t1, t2, *, value=1):
    return b.ew(E.ADD, x, b.ew(E.MUL, b.ew(E.DIV, t1, t2), value))


# ---- floating-point classes and signs ------------------------------------------------------------

def isnan(b: Builder, x: str) -> str:
    """x != x for floats; no integer is NaN."""
    if b.dtype(x).is_float:
        return b.ew(E.NE, x, x)
    return b.full(b.shape(x), False, DType.BOOL)


@op("isnan")
def lower_isnan(b, x):
    return isnan(b, x)


@op("signbit")
def lower_signbit(b, x):
    """The sign bit: true for negative numbers, -0.0 and a NaN with its sign bit set."""
    dt = b.dtype(x)
    if dt.is_float:
        return b.ew(E.SIGNBIT, x)
    if dt is DType.BOOL:
        return b.full(b.shape(x), False, DType.BOOL)
    return b.ew(E.LT, x, 0)


@op("copysign.Tensor", "copysign.Scalar")
def lower_copysign(b, x, y):
    """|x| with y's sign bit (-0.0 and a negative NaN count as negative); integers compute as
    f32, as torch promotes them."""
    dt = b.result_type(x, y)
    dt = dt if dt.is_float else DType.F32
    magnitude = b.ew(E.ABS, b.cast(x, dt))
    if not isinstance(y, str):
        return b.ew(E.NEG, magnitude) if math.copysign(1.0, y) < 0 else magnitude
    return b.ew(E.WHERE, lower_signbit(b, y), b.ew(E.NEG, magnitude), magnitude)


def _nan_ignoring(extreme: EwOp):
    """fmax (fmin): maximum (minimum) ignoring NaN, the other operand where one is NaN, NaN
    only where both are."""
    def lower(b, x, y):
        out = b.ew(extreme, x, y)
        if not b.result_type(x, y).is_float:
            return out
        out = b.ew(E.WHERE, isnan(b, y), x, out)
        return b.ew(E.WHERE, isnan(b, x), y, out)

    return lower


op("fmax")(_nan_ignoring(E.MAX))
op("fmin")(_nan_ignoring(E.MIN))


@op("lgamma")
def lower_lgamma(b, x):
    """log |gamma(x)|; +inf at the poles (0, -1, -2, ...)."""
    return b.ew(E.LGAMMA, to_float(b, x))


@op("digamma")
def lower_digamma(b, x):
    """gamma'(x) / gamma(x); -inf at +0, +inf at -0, NaN at the negative integers (torch's
    values)."""
    return b.ew(E.DIGAMMA, to_float(b, x))


@op("erfinv")
def lower_erfinv(b, x):
    """y with erf(y) = x; +-inf at +-1, NaN outside [-1, 1]."""
    return b.ew(E.ERFINV, to_float(b, x))


@op("nan_to_num")
def lower_nan_to_num(b, x, nan=0.0, posinf=None, neginf=None):
    """NaN, +inf and -inf replaced (the infinities by the type's largest and lowest finite
    values unless given); integers as they are."""
    import torch

    from emmy.dtypes import to_torch

    dt = b.dtype(x)
    if not dt.is_float:
        return x
    info = torch.finfo(to_torch(dt))
    posinf = info.max if posinf is None else posinf
    neginf = info.min if neginf is None else neginf
    out = b.ew(E.WHERE, b.ew(E.EQ, x, float("inf")), posinf, x)
    out = b.ew(E.WHERE, b.ew(E.EQ, x, float("-inf")), neginf, out)
    return b.ew(E.WHERE, b.ew(E.NE, x, x), nan if nan is not None else 0.0, out)


@op("logit", opmath=True)
def lower_logit(b, x, eps=None):
    """log(x / (1 - x)), x clamped to [eps, 1 - eps] when eps is given."""
    x = to_float(b, x)
    if eps is not None:
        x = lower_clamp(b, x, eps, 1.0 - eps)
    return b.ew(E.LOG, b.ew(E.DIV, x, b.ew(E.SUB, 1.0, x)))


@op("atan2")
def lower_atan2(b, y, x):
    """The angle of (x, y), in (-pi, pi]; integers compute as f32."""
    return b.ew(E.ATAN2, to_float(b, y), to_float(b, x))


# ---- fake quantization (quantization-aware training's forward, as torch's kernels compute it)

def _fake_quantize(b, x, scale, zero_point, quant_min: int, quant_max: int):
    """(clamp(round(x / scale) + zero_point, quant_min, quant_max) - zero_point) * scale,
    x / scale as x times f32(1 / scale) and the rounding half to even, as torch's kernel."""
    inv = b.ew(E.DIV, 1.0, b.cast(scale, DType.F32)) if isinstance(scale, str) else \
        float(np.float32(1.0 / scale))
    zero = b.cast(zero_point, DType.F32) if isinstance(zero_point, str) else float(zero_point)
    q = b.ew(E.ADD, b.ew(E.ROUND, b.ew(E.MUL, b.cast(x, DType.F32), inv)), zero)
    q = b.ew(E.MIN, b.ew(E.MAX, q, float(quant_min)), float(quant_max))
    out = b.ew(E.MUL, b.ew(E.SUB, q, zero),
               b.cast(scale, DType.F32) if isinstance(scale, str) else float(scale))
    return b.cast(out, b.dtype(x))


@op("fake_quantize_per_tensor_affine", "fake_quantize_per_tensor_affine.tensor_qparams")
def lower_fake_quantize(b, x, scale, zero_point, quant_min, quant_max):
    return _fake_quantize(b, x, scale, zero_point, quant_min, quant_max)


@op("fake_quantize_per_channel_affine")
def lower_fake_quantize_per_channel(b, x, scale, zero_point, axis, quant_min, quant_max):
    """Each slice along `axis` with its own scale and zero point."""
    from emmy.symbolic import var
    from emmy.tensor_ir.ir import axis_var

    axis %= b.rank(x)
    along = [var(axis_var(axis))]
    scale, zero_point = (b.index_map(t, b.shape(x), along) for t in (scale, zero_point))
    return _fake_quantize(b, x, scale, zero_point, quant_min, quant_max)


def _rounded_zero_point(b, zero_point, quant_min: int, quant_max: int):
    """A learnable (float) zero point as torch's forward uses it: rounded half to even, then
    clamped to the quantized range."""
    z = b.ew(E.ROUND, b.cast(zero_point, DType.F32))
    return b.ew(E.MIN, b.ew(E.MAX, z, float(quant_min)), float(quant_max))


@op("_fake_quantize_learnable_per_tensor_affine")
def lower_fake_quantize_learnable(b, x, scale, zero_point, quant_min, quant_max,
                                  grad_factor=1.0):
    """torch.ao's LSQ fake quantization (a learned scale and zero point): the forward is fake
    quantization by the first scale and the zero point rounded and clamped (grad_factor only
    scales gradients)."""
    from emmy.tensor_ir.decomp.layout import slice_axis

    first = [slice_axis(b, t, 0, 0, 1) for t in (scale, zero_point)]
    return _fake_quantize(b, x, first[0], _rounded_zero_point(b, first[1], quant_min, quant_max),
                          quant_min, quant_max)


@op("_fake_quantize_learnable_per_channel_affine")
def lower_fake_quantize_learnable_per_channel(b, x, scale, zero_point, axis, quant_min,
                                              quant_max, grad_factor=1.0):
    return lower_fake_quantize_per_channel(
        b, x, scale, _rounded_zero_point(b, zero_point, quant_min, quant_max), axis, quant_min,
        quant_max)


@op("angle")
def lower_angle(b, x):
    """A real number's angle: pi where it is negative, NaN where it is NaN, else 0 (integers
    give f32). Complex values' is emmy.tensor_ir.complex's."""
    x = to_float(b, x)
    return b.ew(E.WHERE, b.ew(E.NE, x, x), x, b.ew(E.WHERE, b.ew(E.LT, x, 0.0), math.pi, 0.0))


@op("logaddexp", opmath=True)
def lower_logaddexp(b, x, y):
    """log(e^x + e^y) = max + log1p(e^-|x - y|); where both are the same infinity, that
    infinity (the difference would be NaN)."""
    x, y = to_float(b, x), to_float(b, y)
    top = b.ew(E.MAX, x, y)
    sum_ = b.ew(E.ADD, top, b.ew(E.LOG1P, b.ew(E.EXP, b.ew(E.NEG, b.ew(E.ABS,
                                                                        b.ew(E.SUB, x, y))))))
    same_inf = b.ew(E.AND, b.ew(E.EQ, x, y), b.ew(E.EQ, b.ew(E.ABS, x), float("inf")))
    return b.ew(E.WHERE, same_inf, x, sum_)


@op("hypot", opmath=True)
def lower_hypot(b, x, y):
    """sqrt(x^2 + y^2) without overflow: big * sqrt(1 + (small / big)^2); inf where either is
    infinite (even against NaN, as C's hypot), 0 where both are 0."""
    ax, ay = b.ew(E.ABS, x), b.ew(E.ABS, y)
    big, small = b.ew(E.MAX, ax, ay), b.ew(E.MIN, ax, ay)
    ratio = b.ew(E.WHERE, b.ew(E.EQ, big, 0.0), 0.0, b.ew(E.DIV, small, big))
    out = b.ew(E.MUL, big, b.ew(E.SQRT, b.ew(E.ADD, 1.0, b.ew(E.MUL, ratio, ratio))))
    inf = b.ew(E.OR, b.ew(E.EQ, ax, float("inf")), b.ew(E.EQ, ay, float("inf")))
    return b.ew(E.WHERE, inf, float("inf"), out)


# exponent -> x**exponent without pow
_POW = {
    1: lambda b, x: x,
    2: lambda b, x: b.ew(E.MUL, x, x),
    3: lambda b, x: b.ew(E.MUL, b.ew(E.MUL, x, x), x),
    0.5: lambda b, x: b.ew(E.SQRT, x),
    -0.5: lambda b, x: b.ew(E.RSQRT, x),
    -1: lambda b, x: b.ew(E.RECIPROCAL, x),
}


@op("pow.Tensor_Scalar")
def lower_pow_scalar(b, x, exponent):
    if isinstance(exponent, float) and not b.dtype(x).is_float:
        x = to_float(b, x)
    if exponent == 0:
        return b.full(b.shape(x), 1, b.dtype(x))
    if exponent in _POW and (b.dtype(x).is_float or exponent in (1, 2, 3)):
        return _POW[exponent](b, x)
    return b.ew(E.POW, x, exponent)


@op("pow.Tensor_Tensor")
def lower_pow_tensor(b, x, y):
    return b.ew(E.POW, x, y)


@op("sym_float")
def lower_sym_float(b, x):
    """float() of a number read off a tensor (`2.0 ** k` of an integer k)."""
    return to_float(b, x) if isinstance(x, str) else float(x)


@op("sym_pow")
def lower_sym_pow(b, x, y):
    """`0.9 ** step` of a number read off a tensor (Adam's bias correction written with
    `.item()`): Python's power, in floats unless both are integers."""
    if not all(isinstance(v, int) or (isinstance(v, str) and not b.dtype(v).is_float)
               for v in (x, y)):
        x, y = (to_float(b, v) if isinstance(v, str) else float(v) for v in (x, y))
    return b.ew(E.POW, x, y)


@op("pow.Scalar")
def lower_pow_base(b, base, x):
    """base ** x; an integer x is raised as floats (negative integer powers have no int value)."""
    return b.ew(E.POW, float(base) if not b.dtype(x).is_float else base, x)


@op("exp2")
def lower_exp2(b, x):
    return b.ew(E.POW, 2.0, to_float(b, x))


@op("square")
def lower_square(b, x):
    return b.ew(E.MUL, x, x)


@op("log2")
def lower_log2(b, x):
    return b.ew(E.DIV, b.ew(E.LOG, to_float(b, x)), 0.6931471805599453)


@op("log10")
def lower_log10(b, x):
    return b.ew(E.DIV, b.ew(E.LOG, to_float(b, x)), 2.302585092994046)


# ---- logic and selection ---------------------------------------------------------------------

@op("logical_not")
def lower_not(b, x):
    return b.ew(E.NOT, b.cast(x, DType.BOOL))


@op("bitwise_not", "__invert__")
def lower_invert(b, x):
    _integers(b, x)
    return b.ew(E.NOT if b.dtype(x) is DType.BOOL else E.BITNOT, x)


@op("__lshift__.Tensor", "__lshift__.Scalar", "bitwise_left_shift.Tensor",
    "bitwise_left_shift.Tensor_Scalar", "bitwise_left_shift.Scalar_Tensor")
def lower_shift_left(b, x, y):
    _integers(b, x, y)
    return b.ew(E.SHL, x, y)


@op("__rshift__.Tensor", "__rshift__.Scalar", "bitwise_right_shift.Tensor",
    "bitwise_right_shift.Tensor_Scalar", "bitwise_right_shift.Scalar_Tensor")
def lower_shift_right(b, x, y):
    _integers(b, x, y)
    return b.ew(E.SHR, x, y)


@op("where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar")
def lower_where(b, condition, x, y):
    return b.ew(E.WHERE, condition, x, y)


@op("masked_fill.Scalar", "masked_fill.Tensor")
def lower_masked_fill(b, x, mask, value):
    return b.cast(b.ew(E.WHERE, mask, value, x), b.dtype(x))


@op("clamp", "clamp.Tensor")
def lower_clamp(b, x, min=None, max=None):
    if min is not None:
        x = b.ew(E.MAX, x, min)
    if max is not None:
        x = b.ew(E.MIN, x, max)
    return x


@op("clamp_min", "clamp_min.Tensor")
def lower_clamp_min(b, x, min):
    return b.ew(E.MAX, x, min)


@op("clamp_max", "clamp_max.Tensor")
def lower_clamp_max(b, x, max):
    return b.ew(E.MIN, x, max)


@op("hardtanh")
def lower_hardtanh(b, x, min_val=-1.0, max_val=1.0):
    return lower_clamp(b, x, min_val, max_val)


@op("relu6")
def lower_relu6(b, x):
    return lower_clamp(b, x, 0, 6)


@op("relu")
def lower_relu(b, x):
    return b.ew(E.MAX, x, 0)


# ---- casts -----------------------------------------------------------------------------------

@op("to.dtype")
def lower_to_dtype(b, x, dtype, non_blocking=False, copy=False, memory_format=None):
    return b.cast(x, dtype)


@op("to.dtype_layout", "_to_copy", "to.device")
def lower_to(b, x, *args, dtype=None, **kwargs):
    dtype = dtype or next((a for a in args if isinstance(a, DType)), None)
    return b.cast(x, dtype) if dtype else x


@op("frexp.Tensor")
def lower_frexp(b, x):
    """(mantissa, exponent) with x = mantissa * 2^exponent and 0.5 <= |mantissa| < 1, read off
    the float64 bits of x (exact): the exponent field less 1022, the mantissa those bits with
    the field set to 1022; a float64 subnormal scaled by 2^54 first. 0, infinities and NaN
    stay as they are, with exponent 0, as torch gives them."""
    dt = b.dtype(x)
    if not dt.is_float:
        raise Refused(f"frexp of {dt} (torch takes floating-point tensors)")
    v = b.cast(x, DType.F64)
    tiny = b.ew(E.LT, b.ew(E.ABS, v), 2.0 ** -1022)
    bits = b.bits(b.ew(E.WHERE, tiny, b.ew(E.MUL, v, 2.0 ** 54), v))
    field = b.ew(E.BITAND, b.ew(E.SHR, bits, 52), 0x7FF)
    exponent = b.ew(E.SUB, b.ew(E.SUB, field, 1022), b.ew(E.WHERE, tiny, 54, 0))
    kept = -(0x7FF << 52) - 1                       # every bit but the exponent field's
    mantissa = b.bits(b.ew(E.BITOR, b.ew(E.BITAND, bits, kept), 1022 << 52), as_float=True)
    ordinary = b.ew(E.AND, b.ew(E.NE, v, 0.0), b.ew(E.LT, b.ew(E.ABS, v), float("inf")))
    return (b.cast(b.ew(E.WHERE, ordinary, mantissa, v), dt),
            b.cast(b.ew(E.WHERE, ordinary, exponent, 0), DType.I32))


@op("view.dtype")
def lower_view_dtype(b, x, dtype):
    """`x.view(torch.int32)`: the same bits read as another type of the same width (torchao's
    stochastic rounding masks an f32's low bits so): f32 and i32, f64 and i64, bf16 and i16
    (a bf16's bits are the upper half of its f32's, exactly)."""
    src = b.dtype(x)
    if src is dtype:
        return x
    pair = {src, dtype}
    if pair in ({DType.F32, DType.I32}, {DType.F64, DType.I64}):
        return b.bits(x, as_float=dtype.is_float)
    if pair == {DType.BF16, DType.I16}:
        if src is DType.BF16:
            return b.cast(b.ew(E.SHR, b.bits(b.cast(x, DType.F32)), 16), DType.I16)
        wide = b.ew(E.SHL, b.cast(x, DType.I32), 16)
        return b.cast(b.bits(wide, as_float=True), DType.BF16)
    raise Refused(f"reading {src} bits as {dtype}: emmy reads f32 as i32, f64 as i64 and bf16 "
                  "as i16 (and back)")


@op("type_as")
def lower_type_as(b, x, other):
    return b.cast(x, b.dtype(other))


I0_SERIES_TERMS = 64    # terms of I0's power series, enough for |x| <= I0_ASYMPTOTIC in f64
I0_ASYMPTOTIC = 40.0    # past it, e^|x| / sqrt(2 pi |x|) times the asymptotic series


@op("i0", "special_i0", opmath=True)
def lower_i0(b, x):
    """The modified Bessel function of the first kind of order 0 (torch.i0; a Kaiser window's
    and torchaudio's kaiser resampling): sum over k of ((x/2)^2)^k / (k!)^2, each term from the
    last, for |x| up to I0_ASYMPTOTIC (the terms are positive: no cancellation); past it,
    e^|x| / sqrt(2 pi |x|) (1 + 1/(8|x|) + 9/(2 (8|x|)^2) + ...), whose terms there are below
    the type's precision after a few."""
    a = b.ew(E.ABS, x)
    q = b.ew(E.MUL, b.ew(E.MUL, a, a), 0.25)
    small = b.ew(E.MIN, q, (I0_ASYMPTOTIC / 2) ** 2)    # the series where it is taken
    term = total = b.full(b.shape(x), 1.0, b.dtype(x))
    for k in range(1, I0_SERIES_TERMS):
        term = b.ew(E.MUL, term, b.ew(E.MUL, small, 1.0 / (k * k)))
        total = b.ew(E.ADD, total, term)
    big = b.ew(E.MAX, a, I0_ASYMPTOTIC)
    inv = b.ew(E.RECIPROCAL, b.ew(E.MUL, big, 8.0))
    factor, power, series = 1.0, inv, 1.0
    for k in range(1, 6):       # ((2k-1)!!)^2 / k! over (8x)^k
        factor *= (2 * k - 1) ** 2 / k
        series = b.ew(E.ADD, series, b.ew(E.MUL, power, factor))
        power = b.ew(E.MUL, power, inv)
    asymptotic = b.ew(E.MUL, b.ew(E.DIV, b.ew(E.EXP, big), b.ew(E.SQRT, b.ew(
        E.MUL, big, 2 * math.pi))), series)
    return b.ew(E.WHERE, b.ew(E.LE, a, I0_ASYMPTOTIC), total, asymptotic)

