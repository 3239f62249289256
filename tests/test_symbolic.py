"""The index algebra: simplification must agree with plain integer evaluation."""

import itertools

import numpy as np

from hypothesis import given, settings
from hypothesis import strategies as st

from emmy.symbolic import (canonical, evaluate, floordiv, lin, mod, recombine, render, substitute,
                           var)


def test_reshape_round_trip_simplifies_to_the_variables():
    bounds = {"a0": 8, "a1": 16}
    flat = var("a0") * 16 + var("a1")
    assert floordiv(flat, 16, bounds) == var("a0")
    assert mod(flat, 16, bounds) == var("a1")


def test_trivial_terms_vanish():
    assert var("a0") * 1 + 0 == var("a0")
    assert (var("a0") - var("a0")).is_const
    assert render(var("a0") * 2 - 3) == "a0*2 - 3"


def test_substitution_composes_index_maps():
    # transpose of a transpose is the identity
    inner = (var("a1"), var("a0"))
    outer = {"a0": var("a1"), "a1": var("a0")}
    bounds = {"a0": 4, "a1": 5}
    assert tuple(substitute(e, outer, bounds) for e in inner) == (var("a0"), var("a1"))


def test_free_vars_look_inside_div_and_mod():
    e = floordiv(var("a0") * 3 + var("a1"), 4, {"a0": 10, "a1": 10})
    assert e.free_vars() == {"a0", "a1"}


@settings(max_examples=200, deadline=None)
@given(c0=st.integers(-6, 6), c1=st.integers(-6, 6), k=st.integers(-20, 20),
       d=st.integers(1, 9), e0=st.integers(1, 6), e1=st.integers(1, 6))
def test_floordiv_and_mod_agree_with_python(c0, c1, k, d, e0, e1):
    bounds = {"a0": e0, "a1": e1}
    e = var("a0") * c0 + var("a1") * c1 + k
    q, r = floordiv(e, d, bounds), mod(e, d, bounds)
    for x0, x1 in itertools.product(range(e0), range(e1)):
        env = {"a0": x0, "a1": x1}
        value = c0 * x0 + c1 * x1 + k
        assert evaluate(q, env) == value // d
        assert evaluate(r, env) == value % d
        assert evaluate(lin(0) + q * d + r, env) == value


def _c_evaluate(e, env):
    """`evaluate` as the emitted C computes it: / truncates toward zero, % keeps the sign of
    the numerator."""
    from emmy.symbolic import FloorDiv, Sym

    total = e.const
    for atom, coef in e.terms:
        if isinstance(atom, Sym):
            val = env[atom.name]
        else:
            n = _c_evaluate(atom.num, env)
            q = abs(n) // atom.den * (1 if n >= 0 else -1)
            val = q if isinstance(atom, FloorDiv) else n - q * atom.den
        total += coef * val
    return total


@settings(max_examples=200, deadline=None)
@given(c0=st.integers(-6, 6), c1=st.integers(-6, 6), k=st.integers(-20, 20),
       d=st.integers(1, 9), d2=st.integers(2, 9), m=st.integers(-3, 3),
       e0=st.integers(1, 6), e1=st.integers(1, 6))
def test_divisions_are_right_as_c_computes_them(c0, c1, k, d, d2, m, e0, e1):
    """A numerator that can be negative (a flipped axis: `2239 - a0`) is shifted to start at
    zero, so C's truncating / and % give the floor division and modulo, nested too."""
    bounds = {"a0": e0, "a1": e1}
    e = var("a0") * c0 + var("a1") * c1 + k
    q = floordiv(e, d, bounds)
    outer = mod(q * m + k, d2, bounds)
    for x0, x1 in itertools.product(range(e0), range(e1)):
        env = {"a0": x0, "a1": x1}
        value = c0 * x0 + c1 * x1 + k
        assert _c_evaluate(q, env) == value // d, render(q)
        assert _c_evaluate(outer, env) == (value // d * m + k) % d2, render(outer)


def test_a_split_index_recombines():
    # collapsing nested loops writes k as (k / 3, k % 3); reading them back as a row-major
    # offset must give k again, so the offset stays affine (a contraction's operand)
    bounds = {"k": 144, "a1": 4}
    k = var("k")
    hi, lo = floordiv(k, 3, bounds), mod(k, 3, bounds)
    assert recombine(hi * 3 + lo) == k
    assert recombine(floordiv(hi, 3, bounds) * 9 + mod(hi, 3, bounds) * 3 + lo) == k
    assert recombine(var("a1") * 144 + hi * 6 + lo * 2) == var("a1") * 144 + k * 2
    # a different multiple is left alone
    assert recombine(hi * 4 + lo) == hi * 4 + lo


@settings(max_examples=200, deadline=None)
@given(c=st.integers(-4, 4), d=st.integers(1, 7), m=st.integers(-3, 3), k=st.integers(-9, 9),
       e=st.integers(1, 30))
def test_recombination_agrees_with_python(c, d, m, k, e):
    bounds = {"a0": e}
    x = var("a0") * m + k
    got = recombine(floordiv(x, d, bounds) * (c * d) + mod(x, d, bounds) * c)
    for v in range(e):
        value = m * v + k
        assert evaluate(got, {"a0": v}) == c * d * (value // d) + c * (value % d)


def test_canonical_puts_an_axis_split_by_reshapes_back_together():
    """An int4 weight unpacked through two reshapes: its byte at k // 2, its nibble at k % 2."""
    b = {"k": 1024, "n": 8}
    k = var("k")
    split = floordiv(k, 128, b) * 128 + mod(k, 128, b)        # view(n, 8, 128) of k
    assert render(floordiv(split, 2, b)) == "((k % 128) / 2) + (k / 128)*64"
    assert canonical(floordiv(split, 2, b) + var("n") * 512) == floordiv(k, 2, b) + var("n") * 512
    assert canonical(mod(mod(k, 128, b), 2, b)) == mod(k, 2, b)
    assert canonical(floordiv(floordiv(k, 4, b), 8, b)) == floordiv(k, 32, b)
    assert canonical(mod(mod(k, 6, b), 4, b)) == mod(mod(k, 6, b), 4, b)     # 4 does not divide 6


@settings(max_examples=200, deadline=None)
@given(a=st.sampled_from([2, 4, 6, 8, 12, 16, 128]), d=st.sampled_from([1, 2, 3, 4, 8]),
       c=st.integers(-5, 5), s=st.integers(0, 3), n=st.integers(1, 40))
def test_canonical_keeps_every_value(a, d, c, s, n):
    bounds = {"k": 300, "n": n}
    k, nn = var("k"), var("n")
    split = floordiv(k, a, bounds) * a + mod(k, a, bounds)
    exprs = [floordiv(split, d, bounds) * c + nn * s, mod(mod(split, a, bounds), d, bounds),
             floordiv(floordiv(k * 3 + nn, a, bounds), d, bounds),
             floordiv(mod(k, a, bounds), d, bounds) + floordiv(k, a, bounds) * c]
    env = {"k": np.arange(300)[:, None], "n": np.arange(n)[None, :]}
    for e in exprs:
        np.testing.assert_array_equal(np.broadcast_to(evaluate(canonical(e), env), (300, n)),
                                      np.broadcast_to(evaluate(e, env), (300, n)), err_msg=str(e))
