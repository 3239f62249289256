"""Print Tile IR: each kernel's grid and Fold tree, and the row applied to it."""

from __future__ import annotations

from emmy.loop_ir.printer import COMBINE, format_stmt
from emmy.schedule.row import Row
from emmy.tile_ir.ir import Fold, FoldKind, Item, TileKernel, TileProgram
from emmy.tile_ir.values import value_types

INDENT = "  "


def print_program(tp: TileProgram, rows: dict[str, Row] | None = None,
                  explain: dict[str, list[str]] | None = None) -> str:
    """Every kernel, with the row applied to it when `rows` has one."""
    rows, explain = rows or {}, explain or {}
    return "\n".join(print_kernel(k, rows.get(k.name), explain.get(k.name, ()))
                     for k in tp.kernels)


def print_kernel(k: TileKernel, row: Row | None = None, explain=()) -> str:
    ins = ", ".join(f"{b.name}: {b.type}" for b in k.inputs)
    outs = ", ".join(f"{b.name}: {b.type}" for b in k.outputs)
    lines = [f"kernel {k.name}({ins}) -> ({outs})  # {k.kind}, id {k.identity}"]
    types = {b.name: b.type.dtype for b in (*k.inputs, *k.outputs)} | value_types(k.body)
    grid = " × ".join(f"{a.var} in 0..{a.extent}" for a in k.grid) or "(one job)"
    lines.append(f"{INDENT}grid {grid}  ({k.jobs} job{'s' if k.jobs != 1 else ''})")
    if k.contract is not None:
        c = k.contract
        batch = " × ".join(a.var for a in c.batch)
        lines.append(f"{INDENT}contraction: {c.a.buffer}[{batch + ', ' if batch else ''}{c.m.var}, "
                     f"{c.k.var}] · {c.b.buffer}[{c.k.var}, {c.n.var}] -> {c.acc}  "
                     f"({c.m.extent}x{c.n.extent}x{c.k.extent}"
                     f"{f', batch {c.batch_size}' if c.batch else ''}, {c.element}; "
                     f"{'tensor cores' if c.tensor_core_ok else 'CUDA cores'})")
        for name, op in (("A", c.a), ("B", c.b)):
            if op.window is not None:
                lines.append(f"{INDENT}  {name} gathered (implicit GEMM) through a window: "
                             f"{op.window.describe()}; the k side tabulated per block")
            elif op.computed:
                pairs = ", two at a time on 16-bit pairs" if op.paired else ""
                raw = op.load.dtype
                along = f"k ({c.k.var})" if op.k_major else \
                    f"{'m' if name == 'A' else 'n'} ({op.outer})"
                packed = (f", {op.packing} to {'an' if raw.value[0] == 'i' else 'a'} {raw} of "
                          f"{op.load.buffer} along {along}") if op.packing > 1 else ""
                lines.append(f"{INDENT}  {name} computed (as a dequantized weight is): "
                             f"{len(op.gather)} statement(s) compute each element ({op.value}) "
                             f"from its loads{packed} as its tiles are copied{pairs}; PLACE=cut "
                             f"stores it first")
            elif op.gathered:
                lines.append(f"{INDENT}  {name} gathered (implicit GEMM): {len(op.gather)} "
                             f"statement(s) compute each element ({op.value}), copied element "
                             f"by element")
    if k.attention is not None:
        a = k.attention
        rounded = f" rounded to {a.rounded.value}" if a.rounded else ""
        grouped = "".join(f", {o.buffer} at head h // {o.group}" for o in (a.k, a.v)
                          if o.group > 1)
        if a.bias is not None:
            b = a.bias
            grouped += {"add": f", + {b.buffer}[{b.offset}]",
                        "keep": f", -inf where not {b.buffer}[{b.offset}]",
                        "hide": f", -inf where {b.buffer}[{b.offset}]"}[b.kind]
        lines.append(f"{INDENT}attention: softmax({a.q.buffer}·{a.k.buffer} over {a.dim}{rounded}"
                     f" × {a.scale:g}{', causal' if a.causal else ''}{grouped}) · {a.v.buffer}"
                     f"{f' (head dim {a.dim_v})' if a.dim_v != a.dim else ''}, "
                     f"{a.query.extent} {'query' if a.query.extent == 1 else 'queries'} × "
                     f"{a.keys} keys per head"
                     f"{' (0 for a row with no visible key)' if a.zero_empty else ''}: one "
                     f"flash kernel, the max and sum folds merged into the output fold (online "
                     f"softmax)")
    _items(k.body, 2, types, lines)
    if row is not None:
        lines.append(f"{INDENT}schedule: {row}")
        lines += [f"{INDENT * 2}{e}" for e in explain]
    return "\n".join(lines) + "\n"


def _items(items: tuple[Item, ...], depth: int, types, lines: list[str]) -> None:
    pad = INDENT * depth
    for item in items:
        if isinstance(item, Fold):
            lines.append(pad + _fold_head(item))
            _items(item.body, depth + 1, types, lines)
        else:
            lines.append(pad + format_stmt(item, types))


def _fold_head(f: Fold) -> str:
    rev = " reversed" if f.reverse else ""
    stop = f"min({f.axis.extent}, {f.limit})" if f.limit is not None else f.axis.extent
    head = f"{f.kind} {f.axis.var} in 0..{stop}{rev}"
    if f.kind is FoldKind.MAP:
        return head
    states = ", ".join(f"{i.acc} = init({COMBINE[i.op]}) : {i.dtype}" for i in f.accs)
    return f"{head} into {states}" if states else head
