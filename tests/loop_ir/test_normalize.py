"""Each normalization pass on small hand-written kernels, and the facts normalization owes."""

import numpy as np
import pytest
import torch

from emmy.loop_ir.dataflow import walk
from emmy.loop_ir.ir import Accum, CastTo, Compute, IndexValue, Init, Load, Loop, LoopKind
from emmy.loop_ir.normalize import (dedupe_loads, eliminate_common_subexpressions,
                                    eliminate_dead_code, fold_constants, hoist_invariants,
                                    normalize,
                                    order_commutative_operands, order_statements, rename_ssa)
from emmy.loop_ir.printer import format_body
from emmy.loop_ir.verify import verify
from emmy.tensor_ir.ir import EwOp, ReduceOp, Scalar
from emmy.dtypes import DType

from .programs import (buf, check_torch, kernel, load, loop, op, reduce, run_kernel, store, v)

ADD, MUL, SUB, EXP = EwOp.ADD, EwOp.MUL, EwOp.SUB, EwOp.EXP
X, Y, OUT = buf("x", 4), buf("y", 4), buf("out", 4)


def count(k, kind):
    return sum(isinstance(s, kind) for s in walk(k.body))


def square_twice():
    """(x*x) + (x*x) as written: four loads, two multiplies."""
    return kernel([X], [OUT], loop(
        "i", 4,
        load("p", "x", v("i")), load("q", "x", v("i")), op("s", MUL, "p", "q"),
        load("r", "x", v("i")), load("t", "x", v("i")), op("u", MUL, "r", "t"),
        op("w", ADD, "s", "u"), store("out", "w", v("i"))))


def same_results(a, b, feeds):
    for got, want in zip(run_kernel(a, feeds), run_kernel(b, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-6)


FEEDS = {"x": np.arange(4, dtype=np.float32) - 1.5, "y": np.arange(4, dtype=np.float32) * 0.5}


# ---- the facts ------------------------------------------------------------------------------

def test_square_plus_square_normalizes_to_one_load_and_one_multiply():
    k = normalize(square_twice())
    assert count(k, Load) == 1
    assert [s.op for s in walk(k.body) if isinstance(s, Compute)] == [MUL, ADD]
    same_results(k, square_twice(), FEEDS)


def test_x_plus_x_plus_y_and_y_plus_x_plus_x_give_the_same_body():
    first = kernel([X, Y], [OUT], loop(
        "i", 4, load("a", "x", v("i")), load("b", "x", v("i")), op("c", ADD, "a", "b"),
        load("d", "y", v("i")), op("e", ADD, "c", "d"), store("out", "e", v("i"))))
    second = kernel([Y, X], [OUT], loop(
        "j", 4, load("m", "y", v("j")), load("n", "x", v("j")), op("o", ADD, "n", "n"),
        op("p", ADD, "m", "o"), store("out", "p", v("j"))))
    assert normalize(first) == normalize(second)
    assert normalize(first).inputs == normalize(second).inputs


def test_the_same_facts_hold_from_torch():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    one = check_torch(lambda x, y: x + x + y, x, y).kernels[0]
    two = check_torch(lambda x, y: y + (x + x), x, y).kernels[0]
    assert format_body(one) == format_body(two)
    sq = check_torch(lambda x: (x * x) + (x * x), x).kernels[0]
    assert count(sq, Load) == 1


def test_normalize_is_idempotent_and_keeps_the_invariants():
    for model in (lambda x: torch.softmax(x, -1), lambda x: torch.cumsum(x, 1) * x):
        for k in check_torch(model, torch.randn(3, 5)).kernels:
            assert normalize(k) == k
            verify(k)


# ---- one pass at a time ---------------------------------------------------------------------

def test_dedupe_loads_merges_same_buffer_and_index_only():
    k = kernel([X], [OUT], loop(
        "i", 4, load("a", "x", v("i")), load("b", "x", v("i")), load("c", "x", v("i") * -1 + 3),
        op("d", ADD, "a", "b"), op("e", ADD, "d", "c"), store("out", "e", v("i"))))
    out = dedupe_loads(k)
    assert count(out, Load) == 2
    add = next(s for s in walk(out.body) if isinstance(s, Compute))
    assert add.args == ("a", "a")
    same_results(out, k, FEEDS)


def test_cse_merges_equal_computations_in_scope_only():
    k = kernel([X], [OUT], loop(
        "i", 4, load("a", "x", v("i")), op("b", EXP, "a"),
        loop("j", 1, op("c", EXP, "a"), op("d", ADD, "b", "c"), store("out", "d", v("i"))),
        op("e", EXP, "a")))  # in scope of b: merged too (and dead)
    out = eliminate_common_subexpressions(k)
    assert [s.dst for s in walk(out.body) if isinstance(s, Compute)] == ["b", "d"]


def test_cse_does_not_merge_reads_of_an_accumulator_across_a_fold():
    # acc read before and after the fold of a scan: different values
    k = kernel([X], [OUT, buf("out2", 4)], Init("s", ReduceOp.SUM, DType.F32), loop(
        "i", 4, op("before", MUL, "s", Scalar(2.0, DType.F32)), load("a", "x", v("i")),
        Accum("s", ReduceOp.SUM, "a"), op("after", MUL, "s", Scalar(2.0, DType.F32)),
        store("out", "before", v("i")), store("out2", "after", v("i")), kind=LoopKind.SCAN))
    out = eliminate_common_subexpressions(k)
    assert count(out, Compute) == 2
    same_results(normalize(k), k, FEEDS)


def test_commutative_operands_sort_by_structure_not_by_name():
    def body(first, second):
        return kernel([X], [OUT], loop(
            "i", 4, load(first, "x", v("i")), op(second, EXP, first),
            op("z", ADD, second, first), op("w", SUB, second, first), store("out", "w", v("i")),
            store("out", "z", v("i"))))

    for names in (("a", "b"), ("b", "a")):
        out = order_commutative_operands(body(*names))
        computes = {s.dst: s for s in walk(out.body) if isinstance(s, Compute)}
        assert computes["z"].args == (names[0], names[1])  # the load before the exp
        assert computes["w"].args == (names[1], names[0])  # sub is left alone


def test_hoisting_moves_what_does_not_depend_on_the_loop():
    k = kernel([X, buf("w", 4)], [buf("out", 4, 4)], loop(
        "i", 4, loop(
            "j", 4, load("a", "w", v("i")), op("b", EXP, "a"), load("c", "x", v("j")),
            op("d", MUL, "b", "c"), store("out", "d", v("i"), v("j")))))
    out = hoist_invariants(k)
    (outer,) = out.body
    assert [type(s).__name__ for s in outer.body] == ["Load", "Compute", "Loop"]
    inner = outer.body[-1]
    assert [type(s).__name__ for s in inner.body] == ["Load", "Compute", "Store"]
    feeds = {"x": FEEDS["x"], "w": FEEDS["y"]}
    same_results(out, k, feeds)


def test_hoisting_keeps_reads_of_what_the_loop_folds_and_empty_loops():
    folding = kernel([X], [OUT], Init("s", ReduceOp.SUM, DType.F32), loop(
        "i", 4, op("t", MUL, "s", Scalar(2.0, DType.F32)), load("a", "x", v("i")),
        Accum("s", ReduceOp.SUM, "a"), store("out", "t", v("i")), kind=LoopKind.SCAN))
    assert hoist_invariants(folding) == folding
    empty = kernel([X], [OUT], loop("i", 0, load("a", "x", 3), store("out", "a", v("i"))))
    assert hoist_invariants(empty) == empty


def test_dead_code_goes_including_unread_accumulators():
    k = kernel([X], [buf("out", 1)], loop(
        "i", 1, load("a", "x", 0), op("dead", EXP, "a"),
        Init("s", ReduceOp.SUM, DType.F32), reduce("r", 4, load("b", "x", v("r")),
                                                   Accum("s", ReduceOp.SUM, "b")),
        store("out", "a", v("i"))))
    out = eliminate_dead_code(k)
    assert count(out, Compute) == 0 and count(out, Init) == 0 and count(out, Loop) == 1


def test_statement_order_depends_only_on_what_each_statement_computes():
    one = kernel([X, Y], [OUT], loop(
        "i", 4, load("a", "x", v("i")), load("b", "y", v("i")), op("c", EXP, "b"),
        op("d", ADD, "a", "c"), store("out", "d", v("i"))))
    two = kernel([X, Y], [OUT], loop(
        "i", 4, load("b", "y", v("i")), op("c", EXP, "b"), load("a", "x", v("i")),
        op("d", ADD, "a", "c"), store("out", "d", v("i"))))
    assert order_statements(one) == order_statements(two)


def test_statement_order_keeps_a_read_before_the_fold_that_follows_it():
    k = kernel([X], [OUT], Init("s", ReduceOp.SUM, DType.F32), loop(
        "i", 4, op("t", MUL, "s", Scalar(2.0, DType.F32)), load("a", "x", v("i")),
        Accum("s", ReduceOp.SUM, "a"), store("out", "t", v("i")), kind=LoopKind.SCAN))
    out = order_statements(k)
    body = [type(s).__name__ for s in out.body[1].body]
    assert body.index("Compute") < body.index("Accum")
    same_results(out, k, FEEDS)


def test_renaming_is_sequential_and_orders_inputs_by_first_load():
    k = kernel([X, Y], [OUT], loop(
        "q", 4, load("p", "y", v("q")), CastTo("c", "p", DType.F64), load("z", "x", v("q")),
        op("m", ADD, "c", "z", dtype=DType.F64), store("out", "m", v("q"))))
    out = rename_ssa(k)
    assert [b.name for b in out.inputs] == ["y", "x"]
    assert format_body(out) == (
        "  for a0 in 0..4\n"
        "    in0 = load y[a0]\n"
        "    v0 = cast(in0) : f64\n"
        "    in1 = load x[a0]\n"
        "    v1 = add(v0, in1)\n"
        "    out[a0] = v1\n")


def test_a_parallel_loop_that_runs_once_is_inlined():
    """LayerNorm over (batch, 1, hidden): the output pass is one loop over hidden, so a
    schedule spreads hidden over the lanes (it used to spread the extent-1 loop)."""
    import torch.nn as nn

    from emmy.loop_ir.unit_loops import drop_unit_loops

    lp = check_torch(nn.LayerNorm(64), torch.randn(4, 1, 64))   # checked against torch
    k = lp.kernels[0]
    loops = [s for s in walk(k.body) if isinstance(s, Loop)]
    assert loops and all(s.extent > 1 for s in loops), [(s.var, s.extent) for s in loops]
    assert drop_unit_loops(k) == k


def test_literal_ops_fold_and_their_readers_read_the_literal():
    """or(False, True) cast to f32 then added: the add reads 1.0, the or and cast go."""
    B = DType.BOOL
    k = kernel([X], [OUT], loop(
        "i", 4, op("t", EwOp.OR, Scalar(False, B), Scalar(True, B), dtype=B),
        CastTo("c", "t", DType.F32), op("h", MUL, Scalar(3.0, DType.F32), Scalar(0.5, DType.F32)),
        load("a", "x", v("i")), op("s", ADD, "a", "c"), op("w", MUL, "s", "h"),
        store("out", "w", v("i"))))
    out = eliminate_dead_code(fold_constants(k))
    computes = [s for s in walk(out.body) if isinstance(s, Compute)]
    assert [(s.op, s.args[1:]) for s in computes] == [
        (ADD, (Scalar(1.0, DType.F32),)), (MUL, (Scalar(1.5, DType.F32),))]
    assert count(out, CastTo) == 0
    same_results(out, k, FEEDS)


def test_literals_fold_as_the_interpreter_computes_them():
    """An op computes in its compute type; a cast of a literal rounds it, and a computed
    16-bit value read as a wider float is its 16-bit value (1.0 + 1e-4 in f16 is 1.0, as
    eager has it)."""
    F16 = DType.F16
    k = kernel([X], [OUT], loop(
        "i", 4, op("t", ADD, Scalar(1.0, F16), Scalar(1e-4, F16), dtype=F16),
        CastTo("h", "t", F16), CastTo("c", "t", DType.F32), load("a", "x", v("i")),
        op("s", ADD, "a", "c"), op("r", ADD, "s", "h"), store("out", "r", v("i"))))
    out = fold_constants(k)
    by_name = {s.dst: s for s in walk(out.body) if isinstance(s, Compute)}
    assert by_name["s"].args[1] == Scalar(1.0, DType.F32)
    assert by_name["r"].args[1] == Scalar(1.0, F16)       # 1.0001 rounds to 1 in f16
    same_results(out, k, FEEDS)


def test_a_mask_cast_back_to_bool_is_its_comparison():
    """torch's tril of a constant mask: cast(where(j <= i, 1, 0), bool) is j <= i."""
    B, I64 = DType.BOOL, DType.I64
    k = kernel([X], [buf("out", 4, 4)], loop("i", 4, loop(
        "j", 4, IndexValue("vi", v("i"), I64), IndexValue("vj", v("j"), I64),
        op("le", EwOp.LE, "vj", "vi", dtype=B),
        op("sel", EwOp.WHERE, "le", Scalar(1, I64), Scalar(0, I64), dtype=I64),
        CastTo("m", "sel", B), load("a", "x", v("j")),
        op("w", EwOp.WHERE, "m", "a", Scalar(float("-inf"), DType.F32)),
        store("out", "w", v("i"), v("j")))))
    out = eliminate_dead_code(fold_constants(k))
    masked = [s for s in walk(out.body) if isinstance(s, Compute) and s.dst == "w"][0]
    assert masked.args[0] == "le" and count(out, CastTo) == 0
    same_results(out, k, FEEDS)


def test_a_select_by_a_literal_is_its_arm():
    k = kernel([X], [OUT], loop(
        "i", 4, load("a", "x", v("i")), op("e", EXP, "a"),
        op("w", EwOp.WHERE, Scalar(True, DType.BOOL), "e", "a"), store("out", "w", v("i"))))
    out = fold_constants(k)
    assert [s.value for s in walk(out.body) if hasattr(s, "value")] == ["e"]
    same_results(out, k, FEEDS)


@pytest.mark.parametrize("fn", [EwOp.ERF, EwOp.LGAMMA])
def test_special_functions_of_literals_fold(fn):
    """erf and lgamma go through np.frompyfunc, which returns a Python float for one literal
    (EDL's Dirichlet KL: `torch.lgamma(torch.ones(...))`)."""
    k = kernel([X], [OUT], loop(
        "i", 4, op("t", fn, Scalar(0.5, DType.F32)), load("a", "x", v("i")),
        op("s", ADD, "a", "t"), store("out", "s", v("i"))))
    out = eliminate_dead_code(fold_constants(k))
    (s,) = [s for s in walk(out.body) if isinstance(s, Compute)]
    assert isinstance(s.args[1], Scalar) and s.args[1].dtype is DType.F32
    same_results(out, k, FEEDS)
