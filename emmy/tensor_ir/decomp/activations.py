"""Activation functions, each a few elementwise ops computed in f32 for half inputs."""

from __future__ import annotations

import math

from emmy.tensor_ir.builder import Builder
from emmy.tensor_ir.decomp.layout import along, norm_dim, slice_axis
from emmy.tensor_ir.decomp.table import Decomp, Refused, registrar
from emmy.tensor_ir.ir import EwOp as E

OPS: dict[str, Decomp] = {}
op = registrar(OPS)

SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


def softplus(b: Builder, x: str, beta: float = 1.0, threshold: float = 20.0) -> str:
    """log(1 + exp(beta*x)) / beta, and x itself where beta*x > threshold."""
    bx = b.ew(E.MUL, x, beta)
    soft = b.ew(E.DIV, b.ew(E.LOG1P, b.ew(E.EXP, bx)), beta)
    return b.ew(E.WHERE, b.ew(E.GT, bx, threshold), x, soft)


def elu(b: Builder, x: str, alpha=1.0, scale=1.0, input_scale=1.0) -> str:
    negative = b.ew(E.MUL, b.ew(E.EXPM1, b.ew(E.MUL, x, input_scale)), alpha * scale)
    return b.ew(E.WHERE, b.ew(E.GT, x, 0), b.ew(E.MUL, x, scale), negative)


@op("gelu", opmath=True)
def lower_gelu(b, x, *, approximate="none"):
    if approximate == "tanh":
        # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        inner = b.ew(E.ADD, x, b.ew(E.MUL, b.ew(E.MUL, b.ew(E.MUL, x, x), x), 0.044715))
        t = b.ew(E.TANH, b.ew(E.MUL, inner, math.sqrt(2 / math.pi)))
    else:
        # 0.5 x (1 + erf(x / sqrt(2)))
        t = b.ew(E.ERF, b.ew(E.MUL, x, 1 / math.sqrt(2)))
    return b.ew(E.MUL, b.ew(E.MUL, x, 0.5), b.ew(E.ADD, t, 1.0))


@op("silu", opmath=True)
def lower_silu(b, x):
    return b.ew(E.MUL, x, b.ew(E.SIGMOID, x))


@op("mish", opmath=True)
def lower_mish(b, x):
    return b.ew(E.MUL, x, b.ew(E.TANH, softplus(b, x)))


@op("softplus", opmath=True)
def lower_softplus(b, x, beta=1.0, threshold=20.0):
    return softplus(b, x, beta, threshold)


@op("log_sigmoid", opmath=True)
def lower_log_sigmoid(b, x):
    """min(x, 0) - log1p(exp(-|x|)), stable at both ends."""
    return b.ew(E.SUB, b.ew(E.MIN, x, 0), b.ew(E.LOG1P, b.ew(E.EXP, b.ew(E.NEG, b.ew(E.ABS, x)))))


@op("elu", opmath=True)
def lower_elu(b, x, alpha=1.0, scale=1.0, input_scale=1.0):
    return elu(b, x, alpha, scale, input_scale)


@op("selu", opmath=True)
def lower_selu(b, x):
    return elu(b, x, SELU_ALPHA, SELU_SCALE)


@op("celu", opmath=True)
def lower_celu(b, x, alpha=1.0):
    return elu(b, x, alpha, 1.0, 1.0 / alpha)


@op("leaky_relu", opmath=True)
def lower_leaky_relu(b, x, negative_slope=0.01):
    return b.ew(E.WHERE, b.ew(E.GT, x, 0), x, b.ew(E.MUL, x, negative_slope))


@op("rrelu", opmath=True)
def lower_rrelu(b, x, lower=1 / 8, upper=1 / 3, training=False, generator=None):
    """Evaluation mode: leaky_relu with the mean slope (lower + upper) / 2. In training each
    element draws its slope at random, which a compiled program cannot reproduce."""
    if training:
        raise Refused("training mode draws a random slope per element; call it with "
                      "training=False (model.eval())")
    return lower_leaky_relu(b, x, (lower + upper) / 2)


@op("hardsigmoid", opmath=True)
def lower_hardsigmoid(b, x):
    """relu6(x + 3) / 6"""
    return b.ew(E.DIV, b.ew(E.MIN, b.ew(E.MAX, b.ew(E.ADD, x, 3.0), 0.0), 6.0), 6.0)


@op("hardswish", opmath=True)
def lower_hardswish(b, x):
    return b.ew(E.MUL, x, lower_hardsigmoid(b, x))


@op("hardshrink", opmath=True)
def lower_hardshrink(b, x, lambd=0.5):
    return b.ew(E.WHERE, b.ew(E.GT, b.ew(E.ABS, x), lambd), x, 0.0)


@op("softshrink", opmath=True)
def lower_softshrink(b, x, lambd=0.5):
    shrunk = b.ew(E.SUB, x, b.ew(E.MUL, b.ew(E.SIGN, x), lambd))
    return b.ew(E.WHERE, b.ew(E.GT, b.ew(E.ABS, x), lambd), shrunk, 0.0)


@op("threshold", opmath=True)
def lower_threshold(b, x, threshold, value):
    return b.ew(E.WHERE, b.ew(E.GT, x, threshold), x, value)


@op("glu", opmath=True)
def lower_glu(b, x, dim=-1):
    dim = norm_dim(dim, b.rank(x))
    half = b.shape(x)[dim] // 2
    first, second = slice_axis(b, x, dim, 0, half), slice_axis(b, x, dim, half, 2 * half)
    return b.ew(E.MUL, first, b.ew(E.SIGMOID, second))


@op("prelu", "_prelu_kernel", opmath=True)
def lower_prelu(b, x, weight):
    """x where x > 0, else weight * x; a per-channel weight runs along axis 1."""
    if b.rank(weight) == 1 and b.shape(weight)[0] > 1:
        weight = along(b, weight, b.shape(x), 1)
    return b.ew(E.WHERE, b.ew(E.GT, x, 0), x, b.ew(E.MUL, x, weight))
