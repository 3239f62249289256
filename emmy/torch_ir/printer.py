"""Print Torch IR as text."""

from __future__ import annotations

from emmy.dtypes import DType
from emmy.torch_ir.ir import Arg, Graph, InputKind, Ref, updated_input


def print_graph(g: Graph) -> str:
    """Deterministic text: inputs, one line per op with its type, then the outputs."""
    ins = ", ".join(f"{p.name}: {p.type}" for p in g.inputs)
    lines = [f"graph {g.name}({ins}) -> ({', '.join(r.name for r in g.outputs)})"]
    for p in g.placeholders:
        if p.kind is not InputKind.INPUT:
            lines.append(f"  {p.name} = load({p.target!r}) : {p.type}".replace("'", '"'))
    for n in g.nodes:
        args = [_fmt(a) for a in n.args] + [f"{k}={_fmt(v)}" for k, v in n.kwargs]
        if isinstance(n.type, tuple):
            ty = "(" + ", ".join(map(str, n.type)) + ")"
        else:
            ty = str(n.type) if n.type is not None else "?"
        lines.append(f"  {n.name} = {n.op}({', '.join(args)}) : {ty}")
    lines.append(f"  return {', '.join(r.name for r in g.returned)}")
    for target, r in zip(g.updates, g.outputs[len(g.returned):]):
        lines.append(f"  store({target!r}, {r.name})".replace("'", '"') +
                     (f"     # {g.update_label(target)}" if updated_input(target) is not None
                      else ""))
    return "\n".join(lines) + "\n"


def _fmt(a: Arg) -> str:
    if isinstance(a, Ref):
        return a.name
    if isinstance(a, tuple):
        return "[" + ", ".join(_fmt(x) for x in a) + "]"
    if isinstance(a, DType):
        return str(a)
    if isinstance(a, float):
        return repr(a)
    return repr(a) if isinstance(a, str) else str(a)
