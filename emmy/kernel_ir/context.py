"""What lowering one Tile IR kernel to Kernel IR keeps at hand, and helpers every part shares."""

from __future__ import annotations

from dataclasses import dataclass, field

from emmy.dtypes import DType
from emmy.kernel_ir import ir as K
from emmy.symbolic import Lin, floordiv, mod, var
from emmy.schedule.decisions import Decisions
from emmy.tensor_ir.ir import ReduceOp
from emmy.tile_ir.ir import TileKernel

ARG_OPS = (ReduceOp.ARGMAX, ReduceOp.ARGMIN)


def ctype(t: DType) -> str:
    """The C type a value of this type is computed in (half types compute in float)."""
    return t.compute.c_name


@dataclass
class Fn:
    """What lowering one kernel needs at hand."""

    k: TileKernel
    d: Decisions
    types: dict[str, DType]
    shapes: dict[str, tuple[int, ...]]
    bounds: dict[str, int]
    stage: dict[str, str] = field(default_factory=dict)       # buffer -> shared array
    stage_index: dict[str, tuple[Lin, ...]] = field(default_factory=dict)  # pattern, axis -> "i"
    filled: set[str] = field(default_factory=set)      # staged rows already in shared memory
    filling: set[str] = field(default_factory=set)
    shared: list[K.SharedArray] = field(default_factory=list)
    shared_top: int = 0
    counter: int = 0
    reciprocals: set[str] = field(default_factory=set)   # divisors whose reciprocal is computed
    cluster_combines: int = 0      # combines across a cluster so far (their slots alternate)

    def fresh(self, stem: str) -> str:
        self.counter += 1
        return f"{stem}{self.counter}"

    def alloc(self, name: str, c: str, count: int, size: int) -> K.SharedArray:
        arr = K.SharedArray(name, c, count, self.shared_top)
        self.shared_top += (count * size + 15) // 16 * 16
        self.shared.append(arr)
        return arr


def buffer_dtype(fn: Fn, name: str) -> DType:
    return next(b.type.dtype for b in (*fn.k.inputs, *fn.k.outputs) if b.name == name)


def elem(fn: Fn, name: str) -> str:
    return buffer_dtype(fn, name).c_name


def decode(fn: Fn, flat: str, axes, extent_total: int) -> list[K.KStmt]:
    """Coordinates of a flat row-major index over `axes`."""
    out, stride = [], extent_total
    fn.bounds[flat] = extent_total
    for a in axes:
        stride //= a.extent
        e = floordiv(var(flat), stride, fn.bounds)
        e = mod(e, a.extent, fn.bounds) if stride * a.extent < extent_total else e
        out.append(K.Index(a.var, e))
    return out
