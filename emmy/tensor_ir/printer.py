"""Print Tensor IR as text, one definition a line with its type."""

from __future__ import annotations

from emmy.symbolic import render
from emmy.tensor_ir.ir import (Cast, Def, Elementwise, Gather, IndexMap, Input, InputKind, Iota,
                               Program, Reduce, Scalar, Scan)


def print_program(p: Program) -> str:
    """Deterministic text: the inputs, one line per definition, then the outputs."""
    lines = [f"program {p.name}"]
    lines += [f"  {d.name} = {format_def(d)} : {d.type}" for d in p.defs]
    lines.append(f"  return {', '.join(p.outputs)}")
    return "\n".join(lines) + "\n"


def format_def(d: Def) -> str:
    """The right-hand side of a definition: `multiply(x, x)`, `index_map(v1, [a0, 0])`, …"""
    match d:
        case Input(kind=InputKind.INPUT):
            return f'input("{d.name}")'
        case Input():
            return f'load("{d.target or d.name}")'
        case Elementwise():
            return f"{d.op}({', '.join(_operand(a) for a in d.args)})"
        case Cast():
            return f"cast({d.arg})"
        case IndexMap():
            return f"index_map({d.arg}, [{', '.join(render(e) for e in d.index)}])"
        case Reduce():
            return f"reduce_{d.op}({d.arg}, axes=[{', '.join(map(str, d.axes))}])"
        case Scan():
            flags = "".join(f", {f}" for f in ("reverse", "exclusive") if getattr(d, f))
            return f"scan_{d.op}({d.arg}, axis={d.axis}{flags})"
        case Iota():
            return f"iota(axis={d.axis})"
        case Gather():
            at = "".join(f", @{k}={a}" for k, a in enumerate(d.indices))
            return f"gather({d.arg}, [{', '.join(render(e) for e in d.index)}]{at})"
    raise TypeError(f"not a Tensor IR definition: {d!r}")


def _operand(a: str | Scalar) -> str:
    return a if isinstance(a, str) else str(a)
