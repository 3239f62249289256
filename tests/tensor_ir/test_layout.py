"""Layout ops are IndexMaps with no arithmetic; checked against eager PyTorch."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from emmy.dtypes import DType
from emmy.tensor_ir.builder import Builder
from emmy.tensor_ir.decomp import layout
from emmy.tensor_ir.interp import run
from emmy.tensor_ir.ir import Elementwise, IndexMap, Input, TensorType

LAYOUT = {
    "view": lambda x: x.view(6, 20),
    "view_infer": lambda x: x.view(-1, 4),
    "reshape_split": lambda x: x.reshape(2, 3, 2, 10),
    "flatten": lambda x: x.flatten(),
    "flatten_middle": lambda x: x.flatten(1, 2),
    "unflatten": lambda x: x.unflatten(2, (2, 5)),
    "permute": lambda x: x.permute(2, 0, 1),
    "transpose": lambda x: x.transpose(0, 2),
    "t": lambda x: x[0].t(),
    "mT": lambda x: x.mT,
    "T": lambda x: x[0].T,
    "movedim": lambda x: x.movedim(0, 2),
    "expand": lambda x: x[:, :1].expand(2, 3, 5, 10),
    "expand_as": lambda x: x[:1].expand_as(x),
    "unsqueeze": lambda x: x.unsqueeze(1),
    "roll": lambda x: torch.roll(x, 2, 1),
    "roll_two_dims": lambda x: torch.roll(x, (1, -7), (0, 2)),
    "roll_flat": lambda x: torch.roll(x, 13),
    "diagonal": lambda x: torch.diagonal(x, -1, 0, 2),
    "diag_of_matrix": lambda x: torch.diag(x[0], 2),
    "diag_embed_vector": lambda x: torch.diag(x[0, 0], -3),
    "index_none": lambda x: x[None, :, None],
    "squeeze": lambda x: x[:, :1].squeeze(),
    "squeeze_dim": lambda x: x[:, :1].squeeze(1),
    "slice": lambda x: x[:, 1:3],
    "slice_step": lambda x: x[:, :, 1:9:3],
    "slice_negative": lambda x: x[-2:, :, :-1],
    "select": lambda x: x[1],
    "select_negative": lambda x: x[:, -1],
    "narrow": lambda x: x.narrow(2, 2, 5),
    "flip": lambda x: x.flip(0, 2),
    "contiguous": lambda x: x.transpose(0, 1).contiguous(),
    "clone": lambda x: x.clone(),
    "repeat": lambda x: x.repeat(2, 1, 1),
    "repeat_new_axis": lambda x: x[0].repeat(2, 1, 3),
    "repeat_interleave": lambda x: x.repeat_interleave(3, 1),
    "repeat_interleave_negative_dim": lambda x: x.repeat_interleave(2, dim=-1),
    "repeat_interleave_flat": lambda x: x[:, :2, :3].repeat_interleave(2),
    "split": lambda x: x.split(3, dim=2),
    "chunk": lambda x: x.chunk(2, dim=0),
    "unbind": lambda x: x.unbind(1),
    "cat": lambda x: torch.cat([x, x.flip(2)], 2),
    "cat_three": lambda x: torch.cat([x[:, :1], x, x[:, 2:]], 1),
    "stack": lambda x: torch.stack([x[0], x[1], x[2]], 1),
    "broadcast_tensors": lambda x: torch.broadcast_tensors(x, x[0, :1]),
    "view_of_transpose": lambda x: x.transpose(1, 2).reshape(3, 40),
}


@pytest.mark.parametrize("name", LAYOUT)
def test_layout(check, name):
    check(LAYOUT[name], torch.randn(3, 4, 10))


PURE = ["view", "permute", "transpose", "expand", "slice_step", "select", "flip", "repeat",
        "view_of_transpose", "movedim", "unflatten", "roll", "roll_two_dims", "diagonal"]


@pytest.mark.parametrize("name", PURE)
def test_views_are_one_index_map_without_arithmetic(check, name):
    program = check(LAYOUT[name], torch.randn(3, 4, 10))
    body = [d for d in program.defs if not isinstance(d, Input)]
    assert len(body) <= 1 and all(isinstance(d, IndexMap) for d in body)


def test_chained_views_compose_into_one_index_map(check):
    program = check(lambda x: x.permute(2, 0, 1).reshape(10, 12).t().flip(0)[1:, ::2],
                    torch.randn(3, 4, 10))
    body = [d for d in program.defs if not isinstance(d, Input)]
    assert len(body) == 1 and isinstance(body[0], IndexMap)


def test_transpose_twice_is_the_input_itself(check):
    """(returned, it is copied: one identity index map of the input)"""
    program = check(lambda x: x.transpose(0, 1).transpose(1, 0), torch.randn(3, 4))
    (out,) = [d for d in program.defs if d.name == program.outputs[0]]
    assert len(program.defs) == 2 and out.arg == program.inputs[0].name


def test_arithmetic_on_transposed_views(check):
    program = check(lambda x, y: x.t() * 2 + y, torch.randn(3, 4), torch.randn(4, 3))
    assert sum(isinstance(d, Elementwise) for d in program.defs) == 2


CREATION = {
    "zeros_like": lambda x: torch.zeros_like(x) + x,
    "ones": lambda x: x + torch.ones(4, 10),
    "full": lambda x: torch.full((3, 4, 10), 2.5) * x,
    "arange": lambda x: x + torch.arange(10),
    "arange_float": lambda x: x * torch.arange(0.5, 5.5, 0.5),
    "tril": lambda x: torch.tril(x),
    "triu_offset": lambda x: torch.triu(x, 1),
    "new_zeros": lambda x: x.new_zeros(2, 3) + 1,
    "eye": lambda x: x[0] + torch.eye(4, 10),
    "eye_square_half": lambda x: x[0, :, :4].half() * torch.eye(4, dtype=torch.float16),
    "one_hot": lambda x: torch.nn.functional.one_hot(x.argmax(2), 10),
}


@pytest.mark.parametrize("name", CREATION)
def test_creation(check, name):
    check(CREATION[name], torch.randn(3, 4, 10))


# ---- property: chains of views agree with numpy and compose into one IndexMap ----------------

FACTORS = [2, 2, 2, 3, 3, 4, 5]


@st.composite
def view_chains(draw):
    factors = draw(st.lists(st.sampled_from(FACTORS), min_size=1, max_size=4))
    steps = draw(st.lists(st.tuples(st.sampled_from(["reshape", "permute", "flip", "slice"]),
                                    st.randoms(use_true_random=False)), max_size=4))
    return tuple(factors), steps


def _regroup(factors, rng):
    """A random shape with the same number of elements."""
    numel = int(np.prod(factors))
    shape = []
    for f in sorted(_prime_factors(numel), key=lambda _: rng.random()):
        if shape and rng.random() < 0.5:
            shape[-1] *= f
        else:
            shape.append(f)
    return shape or [1]


def _prime_factors(n):
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


@settings(max_examples=60, deadline=None)
@given(view_chains())
def test_view_chains_match_numpy_and_stay_one_index_map(chain):
    factors, steps = chain
    data = np.arange(int(np.prod(factors)), dtype=np.float32).reshape(factors)
    b = Builder("p")
    x = b.input("x", TensorType(tuple(factors), DType.F32))
    y, want = x, data
    for kind, rng in steps:
        if kind == "reshape":
            shape = _regroup(want.shape, rng)
            y, want = layout.reshape(b, y, shape), want.reshape(shape)
        elif kind == "permute":
            dims = list(range(want.ndim))
            rng.shuffle(dims)
            y, want = layout.permute(b, y, dims), want.transpose(dims)
        elif kind == "flip":
            d = rng.randrange(want.ndim)
            y, want = layout.flip(b, y, [d]), np.flip(want, d)
        else:
            d = rng.randrange(want.ndim)
            start, step = rng.randrange(want.shape[d]), rng.choice([1, 2])
            y, want = layout.slice_axis(b, y, d, start, None, step), \
                np.take(want, range(start, want.shape[d], step), axis=d)
    program = b.finish([y])
    (got,) = run(program, {"x": data})
    np.testing.assert_array_equal(got, want)
    assert len(program.defs) <= 2


def test_a_program_returning_an_input_returns_a_copy():
    """`x.reshape(-1)` of a vector is x itself: the program copies it into an output of its
    own (found by bench/fuzz.py: with no kernel, the check read an output never written)."""
    from tests.tensor_ir.emitted import assert_emitted_cuda_matches_eager

    stages = assert_emitted_cuda_matches_eager("torch.randn(17,).reshape(-1)")
    assert len(stages["loop"].kernels) == 1
    assert stages["loop"].outputs[0].name not in {b.name for b in stages["loop"].inputs}


def test_sample_frequencies_and_resized_fresh_tensors(check):
    """torch.fft.fftfreq / rfftfreq (a spectral solver's wave numbers) as torch computes them,
    odd and even lengths; `x.new().resize_(shape).fill_(1)` and `.resize_as_(x)` (DeepGuidedFilter,
    reid-strong-baseline) as tensors of that shape; a resize to fewer elements keeps the first."""
    check(lambda x: (x * torch.fft.fftfreq(7, d=0.1), torch.fft.fftfreq(8),
                     torch.fft.rfftfreq(9, d=0.5), torch.fft.rfftfreq(8, d=0.25) + x[0, :5],
                     x.new().resize_((2, 7)).fill_(1.0) + x,
                     x.new().resize_as_(x).fill_(2) * x,
                     x.reshape(14).clone().resize_((3, 4))),
          torch.randn(2, 7))


def test_as_strided_of_a_contiguous_tensor(check):
    """HF Longformer's `_chunk`: overlapping windows as a stride of half a window, and
    icefall's relative shift (a row stride one less than the row), with an offset."""
    def chunk(x):
        h = x.view(2, 2, 8, 8)
        size, stride = list(h.size()), list(h.stride())
        size[1], stride[1] = 3, stride[1] // 2
        shifted = x.reshape(2, 16, 8).as_strided((2, 15, 7), (128, 7, 1), 1)
        return h.as_strided(size=size, stride=stride) * 2, shifted

    check(chunk, torch.randn(2, 16, 8))


def test_as_strided_of_a_view_that_is_not_contiguous_is_refused():
    from emmy.errors import UserError
    from emmy.torch_ir.capture import capture
    from tests.tensor_ir.conftest import Fn

    with pytest.raises(UserError, match="as_strided.* not contiguous"):
        capture(Fn(lambda x: x.t().as_strided((4, 4), (1, 4))), (torch.randn(4, 6),))
