"""Tensor IR: framework-neutral tensor primitives in SSA form.

A program is a list of named definitions in dependency order. Each definition produces one
tensor of a known `TensorType`. Broadcasting, transposes, reshapes, slices and flips are
explicit `IndexMap`s (no arithmetic); a matrix product is an elementwise product of two
index-mapped operands followed by a `Reduce(sum)` over the contracted axis.

Index expressions use the output's axis variables `a0, a1, …` (see `axis_var`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping, Union

from emmy.dtypes import DType
from emmy.symbolic import Lin
from emmy.torch_ir.ir import InputKind, TensorType

__all__ = ["EwOp", "ReduceOp", "Scalar", "Input", "Elementwise", "Cast", "IndexMap", "Reduce",
           "Scan", "Iota", "Gather", "Def", "gather_var", "Program", "axis_var", "TensorType",
           "InputKind", "ARITY", "COMMUTATIVE"]


def axis_var(i: int) -> str:
    """Name of the i-th output axis in IndexMap expressions."""
    return f"a{i}"


def gather_var(k: int) -> str:
    """Name of the k-th data-dependent index in a Gather's (and a Loop IR load's) expressions:
    the value of its k-th index tensor (Loop IR: value) at the position read. Never a C name,
    so an expression that still holds one cannot reach generated code."""
    return f"@{k}"


class EwOp(Enum):
    # unary
    NEG = "neg"; ABS = "abs"; EXP = "exp"; LOG = "log"; LOG1P = "log1p"; EXPM1 = "expm1"
    SQRT = "sqrt"; RSQRT = "rsqrt"; SIN = "sin"; COS = "cos"; TANH = "tanh"
    SIGMOID = "sigmoid"; ERF = "erf"; FLOOR = "floor"; CEIL = "ceil"; SIGN = "sign"
    ROUND = "round"  # to the nearest integer, halves to even (rint)
    TAN = "tan"; ASIN = "asin"; ACOS = "acos"; ATAN = "atan"; SINH = "sinh"; COSH = "cosh"
    ASINH = "asinh"; ACOSH = "acosh"; ATANH = "atanh"
    LGAMMA = "lgamma"  # log |gamma(x)|
    DIGAMMA = "digamma"  # gamma's logarithmic derivative
    ERFINV = "erfinv"  # erf's inverse on [-1, 1]
    SIGNBIT = "signbit"  # the sign bit (true for -0.0 and a negative NaN)
    RECIPROCAL = "reciprocal"; NOT = "not"
    BITNOT = "bitnot"  # an integer's bits inverted (~)
    BITS = "bits"  # an f32 (f64) value's bits read as an i32 (i64): Builder.bits
    FLOAT_BITS = "float_bits"  # an i32 (i64) value's bits read as an f32 (f64): Builder.bits
    # binary
    ADD = "add"; SUB = "sub"; MUL = "multiply"; DIV = "divide"; POW = "pow"
    MAX = "maximum"; MIN = "minimum"; ATAN2 = "atan2"
    FMOD = "fmod"  # C's fmod: a float remainder, exact, its sign the dividend's
    LT = "lt"; LE = "le"; GT = "gt"; GE = "ge"; EQ = "eq"; NE = "ne"; AND = "and"; OR = "or"
    BITAND = "bitand"; BITOR = "bitor"; BITXOR = "bitxor"   # integers' bits (&, |, ^)
    SHL = "shl"; SHR = "shr"  # shifts as torch's: a count outside [0, bits) gives 0, or the sign
    # ternary
    WHERE = "where"

    def __str__(self) -> str:
        return self.value


_UNARY = {EwOp.NEG, EwOp.ABS, EwOp.EXP, EwOp.LOG, EwOp.LOG1P, EwOp.EXPM1, EwOp.SQRT,
          EwOp.RSQRT, EwOp.SIN, EwOp.COS, EwOp.TANH, EwOp.SIGMOID, EwOp.ERF, EwOp.FLOOR,
          EwOp.CEIL, EwOp.SIGN, EwOp.ROUND, EwOp.TAN, EwOp.ASIN, EwOp.ACOS, EwOp.ATAN,
          EwOp.SINH, EwOp.COSH, EwOp.ASINH, EwOp.ACOSH, EwOp.ATANH, EwOp.LGAMMA,
          EwOp.DIGAMMA, EwOp.ERFINV, EwOp.SIGNBIT, EwOp.RECIPROCAL, EwOp.NOT, EwOp.BITNOT,
          EwOp.BITS, EwOp.FLOAT_BITS}
ARITY: Mapping[EwOp, int] = {op: 1 if op in _UNARY else 3 if op is EwOp.WHERE else 2 for op in EwOp}
COMMUTATIVE = frozenset({EwOp.ADD, EwOp.MUL, EwOp.MAX, EwOp.MIN, EwOp.EQ, EwOp.NE, EwOp.AND, EwOp.OR,
                         EwOp.BITAND, EwOp.BITOR, EwOp.BITXOR})
COMPARISON = frozenset({EwOp.LT, EwOp.LE, EwOp.GT, EwOp.GE, EwOp.EQ, EwOp.NE, EwOp.AND, EwOp.OR,
                        EwOp.NOT, EwOp.SIGNBIT})   # the ops whose result is a bool


class ReduceOp(Enum):
    SUM = "sum"; PROD = "prod"; MAX = "max"; MIN = "min"; ARGMAX = "argmax"; ARGMIN = "argmin"
    LOGADDEXP = "logaddexp"   # log(exp(a) + exp(b)): a running one is logcumsumexp

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Scalar:
    """A literal operand of an elementwise op (broadcast to the output's shape)."""

    value: float | int | bool
    dtype: DType

    def __str__(self) -> str:
        return repr(self.value)


Operand = Union[str, Scalar]  # a str names another definition


@dataclass(frozen=True, slots=True)
class Input:
    """A program input: a tensor argument, or a parameter / buffer / constant shown as load(...)."""

    name: str
    type: TensorType
    kind: InputKind = InputKind.INPUT
    target: str | None = None


@dataclass(frozen=True, slots=True)
class Elementwise:
    name: str
    type: TensorType
    op: EwOp
    args: tuple[Operand, ...]  # every str operand has exactly `type.shape`


@dataclass(frozen=True, slots=True)
class Cast:
    name: str
    type: TensorType
    arg: str


@dataclass(frozen=True, slots=True)
class IndexMap:
    """out[a0, …] = arg[index[0], index[1], …]: transpose, broadcast, reshape, slice, flip."""

    name: str
    type: TensorType
    arg: str
    index: tuple[Lin, ...]  # one expression per axis of `arg`, over the output axes a0, a1, …


@dataclass(frozen=True, slots=True)
class Reduce:
    """Reduce `arg` over `axes`; the output drops those axes. argmax/argmin give i64 positions."""

    name: str
    type: TensorType
    op: ReduceOp
    arg: str
    axes: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Scan:
    """Running reduction along `axis` (cumsum, cumprod, …), optionally reversed / exclusive."""

    name: str
    type: TensorType
    op: ReduceOp  # SUM, PROD, MAX or MIN
    arg: str
    axis: int
    reverse: bool = False
    exclusive: bool = False


@dataclass(frozen=True, slots=True)
class Iota:
    """out[a0, …] = a<axis>: the position along one axis, as a value (masks, one-hot gathers)."""

    name: str
    type: TensorType
    axis: int


@dataclass(frozen=True, slots=True)
class Gather:
    """out[a0, …] = arg[index[0], …], where the index expressions may also name `@0, @1, …`
    (`gather_var`): the value of `indices[k]` at the output position, an integer tensor of the
    output's shape. Embedding, gather, index_select and tensor indexing. Decompositions wrap
    negative positions and clamp the rest into range first, so every read is in bounds (torch
    raises on an out-of-range index; a kernel reads the nearest row)."""

    name: str
    type: TensorType
    arg: str
    index: tuple[Lin, ...]     # one expression per axis of `arg`, over a0, a1, … and @0, @1, …
    indices: tuple[str, ...]   # each of the output's shape


Def = Union[Input, Elementwise, Cast, IndexMap, Reduce, Scan, Iota, Gather]


@dataclass(frozen=True, slots=True)
class Program:
    name: str
    defs: tuple[Def, ...]
    outputs: tuple[str, ...]
    tf32: bool = False        # float32 products may round operands to tf32 (Graph.tf32)
    # Values of PARAM/BUFFER/CONSTANT inputs by name (torch tensors); not part of identity.
    values: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def get(self, name: str) -> Def:
        for d in self.defs:
            if d.name == name:
                return d
        raise KeyError(name)

    @property
    def inputs(self) -> tuple[Input, ...]:
        return tuple(d for d in self.defs if isinstance(d, Input))
