"""Print Loop IR as deterministic text: one line per statement, loops indented.

    kernel k0_rms_norm(x: f32[32,2048], weight: f32[2048]) -> (rms_norm: f32[32,2048])  # id …
      for a0 in 0..32
        acc0 = init(add) : f32
        reduce a1 in 0..2048
          in0 = load x[a0, a1]
          v0 = multiply(in0, in0)
          acc0 <- add(acc0, v0)

A value's type is printed (` : f16`) only where it differs from the type the line implies (the
buffer's type for a load, the operands' type for arithmetic, bool for a comparison), so the text
determines every type and can serve as the kernel's identity.
"""

from __future__ import annotations

from emmy.dtypes import DType
from emmy.symbolic import render
from emmy.loop_ir.ir import (Accum, Buffer, CastTo, Compute, IndexValue, Init, Kernel, Load, Loop,
                             LoopProgram, ReduceOp, Scalar, Stmt, Store)
from emmy.tensor_ir.ir import COMPARISON, EwOp

INDENT = "  "

# The binary op an accumulator folds with, as Elementwise spells it.
COMBINE = {ReduceOp.SUM: "add", ReduceOp.PROD: "multiply", ReduceOp.MAX: "maximum",
           ReduceOp.MIN: "minimum", ReduceOp.ARGMAX: "argmax", ReduceOp.ARGMIN: "argmin",
           ReduceOp.LOGADDEXP: "logaddexp"}


def print_program(lp: LoopProgram) -> str:
    """The program's signature, its intermediate buffers, each kernel, then the notes."""
    lines = [f"program {lp.name}({_buffers(lp.inputs)}) -> ({_buffers(lp.outputs)})"]
    lines += [f"  buffer {b.name}: {b.type}" for b in lp.intermediates]
    text = "\n".join(lines) + "\n"
    for k in lp.kernels:
        text += "\n" + print_kernel(k)
    if lp.notes:
        text += "\n" + "".join(f"# note: {n}\n" for n in lp.notes)
    return text


def print_kernel(k: Kernel, *, show_id: bool = True) -> str:
    """The kernel's signature line (with its identity hash) and its indented loop nest."""
    head = f"kernel {k.name}({_buffers(k.inputs)}) -> ({_buffers(k.outputs)})"
    if show_id:
        from emmy.loop_ir.identity import kernel_id  # identity prints kernels: import late

        head += f"  # id {kernel_id(k)}"
    return head + "\n" + format_body(k)


def format_body(k: Kernel) -> str:
    """The loop nest alone, one indented line per statement."""
    types = {b.name: b.type.dtype for b in k.inputs + k.outputs}
    lines: list[str] = []
    _format_block(k.body, 1, types, lines)
    return "".join(line + "\n" for line in lines)


def _format_block(body: tuple[Stmt, ...], depth: int, types: dict, lines: list[str]) -> None:
    pad = INDENT * depth
    for s in body:
        if isinstance(s, Loop):
            flags = " (reverse)" if s.reverse else ""
            lines.append(f"{pad}{s.kind} {s.var} in 0..{s.extent}{flags}")
            _format_block(s.body, depth + 1, types, lines)
            continue
        lines.append(pad + format_stmt(s, types))
        name = getattr(s, "dst", None) or getattr(s, "acc", None)
        if isinstance(s, Init):
            types[s.acc] = DType.I64 if s.op in (ReduceOp.ARGMAX, ReduceOp.ARGMIN) else s.dtype
        elif name is not None and not isinstance(s, Accum):
            types[name] = s.dtype


def format_stmt(s: Stmt, types: dict[str, DType]) -> str:
    """One statement; `types` maps the names in scope (buffers and values) to their types."""
    match s:
        case Load():
            at = f" ({', '.join(f'@{k} = {a}' for k, a in enumerate(s.dyn))})" if s.dyn else ""
            return (f"{s.dst} = load {s.buffer}[{_index(s.index)}]{at}"
                    + _typed(s.dtype, types.get(s.buffer)))
        case Compute():
            args = ", ".join(_operand(a) for a in s.args)
            return f"{s.dst} = {s.op}({args})" + _typed(s.dtype, implied_type(s, types))
        case CastTo():
            return f"{s.dst} = cast({s.arg}) : {s.dtype}"
        case IndexValue():
            return f"{s.dst} = index({render(s.expr)}) : {s.dtype}"
        case Init():
            return f"{s.acc} = init({COMBINE[s.op]}) : {s.dtype}"
        case Accum():
            at = f" @ {render(s.position)}" if s.position is not None else ""
            return f"{s.acc} <- {COMBINE[s.op]}({s.acc}, {s.value}{at})"
        case Store():
            return f"{s.buffer}[{_index(s.index)}] = {s.value}"
    raise TypeError(f"not a Loop IR statement: {s!r}")


def implied_type(s: Compute, types: dict[str, DType]) -> DType | None:
    """The type a Compute has unless the line says otherwise."""
    if s.op in COMPARISON:
        return DType.BOOL
    values = s.args[1:] if s.op is EwOp.WHERE else s.args
    for a in values:
        if isinstance(a, str):
            return types.get(a)
    return values[0].dtype if values else None


def _typed(dtype: DType, implied: DType | None) -> str:
    return "" if dtype is implied else f" : {dtype}"


def _operand(a: str | Scalar) -> str:
    return a if isinstance(a, str) else repr(a.value)


def _index(index) -> str:
    return ", ".join(render(e) for e in index)


def _buffers(buffers: tuple[Buffer, ...]) -> str:
    return ", ".join(f"{b.name}: {b.type}" for b in buffers)
