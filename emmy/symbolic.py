"""Integer index algebra shared by the IR stages.

Every index expression is a `Lin`: a sum of integer multiples of atoms plus a constant.
An atom is a loop/axis variable (`Sym`) or a floor division / modulo of a `Lin` by a
positive constant (what reshapes produce). Constructors simplify as they build, so
equal expressions compare equal once built with the same bounds:

    (a0*16 + a1) // 16   -> a0        when 0 <= a1 < 16
    (a0*16 + a1) %  16   -> a1        when 0 <= a1 < 16
    x*1 + 0              -> x
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Union

Bounds = Mapping[str, int]  # variable name -> extent; the variable ranges over 0..extent-1


@dataclass(frozen=True, slots=True)
class Sym:
    name: str

    def free_vars(self) -> frozenset[str]:
        return frozenset((self.name,))


@dataclass(frozen=True, slots=True)
class FloorDiv:
    num: "Lin"
    den: int

    def free_vars(self) -> frozenset[str]:
        return self.num.free_vars()


@dataclass(frozen=True, slots=True)
class Mod:
    num: "Lin"
    den: int

    def free_vars(self) -> frozenset[str]:
        return self.num.free_vars()


Atom = Union[Sym, FloorDiv, Mod]


@dataclass(frozen=True, slots=True)
class Lin:
    """sum(coef * atom for atom, coef in terms) + const; terms sorted, no zero coefficients."""

    terms: tuple[tuple[Atom, int], ...] = ()
    const: int = 0

    def __add__(self, other: "Lin | int") -> "Lin":
        other = lin(other)
        if not other.terms:                  # a constant: the terms stay sorted as they are
            return self if not other.const else Lin(self.terms, self.const + other.const)
        if not self.terms:
            return other if not self.const else Lin(other.terms, self.const + other.const)
        acc: dict[Atom, int] = dict(self.terms)
        for atom, coef in other.terms:
            acc[atom] = acc.get(atom, 0) + coef
        return _make(acc, self.const + other.const)

    def __radd__(self, other: int) -> "Lin":
        return self + other

    def __sub__(self, other: "Lin | int") -> "Lin":
        return self + lin(other) * -1

    def __mul__(self, k: int) -> "Lin":
        if not isinstance(k, int):
            raise TypeError("index expressions are affine: multiply by an int only")
        if k == 1:
            return self
        if k == 0:
            return Lin()
        # a nonzero factor keeps every coefficient nonzero and the order of the atoms
        return Lin(tuple((a, c * k) for a, c in self.terms), self.const * k)

    __rmul__ = __mul__

    def __str__(self) -> str:
        return render(self)

    @property
    def is_const(self) -> bool:
        return not self.terms

    def free_vars(self) -> frozenset[str]:
        out: set[str] = set()
        for atom, _ in self.terms:
            out |= atom.free_vars()
        return frozenset(out)


def _make(acc: Mapping[Atom, int], const: int) -> Lin:
    terms = [(a, c) for a, c in acc.items() if c != 0]
    if len(terms) > 1:
        terms.sort(key=lambda t: _atom_key(t[0]))
    return Lin(tuple(terms), const)


def recombine(e: Lin) -> Lin:
    """c*d*(x // d) + c*(x % d) -> c*x (x == d*(x // d) + x % d for every integer x), until
    no such pair is left: an index split by collapsing loops reads back as the index, so a
    flat offset stays affine. (Constructors keep the pieces: a reshape splits an axis into
    them on purpose, to divide each piece exactly.)"""
    acc, const = _recombined(dict(e.terms), e.const)
    return _make(acc, const)


def _recombined(acc: dict[Atom, int], const: int) -> tuple[dict[Atom, int], int]:
    while True:
        pair = next(((m, c) for m, c in acc.items() if isinstance(m, Mod)
                     and acc.get(FloorDiv(m.num, m.den)) == c * m.den), None)
        if pair is None:
            return acc, const
        m, c = pair
        del acc[m], acc[FloorDiv(m.num, m.den)]
        for atom, coef in m.num.terms:
            acc[atom] = acc.get(atom, 0) + coef * c
            if acc[atom] == 0:
                del acc[atom]
        const += m.num.const * c


def canonical(e: Lin) -> Lin:
    """`e` with the pieces a reshape split an index into put back together, inside divisions
    too, wherever the value is the same for every integer:

        c*d*(x // d) + c*(x % d)        -> c*x
        c*(a/b)*(x // a) + c*((x % a) // b) -> c*(x // b)    (b divides a)
        (x % a) % b                     -> x % b             (b divides a)
        (x // a) // b                   -> x // (a*b)

    so that an int4 weight unpacked through two reshapes reads packed[n, k // 2] at parity
    k % 2. The constructors keep the pieces (a reshape splits an axis into them on purpose);
    an analysis that asks how an offset moves along one variable takes this form."""
    acc: dict[Atom, int] = {}
    const = e.const
    for atom, coef in e.terms:
        part = _canonical_atom(atom)
        for a, c in part.terms:
            acc[a] = acc.get(a, 0) + c * coef
            if acc[a] == 0:
                del acc[a]
        const += part.const * coef
    while True:
        acc, const = _recombined(acc, const)
        pair = next(((f, c) for f, c in acc.items() if isinstance(f, FloorDiv)
                     and _mod_piece(f) is not None
                     and acc.get(FloorDiv(*_mod_piece(f))) == c * _mod_piece(f)[1] // f.den),
                    None)
        if pair is None:
            return _make(acc, const)
        f, c = pair
        num, a = _mod_piece(f)
        del acc[f], acc[FloorDiv(num, a)]
        whole = FloorDiv(num, f.den)
        acc[whole] = acc.get(whole, 0) + c
        if acc[whole] == 0:
            del acc[whole]


def _mod_piece(f: FloorDiv) -> tuple[Lin, int] | None:
    """(x, a) where `f` is (x % a) // b with b dividing a, else None."""
    t = f.num.terms
    if f.num.const or len(t) != 1 or t[0][1] != 1 or not isinstance(t[0][0], Mod) \
            or t[0][0].den % f.den:
        return None
    return t[0][0].num, t[0][0].den


def _canonical_atom(atom: Atom) -> Lin:
    if isinstance(atom, Sym):
        return lin(atom)
    num = canonical(atom.num)
    only = num.terms[0][0] if len(num.terms) == 1 and num.terms[0][1] == 1 and \
        not num.const else None
    if isinstance(atom, Mod) and isinstance(only, Mod) and only.den % atom.den == 0:
        return lin(Mod(only.num, atom.den))
    if isinstance(atom, FloorDiv) and isinstance(only, FloorDiv):
        return lin(FloorDiv(only.num, only.den * atom.den))
    return lin(type(atom)(num, atom.den))


@lru_cache(maxsize=1 << 16)
def _atom_key(atom: Atom) -> tuple:
    if isinstance(atom, Sym):
        return (0, _var_order(atom.name))
    kind = 1 if isinstance(atom, FloorDiv) else 2
    return (kind, render(atom.num), atom.den)


@lru_cache(maxsize=1 << 14)
def _var_order(name: str) -> tuple:
    head = name.rstrip("0123456789")
    tail = name[len(head):]
    return (head, int(tail) if tail else -1)


def lin(x: "Lin | int | str | Atom") -> Lin:
    """Coerce an int, a variable name or an atom to a `Lin`."""
    if isinstance(x, Lin):
        return x
    if isinstance(x, bool):
        raise TypeError("bool is not an index")
    if isinstance(x, int):
        return Lin((), x)
    if isinstance(x, str):
        return Lin(((Sym(x), 1),), 0)
    return Lin(((x, 1),), 0)


def var(name: str) -> Lin:
    return lin(name)


def bounds_of(e: Lin, bounds: Bounds) -> tuple[int, int]:
    """Inclusive [lo, hi] of `e` given each variable's extent."""
    lo = hi = e.const
    for atom, coef in e.terms:
        alo, ahi = _atom_bounds(atom, bounds)
        if coef >= 0:
            lo, hi = lo + coef * alo, hi + coef * ahi
        else:
            lo, hi = lo + coef * ahi, hi + coef * alo
    return lo, hi


def _atom_bounds(atom: Atom, bounds: Bounds) -> tuple[int, int]:
    if isinstance(atom, Sym):
        if atom.name not in bounds:
            raise KeyError(f"no extent known for index variable {atom.name}")
        return 0, bounds[atom.name] - 1
    lo, hi = bounds_of(atom.num, bounds)
    if isinstance(atom, FloorDiv):
        return lo // atom.den, hi // atom.den
    if lo >= 0 and hi < atom.den:
        return lo, hi
    return 0, atom.den - 1


def floordiv(e: "Lin | int | str", d: int, bounds: Bounds) -> Lin:
    e = lin(e)
    if d <= 0:
        raise ValueError("floordiv by a non-positive constant")
    if d == 1:
        return e
    # Pull out the terms whose coefficient is a multiple of d; what remains must stay in [0, d).
    whole = {a: c // d for a, c in e.terms if c % d == 0}
    rest = _make({a: c for a, c in e.terms if c % d != 0}, e.const % d)
    base = _make(whole, e.const // d)
    lo, hi = bounds_of(rest, bounds)
    if lo >= 0 and hi < d:
        return base
    if lo // d == hi // d:
        return base + lo // d
    if lo < 0:
        # a numerator that may be negative (a flip: `2239 - a0`) is shifted by whole multiples
        # of d to start at 0, so that C's division (which truncates) is the floor division
        k = -(lo // d)
        return base - k + Lin(((FloorDiv(rest + k * d, d), 1),), 0)
    return base + Lin(((FloorDiv(rest, d), 1),), 0)


def mod(e: "Lin | int | str", d: int, bounds: Bounds) -> Lin:
    e = lin(e)
    if d <= 0:
        raise ValueError("mod by a non-positive constant")
    if d == 1:
        return Lin()
    rest = _make({a: c % d for a, c in e.terms if c % d != 0}, e.const % d)
    lo, hi = bounds_of(rest, bounds)
    if lo >= 0 and hi < d:
        return rest
    return Lin(((Mod(rest, d), 1),), 0)


def substitute(e: Lin, env: Mapping[str, Lin], bounds: Bounds) -> Lin:
    """Replace variables by expressions; `bounds` gives the extents of the new variables."""
    acc: dict[Atom, int] = {}
    const = e.const
    for atom, coef in e.terms:
        if isinstance(atom, Sym):
            if atom.name not in env:
                acc[atom] = acc.get(atom, 0) + coef
                continue
            part = lin(env[atom.name])
        elif isinstance(atom, FloorDiv):
            part = floordiv(substitute(atom.num, env, bounds), atom.den, bounds)
        else:
            part = mod(substitute(atom.num, env, bounds), atom.den, bounds)
        for a, c in part.terms:
            acc[a] = acc.get(a, 0) + c * coef
        const += part.const * coef
    return _make(acc, const)


def rename(e: Lin, names: Mapping[str, str]) -> Lin:
    """`e` with variables renamed (inside floor divisions and remainders too), as it is: a
    renaming to variables of the same extents needs no bounds and simplifies nothing."""
    def atom(a: Atom) -> Atom:
        if isinstance(a, Sym):
            return Sym(names.get(a.name, a.name))
        return type(a)(rename(a.num, names), a.den)
    acc: dict[Atom, int] = {}
    for a, coef in e.terms:
        new = atom(a)
        acc[new] = acc.get(new, 0) + coef
    return _make(acc, e.const)


def evaluate(e: Lin, env: Mapping[str, object]):
    """Evaluate with ints or numpy integer arrays bound to the variables."""
    total = e.const
    for atom, coef in e.terms:
        if isinstance(atom, Sym):
            val = env[atom.name]
        elif isinstance(atom, FloorDiv):
            val = evaluate(atom.num, env) // atom.den
        else:
            val = evaluate(atom.num, env) % atom.den
        total = total + coef * val
    return total


def render(e: "Lin | Atom") -> str:
    """C-compatible text: every numerator of // and % is non-negative (`floordiv` shifts one
    that could be negative; `mod` takes its coefficients mod d), so C and Python agree."""
    if isinstance(e, Sym):
        return e.name
    if isinstance(e, FloorDiv):
        return f"({_grouped(e.num)} / {e.den})"
    if isinstance(e, Mod):
        return f"({_grouped(e.num)} % {e.den})"
    parts: list[str] = []
    for atom, coef in e.terms:
        text = render(atom)
        mag = abs(coef)
        piece = text if mag == 1 else f"{text}*{mag}"
        if not parts:
            parts.append(piece if coef > 0 else f"-{piece}")
        else:
            parts.append(f" + {piece}" if coef > 0 else f" - {piece}")
    if e.const or not parts:
        if not parts:
            parts.append(str(e.const))
        else:
            parts.append(f" + {e.const}" if e.const > 0 else f" - {-e.const}")
    return "".join(parts)


def _grouped(e: Lin) -> str:
    """A numerator of / or %: parenthesized when it is a sum, so C reads it as one operand."""
    text = render(e)
    return f"({text})" if len(e.terms) > 1 or (e.terms and e.const) else text
