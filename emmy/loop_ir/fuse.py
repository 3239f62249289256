"""Decide which tensors are stored and which kernel computes each (fusion by inlining).

Every value is a pure function of its index, so by default a value is inlined into each
consumer, recomputed where needed. A tensor is stored (materialized) only when that is not
possible or not wanted:

- a program output is stored: the caller reads it;
- a scan is stored unless its only consumers are elementwise ops that reach a single output at
  the same positions: a scan runs in order along its axis, so other consumers read it from
  memory. When the elementwise epilogue reaches one output, the output's kernel runs the scan;
- a tensor a sliding window reads (`windowed_reads`): a convolution's or pool's window reads
  each element at several output positions, so a reduction inlined there would be computed
  again at every window position (a chain of convolutions, a pool after a convolution);
- a product (a linear layer's, a convolution's) that a reduction such as a norm's statistics
  reads (`reduced_products`): inlined, each product element would be computed again for
  every output needing the statistic (attention's softmax over scores stays fused);
- an operand of a product that the program computes from a statistic (a norm's rsqrt of the
  mean square, a softmax's sum) where each of its elements feeds many products
  (`normalized_operands`): inlined, the product's kernel would compute the statistic first,
  and no matrix-product template takes a kernel that does;
- a statistic a product's epilogue reads that a reduction of something else computes (a
  dynamic fp8 activation scale times the product, `scaled_products`): inlined, the product's
  kernel would compute the reduction first;
- q, k and v of an attention where the program computes them, and its output where a
  product reads it (`attention_operands`): the flash kernel reads and writes tensors;
- a gather's source where the program computes it, and a gather a product reads
  (`gathered_reads`): positions known only at run time are read from memory, and a
  matrix-product template tiles operands it can address;
- a tensor the caller forces (`forced`, with the reason): lowering does so when inlining would
  copy a reduction so often that a kernel grows past its budget, run one again at every step
  of a loop (`recomputed_statistics`), or make several kernels each run a long chain of
  reductions for one statistic (`shared_statistics`).

Outputs of the same shape that do not depend on each other through memory share one kernel
(they are computed in the same loops and share their loads).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Mapping

from emmy.loop_ir.names import buffer_names, describe
from emmy.tensor_ir.builder import operands
from emmy.tensor_ir.ir import (Cast, Def, Elementwise, EwOp, Gather, IndexMap, Input, Iota,
                              Program, Reduce, ReduceOp, Scan, axis_var)
from emmy import symbolic
from emmy.dtypes import DType


@dataclass(frozen=True, slots=True)
class KernelPlan:
    roots: tuple[str, ...]   # the tensors the kernel stores, in program order
    scan: str | None = None  # the scan whose loop the kernel runs (one of the roots or absorbed)


@dataclass(frozen=True, slots=True)
class FusionPlan:
    kernels: tuple[KernelPlan, ...]  # in an order where each kernel follows what it loads
    stored: tuple[str, ...]          # every materialized non-input tensor, in program order
    buffers: dict[str, str]          # stored tensor -> its buffer's name
    notes: tuple[str, ...]


def plan_fusion(p: Program, forced: Mapping[str, str] | None = None) -> FusionPlan:
    """Choose the stored tensors, absorb scan epilogues, group outputs into kernels.
    `forced` maps tensors to store anyway to the reason why."""
    defs = {d.name: d for d in p.defs}
    users = _users(p)
    roots = [n for n in dict.fromkeys(p.outputs) if not isinstance(defs[n], Input)]
    notes: list[Callable[[Callable[[str], str]], str]] = []  # rendered once buffers are named
    for name, why in (forced or {}).items():
        if name not in roots:
            roots.append(name)
            notes.append(lambda at, n=name, why=why: f"`{n}` is materialized as {at(n)}: {why}")
    scan_of: dict[str, str] = {}  # root -> the scan its kernel runs
    for d in p.defs:
        if not isinstance(d, Scan):
            continue
        if d.name in roots:
            scan_of[d.name] = d.name
            continue
        target, why = _epilogue_root(d, defs, users, roots)
        if target is not None and target not in scan_of:
            scan_of[target] = d.name
            notes.append(lambda at, d=d, t=target: (
                f"scan `{d.name}` runs in the kernel of {at(t)}: its elementwise consumers read "
                f"it at the same positions, so it is never stored"))
            continue
        if target is not None:
            why = lambda at, t=target: f"the kernel of {at(t)} already runs scan `{scan_of[t]}`"
        roots.append(d.name)
        scan_of[d.name] = d.name
        notes.append(lambda at, d=d, why=why: (
            f"scan `{d.name}` is materialized as {at(d.name)}: a scan runs in order along its "
            f"axis, so consumers read it from memory ({why(at)})"))
    order = {d.name: i for i, d in enumerate(p.defs)}
    roots.sort(key=order.__getitem__)
    reads, touched = {}, {}
    for r in roots:
        reads[r], touched[r] = _reads(r, defs, set(roots))
    groups = _group(roots, reads, touched, defs, scan_of)
    kernels = tuple(KernelPlan(tuple(g), next((scan_of[r] for r in g if r in scan_of), None))
                    for g in _order_groups(groups, reads, order))
    names = buffer_names([defs[r] for r in roots], p.outputs, {d.name for d in p.inputs})
    at = lambda n: f"`{names.get(n, n)}`"
    return FusionPlan(kernels, tuple(roots), names, tuple(note(at) for note in notes))


def windowed_reads(p: Program) -> dict[str, str]:
    """Tensors computed from a reduction that a sliding window reads, each with the reason to
    store it. A window is an IndexMap with more elements than its source whose index adds two
    of its axes (o*stride + k*dilation): it reads each source element at several positions,
    and inlined, the reduction behind that element would run again at each of them. (A
    broadcast, as in a matrix product's operand or attention's scores, reads an element at
    several positions along axes its index does not name; chain and attention templates tile
    those, so they stay fused.)"""
    outputs = set(p.outputs)
    heavy: set[str] = set()
    for d in p.defs:
        if isinstance(d, Reduce) or any(a in heavy and a not in outputs for a in operands(d)):
            heavy.add(d.name)
    defs = {d.name: d for d in p.defs}
    sizes = {d.name: math.prod(d.type.shape) for d in p.defs}
    out: dict[str, str] = {}
    for d in p.defs:
        if (isinstance(d, IndexMap) and d.arg in heavy and d.arg not in outputs
                and _window(d, defs)):
            what = "a sliding window" if _overlapping(d) else "an index map"
            out.setdefault(_narrow_end(d.arg, defs),
                           f"{what} (`{d.name}`) makes {sizes[d.name]:,} reads of its "
                           f"{sizes[d.arg]:,} elements; inlined, the reduction behind each "
                           "would run at every read")
    return out


def _overlapping(d: IndexMap) -> bool:
    """Whether an index component adds axes whose ranges overlap (o*stride + k*dilation, a
    window's), rather than combining them into distinct positions (h*64 + d, a reshape's)."""
    extents = {axis_var(i): n for i, n in enumerate(d.type.shape)}
    for e in d.index:
        terms = sorted((abs(c), extents.get(getattr(a, "name", ""), 0)) for a, c in e.terms
                       if isinstance(a, symbolic.Sym))
        reach = 0          # the largest offset the smaller-stride terms add
        for c, n in terms:
            if c <= reach:
                return True
            reach += c * (n - 1)
    return False


def gathered_reads(p: Program) -> dict[str, str]:
    """Tensors to store around a gather, each with the reason: its source where the program
    computes it (a kernel reads it at positions its index tensors give, which no index
    expression can inline), and the gather itself (with its element-wise epilogue) where a
    product reads it (an embedding before a linear layer): stored, the product is a
    matrix-product kernel of its own; fused, no template could address its rows."""
    defs = {d.name: d for d in p.defs}
    users = _users(p)
    outputs = set(p.outputs)
    out: dict[str, str] = {}
    for d in p.defs:
        if not isinstance(d, Gather):
            continue
        if not isinstance(defs[d.arg], Input):
            out.setdefault(d.arg, f"a gather (`{d.name}`) reads it at positions known only at "
                                  "run time")
        pointwise = _closure(d.name, users, defs, through_reductions=False)
        if any(_factors(defs[u], defs) is not None for n in pointwise for u in users[n]):
            end = _epilogue_end(d.name, users, defs)
            if end not in outputs:
                out.setdefault(end, f"a product reads this gather (`{d.name}`): stored, the "
                                    "product is a matrix-product kernel of its own")
    return out


_ORDERS = frozenset({EwOp.EQ, EwOp.NE, EwOp.LT, EwOp.LE, EwOp.GT, EwOp.GE})


def compared_extrema(p: Program, kernels_uses: list[Mapping[str, int]],
                     kernels_roots: list[tuple[str, ...]], stored: set[str]) -> dict[str, str]:
    """Floating-point tensors compared with their own maximum or minimum (an argmax or top-k
    written as `x == x.max(...)`, as torch decomposes topk) that are computed through a
    reduction (a softmax's sum), where a built kernel (each kernel's `uses` and roots) computes
    the comparison and x and reads the extremum another kernel stored, each with the reason to
    store it: inlined, the kernel compares its own recomputation with an extremum another
    kernel found, and a sum taken in another order can differ in its last bit (no position
    then equals the maximum). A kernel that computes all three compares bits it computed."""
    out: dict[str, str] = {}
    for x, r, d, which in _extremum_comparisons(p):
        if x in stored:
            continue
        if any(d in uses and x in uses and r in stored and r not in roots
               for uses, roots in zip(kernels_uses, kernels_roots)):
            out.setdefault(x, f"compared with its {which} (`{d}`), which another kernel "
                              "finds: stored, both compare the same bits")
    return out


def _extremum_comparisons(p: Program) -> list[tuple[str, str, str, str]]:
    """(x, its extremum, the comparison, "maximum" or "minimum") for each float x computed
    through a reduction and compared with its own maximum or minimum."""
    defs = {d.name: d for d in p.defs}

    def source(name: str) -> str:           # through reshapes and broadcasts
        while isinstance(defs[name], IndexMap):
            name = defs[name].arg
        return name

    def elementwise_from(name: str) -> set[str]:    # what `name` computes from, element by element
        seen, todo = {name}, [name]
        while todo:
            d = defs[todo.pop()]
            if isinstance(d, (Elementwise, Cast, IndexMap)):
                for a in operands(d):
                    if a not in seen:
                        seen.add(a)
                        todo.append(a)
        return seen

    out = []
    for d in p.defs:
        if not (isinstance(d, Elementwise) and d.op in _ORDERS
                and all(isinstance(a, str) for a in d.args)):
            continue
        a, b = (source(x) for x in d.args)
        for x, extremum in ((a, b), (b, a)):
            r = defs[extremum]
            if isinstance(r, Reduce) and r.op in (ReduceOp.MAX, ReduceOp.MIN) \
                    and defs[x].type.dtype.is_float and not isinstance(defs[x], Input) \
                    and x in elementwise_from(r.arg) \
                    and any(isinstance(defs[n], Reduce) for n in _ancestors(x, defs)):
                out.append((x, r.name, d.name,
                            "maximum" if r.op is ReduceOp.MAX else "minimum"))
    return out


def reduced_products(p: Program) -> dict[str, str]:
    """Products that a reduction other than a product reads, each with the reason to store it.

    A product is a sum over a multiply of two tensors (a linear layer, a convolution) with what
    is applied to it element by element (bias, activation, reshape). A norm's statistics over it
    (group, layer, instance or batch norm after a linear layer or a convolution) would, inlined,
    compute every product element again in each statistic of each output that needs it: a
    group norm computes a whole group's products for every output element, twice (mean and
    variance). Even a reduction that reads each element once (a pool, a sum) would compute the
    product element by element, where stored it is its own kernel that a matrix-product
    template tiles. A product of f16/bf16 or f32 tensors that a softmax reads (a max
    reduction) and that, through it, feeds another product with an operand of its own stays
    fused: that is attention, which a flash template computes in one pass (online softmax).
    Where no flash template would take it (an f32 head dimension that is not a multiple of 4,
    f64), the scores are stored (a contraction) and the softmax and the product with V read
    them: fused, each output element would compute its row's scores again."""
    defs = {d.name: d for d in p.defs}
    users = _users(p)
    outputs = set(p.outputs)
    order = {d.name: i for i, d in enumerate(p.defs)}
    out: dict[str, str] = {}
    for d in p.defs:
        if d.name in outputs or _factors(d, defs) is None:
            continue
        pointwise = _closure(d.name, users, defs, through_reductions=False)
        readers = [defs[u] for n in pointwise for u in users[n]
                   if isinstance(defs[u], Reduce) and _factors(defs[u], defs) is None]
        if not readers:
            continue
        if _attention_products(d, users, defs):
            continue
        r = min(readers, key=lambda x: order[x.name])    # the first in program order
        out[_epilogue_end(d.name, users, defs)] = (
                       f"a reduction (`{r.name}`, {describe(r)}) reads this product: stored, "
                       f"the product is a matrix-product kernel of its own; inlined, the "
                       f"reduction's kernel would compute it element by element, again for "
                       f"each output that needs the reduction")
    return out


def scaled_products(p: Program) -> dict[str, str]:
    """Statistics a product's epilogue reads, each with the reason to store it: a per-row
    scale computed by a reduction of something other than the product (fp8's dynamic
    activation scale, amax(|x|) / 448, times the product of the quantized x; a norm applied
    after the product). Inlined, the product's kernel would compute the reduction first, and
    no matrix-product template takes a kernel that does; stored, it is a vector the
    template's epilogue loads as it loads a bias. A reduction of the product itself (a norm's
    statistics over it, attention's softmax) is `reduced_products`' business."""
    defs = {d.name: d for d in p.defs}
    users = _users(p)
    outputs = set(p.outputs)
    attention = _attentions(p, users, defs)
    ancestry = _Ancestry(p)
    out: dict[str, str] = {}
    for d in p.defs:
        if _factors(d, defs) is None or d.name in attention:
            continue
        pointwise = _closure(d.name, users, defs, through_reductions=False)
        for u in sorted(pointwise - {d.name}, key=ancestry.index.__getitem__):  # program order
            for a in operands(defs[u]):
                while isinstance(defs[a], IndexMap) and not _sliding(defs[a], defs):
                    a = defs[a].arg
                if a in pointwise or a in outputs or isinstance(defs[a], Input):
                    continue
                stat = _statistic(a, defs)
                if stat is None or ancestry.computes_from(a, d.name):
                    continue
                out.setdefault(a, f"a product's epilogue (`{d.name}`, through `{u}`) reads "
                                  f"it, and it is computed from a reduction (`{stat}`, "
                                  f"{describe(defs[stat])}): stored, the product is a "
                                  f"matrix-product kernel of its own that loads it as a "
                                  f"bias; inlined, its kernel would compute the reduction, "
                                  f"then the product element by element")
    return out


MIN_OPERAND_REUSE = 16   # products an operand element feeds before it is stored (a tile's N)


def normalized_operands(p: Program, flashless: frozenset[str] = frozenset()) -> dict[str, str]:
    """Operands of products that the program computes from a reduction other than a product (a
    pre-norm transformer's RMSNorm or LayerNorm before its projections, a softmax before a
    linear layer), each with the reason to store it. Inlined, the product's kernel computes the
    statistic, then the product element by element (a row kernel re-reading the weight for
    every row); stored, the norm is a row kernel and the product a matrix-product template.
    Kept fused: an operand whose elements each feed fewer than MIN_OPERAND_REUSE products (a
    matrix-vector product after a norm: one pass over each row is best), one whose product
    multiplies it with a tensor of another type (no template does), and attention's
    probabilities (the flash kernel folds the softmax into P V), unless its scores
    are in `flashless` (stored: no flash template took the fused kernel)."""
    defs = {d.name: d for d in p.defs}
    outputs = set(p.outputs)
    out: dict[str, str] = {}
    for d, src, wide in _computed_operands(p, defs, flashless):
        if src in outputs:
            continue
        stat = _statistic(src, defs)
        if stat is None or wide // math.prod(defs[src].type.shape) < MIN_OPERAND_REUSE:
            continue
        out.setdefault(src, f"a product (`{d.name}`) reads it, and it is computed from a "
                            f"reduction (`{stat}`, {describe(defs[stat])}): stored, the "
                            f"product is a matrix-product kernel of its own; inlined, its "
                            f"kernel would compute the reduction, then the product element "
                            f"by element")
    return out


def _computed_operands(p: Program, defs, flashless: frozenset[str] = frozenset()):
    """(product, the tensor an operand of it reads that the program computes, the number of
    multiplies the product makes) for the products outside attention whose operands are of
    one type (f32 probabilities times f16 values: no template multiplies those)."""
    attention = _attentions(p, _users(p), defs, flashless)
    for d in p.defs:
        factors = _factors(d, defs)
        if factors is None or d.name in attention:
            continue
        if len({_source(a, defs).type.dtype for a in factors}) > 1:
            continue
        wide = math.prod(defs[d.arg].type.shape)
        for a in factors:
            src = _computed_source(a, defs)
            if src is not None:
                yield d, src, wide


def elementwise_operands(p: Program) -> dict[str, str]:
    """Operands of products that the program computes element by element from its inputs (an
    activation before a linear layer or a convolution, a scaled weight, an int8 weight
    dequantized: w.half() * scale), each with the reason to store it. Inlined, the product's
    kernel is no matrix product (its operand is not a load of a float tensor, nor a window
    over one) but a row kernel that computes each output element's dot product on its own,
    the operand again for every output; stored, the operand is a map kernel and the product
    a matrix-product template (tensor cores for 16-bit operands). A convolution's input is
    stored before its window (the implicit-GEMM template reads the window). Kept fused: an
    operand whose elements each feed fewer than MIN_OPERAND_REUSE products (a matrix-vector
    product: one pass is best), a product of two types (no template multiplies those),
    attention's, and what a reduction or a gather computes (their own rules:
    `normalized_operands`, chains of products, `gathered_reads`)."""
    defs = {d.name: d for d in p.defs}
    outputs = set(p.outputs)
    out: dict[str, str] = {}
    reads = _reads_inputs(p)
    for d, src, wide in _computed_operands(p, defs):
        if not _element_wise(src, defs) or _dequantized(src, defs):
            continue
        for name in _store_points(src, defs, wide, reads):
            if name not in outputs:
                out.setdefault(name, f"a product (`{d.name}`) reads it, computed element by "
                                     f"element from the program's inputs: stored, the product "
                                     f"is a matrix-product kernel of its own; inlined, a row "
                                     f"kernel would compute it again for every output "
                                     f"element's dot product")
    return out


# the arithmetic a computed operand may do (Tile IR's contract recognizes the same)
COMPUTED_OPERAND_OPS = frozenset({EwOp.MUL, EwOp.ADD, EwOp.SUB, EwOp.NEG})
# and on its integer (or bool) values before they become floats: unpacking data narrower than
# a byte (int4 weights two to a byte: w & 15, w >> 4, chosen by the index's parity)
UNPACKING_OPS = frozenset({EwOp.BITAND, EwOp.BITOR, EwOp.SHR, EwOp.SHL, EwOp.WHERE, EwOp.LT,
                           EwOp.LE, EwOp.GT, EwOp.GE, EwOp.EQ, EwOp.NE})


def operand_op(op: EwOp, dtype: DType) -> bool:
    """Whether a computed operand may compute a value of `dtype` by `op`: its float arithmetic
    (COMPUTED_OPERAND_OPS), or the bit operations, comparisons and selections that unpack
    integer data (UNPACKING_OPS, on integer and bool values only)."""
    return op in COMPUTED_OPERAND_OPS or (op in UNPACKING_OPS and not dtype.is_float)


def _dequantized(name: str, defs) -> bool:
    """A 16-bit float operand computed from narrower data (an int8 weight dequantized:
    w.half() * scale, maybe less a zero point; int4 weights two to a byte, unpacked by bit
    operations): its data (the inputs of at least half a byte an element it has) take fewer
    bytes than it does, and it is their casts, multiplies, adds and subtractions, after the
    bit operations, comparisons and selections that unpack integers (operand_op). Fused, the
    product's template computes its elements as it copies their tiles, reading the narrow
    data once a block row of the output; stored, every product would read twice the bytes
    and more, after a kernel read the narrow data and wrote them. The row's PLACE=cut stores
    it after all."""
    d = defs[name]
    if d.type.dtype not in (DType.F16, DType.BF16):
        return False
    size = math.prod(d.type.shape)
    chain = _ancestors(name, defs) | {name}
    if any(isinstance(defs[n], Elementwise) and not operand_op(defs[n].op, defs[n].type.dtype)
           for n in chain):
        return False
    data = [defs[n] for n in chain if isinstance(defs[n], Input)
            and 2 * _bytes(defs[n]) >= size]
    return bool(data) and sum(_bytes(i) for i in data) < size * d.type.dtype.itemsize


def _bytes(d) -> int:
    return math.prod(d.type.shape) * d.type.dtype.itemsize


def _element_wise(name: str, defs) -> bool:
    """Whether `name` is computed from inputs by element-wise ops, casts and index maps alone
    (no reduction, scan or gather on the way)."""
    return all(isinstance(defs[n], (Input, Iota, Elementwise, Cast, IndexMap))
               for n in _ancestors(name, defs) | {name})


def _reads_inputs(p: Program) -> dict[str, bool]:
    """Whether each definition is computed from an input of the program, for all at once (asked
    of every operand of every product, walking the graph each time was cubic in an unrolled
    scan's length: Mamba's selective_scan_ref over 256 steps)."""
    defs = {d.name: d for d in p.defs}
    out: dict[str, bool] = {}
    for d in p.defs:                      # operands come first
        out[d.name] = any(isinstance(defs[a], Input) or out[a] for a in operands(d))
    return out


def _store_points(src: str, defs, wide: int, reads_inputs: Mapping[str, bool]) -> list[str]:
    """Where to store an element-wise operand: from `src` down, the first tensors each of whose
    elements feeds at least MIN_OPERAND_REUSE products and that read an input (not index maps:
    under a convolution's window, the activation before it; not a mask computed from positions
    alone)."""
    out, seen, todo = [], {src}, [src]
    while todo:
        d = defs[todo.pop()]
        if isinstance(d, (Input, Iota)):
            continue
        reads = reads_inputs[d.name]
        if (reads and not isinstance(d, IndexMap)
                and wide // math.prod(d.type.shape) >= MIN_OPERAND_REUSE):
            out.append(d.name)
            continue
        for a in operands(d):
            if a not in seen:
                seen.add(a)
                todo.append(a)
    return sorted(out)


def recomputed_products(p: Program, kernels_uses: list[Mapping[str, int]]) -> dict[str, str]:
    """Products a built kernel computes at several indices (each kernel's `uses`, from the
    inliner), each with the reason to store it (the end of its epilogue, as `reduced_products`
    stores one): a rotary embedding reads a projection at its own column and at the rotated
    one, so fused, every dot product would run twice and no matrix-product template would take
    the kernel. An attention's scores are read by its softmax's folds and by P V at several
    indices by design (the flash template merges them); `attention_scores` covers those."""
    defs = {d.name: d for d in p.defs}
    users = _users(p)
    attention = _attentions(p, users, defs)
    ancestry = _Ancestry(p)
    out: dict[str, str] = {}
    computing = Counter(n for uses in kernels_uses for n in uses
                        if n not in attention and _factors(defs[n], defs) is not None)
    for name, count in computing.items():
        if count > 1:       # N-BEATS's trunk, read by its backcast's and its forecast's kernels
            out.setdefault(_epilogue_end(name, users, defs), (
                f"{count} kernels compute this product (`{name}`): stored, it is computed once"))
    for uses in kernels_uses:
        products = [d.name for d in p.defs if d.name in uses and d.name not in attention
                    and _factors(d, defs) is not None]
        for name in products:
            if uses[name] > 1:
                out.setdefault(_epilogue_end(name, users, defs), (
                    f"a kernel reads this product (`{name}`) at {uses[name]} different indices "
                    f"(a rotation, a shifted copy): stored, the product is a matrix-product "
                    f"kernel of its own; inlined, each of its elements would be computed "
                    f"{uses[name]} times"))
        # products the kernel combines element-wise (SwiGLU's silu(x W1) * (x W3)), not a
        # chain in which one reads the other: every one but the last is stored, which the last
        # one's epilogue reads
        for i, name in enumerate(products):
            later = [m for m in products[i + 1:] if not ancestry.computes_from(m, name)]
            if later:
                out.setdefault(_epilogue_end(name, users, defs, frozenset(later)), (
                    f"the kernel of `{later[-1]}` also computes this product (`{name}`), which "
                    f"it does not read as an operand: stored, each is a matrix-product kernel, "
                    f"the last one reading the other in its epilogue; together, neither would "
                    f"be"))
    return out


RERUN_LIMIT = 2   # times a reduction (not a product) may run per distinct value before it is stored


def recomputed_statistics(p: Program, kernels_reruns: list[Mapping[str, tuple[int, int]]]
                          ) -> dict[str, str]:
    """Reductions that are not products and that a built kernel runs at least RERUN_LIMIT
    times per distinct value (each kernel's placer counts: copies, worst factor), each with
    the reason to store it: a consumer reads it inside a loop it does not depend on, so
    inlined, the whole reduction would run again at every step of that loop (a sort's ranks,
    read by each output position). Products, and reductions a product reads, stay fused: a
    chain of matrix products recomputes its intermediate per output tile by design, and Tile
    IR's PLACE=cut stores either where a matrix-product template takes the product."""
    defs = {d.name: d for d in p.defs}
    users = _users(p)
    out: dict[str, str] = {}
    for reruns in kernels_reruns:
        for name, (_, factor) in reruns.items():
            d = defs.get(name)
            if (isinstance(d, Reduce) and factor >= RERUN_LIMIT and _factors(d, defs) is None
                    and not _feeds_product(name, users, defs)):
                out.setdefault(name, (
                    f"a consumer reads this reduction inside a loop it does not depend on: "
                    f"inlined, it would run {factor} times per value"))
    return out


SHARED_CHAIN = 4   # reductions chained into a statistic before two kernels share it stored
GROWN_CHAIN = 4    # stored statistics one is computed from before two kernels share it stored


def shared_statistics(p: Program, kernels_uses: list[Mapping[str, int]], stored: set[str]
                      ) -> dict[str, str]:
    """Statistics that two or more built kernels each compute (each kernel's `uses`), where
    getting one runs a chain of at least SHARED_CHAIN reductions that are not stored, each with
    the reason to store it: stored, the first kernel computes it and the others read it, where
    inlined every one would run the whole chain again (a selection's k-th largest key, decided
    a bit at a time by 32 counts, read by the scans and the reduction after them). A statistic
    is a reduction that is not a product, or an element-wise op or cast of statistics and
    literals, or a reshape of one (not a broadcast); only the last of a chain is stored (none
    of its users is a candidate), and only where the chain serves it alone (_funnels). So is a
    statistic (of statistics and constants) that two or more kernels compute from GROWN_CHAIN
    or more stored ones, where it first reaches that many: a potential carried from step to
    step (log-domain Sinkhorn's), which inlined every later kernel computes from all the
    steps before."""
    defs = {d.name: d for d in p.defs}
    users = _users(p)
    statistic: set[str] = set()
    chain: dict[str, frozenset[str]] = {}      # the unstored reductions each value runs
    # statistics made of statistics and constants (a sum started from zeros), and the stored
    # ones each reads through the others
    carried: set[str] = set()
    constant: set[str] = set()
    reach: dict[str, frozenset[str]] = {}
    for d in p.defs:
        names = list(dict.fromkeys(operands(d)))
        below = frozenset().union(*(chain[a] for a in names if a not in stored))
        if isinstance(d, Reduce) and _factors(d, defs) is None:
            statistic.add(d.name)
            below |= {d.name}
        elif names and all(a in statistic for a in names) and (
                isinstance(d, (Elementwise, Cast)) or (isinstance(d, IndexMap) and math.prod(
                    d.type.shape) <= math.prod(defs[d.arg].type.shape))):
            statistic.add(d.name)
        chain[d.name] = below
        if not isinstance(d, Input) and all(a in constant for a in names):
            constant.add(d.name)               # zeros to start a sum from, positions
        elif isinstance(d, Reduce) and _factors(d, defs) is None:
            carried.add(d.name)
        elif all(a in carried or a in constant for a in names) and (
                isinstance(d, (Elementwise, Cast)) or (isinstance(d, IndexMap) and math.prod(
                    d.type.shape) <= math.prod(defs[d.arg].type.shape))):
            carried.add(d.name)
            reach[d.name] = frozenset().union(*(
                ({a} if a in stored else reach.get(a, frozenset())) for a in names
                if a in carried))
    # a kernel computes a statistic where it runs its whole chain
    kernels = {n: sum(chain[n] <= uses.keys() for uses in kernels_uses) for n in statistic}
    candidates = {n for n in statistic - stored
                  if len(chain[n]) >= SHARED_CHAIN and kernels[n] >= 2
                  and not _feeds_product(n, users, defs)}
    out = {n: (f"{kernels[n]} kernels compute this statistic, a chain of {len(chain[n])} "
               f"reductions: stored, it runs once; inlined, each kernel would run the chain")
           for n in sorted(candidates)
           if not any(u in candidates for u in users[n]) and _funnels(n, defs, users, stored)}
    # a statistic carried from step to step (log-domain Sinkhorn's potentials u += eps * ...)
    # that kernels compute from the stored statistics of every step before: stored, each step
    # reads the last one; inlined, a kernel reads them all, and the program grows as its
    # steps' square
    computing = {n: sum(n in uses for uses in kernels_uses) for n in reach.keys() - stored}
    grown = {n for n, count in computing.items()
             if n not in out and len(reach[n]) >= GROWN_CHAIN and count >= 2
             and not _feeds_product(n, users, defs)}
    for n in sorted(grown):
        if any(a in grown for a in operands(defs[n])):
            continue         # where the chain first reaches GROWN_CHAIN (the next pass goes on)
        out[n] = (f"{computing[n]} kernels compute this statistic from {len(reach[n])} stored "
                  "ones: stored, it is read once; inlined, each kernel computes it again from "
                  "all of them")
    return out


def _funnels(name: str, defs, users, stored: set[str]) -> bool:
    """Whether everything `name` computes on the way (its ancestors up to stored tensors and
    inputs) serves only `name`: stored, no kernel computes any of it again. Not so for one
    round of a top-k, whose earlier rounds' picks are outputs too."""
    inside, todo = set(), [name]
    while todo:
        for a in operands(defs[todo.pop()]):
            if a not in inside and a not in stored and not isinstance(defs[a], Input):
                inside.add(a)
                todo.append(a)
    return all(u in inside or u == name for a in inside for u in users[a])


def _feeds_product(name: str, users, defs) -> bool:
    """Whether a matrix product reads `name` through element-wise ops, casts and index maps:
    a product one of whose factors is broadcast (not a row's dot with a tensor of its own
    shape, `(q * x).sum(1)` after SwAV's Sinkhorn, which recomputes nothing by design)."""
    seen, todo = {name}, [name]
    while todo:
        for u in users[todo.pop()]:
            d = defs[u]
            factors = _factors(d, defs)
            if factors is not None and any(_broadcast(f, defs) for f in factors):
                return True
            if isinstance(d, (Elementwise, Cast, IndexMap)) and u not in seen:
                seen.add(u)
                todo.append(u)
    return False


def _attentions(p: Program, users, defs, flashless: frozenset[str] = frozenset()) -> set[str]:
    """The scores and P V products of the attentions kept fused (a flash kernel's), less those
    whose scores are in `flashless` (stored: no flash template took them)."""
    out: set[str] = set()
    for d in p.defs:
        second = _attention_products(d, users, defs)
        if second and _epilogue_end(d.name, users, defs) not in flashless:
            out |= {d.name, *second}
    return out


def _statistic(name: str, defs) -> str | None:
    """The first reduction that is not a product found through the element-wise ops, casts and
    index maps (not sliding windows) that compute `name`; None when there is none."""
    seen, todo = {name}, [name]
    while todo:
        d = defs[todo.pop()]
        if isinstance(d, Reduce):
            if _factors(d, defs) is None:
                return d.name
            continue
        if not (isinstance(d, (Elementwise, Cast))
                or (isinstance(d, IndexMap) and not _sliding(d, defs))):
            continue
        for a in operands(d):
            if a not in seen:
                seen.add(a)
                todo.append(a)
    return None


def attention_scores(p: Program) -> dict[str, str]:
    """The scores products of the attentions `reduced_products` keeps fused, each with what to
    store where no flash template takes it: the end of its epilogue (its cast to the program's
    type, as `reduced_products` stores a product)."""
    defs = {d.name: d for d in p.defs}
    users = _users(p)
    outputs = set(p.outputs)
    return {d.name: _epilogue_end(d.name, users, defs) for d in p.defs
            if d.name not in outputs and _attention_products(d, users, defs)}


def attention_operands(p: Program) -> dict[str, str]:
    """What an attention (the product, softmax and product that `reduced_products`
    keeps fused) must read from memory, each with the reason to store it: q, k and v where the
    program computes them (a linear layer's q|k|v projection, its bias, a scaling), found
    through the casts and index maps between them and the products (head splits, transposes,
    repeated heads), and a mask or bias it computes from its inputs (`(1 - mask) * -1e4`);
    inlined, every score would compute its rows of q and k again, and no flash kernel would
    take it. And its output where a product reads it (an output projection): fused, that
    product would recompute the attention for each of its outputs."""
    defs = {d.name: d for d in p.defs}
    users = _users(p)
    outputs = set(p.outputs)
    out: dict[str, str] = {}
    for d in p.defs:
        second = [] if d.name in outputs else _attention_products(d, users, defs)
        if not second:
            continue
        pointwise = _closure(d.name, users, defs, through_reductions=False)
        reach = _closure(d.name, users, defs, through_reductions=True)
        values = [a for n in second for a in _factors(defs[n], defs) if a not in reach]
        # what the scores meet on their way to the softmax and to P V (a bias or mask tensor,
        # V) where it reads the program's data: a mask of the indices alone (causal) stays
        masks = [a for n in pointwise if isinstance(defs[n], Elementwise)
                 for a in operands(defs[n]) if a not in reach and _reads_data(a, defs)]
        for a in (*_factors(d, defs), *values, *(_truth_of(m, defs) for m in masks)):
            src = _computed_source(a, defs)
            if src is not None and src not in outputs:
                out.setdefault(src, f"attention (`{d.name}`, a softmax, `{second[0]}`) reads "
                                    f"it as q, k or v: stored, one flash kernel computes the "
                                    f"attention; inlined, every score would compute it again")
        for n in second:
            end = _epilogue_end(n, users, defs)
            after = _closure(end, users, defs, through_reductions=False)
            if end not in outputs and any(_factors(defs[u], defs) is not None
                                          for m in after for u in users[m]):
                out.setdefault(end, "a product reads attention's output: stored, the "
                                    "attention is one flash kernel and the product another")
    return out


def _truth_of(name: str, defs) -> str:
    """What a mask tests, through what the attention recognizer reads itself: not, a
    comparison with 0 (`bias == 0`, `~keep`), a cast to bool or a widening one, index maps
    (a broadcast)."""
    d = defs[name]
    while True:
        if ((isinstance(d, Cast) and (d.type.dtype is DType.BOOL or _widening(d, defs)))
                or (isinstance(d, IndexMap) and not _window(d, defs))):
            d = defs[d.arg]
        elif isinstance(d, Elementwise) and (
                d.op is EwOp.NOT or (d.op in (EwOp.EQ, EwOp.NE) and len(d.args) == 2
                                     and any(not isinstance(a, str) and a.value == 0
                                             for a in d.args))):
            d = defs[next(a for a in d.args if isinstance(a, str))]
        else:
            return d.name


def _reads_data(name: str, defs) -> bool:
    """Whether `name` depends on a program input (not only on indices and literals)."""
    return isinstance(defs[name], Input) or any(isinstance(defs[a], Input)
                                                 for a in _ancestors(name, defs))


def _narrow_end(name: str, defs) -> str:
    """What to store for `name`, which a window reads: the value a widening cast widens (a bf16
    activation rather than its f32 copy for the next convolution): half the bytes, the same
    values, and its other readers (a residual add in bf16) read it instead of computing it
    again. The cast costs a conversion where it is read. (A gather's source is stored as the
    gather reads it: positions known at run time read a buffer, not a computation.)"""
    d = defs[name]
    while isinstance(d, Cast) and _widening(d, defs):
        d = defs[d.arg]
    return d.name


def _source(name: str, defs) -> Def:
    """What `name` reads through widening casts and index maps that are not sliding windows:
    the tensor a kernel loads (an input or a stored one) to compute it."""
    d = defs[name]
    while ((isinstance(d, Cast) and _widening(d, defs))
           or (isinstance(d, IndexMap) and not _sliding(d, defs))):
        d = defs[d.arg]
    return d


def _sliding(d: IndexMap, defs) -> bool:
    """A window whose positions overlap (a convolution's), not a broadcast of a reshape."""
    return _window(d, defs) and _overlapping(d)


def _computed_source(name: str, defs) -> str | None:
    """The tensor `name` reads through widening casts and index maps that are not sliding
    windows (what a kernel loads as it is: re-indexed, broadcast, widened; a head split of a
    projection broadcast over the query positions is one), unless that is a program input:
    then None. A narrowing cast is the tensor (q rounded to f16 is what the program reads)."""
    d = _source(name, defs)
    return None if isinstance(d, Input) else d.name


def _widening(d: Cast, defs) -> bool:
    """A cast from one float type to one at least as wide (it loses nothing)."""
    src = defs[d.arg].type.dtype
    return (d.type.dtype.is_float and src.is_float
            and d.type.dtype.itemsize >= src.itemsize)


def _epilogue_end(name: str, users, defs, apart: frozenset[str] = frozenset()) -> str:
    """What to store for a product: the last of the element-wise ops applied to it alone (its
    bias, its activation), which its kernel's epilogue computes, while each is its
    predecessor's only reader and reads nothing else computed from the product (nor from the
    products `apart`: where two products are added, the sum is no one's epilogue). Not a
    widening cast at the end (a 16-bit product widened for its consumers' arithmetic): the
    narrower tensor holds the same values in half the bytes."""
    while len(users[name]) == 1:
        u = defs[users[name][0]]
        if not isinstance(u, (Elementwise, Cast)):
            break
        others = [a for a in operands(u) if a != name]
        computed = apart | {name}
        if any(a in computed or computed & _ancestors(a, defs) for a in others):
            break
        name = u.name
    while isinstance(defs[name], Cast) and _widening(defs[name], defs):
        name = defs[name].arg
    return name


class _Ancestry:
    """Which definitions each one is computed from, for the whole program at once (a bit per
    definition): asked again and again in a loop over products, walking the graph each time
    was quadratic in an unrolled recurrence's length (DeltaNet over 256 steps)."""

    def __init__(self, p: Program):
        self.index = {d.name: i for i, d in enumerate(p.defs)}
        self.mask: dict[str, int] = {}
        for d in p.defs:                      # operands come first
            m = 0
            for a in operands(d):
                m |= self.mask[a] | (1 << self.index[a])
            self.mask[d.name] = m

    def computes_from(self, name: str, ancestor: str) -> bool:
        return bool(self.mask[name] >> self.index[ancestor] & 1)


def _ancestors(name: str, defs) -> set[str]:
    out, todo = set(), [name]
    while todo:
        for a in operands(defs[todo.pop()]):
            if a not in out:
                out.add(a)
                todo.append(a)
    return out


def _factors(d: Def, defs) -> tuple[str, ...] | None:
    """The two tensors a product multiplies (a sum over their multiply, maybe widened first);
    None when `d` is not a product."""
    if not (isinstance(d, Reduce) and d.op is ReduceOp.SUM):
        return None
    arg = defs[d.arg]
    if isinstance(arg, Cast):
        arg = defs[arg.arg]
    if (isinstance(arg, Elementwise) and arg.op is EwOp.MUL
            and all(isinstance(a, str) for a in arg.args) and arg.args[0] != arg.args[1]):
        return arg.args
    return None


def _broadcast(name: str, defs) -> bool:
    """Whether `name` is an index map (through widening casts) of fewer elements than it
    has: a matrix product's factor, each read along the other's free axis."""
    d = defs[name]
    while isinstance(d, Cast) and _widening(d, defs):
        d = defs[d.arg]
    return isinstance(d, IndexMap) and math.prod(d.type.shape) > math.prod(
        defs[d.arg].type.shape)


def _flash_operands(d: Reduce, defs) -> bool:
    """Whether a product multiplies tensors a flash template takes: f16/bf16 (widened to f32 or
    not), or f32 over a head dimension the f32 template takes (a multiple of 4 up to 256:
    emmy.cuda.attention_simt; fused, a product no template takes would compute each row's
    scores again for every output element)."""
    def half(name: str) -> bool:     # through index maps and widening casts
        x = defs[name]
        while x.type.dtype not in (DType.F16, DType.BF16) and isinstance(x, (Cast, IndexMap)):
            x = defs[x.arg]
        return x.type.dtype in (DType.F16, DType.BF16)
    factors = _factors(d, defs)
    if all(half(a) for a in factors):
        return True
    from emmy.cuda.attention_simt import MAX_D

    arg = defs[d.arg]
    dims = [arg.type.shape[a] for a in d.axes]
    return (all(defs[a].type.dtype is DType.F32 for a in factors) and len(dims) == 1
            and isinstance(dims[0], int) and dims[0] % 4 == 0 and 4 <= dims[0] <= MAX_D)


def _closure(name: str, users, defs, through_reductions: bool) -> set[str]:
    """What `name` reaches through element-wise ops, casts and index maps that read each
    element at most once per position (no sliding windows); with `through_reductions`, through
    reductions too, up to the products it reaches (included, not gone through: what a product
    computes is another kernel's business, or another template's)."""
    seen, todo = {name}, [name]
    while todo:
        for u in users[todo.pop()]:
            d = defs[u]
            ok = (isinstance(d, (Elementwise, Cast))
                  or (isinstance(d, IndexMap) and not _window(d, defs))
                  or (through_reductions and isinstance(d, Reduce)))
            if ok and u not in seen:
                seen.add(u)
                if not (through_reductions and _factors(d, defs) is not None):
                    todo.append(u)
    return seen


def _attention_products(d: Def, users, defs) -> list[str]:
    """Where `d` is the scores' product of an attention (a product of f16/bf16 or f32
    tensors that a softmax reads, through a max reduction, and that feeds another product with
    an operand of its own), those products (its probabilities times V); else []."""
    if _factors(d, defs) is None or not _flash_operands(d, defs):
        return []
    pointwise = _closure(d.name, users, defs, through_reductions=False)
    if not any(isinstance(defs[u], Reduce) and defs[u].op is ReduceOp.MAX
               for n in pointwise for u in users[n]):
        return []
    reach = _closure(d.name, users, defs, through_reductions=True)
    return [n for n in reach if (f := _factors(defs[n], defs)) is not None
            and sum(a in reach for a in f) == 1]


def _window(d: IndexMap, defs) -> bool:
    """A window: more elements than its source, an index adding two axes (a sliding one when
    its positions overlap, see _overlapping)."""
    return (math.prod(d.type.shape) > math.prod(defs[d.arg].type.shape)
            and any(len(e.free_vars()) > 1 for e in d.index))


def _users(p: Program) -> dict[str, list[str]]:
    users: dict[str, list[str]] = {d.name: [] for d in p.defs}
    for d in p.defs:
        for a in dict.fromkeys(operands(d)):
            users[a].append(d.name)
    return users


def is_pointwise(d: Def) -> bool:
    """Reads its operands at its own position (elementwise, cast, identity index_map)."""
    if isinstance(d, (Elementwise, Cast)):
        return True
    if isinstance(d, IndexMap):
        identity = tuple(symbolic.var(axis_var(i)) for i in range(len(d.type.shape)))
        return d.index == identity
    return False


def _epilogue_root(scan: Scan, defs, users, roots):
    """The one output a scan reaches through elementwise ops only; or None and why not (a
    function of how to spell a stored tensor)."""
    ends: list[str] = []
    stack, seen = [scan.name], {scan.name}
    while stack:
        for u in users[stack.pop()]:
            if not is_pointwise(defs[u]):
                return None, lambda at, u=u: f"`{u}` ({describe(defs[u])}) reads it at other positions"
            if u in roots and u not in ends:
                ends.append(u)
            elif u not in roots and u not in seen:
                seen.add(u)
                stack.append(u)
    if not ends:
        return None, lambda at: "nothing reads it"
    if len(ends) > 1:
        return None, lambda at: "its values reach several kernels: " + ", ".join(map(at, ends))
    return ends[0], None


def _reads(root: str, defs, stored: set[str]) -> tuple[dict[str, bool], set[str]]:
    """What a root's kernel reads from memory (each with whether only at the root's own
    positions), and every definition the kernel touches."""
    out: dict[str, bool] = {}
    stack = [(a, is_pointwise(defs[root])) for a in operands(defs[root])]
    seen: set[tuple[str, bool]] = set()
    while stack:
        name, same = stack.pop()
        if (name, same) in seen:
            continue
        seen.add((name, same))
        d = defs[name]
        if name in stored or isinstance(d, Input):
            out[name] = out.get(name, True) and same
            continue
        stack += [(a, same and is_pointwise(d)) for a in operands(d)]
    return out, {name for name, _ in seen}


def _group(roots, reads, touched, defs, scan_of) -> list[list[str]]:
    """Put outputs of one shape in one kernel when they share work (a load, a value) and
    depend on each other only at the same positions."""
    groups: list[list[str]] = []
    reach: dict[str, set[str]] = {}      # _reaches, once per stored tensor
    stored = set(roots)
    products = {r: {n for n in (touched[r] - stored) | {r} if _factors(defs[n], defs) is not None}
                for r in roots}
    for r in roots:
        for g in groups:
            if r not in scan_of and g[0] not in scan_of \
                    and defs[g[0]].type.shape == defs[r].type.shape \
                    and any(touched[r] & (touched[m] | {m}) for m in g) \
                    and _one_product(products[r], set().union(*(products[m] for m in g))) \
                    and _can_share(g + [r], reads, reach) \
                    and _kernels_acyclic([m for m in roots if m not in g and m != r],
                                         [x + [r] if x is g else x for x in groups], reads):
                g.append(r)
                break
        else:
            groups.append([r])
    return groups


def _one_product(a: set[str], b: set[str]) -> bool:
    """Whether outputs computing products `a` and `b` may share a kernel: not when each computes
    a product of its own (a k and a v projection of the same input), which no matrix-product
    template computes in one kernel."""
    return not a or not b or a == b


def _can_share(group: list[str], reads, reach: dict[str, set[str]]) -> bool:
    members = set(group)
    for a in group:
        for m, same in reads[a].items():
            if m in members and not same:
                return False  # read at other positions: it would have to be recomputed
            if m not in members:
                if m not in reach:
                    reach[m] = _reaches(m, reads)
                if members & reach[m]:
                    return False  # through another kernel: the group would wait on itself
    return True


def _kernels_acyclic(rest: list[str], groups: list[list[str]], reads) -> bool:
    """Whether the kernels, `groups` and every root of `rest` not in one (a kernel of its
    own), can run in some order, each after the kernels it loads from. Two groups can each
    read the other (a reads d, c reads b, with {a, b} and {c, d} grouped) while no stored
    tensor depends on itself."""
    owner = {r: i for i, g in enumerate(groups) for r in g}
    for r in rest:
        owner.setdefault(r, len(owner) + len(groups))
    deps: dict[int, set[int]] = {}
    for r, i in owner.items():
        deps.setdefault(i, set()).update(owner[m] for m in reads.get(r, {})
                                         if m in owner and owner[m] != i)
    state: dict[int, int] = {}                     # 1: on the path, 2: done

    def visit(i: int) -> bool:
        state[i] = 1
        for j in deps.get(i, ()):
            if state.get(j) == 1 or (j not in state and not visit(j)):
                return False
        state[i] = 2
        return True

    return all(i in state or visit(i) for i in deps)


def _reaches(name: str, reads) -> set[str]:
    """The stored tensors `name` depends on, through any chain of kernels."""
    out: set[str] = set()
    stack = [name]
    while stack:
        for m in reads.get(stack.pop(), {}):
            if m not in out:
                out.add(m)
                stack.append(m)
    return out


def _order_groups(groups, reads, order) -> list[list[str]]:
    """Each group after the groups it loads from; otherwise in program order."""
    owner = {r: i for i, g in enumerate(groups) for r in g}
    deps = [{owner[m] for r in g for m in reads[r] if m in owner} - {i} for i, g in enumerate(groups)]
    done: list[int] = []
    while len(done) < len(groups):
        ready = [i for i in range(len(groups)) if i not in done and deps[i] <= set(done)]
        done.append(min(ready, key=lambda i: min(order[r] for r in groups[i])))
    return [groups[i] for i in done]
