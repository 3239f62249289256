"""The verifier names the broken invariant."""

import pytest

from emmy.dtypes import DType
from emmy.errors import InternalError
from emmy.loop_ir.ir import Accum, Init, LoopKind, ReduceOp
from emmy.loop_ir.verify import verify
from emmy.tensor_ir.ir import EwOp

from .programs import buf, kernel, load, loop, op, reduce, store, v

X, OUT = buf("x", 4), buf("out", 4)


@pytest.mark.parametrize("body, message", [
    (loop("i", 4, op("b", EwOp.EXP, "a"), store("out", "b", v("i"))), "`a` is read outside"),
    (loop("i", 4, load("a", "x", v("j")), store("out", "a", v("i"))), "not enclosing loops"),
    (loop("i", 4, load("a", "y", v("i")), store("out", "a", v("i"))), "not an input"),
    (loop("i", 4, load("a", "x", v("i"), 0), store("out", "a", v("i"))), "2 indices"),
    (loop("i", 4, load("a", "x", v("i")), load("a", "x", v("i")), store("out", "a", v("i"))),
     "defined twice"),
    (loop("i", 4, Init("s", ReduceOp.SUM, DType.F32), loop(
        "j", 4, load("a", "x", v("j")), Accum("s", ReduceOp.SUM, "a")), store("out", "s", v("i"))),
     "reduce/scan loops"),
    (loop("i", 4, Init("s", ReduceOp.MAX, DType.F32), reduce(
        "j", 4, load("a", "x", v("j")), Accum("s", ReduceOp.SUM, "a")), store("out", "s", v("i"))),
     "initialized for max"),
    (loop("i", 4, Init("s", ReduceOp.SUM, DType.F32), reduce(
        "j", 4, load("a", "x", v("j")), Accum("s", ReduceOp.SUM, "a"),
        op("b", EwOp.EXP, "s")), store("out", "s", v("i"))), "read inside a reduce loop"),
])
def test_broken_kernels_are_refused(body, message):
    with pytest.raises(InternalError, match=message):
        verify(kernel([X], [OUT], body))


def test_a_scan_may_read_its_running_value():
    k = kernel([X], [OUT], Init("s", ReduceOp.SUM, DType.F32), loop(
        "i", 4, load("a", "x", v("i")), Accum("s", ReduceOp.SUM, "a"), store("out", "s", v("i")),
        kind=LoopKind.SCAN))
    assert verify(k) is k
