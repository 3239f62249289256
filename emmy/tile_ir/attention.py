"""Attention: the three folds that scaled dot-product attention lowers to, recognized as one.

    grid b.. × i
      reduce j: m = max(S(i, j))                         S = (q[i]·k[j]) * scale, masked
      reduce j: l = sum(exp(S(i, j) - m))
      map d:    out[i, d] = sum_j v[j, d] * exp(S(i, j) - m) / l

Each fold recomputes the scores. The recognizer reads each fold's folded value as an
expression tree (through nested folds) and matches the three trees above, with the same
q, k, scale and mask in each; a kernel is attention only when all of it matches, so the
flash-attention template (one pass over the keys with an online, rescaling softmax: the max
and the sum folds merged into the output fold) computes exactly what the kernel computes.
The mask, when there is one, is causal (key j visible to query i iff j <= i), written as
torch's `is_causal`, as a select of -inf under any comparison of the indices that means the
same (`tril` masks, `masked_fill` of `triu(.., 1)`), either way round. A mask or bias read
from a tensor (`attn_mask`, added or bool, or `masked_fill` by a mask tensor) is `bias`, read
per score. k and v may be read at head h // g (grouped-query attention: `Operand.group`), and
an operand may start inside its buffer (q, k and v sliced from one packed projection).

Attention written out by hand (`softmax(q @ k.transpose(-2, -1) / sqrt(d)) @ v` in f16/bf16)
rounds the scores to the input type (the product's result) and the probabilities too (the
softmax's result, before the second product). The recognizer accepts both: the template rounds
each score to the 16-bit type as the program does (`Attention.rounded`), and rounds P to that
type anyway for its P V product; it rounds exp(S - m) before dividing by the row sum rather
than the quotient, an ulp of P apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from emmy.dtypes import DType
from emmy.loop_ir.ir import CastTo, Compute, IndexValue, Load, Store
from emmy.schedule.facts import offset
from emmy.symbolic import FloorDiv, Lin, Sym, var
from emmy.tensor_ir.ir import EwOp, ReduceOp, Scalar
from emmy.tile_ir.ir import Axis, Fold, FoldKind, TileKernel

_HALF = (DType.F16, DType.BF16)
SINGLE_QUERY = "emmy_q"      # the query axis of a kernel with one query a head (no grid axis)


@dataclass(frozen=True, slots=True)
class Operand:
    buffer: str
    dtype: DType
    offset: Lin          # element offset with the key/query axis named "s" and the dim "d"
    group: int = 1       # the offset's head index is h // group (grouped-query k and v)


@dataclass(frozen=True, slots=True)
class Attention:
    batch: tuple[Axis, ...]      # grid axes besides the query axis, outermost first
    query: Axis                  # i
    keys: int                    # extent of j
    dim: int                     # head dim of q and k
    dim_v: int                   # head dim of v and the output (MLA's differs from dim)
    q: Operand
    k: Operand
    v: Operand
    scale: float
    causal: bool
    store: Store                 # out[.., i, d] = value (after `cast`, if any)
    d_var: str                   # the output fold's axis var (in `store`)
    value_var: str               # the stored value's name
    cast: CastTo | None          # the cast of the accumulator before the store
    rounded: DType | None = None  # S rounded to this 16-bit type before the scale (q @ k in f16)
    bias: "Bias | None" = None    # a mask or bias read from a tensor, after the scale
    zero_empty: bool = False      # a row with no visible key gives 0 (torch's attention), not
                                  # 0 / 0 = NaN (softmax written out)


@dataclass(frozen=True, slots=True)
class Bias:
    """S(i, j) + bias[..] ("add"), or S kept where mask[..] is true ("keep") or false ("hide"),
    -inf elsewhere (true: nonzero, for a mask of numbers): attn_mask, or a mask tensor under
    masked_fill."""

    kind: str
    buffer: str
    dtype: DType
    offset: Lin          # over the batch axes, "qi" (the query) and "kj" (the key)
    rounded: bool = False  # added in the scores' 16-bit type (eager rounds the sum to it)


def find_attention(k: TileKernel) -> Attention | None:
    """The kernel as attention (module docstring), or None."""
    folds = [i for i in k.body if isinstance(i, Fold)]
    rest = [i for i in k.body if not isinstance(i, Fold)]
    if len(folds) != 3 or any(not isinstance(i, (IndexValue, CastTo, Store, Compute))
                               for i in rest):
        return None
    f_max, f_sum, f_out = folds
    if not (_reduce(f_max, ReduceOp.MAX) and _reduce(f_sum, ReduceOp.SUM)
            and f_out.kind is FoldKind.MAP):
        return None
    inner = [i for i in f_out.body if isinstance(i, Fold)]
    tail = [i for i in f_out.body if not isinstance(i, Fold)]
    if len(inner) != 1 or not _reduce(inner[0], ReduceOp.SUM):
        return None
    shapes = {b.name: b.type.shape for b in (*k.inputs, *k.outputs)}
    outer_defs = {s.dst: s for s in k.body if isinstance(s, (IndexValue, Compute))}
    m, l, o = f_max.accs[0].acc, f_sum.accs[0].acc, inner[0].accs[0].acc
    if None in (_folded(f_max), _folded(f_sum), _folded(inner[0])):
        return None
    t1 = _tree(_folded(f_max), f_max, outer_defs)
    # the query axis: the grid's last, or none where there is one query a head (a decode
    # step's q of length 1: its axis is gone, every grid axis is a batch axis)
    i_axis = k.grid[-1] if k.grid else Axis(SINGLE_QUERY, 1)
    s1 = _score(t1, f_max.axis.var, i_axis.var, shapes)
    if s1 is None and k.grid:
        i_axis = Axis(SINGLE_QUERY, 1)
        s1 = _score(t1, f_max.axis.var, i_axis.var, shapes)
    t2 = _tree(_folded(f_sum), f_sum, outer_defs)
    t3 = _tree(_folded(inner[0]), inner[0], outer_defs)
    if s1 is None:
        return None
    # sum: exp(S - m)
    if not (t2[0] == "exp" and t2[1][0] == "sub" and _shift(t2[1][2], m)):
        return None
    s2 = _score(t2[1][1], f_sum.axis.var, i_axis.var, shapes)
    # output: v[j, d] * exp(S - m) / l, either order of the product
    if t3[0] != EwOp.MUL.value:
        return None
    load_v, prob = (t3[1], t3[2]) if _is_load(t3[1]) else (t3[2], t3[1])
    p_round = None
    if prob[0] == "cast" and prob[1][0] == "cast" and prob[1][2] in _HALF:
        p_round, prob = prob[1][2], prob[1][1]         # P rounded to 16 bits (softmax(..).half())
    if not (_is_load(load_v) and prob[0] == EwOp.DIV.value and _total(prob[2], l)):
        return None
    p = prob[1]
    if not (p[0] == "exp" and p[1][0] == "sub" and _shift(p[1][2], m) == _shift(t2[1][2], m)):
        return None
    zero_empty = _shift(p[1][2], m) == _total(prob[2], l) == "safe"
    s3 = _score(p[1][1], inner[0].axis.var, i_axis.var, shapes)
    if s2 is None or s3 is None or not (s1 == s2 == s3):
        return None
    (q_off, q_buf, k_off, k_buf), scale, causal, rounded, mask = s1
    d_var = f_out.axis.var
    _, v_buf, v_idx = _load_of(load_v)
    v_off = offset(v_idx, shapes[v_buf])
    if any(not isinstance(a, Sym) and a.free_vars() & {inner[0].axis.var, d_var}
           for a, _ in v_off.terms):
        return None      # v read at a function of the key or the column (d // 2), not at them
    v_off = _rename(v_off, {inner[0].axis.var: "s", d_var: "d"})
    stores = [s for s in (*rest, *tail) if isinstance(s, Store)]
    casts = [s for s in (*rest, *tail) if isinstance(s, CastTo)]
    if len(stores) != 1 or len(casts) > 1:
        return None
    store, cast = stores[0], (casts[0] if casts else None)
    value = cast.dst if cast else o
    if store.value != value or (cast and cast.arg != o):
        return None
    types = {b.name: b.type.dtype for b in (*k.inputs, *k.outputs)}
    if not (types[q_buf] is types[k_buf] is types[v_buf]):
        return None
    if p_round not in (None, types[q_buf]) or rounded not in (None, types[q_buf]):
        return None      # the template rounds S and P to the operands' type only
    batch = tuple(a for a in k.grid if a is not i_axis)
    vars_ok = {a.var for a in batch} | {"s", "d"}
    operands = []
    for buf, off in ((q_buf, _rename(q_off, {i_axis.var: "s"})), (k_buf, k_off), (v_buf, v_off)):
        off, group = _grouped(off, batch[-1].var if batch else None)
        if off is None or not {a.name for a, _ in off.terms} <= vars_ok:
            return None
        operands.append(Operand(buf, types[buf], off, group))
    dim, dim_v = _extent_of(_nested(f_max)), _extent_of(f_out)
    if operands[0].group != 1:
        return None
    bias = None
    if mask is not None:
        kind, buf, off, in_half = mask
        if not {a.name for a, _ in off.terms} <= {a.var for a in batch} | {"qi", "kj"}:
            return None
        if kind == "add" and types[buf] is DType.BOOL:
            return None                  # a bool added (a select reads any type's truth)
        bias = Bias(kind, buf, types[buf], off, in_half and rounded is not None)
    return Attention(batch=batch, query=i_axis, keys=f_max.axis.extent, dim=dim, dim_v=dim_v,
                     q=operands[0], k=operands[1], v=operands[2], scale=scale, causal=causal,
                     store=store, d_var=d_var, value_var=value, cast=cast, rounded=rounded,
                     bias=bias, zero_empty=zero_empty)


def _shift(t, m: str) -> str | None:
    """What the folds subtract from S: "plain", the max m itself; "safe", 0 where m is -inf
    (a row with no visible key: its exps are all 0, not NaN); None: neither."""
    if t == ("acc", m):
        return "plain"
    ninf = ("const", float("-inf"))
    if (t[0] == "where" and t[2] == ("const", 0.0) and t[3] == ("acc", m)
            and t[1][0] == EwOp.EQ.value and {t[1][1], t[1][2]} == {("acc", m), ninf}):
        return "safe"
    return None


def _total(t, l: str) -> str | None:
    """What P divides by: "plain", the sum l; "safe", max(l, 1) (l is at least 1 where any key
    is visible: the max's exp(0); 1 where none is, so P is 0); None: neither."""
    if t == ("acc", l):
        return "plain"
    if t[0] == EwOp.MAX.value and {t[1], t[2]} == {("acc", l), ("const", 1.0)}:
        return "safe"
    return None


def _grouped(off: Lin, head: str | None) -> tuple[Lin | None, int]:
    """(offset, group): an operand read at head h // g (grouped-query attention's k and v,
    `enable_gqa`) as the offset at head h and g; plain symbols only, else (None, 1)."""
    group, names, out = 1, set(), Lin((), off.const)
    for atom, coef in off.terms:
        if isinstance(atom, FloorDiv) and head is not None and atom.num == var(head):
            group, atom = atom.den, Sym(head)
        elif not isinstance(atom, Sym) or atom.name in names:
            return None, 1               # another atom, or h and h // g both
        names.add(atom.name)
        out = out + var(atom.name) * coef
    return out, group


def flash_ok(a: Attention) -> bool:
    """Whether a flash template takes it: f16/bf16 operands (tensor cores) or f32 (CUDA cores:
    emmy.cuda.attention_simt), batch axes before the head axis that are one axis in memory in
    every operand (emmy.schedule.flash.merged_batch_stride), and a layout the
    template's smallest configuration builds on any target with cp.async (16-byte aligned rows,
    also where k and v start inside a packed q|k|v buffer; else the kernel keeps the generic
    row space)."""
    if a.q.dtype not in (*_HALF, DType.F32):
        return False
    from emmy.cuda.attention import AttentionConfig, constraints
    from emmy.cuda.attention_simt import constraints_simt
    from emmy.schedule.flash import merged_batch_stride, problem_of

    if any(merged_batch_stride(a, x.offset) is None
           for x in (a.q, a.k, a.v, *((a.bias,) if a.bias else ()))):
        return False

    if a.q.dtype is DType.F32:
        return not constraints_simt(problem_of(a), AttentionConfig(
            bq=32, bkv=32, warps=4, stages=1, inst="simt"), "sm_80")
    return not constraints(problem_of(a), AttentionConfig(bq=64, bkv=32, warps=4, stages=1),
                           "sm_80")


# --- expression trees -------------------------------------------------------------------------

def _reduce(f: Fold, op: ReduceOp) -> bool:
    return f.kind is FoldKind.REDUCE and len(f.accs) == 1 and f.accs[0].op is op and not f.reverse


def _folded(f: Fold) -> str | None:
    """The value a fold accumulates at its own level; None when it accumulates deeper (a fold
    whose body is further folds, as a transposed convolution's)."""
    from emmy.loop_ir.ir import Accum

    accums = [s for s in f.body if isinstance(s, Accum)]
    return accums[0].value if len(accums) == 1 else None


def _nested(f: Fold) -> Fold:
    return next(i for i in f.body if isinstance(i, Fold))


def _extent_of(f: Fold) -> int:
    return f.axis.extent


def _tree(name, fold: Fold, outer: dict):
    """The expression `name` denotes inside `fold`: nested folds become ("sum", axis, tree)."""
    defs = {s.dst: s for s in fold.body if isinstance(s, (Load, Compute, CastTo, IndexValue))}
    nested = {i.accs[0].acc: i for i in fold.body if isinstance(i, Fold) and len(i.accs) == 1}

    def walk(n):
        if isinstance(n, Scalar):
            return ("const", float(n.value))
        if n in nested:
            f = nested[n]
            if not _reduce(f, ReduceOp.SUM) or _folded(f) is None:
                return ("opaque", n)
            return ("sum", f.axis.var, _tree(_folded(f), f, {**outer, **defs}))
        s = defs.get(n) or outer.get(n)
        match s:
            case None:
                return ("acc", n)
            case Load() if not s.dyn:
                return ("load", s.buffer, s.index)
            case CastTo():
                return ("cast", walk(s.arg), s.dtype)
            case IndexValue():
                return ("index", s.expr)
            case Compute():
                return (s.op.value, *(walk(a) for a in s.args))
        return ("opaque", n)
    return walk(name)


def _is_load(t) -> bool:
    return t[0] == "load" or (t[0] == "cast" and t[1][0] == "load")


def _load_of(t):
    return t if t[0] == "load" else t[1] if t[0] == "cast" and t[1][0] == "load" else None


def _score(t, j: str, i: str, shapes: dict[str, tuple[int, ...]]):
    """((q offset, q buffer, k offset, k buffer), scale, causal, rounded, bias) of S(i, j),
    offsets renamed so that the sequence axis is "s" and the head dim "d"; None when `t` is
    not a score. S is, from the outside in: in any order, [a cast to f32], [the causal mask: a
    select of -inf], [a mask read from a tensor: a select of -inf by a loaded bool, or a
    loaded bias added; `bias` = (kind, buffer, offset over the batch axes, "qi" and "kj",
    whether it is added inside the 16-bit cast)];
    then [times or divided by a constant], [a cast to f16/bf16: `rounded`], then
    sum_d q[i, d] * k[j, d]; a cast to f32 comes with the 16-bit cast and only with it."""
    widened = causal = False
    bias = None
    ninf = ("const", float("-inf"))
    while True:
        if t[0] == "cast" and t[2] is DType.F32 and not widened:
            t, widened = t[1], True
        elif t[0] == "where" and ninf in (t[2], t[3]):
            keep = t[3] == ninf                  # where(c, S, -inf) keeps S where c holds
            cond, t = t[1], (t[2] if keep else t[3])
            if not causal and _visible(cond, j, i) is keep:
                causal = True
            elif bias is None and (m := _mask_load(_truth(cond)[0], j, i, shapes)) is not None:
                keep ^= _truth(cond)[1]
                bias = ("keep" if keep else "hide", *m, False)
            else:
                return None
        elif t[0] == EwOp.ADD.value and bias is None and (
                _load_of(t[1]) is not None or _load_of(t[2]) is not None):
            side = 1 if _load_of(t[1]) is not None else 2      # the bias; the other, S
            m = _mask_load(t[side], j, i, shapes)
            if m is None:
                return None
            # added before the widening cast: in the 16-bit type of the scores
            bias, t = ("add", *m, widened), t[3 - side]
        else:
            break
    scale = 1.0
    if t[0] == EwOp.MUL.value and ("const" in (t[1][0], t[2][0])):
        c, t = (t[1], t[2]) if t[1][0] == "const" else (t[2], t[1])
        scale = c[1]
    elif t[0] == EwOp.DIV.value and t[2][0] == "const" and t[2][1] != 0:
        t, scale = t[1], 1.0 / t[2][1]
    rounded = None
    if t[0] == "cast" and t[2] in _HALF:
        t, rounded = t[1], t[2]
    if widened != (rounded is not None) or t[0] != "sum":
        return None
    d, prod = t[1], t[2]
    if prod[0] != EwOp.MUL.value:
        return None
    a, b = _load_of(prod[1]), _load_of(prod[2])
    if a is None or b is None:
        return None
    oa, ob = offset(a[2], shapes[a[1]]), offset(b[2], shapes[b[1]])
    va, vb = oa.free_vars(), ob.free_vars()
    if i == SINGLE_QUERY:        # one query a head: q is the operand that does not name j, read
        if any(not isinstance(x, Sym) for x, _ in (oa if j not in va else ob).terms):
            return None          # at plain batch and head indices (not at a row // 2)
        va, vb = (va | {i}, vb) if j not in va else (va, vb | {i})
    if i in va and j in vb and j not in va and i not in vb:
        q, k = (oa, a[1]), (ob, b[1])
    elif i in vb and j in va and j not in vb and i not in va:
        q, k = (ob, b[1]), (oa, a[1])
    else:
        return None
    qo = _rename(q[0], {d: "d"})
    ko = _rename(k[0], {d: "d", j: "s"})
    if any(not isinstance(x, Sym) and x.free_vars() & {"d", "s", i}
           for x, _ in (*qo.terms, *ko.terms)):
        return None      # (a head index h // g is an atom of its own: see _grouped)
    return (qo, q[1], ko, k[1]), scale, causal, rounded, bias


def _truth(cond) -> tuple[tuple, bool]:
    """(x, negated): `cond` is x's truth (x != 0), or its negation, through not, a cast to
    bool, and comparisons with 0 (a float mask buffer compared with 0, as minGPT writes it)."""
    zero = ("const", 0.0)
    match cond:
        case (EwOp.NOT.value, x):
            x, neg = _truth(x)
            return x, not neg
        case ("cast", x, DType.BOOL):
            return _truth(x)
        case (EwOp.EQ.value | EwOp.NE.value as op, x, y) if zero in (x, y):
            x, neg = _truth(y if x == zero else x)
            return x, neg ^ (op == EwOp.EQ.value)
    return cond, False


def _mask_load(t, j: str, i: str, shapes) -> tuple[str, Lin] | None:
    """(buffer, offset with the query index named "qi" and the key index "kj") where `t` is
    a load (or a cast of one) of a mask or bias; None otherwise."""
    lo = _load_of(t)
    if lo is None:
        return None
    off = offset(lo[2], shapes[lo[1]])
    if any(not isinstance(a, Sym) for a, _ in off.terms):
        return None
    return lo[1], _rename(off, {i: "qi", j: "kj"})


_COMPARE = {EwOp.LE.value: (1, 0), EwOp.LT.value: (1, 1),      # x <= y: x - y <= 0
            EwOp.GE.value: (-1, 0), EwOp.GT.value: (-1, 1)}    # x < y: x - y + 1 <= 0


def _visible(cond, j: str, i: str) -> bool | None:
    """True where `cond` holds exactly when key j <= query i (the causal mask), False where it
    holds exactly when j > i, else None. The condition is a comparison of affine integer
    expressions of the two indices (or its negation), normalized to a_i i + a_j j + c <= 0."""
    negate = False
    while cond[0] == EwOp.NOT.value:
        cond, negate = cond[1], not negate
    if cond[0] not in _COMPARE:
        return None
    sign, strict = _COMPARE[cond[0]]
    x, y = _affine(cond[1], i, j), _affine(cond[2], i, j)
    if x is None or y is None:
        return None
    a_i, a_j, c = (sign * (x[n] - y[n]) for n in range(3))
    c += strict
    if negate:             # not (e <= 0)  <=>  e >= 1  <=>  -e + 1 <= 0
        a_i, a_j, c = -a_i, -a_j, -c + 1
    if a_i != -a_j or a_j == 0:
        return None
    if a_j > 0:            # a (j - i) + c <= 0  <=>  j - i <= floor(-c / a): j <= i iff that is 0
        return True if -a_j < c <= 0 else None
    return False if 0 < c <= -a_j else None    # -a (j - i) + c <= 0  <=>  j - i >= ceil(c / a)


def _affine(t, i: str, j: str) -> tuple[int, int, int] | None:
    """(a_i, a_j, c) with `t` = a_i i + a_j j + c over the integers, or None."""
    match t:
        case ("index", e):
            if any(not isinstance(x, Sym) or x.name not in (i, j) for x, _ in e.terms):
                return None
            coef = {x.name: k for x, k in e.terms}
            return coef.get(i, 0), coef.get(j, 0), e.const
        case ("const", v):
            return (0, 0, int(v)) if float(v).is_integer() else None
        case ("cast", x, _):
            return _affine(x, i, j)
        case (EwOp.NEG.value, x):
            a = _affine(x, i, j)
            return None if a is None else tuple(-n for n in a)
        case (EwOp.ADD.value | EwOp.SUB.value, x, y):
            a, b = _affine(x, i, j), _affine(y, i, j)
            if a is None or b is None:
                return None
            sign = 1 if t[0] == EwOp.ADD.value else -1
            return tuple(p + sign * q for p, q in zip(a, b))
    return None


def _rename(e: Lin, names: dict[str, str]) -> Lin:
    """`e` with the index variables `names` renamed, inside floor divisions and remainders too
    (a key position (n // 2) * 4 + j // 4 of 2-D windows unfolded from an image)."""
    from emmy.symbolic import rename

    return rename(e, names)
