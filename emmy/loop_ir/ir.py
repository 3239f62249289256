"""Loop IR: one scalar loop nest per kernel, after fusion and normalization.

A kernel body is a block: a tuple of statements run in order. Values are SSA names scoped
lexically: a name defined in a block is visible in the rest of that block and in loops nested
in it. Accumulators are the one mutable thing: `Init` defines one, `Accum` folds a value into
it inside a `reduce` or `scan` loop, and after a reduce loop ends its final value is read by name.
Inside a `scan` loop, reading the accumulator after its `Accum` gives the running value.

    kernel k0_rms_norm(x: f32[32,2048], weight: f32[2048]) -> (rms_norm: f32[32,2048])
      for a0 in 0..32
        acc0 = init(add) : f32
        reduce a1 in 0..2048
          in0 = load x[a0, a1]
          v0 = multiply(in0, in0)
          acc0 <- add(acc0, v0)
        …
        for a2 in 0..2048
          …
          rms_norm[a0, a2] = v5
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Union

from emmy.dtypes import DType
from emmy.symbolic import Lin
from emmy.tensor_ir.ir import EwOp, ReduceOp, Scalar, TensorType

__all__ = ["LoopKind", "Loop", "Load", "Compute", "CastTo", "IndexValue", "Init", "Accum",
           "Store", "Stmt", "Buffer", "Kernel", "LoopProgram", "Scalar", "EwOp", "ReduceOp"]


class LoopKind(Enum):
    PARALLEL = "for"      # iterations independent: each writes its own outputs
    REDUCE = "reduce"     # folds values into accumulators defined outside the loop
    SCAN = "scan"         # like reduce, and reads the running value inside the loop (in order)

    def __str__(self) -> str:
        return self.value


Operand = Union[str, Scalar]  # a str names an SSA value in scope


@dataclass(frozen=True, slots=True)
class Load:
    """dst = buffer[index]; an index expression may name `@k` (`gather_var`): the integer
    value `dyn[k]`, read at run time (a gather's position, in range)."""

    dst: str
    buffer: str
    index: tuple[Lin, ...]
    dtype: DType
    dyn: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Compute:
    dst: str
    op: EwOp
    args: tuple[Operand, ...]
    dtype: DType


@dataclass(frozen=True, slots=True)
class CastTo:
    dst: str
    arg: str
    dtype: DType


@dataclass(frozen=True, slots=True)
class IndexValue:
    """dst = the value of an index expression (from Iota), as `dtype`."""

    dst: str
    expr: Lin
    dtype: DType


@dataclass(frozen=True, slots=True)
class Init:
    """acc = the identity of `op` (0 for add, -inf for max, …); argmax/argmin also track a position."""

    acc: str
    op: ReduceOp
    dtype: DType  # the type of the folded values (argmax/argmin read back as i64)


@dataclass(frozen=True, slots=True)
class Accum:
    """acc <- op(acc, value); for argmax/argmin, `position` is the index being folded."""

    acc: str
    op: ReduceOp
    value: str
    position: Lin | None = None


@dataclass(frozen=True, slots=True)
class Store:
    buffer: str
    index: tuple[Lin, ...]
    value: str


@dataclass(frozen=True, slots=True)
class Loop:
    var: str
    extent: int
    kind: LoopKind
    body: tuple["Stmt", ...]
    reverse: bool = False  # iterate extent-1 down to 0 (reverse scans)


Stmt = Union[Load, Compute, CastTo, IndexValue, Init, Accum, Store, Loop]


@dataclass(frozen=True, slots=True)
class Buffer:
    name: str
    type: TensorType


@dataclass(frozen=True, slots=True, kw_only=True)
class Kernel:
    name: str
    inputs: tuple[Buffer, ...]
    outputs: tuple[Buffer, ...]
    body: tuple[Stmt, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopProgram:
    name: str
    inputs: tuple[Buffer, ...]         # program inputs, in the Tensor IR's order
    intermediates: tuple[Buffer, ...]  # written by one kernel, read by a later one
    outputs: tuple[Buffer, ...]        # program outputs, in order
    kernels: tuple[Kernel, ...]        # in execution order
    notes: tuple[str, ...] = ()        # fusion decisions worth reading: why a value was materialized
    tf32: bool = False                 # float32 products may round operands to tf32
