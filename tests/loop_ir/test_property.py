"""Random programs: Loop IR (fused, normalized or not) computes what Tensor IR computes."""

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emmy import symbolic
from emmy.dtypes import DType
from emmy.errors import InternalError
from emmy.loop_ir import interp
from emmy.loop_ir.lower import lower
from emmy.loop_ir.normalize import normalize
from emmy.loop_ir.verify import verify
from emmy.tensor_ir import interp as tensor_interp
from emmy.tensor_ir.builder import Builder
from emmy.tensor_ir.ir import EwOp, ReduceOp, TensorType, axis_var, gather_var

from .programs import check_torch, random_feeds

F64 = DType.F64
UNARY = [EwOp.NEG, EwOp.ABS, EwOp.EXP, EwOp.TANH, EwOp.SIGMOID, EwOp.SIN, EwOp.COS]
BINARY = [EwOp.ADD, EwOp.SUB, EwOp.MUL, EwOp.MAX, EwOp.MIN]
SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def shape_of(b, x):
    return b.shape(x)


def unary(draw, b, x, values):
    return b.ew(draw(st.sampled_from(UNARY)), x)


def binary(draw, b, x, values):
    y = draw(st.sampled_from(values))
    op = draw(st.sampled_from(BINARY + [EwOp.DIV]))
    try:
        if op is EwOp.DIV:  # a denominator away from zero
            return b.ew(op, x, b.ew(EwOp.ADD, b.ew(EwOp.MUL, y, y), 1.0))
        return b.ew(op, x, y)
    except InternalError:  # shapes that do not broadcast
        return b.ew(op, x, 0.5) if op is not EwOp.DIV else b.ew(op, x, 3.0)


def select(draw, b, x, values):
    y = draw(st.sampled_from(values))
    try:
        return b.ew(EwOp.WHERE, b.ew(EwOp.GT, x, 0.0), x, y)
    except InternalError:
        return b.ew(EwOp.WHERE, b.ew(EwOp.GT, x, 0.0), x, -1.0)


def reduction(draw, b, x, values):
    rank = len(shape_of(b, x))
    if rank == 0:
        return x
    op = draw(st.sampled_from(list(ReduceOp)))
    axes = draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True))
    if op in (ReduceOp.ARGMAX, ReduceOp.ARGMIN):
        axes = axes[:1]
    out = b.reduce(op, x, axes, keepdim=draw(st.booleans()))
    return b.cast(out, F64) if op in (ReduceOp.ARGMAX, ReduceOp.ARGMIN) else out


def scan(draw, b, x, values):
    rank = len(shape_of(b, x))
    if rank == 0:
        return x
    op = draw(st.sampled_from([ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MAX, ReduceOp.MIN]))
    return b.scan(op, x, draw(st.integers(0, rank - 1)), reverse=draw(st.booleans()),
                  exclusive=draw(st.booleans()))


def transpose(draw, b, x, values):
    shape = shape_of(b, x)
    perm = draw(st.permutations(range(len(shape))))
    out = tuple(shape[p] for p in perm)
    return b.index_map(x, out, [symbolic.var(axis_var(perm.index(i))) for i in range(len(shape))])


def broadcast(draw, b, x, values):
    shape = shape_of(b, x)
    if len(shape) >= 3:
        return x
    at, extent = draw(st.integers(0, len(shape))), draw(st.integers(2, 3))
    out = shape[:at] + (extent,) + shape[at:]
    return b.index_map(x, out, [symbolic.var(axis_var(i if i < at else i + 1))
                                for i in range(len(shape))])


def reshape(draw, b, x, values):
    """Flatten, or split the flat index into two factors when the size allows."""
    shape = shape_of(b, x)
    numel = int(np.prod(shape)) if shape else 1
    cut = draw(st.sampled_from([d for d in range(1, numel + 1) if numel % d == 0]))
    out = (cut, numel // cut) if draw(st.booleans()) else (numel,)
    bounds = {axis_var(i): n for i, n in enumerate(out)}
    flat = symbolic.var("a0") * out[1] + symbolic.var("a1") if len(out) == 2 else symbolic.var("a0")
    index, stride = [], numel
    for n in shape:
        stride //= n
        index.append(symbolic.mod(symbolic.floordiv(flat, stride, bounds), n, bounds))
    return b.index_map(x, out, index)


def flip_or_slice(draw, b, x, values):
    shape = shape_of(b, x)
    if not shape:
        return x
    axis = draw(st.integers(0, len(shape) - 1))
    n = shape[axis]
    start = draw(st.integers(0, n - 1))
    size = draw(st.integers(1, n - start))
    flip = draw(st.booleans())
    out = shape[:axis] + (size,) + shape[axis + 1:]
    pos = symbolic.var(axis_var(axis))
    at = pos * -1 + (start + size - 1) if flip else pos + start
    return b.index_map(x, out, [at if i == axis else symbolic.var(axis_var(i))
                                for i in range(len(shape))])


def round_trip(draw, b, x, values):
    low = draw(st.sampled_from([DType.F32, DType.F16, DType.BF16]))
    return b.cast(b.cast(x, low), F64)


def position(draw, b, x, values):
    shape = shape_of(b, x)
    if not shape:
        return x
    return b.ew(EwOp.ADD, x, b.cast(b.iota(shape, draw(st.integers(0, len(shape) - 1))), F64))


def gather(draw, b, x, values):
    """x read along one axis at positions computed from another value's data (negative ones
    wrap, the rest clamp: the builder's rule), so a computed source is stored first."""
    shape = shape_of(b, x)
    y = draw(st.sampled_from(values))
    if not shape or not shape_of(b, y):
        return x
    try:
        at = b.broadcast_to(y, shape)
    except InternalError:
        at = x
    positions = b.cast(b.ew(EwOp.MUL, b.ew(EwOp.TANH, at), 4.0), DType.I64)   # -4..4
    axis = draw(st.integers(0, len(shape) - 1))
    index = [symbolic.var(gather_var(0) if j == axis else axis_var(j)) for j in range(len(shape))]
    return b.gather(x, shape, index, [positions])


STEPS = [unary, binary, select, reduction, scan, transpose, broadcast, reshape, flip_or_slice,
         round_trip, position, gather, gather]


@st.composite
def programs(draw):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    b = Builder("random")
    values = [b.input("x", TensorType(shape, F64))]
    if draw(st.booleans()):
        tail = shape[draw(st.integers(0, len(shape) - 1)):]
        values.append(b.input("y", TensorType(tuple(n if draw(st.booleans()) else 1
                                                    for n in tail), F64)))
    made = []
    for _ in range(draw(st.integers(1, 7))):
        step = draw(st.sampled_from(STEPS))
        x = draw(st.sampled_from(values))
        made.append(step(draw, b, x, values))
        values.append(made[-1])
    outputs = draw(st.lists(st.sampled_from(made), min_size=1, max_size=3, unique=True))
    return b.finish(outputs)


@SETTINGS
@given(programs(), st.integers(0, 2**16))
def test_random_programs_agree_with_the_tensor_ir(program, seed):
    feeds = {name: t.numpy() for name, t in random_feeds(program, seed).items()}
    want = tensor_interp.run(program, feeds)
    for normalized in (True, False):
        lp = lower(program, normalized=normalized)
        for k in lp.kernels:
            verify(k)
            if normalized:
                assert normalize(k) == k
        got = interp.run(lp, feeds)
        for b, g, w in zip(lp.outputs, got, want):
            assert g.shape == w.shape, b.name
            np.testing.assert_allclose(g, w, rtol=2e-3, atol=1e-9, err_msg=f"{b.name} "
                                       f"(normalized={normalized})")


TORCH_STEPS = [
    lambda x: torch.softmax(x, -1),
    lambda x: torch.log_softmax(x, 0),
    lambda x: torch.cumsum(x, -1),
    lambda x: x.sum(-1, keepdim=True) * x,
    lambda x: x - x.mean(0),
    lambda x: x.amax(-1, keepdim=True) + x,
    lambda x: x.T.contiguous(),
    lambda x: torch.relu(x) + torch.sigmoid(x),
    lambda x: x @ x.T,
    lambda x: torch.flip(x, [0]),
    lambda x: torch.layer_norm(x, x.shape[-1:]),
    lambda x: x.reshape(-1).reshape(x.shape[::-1]),
]


@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(range(len(TORCH_STEPS))), min_size=1, max_size=4),
       st.integers(2, 5), st.integers(2, 5))
def test_random_torch_functions_agree_with_eager(steps, m, n):
    def fn(x):
        for i in steps:
            x = TORCH_STEPS[i](x)
        return x

    x = torch.randn(m, n, generator=torch.Generator().manual_seed(m * 7 + n), dtype=torch.float64)
    lp = check_torch(fn, x)
    (got,) = interp.run(lp, {lp.inputs[0].name: x})
    np.testing.assert_allclose(got, fn(x).numpy(), rtol=1e-7, atol=1e-9)
