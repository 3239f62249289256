"""The index algebra: simplification must agree with plain integer evaluation."""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from emmy.symbolic import evaluate, floordiv, lin, mod, render, substitute, var


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
