"""What legality and the space need to know about a Tile IR kernel, computed once."""

from __future__ import annotations

from dataclasses import dataclass

from emmy.loop_ir.ir import Compute, Load, Store
from emmy.memo import ByIdentity
from emmy.symbolic import Lin, Sym, lin, recombine
from emmy.tensor_ir.ir import EwOp, ReduceOp, Scalar
from emmy.tile_ir.chain import find_chain
from emmy.tile_ir.ir import Fold, FoldKind, Item, KernelKind, TileKernel


@dataclass(frozen=True, slots=True)
class Access:
    """A load or store along the axis a schedule distributes over lanes."""

    buffer: str
    itemsize: int
    stride: int | None    # elements between consecutive axis values; None: not affine in the axis
    aligned: int          # largest power of two (<= 16) dividing every other term of the offset
    is_store: bool


@dataclass(frozen=True, slots=True)
class Facts:
    kind: KernelKind
    jobs: int
    axes: tuple[tuple[str, int], ...]      # the distributed axes: (var, extent)
    accesses: tuple[Access, ...]           # loads/stores directly along a distributed axis
    fold_kinds: tuple[FoldKind, ...]       # the job body's folds, in order
    reused: tuple[str, ...]                # buffers read by a reduce fold and again by a later map fold
    reuse_row_bytes: int                   # bytes of one job's rows of the reused buffers
    split_ops: tuple[ReduceOp, ...] | None  # accumulators when the job is a pure reduction
    atomic_ok: bool                        # pure f32 sum whose store is linear in the accumulator
    widest: int                            # widest element among distributed accesses (bytes)
    chain: bool = False                    # a fused chain of two products (PLACE=cut splits it)
    fold_ops: tuple[ReduceOp, ...] = ()    # the accumulators of the job body's folds
    reverse: bool = False                  # a fold of the job body runs backwards (a reverse scan)


def buffer_types(k: TileKernel) -> dict:
    return {b.name: b.type for b in (*k.inputs, *k.outputs)}


def offset(index: tuple[Lin, ...], shape: tuple[int, ...]) -> Lin:
    """Row-major element offset of an index (an axis split in pieces reads back as itself)."""
    total, stride = lin(0), 1
    for e, s in zip(reversed(index), reversed(shape)):
        total = total + e * stride
        stride *= s
    return recombine(total)


def stride_along(off: Lin, axis: str) -> int | None:
    """Elements between consecutive values of `axis` in an offset; None when not affine in it."""
    if any(axis in a.free_vars() for a, _ in off.terms if a != Sym(axis)):
        return None
    return dict(off.terms).get(Sym(axis), 0)


def _access(item: Load | Store, axis: str, types) -> Access | None:
    t = types[item.buffer]
    off = offset(item.index, t.shape)
    if axis not in off.free_vars():
        return None
    rest = [c for a, c in off.terms if a != Sym(axis)] + [off.const]
    if any(not isinstance(a, Sym) for a, _ in off.terms if a != Sym(axis)):
        aligned = 1
    else:
        aligned = 16
        while aligned > 1 and any(c % aligned for c in rest):
            aligned //= 2
    return Access(item.buffer, t.dtype.itemsize, stride_along(off, axis), aligned,
                  isinstance(item, Store))


def _direct_accesses(items: tuple[Item, ...], axis: str, types) -> list[Access]:
    """Accesses in a fold's own body (nested folds run serially per lane, so they don't count)."""
    out = []
    for i in items:
        if isinstance(i, (Load, Store)):
            a = _access(i, axis, types)
            if a:
                out.append(a)
    return out


def _loads(items: tuple[Item, ...]) -> set[str]:
    """Buffers the items read at positions the schedule knows (not gathers: a staged row
    holds one known row)."""
    out: set[str] = set()
    for i in items:
        if isinstance(i, Load) and not i.dyn:
            out.add(i.buffer)
        elif isinstance(i, Fold):
            out |= _loads(i.body)
    return out


_FACTS = ByIdentity()


def facts(k: TileKernel) -> Facts:
    """What the rules ask of a kernel, once per kernel (by identity: hashing a large kernel's
    whole tree at every question was most of a long schedule search)."""
    return _FACTS(k, None, lambda: _facts(k))


facts.cache_clear = _FACTS.clear       # as a functools cache has it (bench/schedule_time.py)


def _facts(k: TileKernel) -> Facts:
    types = buffer_types(k)
    folds = k.folds
    if k.kind is KernelKind.MAP:
        axes = (k.grid[-1].var, k.grid[-1].extent) if k.grid else ("", 1)
        accesses = _direct_accesses(k.body, axes[0], types) if k.grid else []
        axes_t = (axes,) if k.grid else ()
    else:
        axes_t = tuple((f.axis.var, f.axis.extent) for f in folds)
        accesses = [a for f in folds for a in _direct_accesses(f.body, f.axis.var, types)]
    reused: list[str] = []
    seen_reduce: set[str] = set()
    for f in folds:
        if f.kind is FoldKind.REDUCE:
            seen_reduce |= _loads(f.body)
        elif f.kind is FoldKind.MAP:
            reused += [n for n in sorted(_loads(f.body) & seen_reduce) if n not in reused]
    # A staged row holds the buffer along the longest fold that reads it.
    row_bytes = sum(max(f.axis.extent for f in folds if name in _loads(f.body))
                    * types[name].dtype.itemsize for name in reused)
    pure_reduction = len(folds) == 1 and folds[0].kind is FoldKind.REDUCE
    split_ops = tuple(i.op for f in folds for i in f.accs) if pure_reduction else None
    return Facts(kind=k.kind, jobs=k.jobs, axes=axes_t, accesses=tuple(accesses),
                 fold_kinds=tuple(f.kind for f in folds), reused=tuple(reused),
                 reuse_row_bytes=row_bytes, split_ops=split_ops,
                 atomic_ok=pure_reduction and _atomic_ok(k),
                 widest=max((a.itemsize for a in accesses), default=4),
                 chain=find_chain(k) is not None,
                 fold_ops=tuple(i.op for f in folds for i in f.accs),
                 reverse=any(f.reverse for f in folds))


def _atomic_ok(k: TileKernel) -> bool:
    """One f32 sum whose stored value is the accumulator, maybe scaled by a literal (mean)."""
    folds = k.folds
    if len(folds) != 1 or len(folds[0].accs) != 1:
        return False
    init = folds[0].accs[0]
    if init.op is not ReduceOp.SUM or init.dtype.value != "f32":
        return False
    linear = {init.acc}
    for item in k.body:
        match item:
            case Fold():
                continue
            case Compute(dst=dst, op=EwOp.MUL | EwOp.DIV, args=(str() as a, Scalar())) if a in linear:
                linear.add(dst)
            case Compute(dst=dst, op=EwOp.MUL, args=(Scalar(), str() as a)) if a in linear:
                linear.add(dst)
            case Store(value=v):
                if v not in linear:
                    return False
            case Load():
                continue
            case _:
                return False
    return all(b.type.dtype.value == "f32" for b in k.outputs)
