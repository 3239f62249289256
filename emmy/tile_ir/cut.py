"""PLACE=cut on a kernel that a template builds: the kernel as two, with a buffer between them.

    splits(k)       whether PLACE=cut makes two kernels of `k`
    cut_in_two(k)   (producer `<name>_cut0`, consumer `<name>_cut1`, the buffer between them)

Two kinds of kernel split so:
- a fused chain of products (emmy.tile_ir.chain): the intermediate product is stored;
- a product whose operand the template computes as it copies its tiles (a computed operand,
  emmy.tile_ir.contract: an int8 weight dequantized, w.half() * scale): the operand is
  stored by a map kernel, and the product reads it as a plain tensor. Fused, the template
  reads the narrow data once a block row of the output and converts every element again
  there; cut, the conversion runs once, and the product reads twice the bytes (f16 rather
  than int8) after a kernel read the int8 data and wrote the f16 copy.
"""

from __future__ import annotations

from dataclasses import replace

from emmy.loop_ir.ir import Buffer, Load, Store
from emmy.symbolic import var
from emmy.tile_ir.chain import cut_chain, cut_part, find_chain
from emmy.tile_ir.ir import Fold, Item, KernelKind, TileKernel
from emmy.tile_ir.values import index_vars, used, value_types
from emmy.torch_ir.ir import TensorType


def splits(k: TileKernel) -> bool:
    """Whether PLACE=cut makes two kernels of `k` (cut_in_two)."""
    return find_chain(k) is not None or _computed(k) is not None


def cut_in_two(k: TileKernel) -> tuple[TileKernel, TileKernel, Buffer] | None:
    """The producer and the consumer PLACE=cut makes of `k`, and the buffer between them;
    None when PLACE=cut does not split `k` (see the module docstring)."""
    chain = find_chain(k)
    if chain is not None:
        return cut_chain(k, chain)
    op = _computed(k)
    return None if op is None else cut_operand(k, op)


def _computed(k: TileKernel):
    """The first computed operand of a contraction whose fold is one flat reduce (the
    operand's statements then sit in it as they are), or None."""
    con = k.contract
    if k.kind is not KernelKind.CONTRACT or con is None:
        return None
    folds = k.folds
    if len(folds) != 1 or folds[0].axis.var != con.k.var \
            or any(isinstance(i, Fold) for i in folds[0].body):
        return None
    return next((op for op in (con.a, con.b) if op.computed), None)


def cut_operand(k: TileKernel, op) -> tuple[TileKernel, TileKernel, Buffer]:
    """A map kernel storing the computed operand `op` over (its grid axes, k), and the
    product reading it: both contractions-to-be are found again by the caller's lift
    (the consumer's operand is then a plain load)."""
    from emmy.tile_ir.contract import find_contraction

    fold = k.folds[0]
    kaxis = fold.axis
    reads = index_vars(op.gather)
    axes = tuple(a for a in k.grid if a.var in reads) + (kaxis,)
    index = tuple(var(a.var) for a in axes)
    dtype = value_types(op.gather)[op.value]
    mid = Buffer(f"{k.name}_operand", TensorType(tuple(a.extent for a in axes), dtype))
    first = cut_part(k, "cut0", op.gather + (Store(mid.name, index, op.value),),
                     kind=KernelKind.MAP, outputs=(mid,), grid=axes, atomic=False)
    gone = {s.dst for s in op.gather}
    load = Load(op.value, mid.name, index, dtype)
    inner = tuple(s for s in fold.body if getattr(s, "dst", None) not in gone)
    body = _live(tuple(replace(fold, body=(load, *inner)) if i is fold else i for i in k.body))
    second = cut_part(k, "cut1", body, extra=(mid,))
    con = find_contraction(second)
    assert con is not None, f"{k.name}: the product without its computed operand"
    return first, replace(second, kind=KernelKind.CONTRACT, contract=con), mid


def _live(body: tuple[Item, ...]) -> tuple[Item, ...]:
    """`body` without the job's statements outside the fold that nothing reads any more (a
    scale the computed operand loaded)."""
    needed = used(body)
    return tuple(i for i in body if getattr(i, "dst", None) in needed | {None})
