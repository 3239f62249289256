"""Cheaper arithmetic for the generic (row and map) kernels: a division by a value computed
before a fold becomes a multiplication by its reciprocal, and kernels whose floating-point data
is all 16-bit take the hardware's approximate exp (and sigmoid through it).

Reciprocals: softmax divides every element of a row by the row's sum. x * (1/s) is within
1.5 ulp of the exact quotient where x / s rounds it to 0.5 ulp (the same trade as fast-math
division), and costs one multiplication an element instead of an IEEE division (about ten
instructions). The special values agree (s = 0 or inf gives the same inf, NaN or 0 either
way); only an s so small that 1/s overflows (|s| < 2^-128) differs.

Approximations: a 16-bit kernel reads and writes f16 / bf16 (11 and 8 significant bits) and
computes in f32. Its exp is ex2.approx.ftz of x * log2(e) (as `__expf`): relative error under
about 2^-21 + |x| * 2^-24 (x * log2(e) is rounded to f32 first), at most 6e-6 over f32's range,
forty times under f16's half ulp; its sigmoid is 1 / (1 + that exp) with an approximate
reciprocal, the same bound. Both bounds are relative everywhere (no range where a small
result carries a large error), so a cancellation downstream amplifies at most 6e-6 of the
cancelled terms. They take 2 and 5
instructions where expf and an IEEE division take 8 and 10: in softmax over a bf16 row, the
library exp was most of the kernel's instructions. Not approximated: tanh (tanh.approx.f32's
2^-11 is f16's own precision, and GELU's 1 + tanh(z) cancels it for negative inputs) and log
(lg2.approx's error is absolute near 1, where log's result is small). A kernel that reads or
writes any f32 or f64 buffer keeps the library functions. emmy_kernel.cuh implements the
`em_fast_*` functions (on the CPU emulator: the same formulas with the C library, exp2f of the
rounded product, which is where ex2.approx's error comes from).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from emmy.dtypes import DType
from emmy.kernel_ir import ir as K
from emmy.loop_ir.ir import Compute
from emmy.tensor_ir.ir import EwOp
from emmy.tile_ir.ir import Fold, TileKernel
from emmy.tile_ir.values import defined

FAST = {"exp": "fast_exp", "sigmoid": "fast_sigmoid"}


def reciprocal_divisions(f: Fold, types: Mapping[str, DType],
                         exact: frozenset[str] = frozenset()) -> tuple[Fold, dict[str, Compute]]:
    """`f` with each floating-point division by a value defined outside it (`types`: the
    kernel's value types) made a multiplication by `<divisor>_rcp`, and for each divisor the
    statement computing that reciprocal, to run once before the fold. A quotient in `exact`
    (it leads to a step: loop_ir.semantics.exact_operands) stays a division: its 0.5 ulp is what
    eager rounds to an integer."""
    inside = defined(f.body) | {i.acc for i in f.accs}
    made: dict[str, Compute] = {}

    def rewrite(items):
        out = []
        for s in items:
            if isinstance(s, Fold):
                s = replace(s, body=rewrite(s.body))
            elif isinstance(s, Compute) and s.op is EwOp.DIV and s.dtype.is_float and \
                    s.dst not in exact and \
                    isinstance(s.args[1], str) and s.args[1] not in inside and \
                    types.get(s.args[1], DType.I64).is_float:
                d = s.args[1]
                made.setdefault(d, Compute(f"{d}_rcp", EwOp.RECIPROCAL, (d,), s.dtype))
                s = Compute(s.dst, EwOp.MUL, (s.args[0], f"{d}_rcp"), s.dtype)
            out.append(s)
        return tuple(out)
    return replace(f, body=rewrite(f.body)), made


def sixteen_bit(k: TileKernel) -> bool:
    """Every floating-point buffer the kernel reads or writes holds 16-bit floats."""
    floats = [b.type.dtype for b in (*k.inputs, *k.outputs) if b.type.dtype.is_float]
    return bool(floats) and all(t.itemsize == 2 for t in floats)


def approximate(body: tuple[K.KStmt, ...]) -> tuple[K.KStmt, ...]:
    """`body` with each float exp and sigmoid made its fast form."""
    out = []
    for s in body:
        match s:
            case K.Let(op=op, ctype="float") if op in FAST:
                s = replace(s, op=FAST[op])
            case K.For() | K.If() | K.LastBlock():
                s = replace(s, body=approximate(s.body))
        out.append(s)
    return tuple(out)
