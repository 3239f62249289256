"""Constant integer tables read back as index expressions.

A program's constant tensors of positions (a list a forward indexes with, `x[:, [0, 4, 1, 5, 2,
6, 3, 7]]`, lifted by torch.export; an integer buffer, whose values the program binds when it
is compiled) are, more often than not, a reshape and a transpose of a range: AWQ's interleaved
nibble order is the 2 x 4 transpose of range(8), a channel shuffle's the g x c/g transpose,
GPTQ's group index `g_idx` the range k // 128. Such a table is a sum of its axes' mixed-radix digits, each times a
coefficient:

    [0, 4, 1, 5, 2, 6, 3, 7][a] = 4 * (a % 2) + (a // 2)     (a over 0..7)

`table_index` finds that sum where there is one, so that a read through the table is an index
map (affine in the digits: no load of the table, no data-dependent read, fusable into whatever
consumes it) rather than a gather.
"""

from __future__ import annotations

import itertools

import numpy as np

from emmy import symbolic
from emmy.tensor_ir.ir import axis_var

MAX_ELEMENTS = 1 << 16   # tables past this stay data (checking one costs its size)


def _primes(n: int) -> list[int]:
    """n's prime factors, smallest first (with repeats)."""
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out + ([n] if n > 1 else [])


def table_index(values) -> symbolic.Lin | None:
    """`values` (an integer array) as an index expression over axis_var(0), axis_var(1), ...:
    a constant plus, for each axis, its mixed-radix digits (prime radices in some order, merged
    where the coefficients say two neighbours are one digit) times a coefficient each; None
    where the table is no such sum (or too large to check)."""
    table = np.asarray(values)
    if table.dtype.kind not in "iu" or table.size == 0 or table.size > MAX_ELEMENTS:
        return None
    table = table.astype(np.int64)
    base = int(table.flat[0])
    along = []   # the table along each axis (the others at 0), less the base
    for axis, n in enumerate(table.shape):
        line = table[tuple(slice(None) if i == axis else 0 for i in range(table.ndim))] - base
        along.append(line)
    separable = np.full(table.shape, base, dtype=np.int64)
    for axis, line in enumerate(along):
        separable = separable + line.reshape([-1 if i == axis else 1 for i in range(table.ndim)])
    if not np.array_equal(separable, table):
        return None
    bounds = {axis_var(i): n for i, n in enumerate(table.shape)}
    expr = symbolic.lin(base)
    for axis, line in enumerate(along):
        digits = _digits(line)
        if digits is None:
            return None
        a = symbolic.var(axis_var(axis))
        for stride, radix, coef in digits:
            digit = symbolic.floordiv(a, stride, bounds)
            if stride * radix < len(line):
                digit = symbolic.mod(digit, radix, bounds)
            expr = expr + digit * coef
    return expr


def _orders(items: list[int]):
    """The distinct orders of a multiset, lazily (2^16 has one, not 16! to sift)."""
    if not items:
        yield ()
        return
    for first in dict.fromkeys(items):
        rest = list(items)
        rest.remove(first)
        for tail in _orders(rest):
            yield (first, *tail)


MAX_ORDERS = 720   # orders of an extent's prime factors tried (6! covers 2 x 2 x 3 x 3 x 5 x 7)


def _digits(line: np.ndarray) -> list[tuple[int, int, int]] | None:
    """[(stride, radix, coefficient)] with line[i] == sum(coefficient * (i // stride % radix)),
    zero coefficients left out, or None."""
    n = len(line)
    if not line.any():
        return []
    positions = np.arange(n)
    for order in itertools.islice(_orders(_primes(n)), MAX_ORDERS):
        digits: list[list[int]] = []   # least significant first
        stride = 1
        for p in order:
            coef = int(line[stride])
            if digits and coef == digits[-1][2] * digits[-1][1]:
                digits[-1][1] *= p   # one digit: (i // s) % r * c + (i // s*r) % p * c*r
            else:
                digits.append([stride, p, coef])
            stride *= p
        modeled = sum((positions // s % r * c for s, r, c in digits), np.zeros(n, np.int64))
        if np.array_equal(modeled, line):
            return [(s, r, c) for s, r, c in digits if c]
    return None
