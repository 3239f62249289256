"""Complex tensors as pairs of real ones (emmy.tensor_ir.complex): every rule against eager on
random inputs, no complex type past the Torch IR, complex inputs, parameters and outputs
stored as (real, imaginary) pairs, and a clear refusal of what is not lowered."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import torch
import torch.nn as nn

from emmy.dtypes import DType, as_stored, as_user
from emmy.errors import UnsupportedOp, UserError
from emmy.tensor_ir.ir import Elementwise, Input
from emmy.tensor_ir.lower import SUPPORTED_OPS, lower
from emmy.torch_ir.capture import capture
from tests.tensor_ir.conftest import check_module


def _z(*shape, dtype=torch.complex64):
    return torch.randn(*shape, dtype=dtype)


def _no_complex(program) -> None:
    assert not any(d.type.dtype.is_complex for d in program.defs)


def llama_rotary(xq, xk, freqs_cis):
    """The Llama reference code's apply_rotary_emb."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def freqs(dim: int, end: int):
    f = 1.0 / (10000.0 ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    angles = torch.outer(torch.arange(end).float(), f)
    return torch.polar(torch.ones_like(angles), angles)


class Rotary(nn.Module):
    def __init__(self, seq: int, dim: int):
        super().__init__()
        self.register_buffer("freqs_cis", freqs(dim, seq))

    def forward(self, xq, xk):
        return llama_rotary(xq, xk, self.freqs_cis)


def test_llama_rotary_with_a_complex_buffer_is_real_arithmetic():
    x = torch.randn(2, 6, 3, 16)
    program = check_module(Rotary(6, 16), x, torch.randn(2, 6, 3, 16))
    _no_complex(program)
    buffer = next(d for d in program.defs if isinstance(d, Input) and d.name == "freqs_cis")
    assert buffer.type.shape == (6, 8, 2) and buffer.type.dtype is DType.F32
    assert program.values["freqs_cis"].shape == (6, 8, 2)


def test_llama_rotary_with_freqs_cis_an_input_in_half_precision():
    x = torch.randn(1, 5, 2, 8, dtype=torch.float16)
    check_module(llama_rotary, x, x.flip(1), freqs(8, 5))


@pytest.mark.parametrize("fn", [
    lambda z, w, y: z * w,
    lambda z, w, y: z / w,
    lambda z, w, y: z + w - 2 * z,
    lambda z, w, y: z * y + y / w - z / y,           # real tensors among complex ones
    lambda z, w, y: y - z,
    lambda z, w, y: z * 1j + (2 - 3j),
    lambda z, w, y: torch.add(z, w, alpha=2),
    lambda z, w, y: -z.conj() + w.conj_physical(),
    lambda z, w, y: torch.exp(z) + torch.log(w) + torch.sqrt(z),
    lambda z, w, y: z ** 2 + w ** -1 + z ** 3 + 1 / z,
    lambda z, w, y: (z.abs(), z.angle(), z.real, z.imag, (z * w.conj()).real),
    lambda z, w, y: torch.polar(y.abs(), y) + torch.complex(y, -y),
    lambda z, w, y: y.to(torch.complex64) + 1,
    lambda z, w, y: (z == w, z != z, z == 0),
], ids=["mul", "div", "add_sub", "mixed_real", "rsub", "literals", "alpha", "conj", "exp_log_sqrt",
        "pow", "to_real", "polar", "cast", "compare"])
def test_arithmetic_matches_eager(fn):
    torch.manual_seed(0)
    _no_complex(check_module(fn, _z(3, 5), _z(3, 5), torch.randn(3, 5)))


@pytest.mark.parametrize("fn", [
    lambda z, y: (z.sum(-1), z.mean(0), z.sum()),
    lambda z, y: (z.permute(1, 0, 2)[1:, :, ::2], z.transpose(0, 2).reshape(4, -1), z[:, 1]),
    lambda z, y: tuple(z.split(2, 1)) + tuple(z.unbind(0)),
    lambda z, y: (torch.cat([z, y], 1), torch.stack([z, z.conj()], -1)),
    lambda z, y: (torch.where(y > 0, z, 0), torch.where(y > 0, y, z), z.masked_fill(y < 0, 2j)),
    lambda z, y: (z.flip(0), z.expand(2, 2, 3, 4), z.unsqueeze(1).squeeze(1), z.clone()),
    lambda z, y: z[torch.tensor([1, 0, 1])],
    lambda z, y: (z.cumsum(1), torch.zeros_like(z), torch.ones_like(z), torch.full_like(z, 1 - 2j)),
], ids=["sums", "views", "split", "cat_stack", "where", "layout", "index", "creation"])
def test_views_sums_and_indexing_are_by_parts(fn):
    torch.manual_seed(1)
    _no_complex(check_module(fn, _z(2, 3, 4), torch.randn(2, 3, 4)))


@pytest.mark.parametrize("fn", [
    lambda a, b: a @ b,
    lambda a, b: torch.bmm(a.unsqueeze(0), b.unsqueeze(0)),
    lambda a, b: torch.einsum("ij,jk->ik", a, b),
    lambda a, b: a @ b.conj(),
    lambda a, b: (a.unsqueeze(0).expand(2, 4, 6) @ b).sum(0),
])
def test_products_are_real_products(fn):
    torch.manual_seed(2)
    _no_complex(check_module(fn, _z(4, 6), _z(6, 3)))


def test_complex128_computes_in_float64():
    program = check_module(lambda z, w: z * w + z.abs(), _z(4, dtype=torch.complex128),
                           _z(4, dtype=torch.complex128))
    assert {d.type.dtype for d in program.defs if isinstance(d, Elementwise)} <= \
        {DType.F64, DType.BOOL}


def test_a_conjugate_view_input_is_read_conjugated():
    z = _z(3)
    got = lower(capture(nn.Identity(), (z,)))
    assert got.get(got.outputs[0]).type.shape == (3, 2)
    assert torch.equal(as_stored(z.conj()), torch.view_as_real(z.conj().resolve_conj()))
    assert torch.equal(as_user(as_stored(z), DType.C64), z)


def test_an_op_not_lowered_on_complex_values_is_refused_by_name():
    with pytest.raises(UnsupportedOp, match="not on complex tensors") as info:
        lower(capture(_Sigmoid(), (_z(4),)))
    assert info.value.op == "sigmoid"
    assert "return torch.sigmoid(z)" in str(info.value)


class _Sigmoid(nn.Module):
    def forward(self, z):
        return torch.sigmoid(z)


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_complex32_is_refused_as_an_element_type():
    with pytest.raises(UserError, match="unsupported element type torch.complex32"):
        capture(nn.Identity(), (torch.zeros(4, dtype=torch.complex32),))


def test_emmy_ops_lists_the_ops_of_complex_values():
    assert {"view_as_complex", "view_as_real", "polar", "angle", "conj", "_conj"} <= \
        set(SUPPORTED_OPS)


class _Mixed(nn.Module):
    """A complex input, a complex parameter, complex and real outputs."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(5, dtype=torch.complex64))

    def forward(self, z, y):
        a = z * self.w + y
        return a, (a * a.conj()).real.sum(-1), torch.view_as_real(torch.exp(a) / self.w)


def test_emitted_cuda_of_complex_values_passes_on_the_emulator_and_on_fresh_inputs():
    """The kernels on the CPU emulator, then the harness's fresh draws (complex inputs drawn
    anew as pairs of real values)."""
    from emmy.bench.harness import check_program, make_cases
    from emmy.check import check_cuda_program
    from emmy.frontend.workload import Workload
    from emmy.pipeline import Options, compile_to

    torch.manual_seed(3)
    model = _Mixed().eval()
    inputs = (_z(3, 5), torch.randn(3, 5))
    workload = Workload(name="mixed", model=model, inputs=inputs, source="", origin="<test>")
    stages = compile_to(workload, "cuda", Options(target="sm_90a"))
    report, _ = check_cuda_program(workload, stages["torch"], stages["cuda"])
    assert report is not None and report.ok, report
    assert [o.type.shape for o in stages["cuda"].outputs] == [(3, 5, 2), (3,), (3, 5, 2)]
    case = make_cases(workload, stages["torch"], seeds=(1,), distributions=("normal",))[0]
    assert case.args[0].dtype == torch.complex64 and not torch.equal(case.args[0], inputs[0])
    assert check_program(workload, stages["torch"], stages["cuda"], device="cpu").verdict == "ok"


def test_emmy_compile_returns_complex_outputs_as_complex():
    import emmy

    model = _Mixed().eval()
    z, y = _z(2, 5), torch.randn(2, 5)
    compiled = emmy.compile(model, z, y, db=None, run="emulate")
    got, want = compiled(z, y), model(z, y)
    assert [g.dtype for g in got] == [torch.complex64, torch.float32, torch.float32]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w.detach(), atol=1e-4, rtol=1e-4)


def test_cli_refuses_an_op_on_complex_values_with_exit_2(capsys):
    from emmy.cli import main

    rc = main(["run", "-c", "torch.sigmoid(torch.randn(4, dtype=torch.cfloat))", "--check"])
    err = capsys.readouterr().err
    assert rc == 2 and "unsupported op `sigmoid`" in err and "not on complex tensors" in err
    assert "Traceback" not in err


def test_division_by_zero_and_across_magnitudes_is_torchs_to_the_bit():
    """Smith's division, as torch's kernel: huge and tiny divisors without overflow, a zero
    divisor the parts' own infinities and NaNs."""
    import numpy as np

    from emmy.tensor_ir.interp import run
    from tests.tensor_ir.conftest import Fn

    inf = float("inf")
    z = torch.tensor([1 + 1j, 0j, 1 + 0j, complex(inf, 0), 3 - 2j, 1e30 + 1e30j, 2 + 0j, -1j])
    w = torch.tensor([0j, 0j, complex(inf, 0), 1 + 1j, 1e-30 + 1e30j, 1e30 - 1e30j, 0j, 0j])
    graph = capture(Fn(lambda z, w: (z / w, torch.reciprocal(w))), (z, w))
    got = run(lower(graph), {"args_0": z, "args_1": w})
    for g, want in zip(got, (z / w, torch.reciprocal(w))):
        assert np.array_equal(g, torch.view_as_real(want).numpy(), equal_nan=True)


_UNARY = [
    ("neg", lambda a: -a), ("conj", lambda a: a.conj()), ("exp", lambda a: torch.exp(0.3 * a)),
    ("square", lambda a: a * a), ("flip", lambda a: a.flip(-1)),
    ("transpose", lambda a: a.transpose(0, 1).reshape(a.shape)),
    ("sum", lambda a: a.sum(0, keepdim=True).expand(a.shape)),
    ("abs", lambda a: a.abs()), ("real", lambda a: a.real), ("angle", lambda a: a.angle()),
]
_BINARY = [
    ("add", lambda a, b: a + b), ("sub", lambda a, b: a - b), ("mul", lambda a, b: a * b),
    ("div", lambda a, b: a / (b.abs() + 1) if b.is_complex() else a / (b.abs() + 1)),
    ("cdiv", lambda a, b: a / (b + 2.5 + 0.5j) if b.is_complex() else a / (b + 2.5)),
    ("cat", lambda a, b: torch.cat([a, b], 0)[: a.shape[0]] if a.shape == b.shape else a + b),
    ("matmul", lambda a, b: a @ b.transpose(0, 1).conj() if a.is_complex() == b.is_complex()
     else a + b),
]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          derandomize=True)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 100), st.integers(0, 2),
                          st.integers(0, 2)), min_size=1, max_size=7))
def test_random_programs_of_complex_ops_match_eager(steps):
    """Chains of unary and binary ops over two complex inputs and a real one (each step's
    result joins the values later steps pick from): the Tensor IR against eager, within a
    tolerance scaled by the output's largest magnitude (chained products reach 1e4, where a
    part that cancels to 0, the imaginary part of z z^H's diagonal, is eager's rounding
    residue of 1e-4 as much as emmy's exact 0)."""
    import numpy as np

    from emmy.tensor_ir.interp import run
    from tests.tensor_ir.conftest import Fn

    def program(z, w, y):
        values = [z, w, y]
        for binary, which, i, j in steps:
            pick = lambda k: values[-1 - k % len(values)]     # noqa: E731
            if binary:
                values.append(_BINARY[which % len(_BINARY)][1](pick(i), pick(j)))
            else:
                values.append(_UNARY[which % len(_UNARY)][1](pick(i)))
        return values[-1] if values[-1].is_complex() else values[-1] + 0j * values[0]

    torch.manual_seed(len(steps))
    args = (_z(4, 4), _z(4, 4), torch.randn(4, 4))
    graph = capture(Fn(program), args)
    lowered = lower(graph)
    _no_complex(lowered)
    (got,) = run(lowered, {p.name: a for p, a in zip(graph.inputs, args)})
    want = as_stored(program(*args)).numpy()
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6 * scale)
