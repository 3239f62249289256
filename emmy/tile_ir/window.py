"""A gathered operand in window form: an element that splits into a part of its row (column)
and a part of its reduction index, so a template computes each part once and combines them
per element with a few adds and compares.

A convolution's input under the window, (b, oh, ow) x (c, kh, kw), is

    0 <= oh + kh - 1 < H  and  0 <= ow + kw - 1 < W  ?  x[b*CHW + c*HW + (oh+kh-1)*W + ow+kw-1] : 0

Every index expression in it is a sum of a term over the grid axes (the outer side: the
operand's rows or columns and the batch) and a term over the reduction index (the k side):

    element(o, k) = all(lo_i <= o_i + k_i < hi_i) ? buffer[base(o) + offset(k)] : 0

The template then decodes o once per thread (its tile columns stay the same across K tiles),
reads (offset(k), k_i) from a table the block fills once, and spends per element an add and
two compares per range and one predicated load, instead of decoding (b, oh, ow, c, kh, kw)
from the flat indices every time: about 12 instructions per element instead of 37 in the SASS
of the ResNet 3x3 f16 row.

The lowering reads the padded load's index modulo the input's extent (so that an unmasked
load stays inside the buffer): `(oh + kh + H - 1) % H`. Under the mask, which says
0 <= oh + kh - 1 < H, that is oh + kh - 1 itself; `window` unwraps such terms where the mask
proves it, and the template loads only where the mask holds. Anything else (a transposed
convolution's stride test, a division of the window position) is not a window: the operand
keeps its per-element statements.
"""

from __future__ import annotations

from dataclasses import dataclass

from emmy.dtypes import DType
from emmy.loop_ir.ir import CastTo, Compute, IndexValue, Load
from emmy.schedule.facts import offset
from emmy.symbolic import FloorDiv, Lin, Mod, bounds_of, lin
from emmy.tensor_ir.ir import EwOp, Scalar

_INTS = (DType.I32, DType.I64)


@dataclass(frozen=True, slots=True)
class Range:
    """lo <= outer + k < hi (a bound None is absent)."""

    outer: Lin          # over the operand's grid axes and the batch axes
    k: Lin              # over the reduction index
    lo: int | None
    hi: int | None


@dataclass(frozen=True, slots=True)
class Window:
    """element(o, k) = all(ranges) ? buffer[outer(o) + k(k)] : 0."""

    buffer: str
    outer: Lin
    k: Lin
    ranges: tuple[Range, ...]

    def describe(self) -> str:
        return (f"{self.buffer}[({self.outer}) + ({self.k})]"
                + "".join(f", {_range_text(r)}" for r in self.ranges))


def _range_text(r: Range) -> str:
    e = f"{r.outer} + {r.k}" if r.outer.terms and r.k.terms else str(r.outer if r.outer.terms
                                                                       else r.k)
    return (f"{r.lo} <= " if r.lo is not None else "") + e + \
        (f" < {r.hi}" if r.hi is not None else "")


# comparison `e op c` as the range of e (lo, hi), c an int
_COMPARE = {EwOp.GE: lambda c: (c, None), EwOp.GT: lambda c: (c + 1, None),
            EwOp.LT: lambda c: (None, c), EwOp.LE: lambda c: (None, c + 1),
            EwOp.EQ: lambda c: (c, c + 1)}
_MIRROR = {EwOp.GE: EwOp.LE, EwOp.GT: EwOp.LT, EwOp.LT: EwOp.GT, EwOp.LE: EwOp.GE,
           EwOp.EQ: EwOp.EQ}


def window(items, value: str, shapes, kvar: str, outer_vars, bounds) -> Window | None:
    """The gathered element computed by `items` (value `value`: a load, maybe widened to f32,
    maybe under where(mask, ., 0)) in window form, or None when it has none. `outer_vars`
    are the grid axes of its rows (columns) and the batch axes; `bounds` every var's extent."""
    lins: dict[str, Lin] = {}
    conds: dict[str, list[tuple[Lin, int | None, int | None]]] = {}
    load: Load | None = None
    loaded: set[str] = set()          # names holding the loaded element's value
    mask: list | None = None
    for s in items:
        if isinstance(s, IndexValue) and s.dtype in _INTS:
            lins[s.dst] = s.expr
        elif isinstance(s, Load) and load is None and not s.dyn:
            load = s
            loaded.add(s.dst)
        elif isinstance(s, CastTo) and s.arg in loaded and s.dtype is DType.F32:
            loaded.add(s.dst)
        elif isinstance(s, CastTo) and s.arg in lins and s.dtype in _INTS:
            lins[s.dst] = lins[s.arg]
        elif isinstance(s, Compute):
            got = _compute(s, lins, conds, loaded)
            if got is None:
                return None
            kind, result = got
            if kind == "lin":
                lins[s.dst] = result
            elif kind == "cond":
                conds[s.dst] = result
            else:
                mask = result
                loaded.add(s.dst)
        else:
            return None
    if load is None or value not in loaded:
        return None
    ranges = _merged(mask or [])
    off = _unwrapped(offset(load.index, shapes[load.buffer]), ranges)
    outer_vars, sides = frozenset(outer_vars), []
    for e in (off, *(r for r, _, _ in ranges)):
        side = _split(e, outer_vars, kvar)
        if side is None:
            return None
        sides.append(side)
    (o, kk), rest = sides[0], sides[1:]
    out = []
    for (e_o, e_k), (_, lo, hi) in zip(rest, ranges):
        lo_v, hi_v = bounds_of(e_o + e_k, bounds)
        if (lo is None or lo <= lo_v) and (hi is None or hi_v < hi):
            continue                  # always true: no test needed
        out.append(Range(e_o, e_k, lo, hi))
    return Window(load.buffer, o + off.const, kk, tuple(out))


def _compute(s: Compute, lins, conds, loaded):
    """("lin", Lin) | ("cond", ranges) | ("where", ranges) for one statement; None when it
    is none of the forms a window is made of."""
    args = s.args

    def as_lin(a) -> Lin | None:
        if isinstance(a, Scalar):
            return lin(int(a.value)) if not a.dtype.is_float and not isinstance(a.value, bool) \
                else None
        return lins.get(a)

    if s.op in (EwOp.ADD, EwOp.SUB) and s.dtype in _INTS:
        x, y = as_lin(args[0]), as_lin(args[1])
        if x is None or y is None:
            return None
        return "lin", x + y if s.op is EwOp.ADD else x - y
    if s.op is EwOp.MUL and s.dtype in _INTS:
        x, y = as_lin(args[0]), as_lin(args[1])
        if x is None or y is None:
            return None
        if not x.terms:
            x, y = y, x
        if y.terms:
            return None
        return "lin", x * y.const
    if s.op is EwOp.NEG and s.dtype in _INTS:
        x = as_lin(args[0])
        return None if x is None else ("lin", x * -1)
    if s.op in _COMPARE:
        x, y = as_lin(args[0]), as_lin(args[1])
        if x is None or y is None:
            return None
        op = s.op
        if not x.terms and y.terms:
            x, y, op = y, x, _MIRROR[op]
        if y.terms:
            x, y = x - y, lin(0)
        lo, hi = _COMPARE[op](y.const - x.const)
        return "cond", [(x - x.const, lo, hi)]
    if s.op is EwOp.AND and all(isinstance(a, str) and a in conds for a in args):
        return "cond", [c for a in args for c in conds[a]]
    if s.op is EwOp.WHERE:
        m, x, zero = args
        if (isinstance(m, str) and m in conds and isinstance(x, str) and x in loaded
                and isinstance(zero, Scalar) and zero.value == 0):
            return "where", conds[m]
    return None


def _merged(conds) -> list[tuple[Lin, int | None, int | None]]:
    """One (expression, lo, hi) per distinct expression: the intersection of its ranges."""
    out: dict[Lin, tuple[int | None, int | None]] = {}
    for e, lo, hi in conds:
        plo, phi = out.get(e, (None, None))
        lo = plo if lo is None else lo if plo is None else max(lo, plo)
        hi = phi if hi is None else hi if phi is None else min(hi, phi)
        out[e] = (lo, hi)
    return [(e, lo, hi) for e, (lo, hi) in out.items()]


def _unwrapped(off: Lin, ranges) -> Lin:
    """The offset with each `(e + d) % n` (and `(e + d) / n`) replaced by what it is where
    the ranges hold: e + d - q*n (and q) when a range lo <= e < hi puts e + d inside one
    period [q*n, (q+1)*n)."""
    known = {e: (lo, hi) for e, lo, hi in ranges if lo is not None and hi is not None}
    out = lin(off.const)
    for atom, coef in off.terms:
        if isinstance(atom, (Mod, FloorDiv)):
            num = atom.num
            e = num - num.const
            if e in known:
                lo, hi = known[e]
                q = (lo + num.const) // atom.den
                if (hi - 1 + num.const) // atom.den == q:
                    out = out + (num - q * atom.den if isinstance(atom, Mod) else lin(q)) * coef
                    continue
        out = out + Lin(((atom, coef),), 0)
    return out


def _split(e: Lin, outer_vars: frozenset[str], kvar: str) -> tuple[Lin, Lin] | None:
    """e (without its constant) as (terms over the outer side, terms over k); None when an
    atom reads both sides."""
    o, k = lin(0), lin(0)
    for atom, coef in e.terms:
        free = atom.free_vars()
        if free <= outer_vars:
            o = o + Lin(((atom, coef),), 0)
        elif free <= {kvar}:
            k = k + Lin(((atom, coef),), 0)
        else:
            return None
    return o, k


TABLE_BITS = 32      # a table entry's window positions share one 32-bit word
INT_MAX = 2**31 - 1


def k_fields(w: Window, bounds) -> tuple[tuple[int, int], ...]:
    """[min, max] of the k side of each range that has one, in order."""
    return tuple(bounds_of(r.k, bounds) for r in w.ranges if r.k.terms)


def tabled(w: Window | None, bounds) -> Window | None:
    """`w` when a template can tabulate its k side: the offset in an int, the ranges' k sides
    packed into one 32-bit word; else None."""
    if w is None:
        return None
    lo, hi = bounds_of(w.k, bounds)
    bits = sum(max(1, (b - a).bit_length()) for a, b in k_fields(w, bounds))
    return w if -INT_MAX <= lo and hi <= INT_MAX and bits <= TABLE_BITS else None
