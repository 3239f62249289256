"""Names and types of the SSA values in a Tile IR body."""

from __future__ import annotations

from emmy.dtypes import DType
from dataclasses import replace

from emmy.loop_ir.ir import Accum, CastTo, Compute, IndexValue, Init, Load, Store
from emmy.symbolic import floordiv, mod, substitute, var
from emmy.tensor_ir.ir import ReduceOp
from emmy.tile_ir.ir import Axis, Fold, FoldKind, Item


def value_types(items: tuple[Item, ...], out: dict[str, DType] | None = None) -> dict[str, DType]:
    """The type of every value defined in `items` (argmax/argmin accumulators read as i64)."""
    out = {} if out is None else out
    for i in items:
        match i:
            case Load(dst=d, dtype=t) | Compute(dst=d, dtype=t) | CastTo(dst=d, dtype=t) | \
                    IndexValue(dst=d, dtype=t):
                out[d] = t
            case Init():
                out[i.acc] = _acc_type(i)
            case Fold():
                for init in i.accs:
                    out[init.acc] = _acc_type(init)
                value_types(i.body, out)
    return out


def _acc_type(i: Init) -> DType:
    return DType.I64 if i.op in (ReduceOp.ARGMAX, ReduceOp.ARGMIN) else i.dtype


def defined(items: tuple[Item, ...]) -> set[str]:
    return set(value_types(items))


def used(items: tuple[Item, ...]) -> set[str]:
    """Names read by `items` (operands, stored values, accumulators)."""
    out: set[str] = set()
    for i in items:
        match i:
            case Compute(args=args):
                out |= {a for a in args if isinstance(a, str)}
            case CastTo(arg=a):
                out.add(a)
            case Accum(acc=acc, value=v):
                out |= {acc, v}
            case Store(value=v):
                out.add(v)
            case Load(dyn=dyn):
                out |= set(dyn)   # a gather's positions
            case Fold():
                out |= used(i.body)
    return out


def free(items: tuple[Item, ...]) -> list[str]:
    """Names `items` read but do not define, sorted for determinism."""
    return sorted(used(items) - defined(items))


def reads(items: tuple[Item, ...], buffer: str) -> bool:
    """Whether `items` load from `buffer` (nested folds included)."""
    for i in items:
        if isinstance(i, Load) and i.buffer == buffer:
            return True
        if isinstance(i, Fold) and reads(i.body, buffer):
            return True
    return False


def substitute_item(item: Item, env, bounds) -> Item:
    """Replace index variables in an item (and the folds nested in it)."""
    match item:
        case Fold():
            return replace(item, body=tuple(substitute_item(i, env, bounds) for i in item.body))
        case Load():
            return replace(item, index=tuple(substitute(e, env, bounds) for e in item.index))
        case Store():
            return replace(item, index=tuple(substitute(e, env, bounds) for e in item.index))
        case IndexValue():
            return replace(item, expr=substitute(item.expr, env, bounds))
        case Accum() if item.position is not None:
            return replace(item, position=substitute(item.position, env, bounds))
        case _:
            return item


def operands(s) -> list[str]:
    """The values a statement reads (a gather's load: its positions)."""
    if isinstance(s, Load):
        return list(s.dyn)
    args = [a for a in getattr(s, "args", ()) if isinstance(a, str)]
    return args + [s.arg] if isinstance(s, CastTo) else args


def closure(names: set[str], defs: dict) -> set[str]:
    """`names` defined in `defs` and every name there they depend on."""
    out: set[str] = set()
    stack = [n for n in names if n in defs]
    while stack:
        n = stack.pop()
        if n not in out:
            out.add(n)
            stack += [a for a in operands(defs[n]) if a in defs]
    return out


def index_exprs(items):
    """The index expressions of the loads, stores and index values in `items`, nested folds'
    too."""
    for i in items:
        match i:
            case Fold():
                yield from index_exprs(i.body)
            case Load() | Store():
                yield from i.index
            case IndexValue():
                yield i.expr


def index_vars(items) -> set[str]:
    return {v for e in index_exprs(items) for v in e.free_vars()}


def fold_extents(f: Fold) -> dict[str, int]:
    """The axis extent of `f` and of every fold nested in it."""
    out = {f.axis.var: f.axis.extent}
    for i in f.body:
        if isinstance(i, Fold):
            out |= fold_extents(i)
    return out


def merge_reduces(outer: Fold, inner: Fold, prefix: tuple[Item, ...],
                  extents: dict[str, int]) -> Fold:
    """One reduce over outer*n + inner for a reduce whose body is `prefix` (pure statements,
    recomputed per element of the merged reduce) and then `inner`, a reduce into the same
    accumulators; records the merged axis's extent in `extents`."""
    n = inner.axis.extent
    merged = f"{outer.axis.var}_{inner.axis.var}"
    extents[merged] = outer.axis.extent * n
    env = {outer.axis.var: floordiv(var(merged), n, extents),
           inner.axis.var: mod(var(merged), n, extents)}
    body = tuple(substitute_item(i, env, extents) for i in (*prefix, *inner.body))
    return Fold(FoldKind.REDUCE, Axis(merged, outer.axis.extent * n), outer.accs, body)
