"""Kernel IR for the elements a lane computes: V-element groups along a fold's axis
(contiguous accesses become vector loads and stores, staged rows read shared memory), and the
Loop IR statements of one element."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

from emmy.kernel_ir import ir as K
from emmy.kernel_ir.context import ARG_OPS, Fn, ctype, elem
from emmy.kernel_ir.fastmath import approximate, sixteen_bit
from emmy.loop_ir.ir import Accum, CastTo, Compute, IndexValue, Init, Load, Store
from emmy.loop_ir.semantics import STEPS, cast_is_step, exact_operands
from emmy.memo import ByIdentity
from emmy.schedule.facts import offset, stride_along
from emmy.symbolic import (Lin, Sym, bounds_of, canonical, evaluate, floordiv, lin, mod, render,
                           substitute, var)
from emmy.dtypes import DType
from emmy.tensor_ir.ir import EwOp, Scalar, gather_var
from emmy.tile_ir.apply import CLUSTER_RANK
from emmy.tile_ir.ir import Axis, Fold, Item
from emmy.tile_ir.contract import NIBBLE_ORDERS, constant_zero, pair_kinds, sixteen_bits
from emmy.tile_ir.values import index_vars, operands, value_types


def group(fn: Fn, items: tuple[Item, ...], axis: str | None, base: Lin, V: int, *,
           accs: dict[str, str] | None = None, reverse_extent: int | None = None,
           tag: str = "", env: dict[str, Lin] | None = None,
           acc_lanes: bool = False) -> list[K.KStmt]:
    """V consecutive elements along `axis` from `base`: contiguous accesses become vectors.
    `env` binds the other axes; with `acc_lanes`, element v reads accumulator `accs[a]_v`."""
    accs = accs or {}
    local = set(value_types(items))

    def at(v: int) -> dict[str, Lin]:
        if axis is None:
            return dict(env or {})
        pos = base + v
        return {**(env or {}), axis: lin(reverse_extent - 1) - pos if reverse_extent else pos}
    if V == 1:
        return stmts(fn, items, tag, at(0), lane0_stores=False, accs=accs, local=local, axis=axis)
    vec_loads, vec_stores = {}, {}
    # (with acc_lanes, each element reads its own accumulator)
    invariant = _invariant(items, axis, local | (set(accs) if acc_lanes else set()))
    for s in items:
        if isinstance(s, (Load, Store)) and _contiguous(fn, s, axis) and not reverse_extent:
            if isinstance(s, Load) and not _needs(items, s.dyn, local) <= invariant:
                continue   # a gather whose position differs between the group's elements
            (vec_loads if isinstance(s, Load) else vec_stores)[id(s)] = s
    # what the vector gathers' positions need, computed once for the group
    once = set().union(*(_needs(items, s.dyn, local) for s in vec_loads.values()))
    first = tuple(s for s in items if getattr(s, "dst", None) in once)
    out: list[K.KStmt] = stmts(fn, first, f"{tag}_i", at(0), lane0_stores=False, accs=accs,
                               local=local, axis=axis)
    shared = {n: f"{n}{tag}_i" for n in once}
    for s in items:
        if id(s) in vec_loads:
            names = tuple(f"{s.dst}{tag}_{v}" for v in range(V))
            dyn = tuple(shared.get(a, accs.get(a, a)) for a in s.dyn)
            out += _load(fn, s, names, at(0), axis, dyn)
    rest = tuple(s for s in items if id(s) not in vec_loads and id(s) not in vec_stores
                 and getattr(s, "dst", None) not in once)
    for v in range(V):
        lane_accs = {a: f"{n}_{v}" for a, n in accs.items()} if acc_lanes else accs
        lane_accs = {**lane_accs, **shared}
        out += stmts(fn, rest, f"{tag}_{v}", at(v), lane0_stores=False, accs=lane_accs,
                     local=local, axis=axis)
    for s in items:
        if id(s) in vec_stores:
            idx = tuple(substitute(e, at(0), fn.bounds) for e in s.index)
            out.append(K.GlobalStore(s.buffer, elem(fn, s.buffer), offset(idx, fn.shapes[s.buffer]),
                                     tuple(_lane_name(s.value, tag, v, accs, acc_lanes, local)
                                           for v in range(V))))
    return out


def _lane_name(value: str, tag: str, v: int, accs: dict[str, str], acc_lanes: bool,
               local: set[str]) -> str:
    """Element v's name for `value` in a group (an accumulator keeps its renamed name; a value
    from outside the group, the same for every element, its own)."""
    if value in accs:
        return f"{accs[value]}_{v}" if acc_lanes else accs[value]
    return f"{value}{tag}_{v}" if value in local else value


def _contiguous(fn: Fn, s: Load | Store, axis: str | None) -> bool:
    return axis is not None and stride_along(offset(s.index, fn.shapes[s.buffer]), axis) == 1


def _needs(items, names, local: set[str]) -> set[str]:
    """The group's own values that computing `names` takes, `names` included."""
    defs = {getattr(s, "dst", None): s for s in items}
    out: set[str] = set()
    todo = [n for n in names if n in local]
    while todo:
        n = todo.pop()
        if n in out or n not in defs:
            continue
        out.add(n)
        todo += [a for a in operands(defs[n]) if a in local]
    return out


def _invariant(items, axis: str | None, local: set[str]) -> set[str]:
    """The group's values that are the same for every element along `axis`."""
    out: set[str] = set()
    for s in items:
        if not isinstance(s, (Load, Compute, CastTo, IndexValue)):
            continue
        index = s.index if isinstance(s, Load) else (s.expr,) if isinstance(s, IndexValue) else ()
        if (all(axis not in e.free_vars() for e in index)
                and all(a in out or a not in local for a in operands(s))):
            out.add(s.dst)
    return out


def _load(fn: Fn, s: Load, names: tuple[str, ...], env, axis: str | None,
          dyn: tuple[str, ...] = ()) -> list[K.KStmt]:
    """A global load, or a read of the staged row when the access follows its pattern; `dyn`
    names the values of a gather's positions (@0, @1, …)."""
    env = {**env, **{gather_var(k): var(a) for k, a in enumerate(dyn)}}
    idx = tuple(substitute(e, env, fn.bounds) for e in s.index)
    c = ctype(s.dtype)
    direct = K.GlobalLoad(names, c, s.buffer, offset(idx, fn.shapes[s.buffer]))
    if (s.dyn or s.buffer not in fn.stage or axis is None
            or _pattern(fn, s, axis) != fn.stage_index[s.buffer]):
        return [direct]
    extent = fn.bounds[f"stage_extent_{s.buffer}"]
    where = var("slot") * extent + env[axis]
    if s.buffer in fn.filled:
        return [K.SharedLoad(names, c, fn.stage[s.buffer], where)]
    fn.filling.add(s.buffer)
    return [direct, K.SharedStore(fn.stage[s.buffer], elem(fn, s.buffer), where, names)]


def _pattern(fn: Fn, s: Load, axis: str) -> tuple[Lin, ...]:
    """The load's index with its fold axis named `i`."""
    bounds = {**fn.bounds, "i": fn.bounds.get(axis, 1 << 30)}
    return tuple(substitute(e, {axis: var("i")}, bounds) for e in s.index)


def stmts(fn: Fn, items, suffix: str, env: dict[str, Lin], *, lane0_stores: bool,
           accs: dict[str, str] | None = None, local: set[str] | None = None,
           axis: str | None = None) -> list[K.KStmt]:
    """Statements for one element: names in `local` get `suffix`, `accs` renames accumulators."""
    local = set(value_types(tuple(items))) if local is None else local
    out: list[K.KStmt] = []
    for s in items:
        out += scalar(fn, s, suffix, env, lane0_stores=lane0_stores, accs=accs or {},
                       local=local, axis=axis)
    return out


def scalar(fn: Fn, s: Item, suffix: str, env: dict[str, Lin], *, lane0_stores: bool,
            accs: dict[str, str] | None = None, local: set[str] = frozenset(),
            axis: str | None = None) -> list[K.KStmt]:
    """One Loop IR statement for one element."""
    accs = accs or {}

    def name(n: str) -> str:
        if n in accs:
            return accs[n]
        return n + suffix if n in local else n

    def arg(a) -> str:
        return _literal(a) if isinstance(a, Scalar) else name(a)

    def exact(a) -> str:
        """An operand of a step function: a 16-bit value rounded to its type first."""
        return _rounded(fn, a, arg(a))
    def index(idx):
        return tuple(substitute(e, env, fn.bounds) for e in idx)
    match s:
        case Load():
            return _load(fn, s, (name(s.dst),), env, axis, tuple(name(a) for a in s.dyn))
        case Compute() if s.op in STEPS or s.dst in exact_values(fn.k):
            return [K.Let(name(s.dst), ctype(s.dtype), s.op.value, tuple(exact(a) for a in s.args))]
        case Compute():
            return [K.Let(name(s.dst), ctype(s.dtype), s.op.value, tuple(arg(a) for a in s.args))]
        case CastTo() if cast_is_step(s.dtype) or s.dst in exact_values(fn.k):
            # to an integer (a step), or a 16-bit value read as f32/f64: its 16-bit value, as
            # eager has it (`x.half().float()`, an op computing in f32 on a value a fused op
            # before it gave as f16)
            return [K.Let(name(s.dst), ctype(s.dtype), "cast", (exact(s.arg),))]
        case CastTo():
            return [K.Let(name(s.dst), ctype(s.dtype), "cast", (name(s.arg),))]
        case IndexValue():
            return [K.Let(name(s.dst), ctype(s.dtype), "index", (_c_index(substitute(s.expr, env, fn.bounds)),))]
        case Init():
            return init_acc(name(s.acc), s)
        case Accum():
            pos = substitute(s.position, env, fn.bounds) if s.position is not None else None
            return [K.Fold(name(s.acc), s.op, name(s.value), pos)]
        case Store():
            off = offset(index(s.index), fn.shapes[s.buffer])
            if fn.k.atomic:
                st = K.AtomicAdd(s.buffer, elem(fn, s.buffer), off, name(s.value))
            else:
                st = K.GlobalStore(s.buffer, elem(fn, s.buffer), off, (name(s.value),))
            if not lane0_stores:
                return [st]
            # a cluster's blocks all hold the job's values: the first block stores them
            return [K.If("lane == 0" + (f" && {CLUSTER_RANK} == 0" if fn.k.cluster > 1 else ""),
                         (st,))]
        case Fold():
            return serial_fold(fn, s, suffix, env, accs, local)
    raise AssertionError(f"unexpected item {s!r}")


def _rounded(fn: Fn, a, text: str) -> str:
    """`text` (the C name of operand `a`), rounded to its 16-bit type where it is a value the
    kernel computed (loads are exact)."""
    t = fn.types.get(a) if isinstance(a, str) else None
    if t is None or not t.is_narrow_float or a in _loaded(fn.k):
        return text
    return f"em_cvt<float>(em_cvt<{t.c_name}>({text}))"


_PER_KERNEL = ByIdentity()   # asked for every statement: hashing a whole kernel each time
#                              made a kernel of 32 fused LayerNorms take minutes


def exact_values(k) -> frozenset[str]:
    """The values whose operands are rounded to their 16-bit type (exact_operands)."""
    return _PER_KERNEL(k, "exact", lambda: exact_operands(k.body))


def _loaded(k) -> frozenset[str]:
    """The values a kernel loads from memory (exact in their type)."""
    return _PER_KERNEL(k, "loaded", lambda: _loads_of(k))


def _loads_of(k) -> frozenset[str]:
    out: set[str] = set()

    def walk(items) -> None:
        for i in items:
            if isinstance(i, Load):
                out.add(i.dst)
            elif isinstance(i, Fold):
                walk(i.body)
    walk(k.body)
    return frozenset(out)


def serial_fold(fn: Fn, f: Fold, suffix: str, env, accs, local) -> list[K.KStmt]:
    """A fold nested inside a lane's work: a plain loop."""
    out: list[K.KStmt] = []
    names = {i.acc: accs.get(i.acc, i.acc + suffix if i.acc in local else i.acc) for i in f.accs}
    for init in f.accs:
        out += init_acc(names[init.acc], init)
    loop_var = f"{f.axis.var}{suffix}"
    fn.bounds[loop_var] = f.axis.extent
    pos = lin(f.axis.extent - 1) - var(loop_var) if f.reverse else var(loop_var)
    body = stmts(fn, f.body, suffix, {**env, f.axis.var: pos}, lane0_stores=False,
                  accs={**accs, **names}, local=local)
    out.append(K.For(loop_var, lin(0), lin(f.axis.extent), 1, tuple(body)))
    out += finish(f.accs, names, fn)
    return out


def finish(inits, names: dict[str, str], fn: Fn) -> list[K.KStmt]:
    """After a fold: argmax/argmin accumulators read back as their position."""
    return [K.Let(names[i.acc], "long long", "argpos", (names[i.acc],))
            for i in inits if i.op in ARG_OPS]


def _literal(a: Scalar) -> str:
    if isinstance(a.value, bool):
        return "true" if a.value else "false"
    if a.dtype.is_float:
        v = float(a.value)
        if v != v:
            return "EM_NAN"
        if v in (float("inf"), float("-inf")):
            return "EM_INF" if v > 0 else "(-EM_INF)"
        text = repr(v)
        return text if a.dtype.compute is DType.F64 else f"{text}f"
    return f"{int(a.value)}LL" if a.dtype is DType.I64 else str(int(a.value))


def _c_index(e: Lin) -> str:
    return render(e)


def init_acc(name: str, init: Init) -> list[K.KStmt]:
    return [K.Let(name, ctype(init.dtype), "identity", (init.op.value,), mutable=True)]


def _epilogue_fn(k, items, axes, batch, parts=None) -> tuple[Fn, dict[str, Lin]]:
    """The lowering context of a template's epilogue: the row and column axes bound to `e_row`
    and `e_col`, the batch axes decoded from the flat `e_bz`. `parts` maps a row (column)
    axis merged from several grid axes to them: each is decoded from the flat index."""
    row_ax, col_ax = axes
    bounds = {"e_row": row_ax.extent, "e_col": col_ax.extent}
    shapes = {b.name: b.type.shape for b in (*k.inputs, *k.outputs)}
    env = _decoded(bounds, "e_bz", batch)
    for ax, flat in ((row_ax, "e_row"), (col_ax, "e_col")):
        env |= _decoded(bounds, flat, (parts or {}).get(ax.var) or (Axis(ax.var, ax.extent),))
    return Fn(k, None, value_types(items), shapes, dict(bounds)), env


def _decoded(bounds: dict[str, int], flat: str, axes) -> dict[str, Lin]:
    """Each of `axes` (outermost first) as a function of their flat row-major index `flat`
    (its extent recorded in `bounds`)."""
    size = 1
    for ax in axes:
        size *= ax.extent
    bounds[flat] = max(size, 1)
    if len(axes) == 1:
        return {axes[0].var: var(flat)}
    env, rest = {}, size
    for ax in axes:
        rest //= ax.extent
        env[ax.var] = mod(floordiv(var(flat), rest, bounds), ax.extent, bounds)
    return env


def element_gather(k, items, value: str, parts, kaxis, batch, raw: int = 0):
    """A template's gathered operand (emmy.cuda.gemm_spec.Gather): the Tile IR statements
    `items` computing one element, with its row (column) axes `parts` decoded from the flat
    `outer` index, the merged reduction axis `kaxis` bound to `kk` and the batch axes decoded
    from the template's `bz`; returns the C statements and the name of the element's value.
    `raw` > 0: `items` may load the template's vector of that many raw elements (RAW)."""
    from emmy.cuda.emit import _block as emit_block

    shapes = {**{b.name: b.type.shape for b in (*k.inputs, *k.outputs)}, RAW: (max(raw, 1),)}

    def at(outer: str, kk: str) -> tuple[list[str], str]:
        lines, env, bounds = _gather_env(outer, kk, parts, kaxis, batch)
        fn = Fn(k, None, value_types(items), shapes, bounds)
        return lines + emit_block(stmts(fn, items, "", env, lane0_stores=False), 0), value
    return at


def _gather_env(outer: str, kk: str, parts, kaxis, batch):
    """(the C statements binding g_bz, g_o and g_k, the Tile IR variables' values in them,
    their bounds) for a gathered element at (`outer`, `kk`) of batch `bz`."""
    bounds = {"g_k": kaxis.extent}
    env = _decoded(bounds, "g_bz", batch) | _decoded(bounds, "g_o", parts)
    env[kaxis.var] = var("g_k")
    return (["const long long g_bz = bz;", f"const int g_o = {outer};", f"const int g_k = {kk};"],
            env, bounds)


RAW = "gm_raw"    # a vector operand's raw elements, as element_vector's functions read them


def element_vector(k, op, parts, kaxis, batch, width: int, along_k: bool, paired: bool):
    """A computed operand read `width` elements at a time (emmy.cuda.gemm_spec.VectorGather),
    the vector along k or (`along_k` False) along its outer index: the offset of its load's
    element, and each element's statements with that load reading the raw vector's element
    j; `paired`, its elements two at a time as well (element_pairs)."""
    from emmy.cuda.gemm_spec import VectorGather

    main = op.load
    shape = next(b.type.shape for b in k.inputs if b.name == main.buffer)

    def where(outer: str, kk: str) -> tuple[list[str], str]:
        lines, env, bounds = _gather_env(outer, kk, parts, kaxis, batch)
        idx = tuple(substitute(e, env, bounds) for e in main.index)
        return lines, _c_index(canonical(offset(idx, shape)))

    def element(outer: str, kk: str, j: int) -> tuple[list[str], str]:
        items = tuple(replace(s, buffer=RAW, index=(lin(j // op.packing),)) if s is main
                      else s for s in op.gather)
        at = element_gather(k, items, op.value, parts, kaxis, batch, raw=width)
        return at(outer, f"{kk} + {j}") if along_k else at(f"{outer} + {j}", kk)

    pair, prologue = element_pairs(k, op, parts, kaxis, batch, along_k, width) if paired \
        else (None, None)
    return VectorGather(main.buffer, main.dtype.c_name, width, where, element, pair, prologue)


RAW_WORDS = "gm_raww.x"   # the raw vector's 32-bit words, as element_pairs's statements read them
PAIR_OPS = {EwOp.MUL: "__hmul2", EwOp.ADD: "__hadd2", EwOp.SUB: "__hsub2", EwOp.NEG: "__hneg2"}


def element_pairs(k, op, parts, kaxis, batch, along_k: bool, width: int):
    """A paired computed operand's elements two at a time (emmy.tile_ir.contract.pair_kinds):
    (outer, kk, j) -> (statements, the name of the pair holding elements j and j + 1 of the
    vector at (outer, kk)), the raw bytes converted by em_8x2_half2 (bf162) from the words
    RAW_WORDS (an int4 operand's, one byte's two nibbles by em_4x2 or em_4x2_il), the other
    loads read per element (once a vector where its elements all read the same one, as a scale
    per group of k does, else once a pair where both do) and the arithmetic done on pairs;
    and the vector's prologue (outer, kk) -> statements (VectorGather.prologue) or None."""
    kinds, main, t = pair_kinds(op), op.load, op.dtype
    c_t = t.c_name
    convert = (f"em_8x2_{'half2' if t is DType.F16 else 'bf162'}"
               f"<{'true' if main.dtype is DType.I8 else 'false'}, {{}}>({RAW_WORDS}[{{}}])")
    varying = {kaxis.var} if along_k else set(op.axes)
    shapes = {b.name: b.type.shape for b in k.inputs}

    steadies = {s.dst: along_k and _steady(s, kaxis, width, shapes[s.buffer])
                for s in op.gather if isinstance(s, Load) and s is not main
                and not kinds[s.dst].startswith("zero")}
    defs = {s.dst: s for s in op.gather}
    # a zero point taken from the nibbles (GPTQ's qzeros: one value for each vector of k),
    # computed once a vector by its integer statements
    zero_point = element_gather(k, tuple(s for s in op.gather if kinds[s.dst] == "zero"),
                                "", parts, kaxis, batch)

    def zero_of(cast: CastTo) -> str | None:
        sub = defs.get(cast.arg)
        if isinstance(sub, Compute) and sub.op is EwOp.SUB and \
                kinds.get(sub.args[1], "").startswith("zero"):
            return sub.args[1]
        return None

    def flat(s: Load, outer: str, kk: str) -> tuple[list[str], Lin]:
        """(the statements binding g_*, the offset in s's buffer) of s at (outer, kk)."""
        bind, env, bounds = _gather_env(outer, kk, parts, kaxis, batch)
        return bind, offset(tuple(substitute(x, env, bounds) for x in s.index), shapes[s.buffer])

    # a zero point packed as the weights are (AWQ's qzeros): the word holding elements j and
    # j + 1's, loaded into gp_<its load>_<j>
    zero_load = next((s for s in op.gather if kinds[s.dst] == "zero:word"), None)

    def zero_word(outer: str, kk: str, j: int) -> list[str]:
        bind, idx = flat(zero_load, f"{outer} + {j}", kk)
        name = f"gp_{zero_load.dst}_{j}"
        return [f"uint32_t {name};", "{", *(f"  {b}" for b in bind),
                f"  {name} = uint32_t({zero_load.buffer}[{_c_index(idx)}]);", "}"]

    # Along the row (AWQ: along n), once a vector: a zero point word the vector's elements
    # share (the vector no wider than a word's nibbles), and the 16-bit loads that read on
    # with the row, aligned (scales[k // group, n]), as one 16-byte load each
    shared_zero = not along_k and zero_load is not None and width <= op.packing
    vectors = set()
    if not along_k and width * t.itemsize == 16:
        for s in op.gather:
            if not isinstance(s, Load) or s is main or kinds[s.dst] != "scalar" or \
                    s.dtype is not t or not index_vars((s,)) & varying:
                continue
            _, off = flat(s, "0", "0")
            terms = dict(off.terms)
            if terms.get(Sym("g_o")) == 1 and off.const % width == 0 and \
                    all("g_o" not in a.free_vars() and c % width == 0
                        for a, c in terms.items() if a != Sym("g_o")):
                vectors.add(s.dst)

    def prologue(outer: str, kk: str) -> list[str]:
        lines = []
        if shared_zero:
            lines += zero_word(outer, kk, 0)
        for s in op.gather:
            if s.dst in vectors:
                bind, idx = flat(s, outer, kk)
                lines += [f"uint4 gp_{s.dst}_v;", "{", *(f"  {b}" for b in bind),
                          f"  gp_{s.dst}_v = *reinterpret_cast<const uint4*>({s.buffer} + "
                          f"({_c_index(idx)}));", "}"]
        return lines

    def pair(outer: str, kk: str, j: int) -> tuple[list[str], str]:
        lines, scalars, pairs = [], {}, {}

        def load(s: Load) -> None:
            if s.dst in vectors:    # its pair: a word of the prologue's vector
                pairs[s.dst] = f"em_pair_bits<{c_t}2>(gp_{s.dst}_v.{'xyzw'[j // 2]})"
                return
            names = []
            steady = steadies[s.dst]
            for e in ((0, 1) if index_vars((s,)) & varying and not steady else (0,)):
                at = (outer, kk if steady else f"{kk} + {j + e}") if along_k else \
                    (f"{outer} + {j + e}", kk)
                bind, env, bounds = _gather_env(*at, parts, kaxis, batch)
                idx = offset(tuple(substitute(x, env, bounds) for x in s.index), shapes[s.buffer])
                names.append(f"gp_{s.dst}_{e}")
                lines.extend([f"{s.dtype.c_name} {names[-1]};", "{", *(f"  {b}" for b in bind),
                              f"  {names[-1]} = {s.buffer}[{_c_index(idx)}];", "}"])
            scalars[s.dst] = (names[0], names[-1]), s.dtype

        def packed(a) -> str:
            if isinstance(a, Scalar):
                bits = sixteen_bits(a.value, t)
                return f"em_pair_bits<{c_t}2>({bits << 16 | bits:#010x}u)"
            if a in pairs:
                return pairs[a]
            (lo, hi), dtype = scalars[a]
            if dtype is not t:
                lo, hi = f"em_cvt<{c_t}>({lo})", f"em_cvt<{c_t}>({hi})"
            return f"em_pair({lo}, {hi})"

        done: set[str] = set()
        for s in op.gather:
            if s is main or kinds[s.dst] == "unpack" or kinds[s.dst].startswith("zero") or \
                    kinds[s.dst].startswith("nibbles") or s.dst in done:
                continue
            if isinstance(s, Load):
                load(s)
                continue
            if isinstance(s, CastTo) and kinds[s.arg] == "raw":
                value = convert.format(j % 4 // 2, j // 4)
            elif isinstance(s, CastTo) and kinds[s.arg].startswith("nibbles"):
                byte = j // 2       # elements j and j + 1: one byte's two nibbles
                signed = kinds[s.arg].endswith("signed")
                interleaved = kinds[s.arg].startswith("nibbles:il")   # nibbles j/2, j/2 + 4
                zero = zero_of(s)
                less = constant_zero(defs.get(s.arg)) or 0   # `(q & 15) - 8` before the cast
                folded = None if zero or less else nibble_bias(s, op.gather, t, signed)
                bias = sixteen_bits(_MAGIC[t] + 8 * signed + less +
                                    (folded[1] if folded else 0), t)
                bias_bits = f"{bias << 16 | bias:#010x}u"
                if zero and kinds[zero] == "zero:pair":   # each element's own zero point
                    bits = [] if shared_zero else zero_word(outer, kk, j)
                    word = f"gp_{zero_load.dst}_{0 if shared_zero else j}"
                    which = NIBBLE_ORDERS[kinds[s.arg].split(":")[1]]
                    lo, hi = which(j % op.packing), which(j % op.packing + 1)
                    both = f"(({word} >> {4 * lo}) & 0x000F000Fu)" if hi == lo + 4 else \
                        f"((({word} >> {4 * lo}) & 0xFu) | ((({word} >> {4 * hi}) & 0xFu) << 16))"
                    lines += [*bits, f"const uint32_t gp_{s.dst}_bias = {bias_bits} + {both};"]
                    bias_bits = f"gp_{s.dst}_bias"
                elif zero:          # magic + 8 signed + z: the same exponent, z more ones
                    bits, _ = zero_point(outer, kk)
                    lines += [f"uint32_t gp_{s.dst}_bias;", "{", *(f"  {b}" for b in bits),
                              f"  gp_{s.dst}_bias = {bias_bits} + uint32_t({zero}) * "
                              f"0x00010001u;", "}"]
                    bias_bits = f"gp_{s.dst}_bias"
                if interleaved:
                    value = (f"em_4x2_il<{c_t}2, {str(signed).lower()}, {j % 8 // 2}>"
                             f"({RAW_WORDS}[{j // 8}], {bias_bits})")
                else:
                    value = (f"em_4x2<{c_t}2, {str(signed).lower()}, "
                             f"{str(kinds[s.arg].startswith('nibbles:hi')).lower()}, "
                             f"{byte % 4}>({RAW_WORDS}[{byte // 4}], {bias_bits})")
                if folded:      # the constant subtracted next, taken away with the magic
                    done.add(folded[0])
                    pairs[folded[0]] = pairs[s.dst] = f"gp_{s.dst}"
            elif isinstance(s, CastTo):
                value = packed(s.arg)
            else:
                value = f"{PAIR_OPS[s.op]}({', '.join(packed(a) for a in s.args)})"
            pairs[s.dst] = f"gp_{s.dst}"
            lines.append(f"const auto gp_{s.dst} = {value};")
        return lines, pairs[op.value]
    return pair, (prologue if shared_zero or vectors else None)


_MAGIC = {DType.F16: 1024, DType.BF16: 128}    # em_4x2's: a nibble's value in its last bits


def nibble_bias(cast: CastTo, items, t: DType, signed: bool) -> tuple[str, int] | None:
    """(the statement, c) where the only use of an int4 pair `cast` is a subtraction of the
    integer constant c (or an addition of -c) that em_4x2 can take away with its magic number
    exactly: c small enough that magic + 8 + c is a value of `t` within a factor of two of
    every magic + nibble (the subtraction is then exact, Sterbenz), as eager's cast, then
    subtraction, is for a 4-bit value. None otherwise."""
    uses = [s for s in items if cast.dst in operands(s)]
    if len(uses) != 1 or not isinstance(uses[0], Compute):
        return None
    s = uses[0]
    if s.op is EwOp.SUB and s.args[0] == cast.dst and isinstance(s.args[1], Scalar):
        c = s.args[1].value
    elif s.op is EwOp.ADD and isinstance(s.args[0], Scalar) ^ isinstance(s.args[1], Scalar):
        c = -next(a for a in s.args if isinstance(a, Scalar)).value
    else:
        return None
    if float(c) != int(c) or s.dtype is not t:
        return None
    bias = _MAGIC[t] + 8 * signed + int(c)
    ok = sixteen_bits(bias, t) is not None and bias / 2 <= _MAGIC[t] and _MAGIC[t] + 15 <= 2 * bias
    return (s.dst, int(c)) if ok else None


def _steady(s: Load, kaxis, width: int, shape) -> bool:
    """Whether load `s` reads one element for all `width` k of each aligned vector (a scale
    per group of 128 weights along k): its offset's terms in k alone take, at every k, their
    value at the vector's first k, and no term mixes k with another variable."""
    import numpy as np

    ks = np.arange(kaxis.extent)
    total = np.zeros_like(ks)
    for atom, c in canonical(offset(s.index, shape)).terms:
        free = atom.free_vars()
        if kaxis.var in free:
            if free != {kaxis.var}:
                return False
            total = total + c * np.asarray(evaluate(Lin(((atom, 1),)), {kaxis.var: ks}))
    return bool(np.array_equal(total, total[ks - ks % width]))


def element_window(w, parts, kaxis, batch, bounds):
    """A template's gathered operand in window form (emmy.cuda.gemm_spec.WindowGather) from
    the Tile IR's Window `w`: its outer side decoded from the flat `outer` index over
    `parts` and from the template's `bz` over `batch`, its k side over the merged reduction
    axis `kaxis`. Offsets are ints where every element of the buffer has one, else 64-bit."""
    from emmy.cuda.gemm_spec import WindowGather
    from emmy.tile_ir.window import k_fields

    kvar, keep = kaxis.var, {**bounds, kaxis.var: kaxis.extent}
    lo, hi = bounds_of(w.outer + w.k, keep)
    wide = not (-2**31 < lo and hi < 2**31)
    itype = "long long" if wide else "int"

    def outer(flat: str):
        env_bounds = {"g_k": kaxis.extent}
        env = _decoded(env_bounds, "g_bz", batch) | _decoded(env_bounds, "g_o", parts)
        at = lambda e: render(substitute(e, env, env_bounds))
        lines = ["const long long g_bz = bz;", f"const {itype} g_o = {flat};"]
        return lines, at(w.outer), tuple(at(r.outer) for r in w.ranges)

    def k(kk: str):
        env = {kvar: var(kk)}
        at = lambda e: render(substitute(e, env, {kk: kaxis.extent}))
        return at(w.k), tuple(at(r.k) for r in w.ranges if r.k.terms)

    return WindowGather(w.buffer, outer, k, tuple((r.lo, r.hi, bool(r.k.terms))
                                                  for r in w.ranges), k_fields(w, keep))


def element_lines(k, items, acc: str, axes, batch, at, parts=None) -> list[str]:
    """For the templates' epilogues: the Tile IR statements `items` for one element, as C: `axes` (the row and column grid
    axes) and `batch` (the batch axes, flattened into one index) bound at `at` = (batch index,
    row, column, accumulator value) C expressions, the accumulator `acc` read as `e_acc`."""
    from emmy.cuda.emit import _block as emit_block   # the emitter imports this module's IR

    fn, env = _epilogue_fn(k, items, axes, batch, parts)
    body = _approximated(k, stmts(fn, items, "", env, lane0_stores=False, accs={acc: "e_acc"}))
    bz, row, col, value = at
    return [f"const long long e_bz = {bz};", f"const int e_row = {row};",
            f"const int e_col = {col};", f"const float e_acc = {value};", *emit_block(body, 0)]


def element_pair_lines(k, items, acc: str, axes, batch, at, parts=None) -> list[str] | None:
    """element_lines for two neighbouring columns: `at` = (batch index, row, column, value of
    that column, value of the next), the column even. Accesses contiguous along the column
    become two-element vectors (one 4-byte store of two halves instead of two 2-byte stores);
    None when one of them could start at an odd element (a vector access must be aligned to
    its size), the stores are atomic or the column axis is merged from several."""
    from emmy.cuda.emit import _block as emit_block

    body = _pair_body(k, items, acc, axes, batch, parts)
    return None if body is None else _pair_prefix(at) + emit_block(body, 0)


def _pair_body(k, items, acc: str, axes, batch, parts) -> list[K.KStmt] | None:
    """The two-column epilogue's Kernel IR over e_bz, e_row, e_col, e_acc_0 and e_acc_1
    (element_pair_lines)."""
    if getattr(k, "atomic", False) or (parts or {}).get(axes[1].var):
        return None
    fn, env = _epilogue_fn(k, items, axes, batch, parts)
    col = axes[1].var
    for s in items:
        if isinstance(s, (Load, Store)) and _contiguous(fn, s, col):
            off = offset(tuple(substitute(e, env, fn.bounds) for e in s.index),
                         fn.shapes[s.buffer])
            if off.const % 2 or any(c % 2 for a, c in off.terms if a != Sym("e_col")):
                return None
    return [replace(s, explicit=True) if isinstance(s, K.GlobalStore) else s
            for s in _approximated(k, group(fn, tuple(items), col, var("e_col"), 2,
                                            accs={acc: "e_acc"}, env=env, acc_lanes=True))]


def _pair_prefix(at) -> list[str]:
    bz, row, column, v0, v1 = at
    return [f"const long long e_bz = {bz};", f"const int e_row = {row};",
            f"const int e_col = {column};", f"const float e_acc_0 = {v0};",
            f"const float e_acc_1 = {v1};"]


def element_staged(k, items, acc: str, axes, batch, parts=None):
    """The two-column epilogue with its one store redirected, for a template that stages the
    output tile in shared memory and stores it whole (by TMA): (StoredTile, staged) where
    `staged(bz, row, col, v0, v1, dst)` computes the pair and stores its two elements at `dst`
    (a pointer of the output's element type); None unless the epilogue stores exactly once,
    unconditionally, two 16-bit elements of one buffer at bz * BS + row * RS + col."""
    from emmy.cuda.emit import _block as emit_block
    from emmy.cuda.gemm_spec import StoredTile

    body = _pair_body(k, items, acc, axes, batch, parts)
    if body is None:
        return None
    stores = [i for i, s in enumerate(body) if isinstance(s, K.GlobalStore)]
    if len(stores) != 1 or _nested_stores(body):
        return None
    st = body[stores[0]]
    coef = dict(st.offset.terms)
    if st.elem not in ("__half", "__nv_bfloat16") or len(st.values) != 2 or st.offset.const \
            or coef.get(Sym("e_col")) != 1 or set(coef) - {Sym("e_bz"), Sym("e_row"), Sym("e_col")}:
        return None
    tile = StoredTile(st.buffer, st.elem, coef.get(Sym("e_row"), 0), coef.get(Sym("e_bz"), 0))

    def staged(bz: str, row: str, col: str, v0: str, v1: str, dst: str) -> list[str]:
        redirected = [replace(s, buffer=f"({dst})", offset=lin(0), explicit=False)
                      if i == stores[0] else s for i, s in enumerate(body)]
        return ["{", *("  " + line for line in _pair_prefix((bz, row, col, v0, v1))
                       + emit_block(redirected, 0)), "}"]
    return tile, staged


def _nested_stores(body) -> bool:
    """A global store under a loop, a condition or a last-block section."""
    def inside(stmts) -> bool:
        return any(isinstance(s, K.GlobalStore) or inside(getattr(s, "body", ()))
                   for s in stmts)
    return any(inside(getattr(s, "body", ())) for s in body)


def _approximated(k, body: list[K.KStmt]) -> tuple[K.KStmt, ...]:
    """An epilogue's statements, with the fast exp / log / sigmoid / tanh where the kernel's
    floating-point data is all 16-bit (emmy.kernel_ir.fastmath)."""
    return approximate(tuple(body)) if sixteen_bit(k) else tuple(body)


def element_epilogue(k, items, acc: str, axes, batch, parts=None):
    """A template's epilogue (emmy.cuda.gemm_spec.Epilogue): element_lines in a block, with
    its two-column form (element_pair_lines) as the `pair` attribute."""
    def one(bz: str, row: str, col: str, value: str) -> list[str]:
        lines = element_lines(k, items, acc, axes, batch, (bz, row, col, value), parts)
        return ["{", *("  " + line for line in lines), "}"]

    def pair(bz: str, row: str, col: str, v0: str, v1: str) -> list[str] | None:
        lines = element_pair_lines(k, items, acc, axes, batch, (bz, row, col, v0, v1), parts)
        return None if lines is None else ["{", *("  " + line for line in lines), "}"]
    one.pair = pair   # type: ignore[attr-defined]
    one.staged = cache(lambda: element_staged(k, items, acc, axes, batch, parts))  # type: ignore[attr-defined]
    return one
