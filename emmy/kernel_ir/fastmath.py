"""Cheaper arithmetic for the generic (row and map) kernels: a division by a value computed
before a fold becomes a multiplication by its reciprocal, and kernels whose floating-point data
is all 16-bit take the hardware's approximate exp, log, sigmoid and tanh.

Reciprocals: softmax divides every element of a row by the row's sum. x * (1/s) is within
1.5 ulp of the exact quotient where x / s rounds it to 0.5 ulp (the same trade as fast-math
division), and costs one multiplication an element instead of an IEEE division (about ten
instructions). The special values agree (s = 0 or inf gives the same inf, NaN or 0 either
way); only an s so small that 1/s overflows (|s| < 2^-128) differs.

Approximations: a 16-bit kernel reads and writes f16 / bf16 (11 and 8 significant bits) and
computes in f32. ex2.approx and lg2.approx (as `__expf` and `__logf`, subnormals flushed) are
within about 2^-21 of the true value, relative, for moderate arguments (exp's error grows with
|x|: x * log2(e) is rounded to f32 first), and tanh.approx.f32 within 2^-10.9: well under
bf16's half ulp (2^-9), near f16's (2^-11), where emmy's checks allow 1e-2. They take 2-5
instructions where the library functions take 8-20: in softmax over a bf16 row, the accurate
exp was most of the kernel's instructions. A kernel that reads or writes any f32 or f64 buffer
keeps the library functions. emmy_kernel.cuh implements the `em_fast_*` functions (on the CPU
emulator: the same formulas with the C library, exp2f of the rounded product, which is where
ex2.approx's error comes from).
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

FAST = {"exp": "fast_exp", "log": "fast_log", "sigmoid": "fast_sigmoid", "tanh": "fast_tanh"}


def reciprocal_divisions(f: Fold, types: Mapping[str, DType]) -> tuple[Fold, dict[str, Compute]]:
    """`f` with each floating-point division by a value defined outside it (`types`: the
    kernel's value types) made a multiplication by `<divisor>_rcp`, and for each divisor the
    statement computing that reciprocal, to run once before the fold."""
    inside = defined(f.body) | {i.acc for i in f.accs}
    made: dict[str, Compute] = {}

    def rewrite(items):
        out = []
        for s in items:
            if isinstance(s, Fold):
                s = replace(s, body=rewrite(s.body))
            elif isinstance(s, Compute) and s.op is EwOp.DIV and s.dtype.is_float and \
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
    """`body` with each float exp / log / sigmoid / tanh made its fast form."""
    out = []
    for s in body:
        match s:
            case K.Let(op=op, ctype="float") if op in FAST:
                s = replace(s, op=FAST[op])
            case K.For() | K.If():
                s = replace(s, body=approximate(s.body))
        out.append(s)
    return tuple(out)
