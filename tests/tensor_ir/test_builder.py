"""The Builder's canonical forms: composed and identity index maps, explicit broadcasts, CSE."""

import numpy as np
import pytest

from emmy.dtypes import DType
from emmy.errors import InternalError
from emmy.symbolic import lin, var
from emmy.tensor_ir.builder import Builder, broadcast_shapes, promote
from emmy.tensor_ir.interp import run
from emmy.tensor_ir.ir import Cast, Elementwise, EwOp, IndexMap, Reduce, ReduceOp, Scan, TensorType

a0, a1, a2 = var("a0"), var("a1"), var("a2")


def _builder(*shapes, dtype=DType.F32):
    b = Builder("t")
    names = [b.input(f"x{i}", TensorType(s, dtype)) for i, s in enumerate(shapes)]
    return b, names


def test_index_map_of_index_map_composes_into_one():
    b, (x,) = _builder((4, 6))
    t = b.index_map(x, (6, 4), [a1, a0])                  # transpose
    s = b.index_map(t, (3, 4), [a0 * 2, a1])              # every other row of the transpose
    d = b.defs[s]
    assert isinstance(d, IndexMap) and d.arg == x
    assert d.index == (a1, a0 * 2)
    p = b.finish([s])
    assert len(p.defs) == 2  # the input and one index map; the intermediate transpose is dead


def test_identity_index_map_returns_its_argument():
    b, (x,) = _builder((4, 6))
    assert b.index_map(x, (4, 6), [a0, a1]) == x
    t = b.index_map(x, (6, 4), [a1, a0])
    assert b.index_map(t, (4, 6), [a1, a0]) == x


def test_reshape_round_trip_is_the_identity():
    from emmy.tensor_ir.decomp.layout import reshape

    b, (x,) = _builder((4, 6))
    assert reshape(b, reshape(b, x, (2, 2, 3, 2)), (4, 6)) == x
    assert reshape(b, reshape(b, x, (24,)), (4, 6)) == x


def test_extent_one_axes_index_with_zero():
    b, (x,) = _builder((4, 1))
    y = b.index_map(x, (4, 1), [a0, a1])
    assert y == x


def test_elementwise_broadcasting_is_explicit():
    b, (x, y) = _builder((4, 1), (6,))
    z = b.ew(EwOp.ADD, x, y)
    add = b.defs[z]
    assert add.type.shape == (4, 6)
    left, right = (b.defs[a] for a in add.args)
    assert isinstance(left, IndexMap) and left.index == (a0, lin(0))
    assert isinstance(right, IndexMap) and right.index == (a1,)


def test_neutral_literals_vanish():
    b, (x,) = _builder((4,))
    assert b.ew(EwOp.MUL, x, 1) == x
    assert b.ew(EwOp.ADD, 0, x) == x
    assert b.ew(EwOp.DIV, x, 1.0) == x
    assert b.ew(EwOp.SUB, x, 0) == x
    assert b.ew(EwOp.SUB, 0, x) != x


def test_same_definition_twice_is_one():
    b, (x,) = _builder((4,))
    assert b.ew(EwOp.MUL, x, x) == b.ew(EwOp.MUL, x, x)
    assert b.index_map(x, (2, 4), [a1]) == b.index_map(x, (2, 4), [a1])


def test_cast_to_the_same_type_is_nothing():
    b, (x,) = _builder((4,))
    assert b.cast(x, DType.F32) == x
    assert isinstance(b.defs[b.cast(x, DType.F16)], Cast)


def test_operands_are_promoted_like_torch():
    b, (i, f) = _builder((4,), (4,), dtype=DType.I64)
    assert b.dtype(b.ew(EwOp.ADD, i, 1)) is DType.I64
    assert b.dtype(b.ew(EwOp.ADD, i, 0.5)) is DType.F32
    assert b.dtype(b.ew(EwOp.LT, i, 0.5)) is DType.BOOL
    assert promote((DType.F16, 2), (DType.F32, 1)) is DType.F16   # a rank-0 f32 does not widen
    assert promote((DType.F16, 2), (DType.BF16, 2)) is DType.F32
    assert promote((DType.BOOL, 2), (DType.I64, 0)) is DType.I64


def test_reduce_keepdim_and_extent_one_axes():
    b, (x,) = _builder((4, 1, 6))
    r = b.reduce(ReduceOp.SUM, x, [1])           # only an extent-1 axis: a squeeze, no Reduce
    assert isinstance(b.defs[r], IndexMap) and b.shape(r) == (4, 6)
    k = b.reduce(ReduceOp.MAX, x, [1, 2], keepdim=True)
    assert b.shape(k) == (4, 1, 1)
    (red,) = [d for d in b.defs.values() if isinstance(d, Reduce)]
    assert red.axes == (2,)


def test_scan_of_a_flip_is_a_reversed_scan():
    from emmy.tensor_ir.decomp.layout import flip

    b, (x,) = _builder((4, 6))
    s = flip(b, b.scan(ReduceOp.SUM, flip(b, x, [1]), 1), [1])
    d = b.defs[s]
    assert isinstance(d, Scan) and d.reverse and d.arg == x


def test_out_of_bounds_index_map_is_an_internal_error():
    b, (x,) = _builder((4,))
    with pytest.raises(InternalError):
        b.index_map(x, (5,), [a0])


def test_broadcast_shapes():
    assert broadcast_shapes((4, 1), (6,)) == (4, 6)
    assert broadcast_shapes((), (3,)) == (3,)
    with pytest.raises(InternalError):
        broadcast_shapes((4,), (3,))


def test_finish_numbers_names_in_order_and_drops_dead_code():
    b, (x,) = _builder((4,))
    b.ew(EwOp.EXP, x)                      # dead
    y = b.ew(EwOp.NEG, x)
    z = b.ew(EwOp.ABS, y)
    p = b.finish([z])
    assert [d.name for d in p.defs] == ["x0", "v0", "v1"]
    assert p.outputs == ("v1",)
    assert isinstance(p.defs[2], Elementwise) and p.defs[2].args == ("v0",)
    (out,) = run(p, {"x0": np.array([1.0, -2.0, 3.0, -4.0], np.float32)})
    assert out.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_bits_reads_a_float_as_an_integer_of_its_width():
    b, (x,) = _builder((5,))
    bits = b.ew(EwOp.BITS, x)
    assert b.dtype(bits) is DType.I32
    values = np.array([1.0, -2.5, 0.0, -0.0, np.inf], np.float32)
    (got,) = run(b.finish([bits]), {"x0": values})
    np.testing.assert_array_equal(got, values.view(np.int32))
    wide, (y,) = _builder((2,), dtype=DType.F64)
    assert wide.dtype(wide.bits(y)) is DType.I64
    half, (h,) = _builder((2,), dtype=DType.F16)
    with pytest.raises(InternalError, match="cast to f32 or f64 first"):
        half.bits(h)
