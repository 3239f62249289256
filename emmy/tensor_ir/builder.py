"""Build a Tensor IR program one definition at a time, canonicalizing as it goes.

The builder gives each definition a fresh SSA name, infers its type, and keeps the program in
a canonical form so that equivalent torch code reaches the same Tensor IR:

    index_map(index_map(x, f), g)  -> index_map(x, f∘g)      (composed with symbolic.substitute)
    index_map(x, identity)         -> x
    (i // d) * d + i % d           -> i      (in index expressions)
    ew(op, x[m,1], y[m,n])         -> ew(op, index_map(x, [a0, 0]), y)   (explicit broadcast)
    cast(x, type of x)             -> x
    x*1, x+0, x-0, x/1             -> x
    cumsum(x) - x                  -> exclusive scan
    reduce over extent-1 axes      -> index_map (a squeeze)
    scan(flip(x)) along the axis   -> flip(scan(x, reverse))
    the same definition twice      -> one definition (hash-consing)

`finish` drops dead definitions and renumbers the fresh names v0, v1, … in program order.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence, Union

from emmy import symbolic
from emmy.dtypes import DType
from emmy.errors import InternalError
from emmy.tensor_ir.tables import table_index
from emmy.tensor_ir.ir import (ARITY, COMPARISON, Cast, Def, Elementwise, EwOp, Gather, IndexMap,
                               Input, InputKind, Iota, Program, Reduce, ReduceOp, Scalar, Scan,
                               TensorType, axis_var, gather_var)

Value = Union[str, Scalar, bool, int, float]  # a definition's name, or a literal

_FRESH = "%"  # prefix of not-yet-numbered names; never a valid torch name


class Builder:
    """Accumulates definitions in dependency order; `finish` turns them into a Program."""

    def __init__(self, name: str):
        self.name = name
        self.defs: dict[str, Def] = {}
        self._memo: dict[tuple, str] = {}

    # ---- queries -------------------------------------------------------------------------

    def type(self, x: str) -> TensorType:
        return self.defs[x].type

    def shape(self, x: str) -> tuple[int, ...]:
        return self.defs[x].type.shape

    def dtype(self, x: str) -> DType:
        return self.defs[x].type.dtype

    def rank(self, x: str) -> int:
        return len(self.defs[x].type.shape)

    def result_type(self, *values: Value) -> DType:
        """The type torch gives an arithmetic op on these operands."""
        return promote(*(self._dtype_of(v) for v in values))

    # ---- definitions ---------------------------------------------------------------------

    def input(self, name: str, type: TensorType, kind: InputKind = InputKind.INPUT,
              target: str | None = None) -> str:
        if name in self.defs or name.startswith(_FRESH):
            raise InternalError(f"input name {name!r} is taken")
        self.defs[name] = Input(name, type, kind, target)
        return name

    def table(self, value, dtype: DType) -> str | None:
        """A constant integer tensor (torch.export's lifted constants: a list the forward
        indexes with, a tensor attribute; a buffer or parameter) as positions computed from an iota, where its
        entries are a digit sum of its indices (emmy.tensor_ir.tables), else None: reads
        through it are then index maps, and a value computed from it an index expression."""
        expr = table_index(value) if value.ndim else None
        if expr is None:
            return None
        shape = tuple(int(n) for n in value.shape)
        bounds = {axis_var(i): n for i, n in enumerate(shape)}
        limit = 2 ** (8 * dtype.itemsize - 1)
        partial = symbolic.lin(0)
        for atom, coef in expr.terms:   # the terms' sums within the type before the constant
            partial = partial + symbolic.lin(atom) * coef
            lo, hi = symbolic.bounds_of(partial, bounds)
            if lo < -limit or hi >= limit:
                return None
        out = None
        for atom, coef in expr.terms:   # each digit: an iota over its range, read at it
            digit = symbolic.lin(atom)
            count = symbolic.bounds_of(digit, bounds)[1] + 1
            term = self.index_map(self.iota((count,), 0, dtype), shape, [digit])
            term = self.ew(EwOp.MUL, term, coef) if coef != 1 else term
            out = term if out is None else self.ew(EwOp.ADD, out, term)
        if out is None:
            return self.full(shape, expr.const, dtype)
        return self.ew(EwOp.ADD, out, expr.const) if expr.const else out

    def ew(self, op: EwOp, *args: Value) -> str:
        """An elementwise op; operands are promoted to a common type and broadcast."""
        if len(args) != ARITY[op]:
            raise InternalError(f"{op} takes {ARITY[op]} operands, got {len(args)}")
        if op in (EwOp.BITS, EwOp.FLOAT_BITS):        # its type is not its operand's
            return self.bits(*args, as_float=op is EwOp.FLOAT_BITS)
        cond, values = (args[0], args[1:]) if op is EwOp.WHERE else (None, args)
        dtype = self.result_type(*values)
        ops = [self.cast(v, dtype) if isinstance(v, str) else _scalar(v, dtype) for v in values]
        if cond is not None:
            ops.insert(0, self.cast(cond, DType.BOOL) if isinstance(cond, str)
                       else _scalar(cond, DType.BOOL))
        shape = broadcast_shapes(*(self.shape(v) for v in ops if isinstance(v, str)))
        ops = [self.broadcast_to(v, shape) if isinstance(v, str) else v for v in ops]
        same = _simplify(op, ops, dtype, shape, self)
        if same is not None:
            return same
        out = DType.BOOL if op in COMPARISON else dtype
        return self._add(Elementwise, TensorType(shape, out), op, tuple(ops))

    def bits(self, x: str, *, as_float: bool = False) -> str:
        """x's bits read as a signed integer of their width: an f32 tensor's as i32, an f64
        tensor's as i64 (a 16-bit float's: cast it to f32 first, which is exact); `as_float`,
        the other way: an i32 tensor's bits as f32, an i64 tensor's as f64."""
        pairs = {DType.F32: DType.I32, DType.F64: DType.I64}
        if as_float:
            pairs = {i: f for f, i in pairs.items()}
        width = pairs.get(self.dtype(x))
        if width is None:
            raise InternalError(f"bits of {self.dtype(x)}: " + ("only i32 or i64" if as_float
                                else "cast to f32 or f64 first"))
        return self._add(Elementwise, TensorType(self.shape(x), width),
                         EwOp.FLOAT_BITS if as_float else EwOp.BITS, (x,))

    def cast(self, x: str, dtype: DType) -> str:
        if self.dtype(x) is dtype:
            return x
        return self._add(Cast, TensorType(self.shape(x), dtype), x)

    def index_map(self, x: str, shape: Sequence[int], index: Sequence[symbolic.Lin | int]) -> str:
        """out[a0, …] = x[index…]; composes with an IndexMap argument; identity returns `x`."""
        shape, index, src, bounds = self._indexing("index_map", x, shape, index)
        # An extent-1 output axis only takes position 0; an extent-1 input axis only gives 0.
        ones = {axis_var(i): symbolic.lin(0) for i, n in enumerate(shape) if n == 1}
        index = tuple(symbolic.substitute(e, ones, bounds) for e in index)
        if isinstance(src, IndexMap):
            env = {axis_var(i): e for i, e in enumerate(index)}
            index = tuple(symbolic.substitute(e, env, bounds) for e in src.index)
            src = self.defs[src.arg]
        index = tuple(symbolic.lin(0) if n == 1 else fold_divmod(e)
                      for e, n in zip(index, src.type.shape))
        _check_in_bounds(src, shape, index, bounds)
        identity = tuple(symbolic.lin(0) if n == 1 else symbolic.var(axis_var(i))
                         for i, n in enumerate(shape))
        if shape == src.type.shape and index == identity:
            return src.name
        return self._add(IndexMap, TensorType(shape, src.type.dtype), src.name, index)

    def gather(self, x: str, shape: Sequence[int], index: Sequence[symbolic.Lin | int],
               indices: Sequence[str]) -> str:
        """out[a0, …] = x[index…], where `index` may name gather_var(k): the value of
        indices[k] (broadcast to `shape`) at the output position. Each gather_var(k) must be
        one whole component of `index` (x's position along that axis); its values are wrapped
        (-1 is the last) and clamped into that axis. Composes with an IndexMap argument."""
        shape, index, src, bounds = self._indexing("gather", x, shape, index)
        clamped = []
        known: dict[str, symbolic.Lin] = {}
        for k, i in enumerate(indices):
            at = [j for j, e in enumerate(index) if e == symbolic.var(gather_var(k))]
            if len(at) != 1 or self.dtype(i) not in (DType.I32, DType.I64):
                raise InternalError(f"gather of {x}: index tensor {k} is not one whole integer "
                                    f"position")
            n = src.type.shape[at[0]]
            bounds[gather_var(k)] = n
            i = self.broadcast_to(i, shape)
            affine = self.affine_value(i)
            if affine is not None and 0 <= symbolic.bounds_of(affine, bounds)[0] \
                    and symbolic.bounds_of(affine, bounds)[1] < n:
                known[gather_var(k)] = affine   # x[arange(n)]: positions the index knows
                clamped.append(i)
                continue
            wrapped = self.ew(EwOp.WHERE, self.ew(EwOp.LT, i, 0), self.ew(EwOp.ADD, i, n), i)
            inside = self.ew(EwOp.MIN, self.ew(EwOp.MAX, wrapped, 0), n - 1)
            clamped.append(self.broadcast_to(inside, shape))
        index = tuple(symbolic.substitute(e, known, bounds) for e in index)
        if isinstance(src, IndexMap):
            env = {axis_var(i): e for i, e in enumerate(index)}
            through = tuple(fold_divmod(symbolic.substitute(e, env, bounds)) for e in src.index)
            if all(_plain_gather_vars(e) for e in through):  # later stages know no @k extent
                index, src = through, self.defs[src.arg]
        used = [k for k in range(len(clamped))
                if any(gather_var(k) in e.free_vars() for e in index)]
        if not used:
            return self.index_map(src.name, shape, index)
        renumber = {gather_var(k): symbolic.var(gather_var(j)) for j, k in enumerate(used)}
        index = tuple(symbolic.substitute(e, renumber, bounds) for e in index)
        return self._add(Gather, TensorType(shape, src.type.dtype), src.name, index,
                         tuple(clamped[k] for k in used))

    def affine_value(self, x: str) -> symbolic.Lin | None:
        """x's value as an index expression over its own axes, where x is integer positions
        computed from an iota by index maps and integer literals (`torch.arange(n) * 2 + 1`,
        and constant tables: Builder.table); else None."""
        d = self.defs[x]
        bounds = {axis_var(i): n for i, n in enumerate(d.type.shape)}
        if d.type.dtype not in (DType.I32, DType.I64):
            return None
        match d:
            case Iota():
                return symbolic.var(axis_var(d.axis))
            case IndexMap() | Cast():
                inner = self.affine_value(d.arg)
                if inner is None or isinstance(d, Cast):
                    return inner
                env = {axis_var(i): e for i, e in enumerate(d.index)}
                return symbolic.substitute(inner, env, bounds)
            case Elementwise(op=EwOp.ADD | EwOp.SUB | EwOp.MUL, args=(a, b)):
                sides = [self.affine_value(v) if isinstance(v, str) else v.value for v in (a, b)]
                if any(v is None or isinstance(v, (bool, float)) for v in sides):
                    return None
                lhs, rhs = sides
                if d.op is EwOp.MUL:
                    if isinstance(lhs, symbolic.Lin) and isinstance(rhs, symbolic.Lin):
                        return None   # a product of positions is not affine
                    return lhs * rhs if isinstance(rhs, int) else rhs * lhs
                return symbolic.lin(lhs) + (symbolic.lin(rhs) if d.op is EwOp.ADD
                                            else symbolic.lin(rhs) * -1)
        return None

    def copy(self, x: str) -> str:
        """x itself, as a definition of its own: an identity index map (a program that returns
        an input returns a copy of it)."""
        identity = tuple(symbolic.var(axis_var(i)) for i in range(self.rank(x)))
        return self._add(IndexMap, self.type(x), x, identity)

    def reduce(self, op: ReduceOp, x: str, axes: Iterable[int], keepdim: bool = False) -> str:
        """Reduce over `axes`, dropping them (or keeping them with extent 1). Axes of extent 1
        are not reduced but squeezed by an IndexMap."""
        shape = self.shape(x)
        axes = {a % len(shape) for a in axes} if shape else set()
        work = tuple(a for a in sorted(axes) if shape[a] != 1)
        positions = op in (ReduceOp.ARGMAX, ReduceOp.ARGMIN)
        if work:
            kept = tuple(n for i, n in enumerate(shape) if i not in work)
            if 0 in shape and op in (ReduceOp.SUM, ReduceOp.PROD):
                # nothing to reduce (torch refuses max, min and positions over no elements)
                x = self.full(kept, 0 if op is ReduceOp.SUM else 1, self.dtype(x))
            else:
                x = self._add(Reduce, TensorType(kept, DType.I64 if positions else
                                                 self.dtype(x)), op, x, work)
        elif positions:
            x = self.full(shape, 0, DType.I64)  # the only position along extent-1 axes
        left = [i for i in range(len(shape)) if i not in work]  # the axes x still has
        out = list(range(len(shape))) if keepdim else [i for i in left if i not in axes]
        index = [0 if i in axes else symbolic.var(axis_var(out.index(i))) for i in left]
        return self.index_map(x, [1 if i in axes else shape[i] for i in out], index)

    def scan(self, op: ReduceOp, x: str, axis: int, *, reverse: bool = False,
             exclusive: bool = False) -> str:
        """Running reduction along `axis`; a scan of a flip is a reversed scan, flipped."""
        axis %= max(self.rank(x), 1)
        src = self.defs[x]
        if isinstance(src, IndexMap) and _is_flip_of(src, self.type(src.arg), axis):
            inner = self.scan(op, src.arg, axis, reverse=not reverse, exclusive=exclusive)
            return self.index_map(inner, src.type.shape, src.index)
        return self._add(Scan, self.type(x), op=op, arg=x, axis=axis, reverse=reverse,
                         exclusive=exclusive)

    def iota(self, shape: Sequence[int], axis: int, dtype: DType = DType.I64) -> str:
        return self._add(Iota, TensorType(tuple(shape), dtype), axis)

    def full(self, shape: Sequence[int], value: float | int | bool, dtype: DType) -> str:
        """A constant tensor: add(value, 0) broadcast to `shape`."""
        zero = _scalar(False if dtype is DType.BOOL else 0, dtype)
        op = EwOp.OR if dtype is DType.BOOL else EwOp.ADD
        return self._add(Elementwise, TensorType(tuple(shape), dtype), op,
                         (_scalar(value, dtype), zero))

    def broadcast_to(self, x: str, shape: Sequence[int]) -> str:
        """Right-aligned numpy broadcasting as an IndexMap."""
        shape = tuple(shape)
        src = self.shape(x)
        lead = len(shape) - len(src)
        if lead < 0 or any(n not in (1, shape[lead + j]) for j, n in enumerate(src)):
            raise InternalError(f"cannot broadcast {src} to {shape}")
        index = [symbolic.var(axis_var(lead + j)) if n != 1 else 0 for j, n in enumerate(src)]
        return self.index_map(x, shape, index)

    # ---- the program ---------------------------------------------------------------------

    def finish(self, outputs: Sequence[str], values=None) -> Program:
        """Keep what the outputs need and number the fresh names v0, v1, … in order."""
        live = self._live(outputs)
        taken = {n for n in self.defs if not n.startswith(_FRESH)}
        names: dict[str, str] = {}
        counter = 0
        for name in self.defs:
            if name in live and name.startswith(_FRESH):
                while f"v{counter}" in taken:
                    counter += 1
                names[name] = f"v{counter}"
                counter += 1
        defs = tuple(_rename(d, names) for n, d in self.defs.items() if n in live)
        return Program(self.name, defs, tuple(names.get(o, o) for o in outputs),
                       values=dict(values or {}))

    # ---- helpers -------------------------------------------------------------------------

    def _indexing(self, what: str, x: str, shape, index):
        """(shape, index, x's definition, the output axes' extents) of a read of x, checked."""
        shape = tuple(int(s) for s in shape)
        index = tuple(symbolic.lin(e) for e in index)
        src = self.defs[x]
        if len(index) != len(src.type.shape):
            raise InternalError(f"{what} of {x}: {len(index)} indices for rank {self.rank(x)}")
        return shape, index, src, {axis_var(i): n for i, n in enumerate(shape)}

    def _add(self, kind, type: TensorType, *fields, **kw) -> str:
        key = (kind, type, fields, tuple(sorted(kw.items())))
        if key in self._memo:
            return self._memo[key]
        name = f"{_FRESH}{len(self.defs)}"
        self.defs[name] = kind(name, type, *fields) if fields else kind(name=name, type=type, **kw)
        self._memo[key] = name
        return name

    def _dtype_of(self, v: Value) -> tuple[DType, int]:
        """(dtype, priority): 2 for a tensor with dimensions, 1 rank-0, 0 a Python literal."""
        if isinstance(v, str):
            return self.dtype(v), (2 if self.shape(v) else 1)
        if isinstance(v, Scalar):
            return v.dtype, 0
        return _literal_dtype(v), 0

    def _live(self, outputs: Sequence[str]) -> set[str]:
        live: set[str] = set()
        stack = list(outputs)
        while stack:
            name = stack.pop()
            if name in live:
                continue
            live.add(name)
            stack.extend(operands(self.defs[name]))
        return live


# ---- type rules ----------------------------------------------------------------------------

_CATEGORY = {DType.BOOL: 0, DType.U8: 1, DType.I8: 1, DType.I16: 1, DType.I32: 1, DType.I64: 1,
             DType.F8E4M3: 2, DType.F8E5M2: 2, DType.F16: 2, DType.BF16: 2, DType.F32: 2,
             DType.F64: 2}
_DEFAULT = {0: DType.BOOL, 1: DType.I64, 2: DType.F32}
_WIDTH = {DType.BOOL: 0, DType.U8: 1, DType.I8: 1, DType.I16: 2, DType.I32: 3, DType.I64: 4,
          DType.F8E4M3: 0, DType.F8E5M2: 0, DType.F16: 1, DType.BF16: 1, DType.F32: 2,
          DType.F64: 3}   # compared within a category (torch promotes no 8-bit float with another)
# two types of one width neither holds: the next wider one holds both (torch's promotion)
_BOTH = {frozenset({DType.F16, DType.BF16}): DType.F32, frozenset({DType.U8, DType.I8}): DType.I16}


def promote(*typed: tuple[DType, int]) -> DType:
    """torch's result type: the highest category wins; within it, the highest-priority operands."""
    top = max(_CATEGORY[d] for d, _ in typed)
    rank = max(p for d, p in typed if _CATEGORY[d] == top)
    if rank == 0:
        return _DEFAULT[top]  # only literals reach the top category: torch's default type
    cands = {d for d, p in typed if _CATEGORY[d] == top and p == rank}
    widest = max(cands, key=lambda d: _WIDTH[d])
    pair = frozenset(d for d in cands if _WIDTH[d] == _WIDTH[widest])
    return _BOTH.get(pair, widest)


def _literal_dtype(v) -> DType:
    if isinstance(v, bool):
        return DType.BOOL
    if isinstance(v, int):
        return DType.I64
    if isinstance(v, float):
        return DType.F32
    raise InternalError(f"not an operand: {v!r}")


def _scalar(v: Value, dtype: DType) -> Scalar:
    if isinstance(v, Scalar):
        v = v.value
    if dtype is DType.BOOL:
        return Scalar(bool(v), dtype)
    if dtype.is_float:
        return Scalar(float(v), dtype)
    if isinstance(v, float) and v != int(v):
        raise InternalError(f"{v} is not an integer ({dtype})")
    return Scalar(int(v), dtype)


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """numpy broadcasting of shapes, right-aligned."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        sizes = {s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0} - {1}
        if len(sizes) > 1:
            raise InternalError(f"shapes {shapes} do not broadcast")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


# ---- local algebra -------------------------------------------------------------------------

# op -> (position of the neutral literal, its value): x*1 -> x, x+0 -> x, x-0 -> x, x/1 -> x
_NEUTRAL = {EwOp.MUL: ((0, 1), (1, 1)), EwOp.ADD: ((0, 0), (1, 0)), EwOp.SUB: ((1, 0),),
            EwOp.DIV: ((1, 1),)}


def _simplify(op: EwOp, ops: list, dtype: DType, shape, b: Builder) -> str | None:
    if op is EwOp.SUB and all(isinstance(v, str) for v in ops):
        scan = b.defs[ops[0]]
        if isinstance(scan, Scan) and scan.op is ReduceOp.SUM and scan.arg == ops[1] \
                and not scan.exclusive:  # cumsum(x) - x: the exclusive cumsum
            return b.scan(ReduceOp.SUM, scan.arg, scan.axis, reverse=scan.reverse, exclusive=True)
    for pos, value in _NEUTRAL.get(op, ()):
        lit, other = ops[pos], ops[1 - pos]
        if isinstance(lit, Scalar) and lit.value == value and isinstance(other, str) \
                and b.shape(other) == shape and b.dtype(other) is dtype:
            return other
    return None


# ---- index helpers ----

def fold_divmod(e: symbolic.Lin) -> symbolic.Lin:
    """(x // d) * d*c + (x % d) * c -> x * c: a split axis merged back (inner atoms first)."""
    terms: dict = {}
    for atom, coef in e.terms:
        if not isinstance(atom, symbolic.Sym):
            atom = type(atom)(fold_divmod(atom.num), atom.den)
        terms[atom] = terms.get(atom, 0) + coef
    out = symbolic.lin(e.const)
    for atom in [a for a in terms if isinstance(a, symbolic.Mod)]:
        whole = symbolic.FloorDiv(atom.num, atom.den)
        if terms.get(whole) == terms[atom] * atom.den:
            out = out + atom.num * terms.pop(atom)
            del terms[whole]
    for atom, coef in terms.items():
        out = out + symbolic.lin(atom) * coef
    return out


def _plain_gather_vars(e: symbolic.Lin) -> bool:
    """Whether every gather_var in `e` is a plain term (none inside a // or a %)."""
    return not any(a.free_vars() & {v for v in e.free_vars() if v.startswith("@")}
                   for a, _ in e.terms if not isinstance(a, symbolic.Sym))


def _is_flip_of(m: IndexMap, src: TensorType, axis: int) -> bool:
    n = m.type.shape[axis] if m.type.shape else 0
    want = tuple(symbolic.var(axis_var(i)) if i != axis else symbolic.var(axis_var(i)) * -1 + (n - 1)
                 for i in range(len(m.type.shape)))
    return m.type.shape == src.shape and n > 1 and m.index == want


def _check_in_bounds(src: Def, shape, index, bounds) -> None:
    if any(n == 0 for n in shape):
        return
    for e, n in zip(index, src.type.shape):
        lo, hi = symbolic.bounds_of(e, bounds)
        if lo < 0 or hi >= n:
            raise InternalError(f"index_map of {src.name}{list(src.type.shape)}: index {e} "
                                f"ranges over [{lo}, {hi}]")


def operands(d: Def) -> tuple[str, ...]:
    """The names a definition reads."""
    if isinstance(d, Elementwise):
        return tuple(a for a in d.args if isinstance(a, str))
    if isinstance(d, (Cast, IndexMap, Reduce, Scan)):
        return (d.arg,)
    if isinstance(d, Gather):
        return (d.arg, *d.indices)
    return ()


def _rename(d: Def, names: dict[str, str]) -> Def:
    new = {"name": names.get(d.name, d.name)}
    if isinstance(d, Elementwise):
        new["args"] = tuple(names.get(a, a) if isinstance(a, str) else a for a in d.args)
    elif isinstance(d, (Cast, IndexMap, Reduce, Scan, Gather)):
        new["arg"] = names.get(d.arg, d.arg)
    if isinstance(d, Gather):
        new["indices"] = tuple(names.get(a, a) for a in d.indices)
    return dataclasses.replace(d, **new)
