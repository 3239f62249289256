"""The correctness harness on the CPU emulator: an honest kernel passes; a kernel that skips an
element, writes its input, computes the wrong function or does not compile fails."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from emmy.bench.harness import (check_program, compare_output, is_discrete, make_cases,
                                resolve_device)
from emmy.dtypes import DType
from emmy.frontend.workload import load_expr, load_file
from emmy.pipeline import compile_to

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def gelu():
    w = load_expr("nn.GELU()(torch.randn(16, 96))")
    stages = compile_to(w, "cuda")
    return w, stages["torch"], stages["cuda"]


def edited(prog, old: str, new: str):
    """The program with one edit to its (only) kernel's source."""
    unit = prog.units[0]
    assert old in unit.source, unit.source
    return dataclasses.replace(prog, units=(dataclasses.replace(
        unit, source=unit.source.replace(old, new, 1)),))


def test_honest_kernel_passes(gelu):
    w, graph, prog = gelu
    check = check_program(w, graph, prog, device="cpu")
    assert check.verdict == "ok", check.reasons
    assert check.device == "cpu" and check.reference_dtype == "f64"
    assert len(check.cases) == 2 and {c.seed for c in check.cases} == {0, 1}
    assert check.errors[0].rel_l2 < 1e-6


def test_an_element_never_written_fails(gelu):
    w, graph, prog = gelu
    bad = edited(prog, "const int tid = threadIdx.x;",
                 "const int tid = threadIdx.x;\n  if (tid == 0) return;")
    check = check_program(w, graph, bad, device="cpu", seeds=(0,))
    assert check.verdict == "incorrect"
    assert check.errors[0].unwritten == 8          # 2 blocks x 4 elements of thread 0
    assert any("never written" in r for r in check.reasons)


def test_a_kernel_writing_its_input_fails(gelu):
    w, graph, prog = gelu
    bad = edited(prog, "em_vstore(out0", "const_cast<float*>(input)[e] = 0.5f;\n    em_vstore(out0")
    check = check_program(w, graph, bad, device="cpu", seeds=(0,))
    assert check.verdict == "incorrect"
    assert check.errors[0].ok                      # the outputs are right: only the input check
    assert any("wrote into its input `input`" in r for r in check.reasons)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_wrong_kernel_fails_at_any_seed(gelu, seed):
    w, graph, prog = gelu
    bad = edited(prog, "0.7071067811865475f", "0.7f")
    check = check_program(w, graph, bad, device="cpu", seeds=(seed,))
    assert check.verdict == "incorrect"
    assert check.errors[0].bad > 0 and "outside tolerance" in check.reasons[0]


def test_a_kernel_that_does_not_compile_is_a_compile_error(gelu):
    w, graph, prog = gelu
    bad = edited(prog, "const int tid", "this is not C++;\n  const int tid")
    check = check_program(w, graph, bad, device="cpu", seeds=(0,))
    assert check.verdict == "compile_error"


def test_cases_are_fresh_and_keep_discrete_inputs_valid():
    w = load_file(EXAMPLES / "losses.py", (("batch_size", 4), ("num_classes", 10)))
    graph = compile_to(w, "torch")["torch"]
    cases = make_cases(w, graph, seeds=(0, 1), distributions=("normal", "uniform", "large"))
    assert len(cases) == 6 and all(c.reference_dtype == "f64" for c in cases)
    logits = [c.args[0] for c in cases]
    assert not torch.equal(logits[0], logits[3])                     # seeds differ
    assert logits[1].abs().max() <= 1 and logits[2].abs().max() > 10  # uniform, large
    for c in cases:
        classes, signs = c.args[2], c.args[3]
        assert classes.dtype == torch.int64 and 0 <= classes.min() and classes.max() < 10
        assert set(signs.unique().tolist()) <= {-1.0, 1.0}
    assert cases[0].expected[0].dtype == torch.float64


def test_parameters_are_drawn_fresh_for_the_program_and_the_reference():
    w = load_expr("nn.RMSNorm(32)(torch.randn(4, 32))")
    graph = compile_to(w, "torch")["torch"]
    (case,) = make_cases(w, graph, seeds=(3,))
    weight = case.inputs["weight"]
    assert not torch.all(weight == 1)
    x = case.inputs["x"].double()
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + torch.finfo(torch.float32).eps)
    assert torch.allclose(case.expected[0], ref * weight.double(), rtol=1e-6)


def test_parameters_are_drawn_at_the_scale_the_model_initialized_them():
    """A linear layer's weight starts at U(+-1/sqrt(fan-in)): its fresh draws keep that root
    mean square (a deep model stays as well-conditioned as itself); a norm's weight of ones and
    its bias of zeros draw N(0, 1); the "large" distribution scales them all by 100."""
    w = load_expr("nn.LayerNorm(64)(nn.Linear(300, 64)(torch.randn(4, 300)))")
    graph = compile_to(w, "torch")["torch"]
    normal, large = make_cases(w, graph, seeds=(1,), distributions=("normal", "large"))
    rms = lambda t: float(t.double().pow(2).mean().sqrt())  # noqa: E731
    fan_in = (1 / 900) ** 0.5                       # U(-a, a) with a = 1/sqrt(300): a/sqrt(3)
    assert rms(normal.inputs["linear_weight"]) == pytest.approx(fan_in, rel=0.1)
    assert rms(large.inputs["linear_weight"]) == pytest.approx(100 * fan_in, rel=0.1)
    for name in ("layernorm_weight", "layernorm_bias"):
        assert 0.6 < rms(normal.inputs[name]) < 1.5


def test_compare_output_flags_poison_and_admits_cancellation_rounding():
    ref = torch.tensor([1.0, 2.0, float("nan"), 3.0], dtype=torch.float64)
    got = torch.tensor([1.0, float("nan"), float("nan"), 3.0])
    e = compare_output("out", DType.F32, got, ref)
    assert not e.ok and e.unwritten == 1 and e.bad == 1 and e.rel_l2 == float("inf")
    assert "at [1]" in e.worst
    big = torch.full((1000,), 1e5, dtype=torch.float64)
    big[0] = 0.5                                    # a cancelling sum: tiny result, large terms
    near = big.clone()
    near[0] = 0.52
    assert compare_output("out", DType.F32, near.float(), big).ok
    near[0] = 1000.0
    assert not compare_output("out", DType.F32, near.float(), big).ok
    shape = compare_output("out", DType.F32, torch.zeros(3), torch.zeros(4, dtype=torch.float64))
    assert not shape.ok and "shape" in shape.worst


def test_discrete_inputs_are_recognized():
    assert is_discrete(torch.tensor([1, 2, 3]))
    assert is_discrete(torch.tensor([-1.0, 1.0, 1.0]))
    assert not is_discrete(torch.randn(10))


def test_auto_device_is_cpu_without_a_gpu():
    from emmy.runtime.gpu import gpu_available

    assert resolve_device("auto") == ("gpu" if gpu_available() else "cpu")
    assert resolve_device("cpu") == "cpu"


def test_an_overflow_the_model_itself_has_is_not_a_failure():
    """exp of N(0,100) overflows float32 in eager too: inf there matches, not an error."""
    w = load_expr("torch.exp(torch.randn(8, 64))")
    stages = compile_to(w, "cuda")
    check = check_program(w, stages["torch"], stages["cuda"], device="cpu", seeds=(0,),
                          distributions=("large",))
    assert check.verdict == "ok", check.reasons
    assert check.cases[0].verdict == "ok"


def test_inf_within_rounding_of_the_overflow_threshold_is_not_a_failure():
    """A sum of 65521.8 rounds to inf in f16 (max 65504) in one summation order and to 65504 in
    another: both are within tolerance; inf far from the threshold is still wrong."""
    from emmy.bench.harness import compare_output
    from emmy.dtypes import DType

    ref = torch.tensor([65521.8, 1.0, -65530.0], dtype=torch.float64)
    got = torch.tensor([float("inf"), 1.0, float("-inf")], dtype=torch.float16)
    assert compare_output("out", DType.F16, got, ref).ok
    far = torch.tensor([60000.0, 1.0, -65530.0], dtype=torch.float64)
    assert not compare_output("out", DType.F16, got, far).ok
    wrong_sign = torch.tensor([-65521.8, 1.0, -65530.0], dtype=torch.float64)
    assert not compare_output("out", DType.F16, got, wrong_sign).ok


def test_a_program_as_far_from_float64_as_its_model_passes_against_the_model():
    """Attention written out by hand in f16 with large projection weights (20 times their
    initial scale, which the harness's fresh draws keep): the scores are in the hundreds, f16
    rounds them by tenths, and the exponentials amplify that, so the eager model in f16 is
    itself far from float64. The flash kernel rounds as the program says and matches the f16
    model: it passes, marked as passing against the model. The same kernel without the scores'
    rounding matches neither, and fails."""
    import torch

    w = load_file(EXAMPLES / "attention_block.py", (("seq_len", 200),))
    with torch.no_grad():
        w.model.c_attn.weight.mul_(20)
    stages = compile_to(w, "cuda")
    check = check_program(w, stages["torch"], stages["cuda"], device="cpu", seeds=(0,))
    assert check.verdict == "ok", check.reasons
    assert check.cases[0].errors[0].native            # float64 alone would have refused it
    prog = stages["cuda"]
    unit = prog.units[1]
    wrong = dataclasses.replace(prog, units=(prog.units[0], dataclasses.replace(
        unit, source=unit.source.replace("= __half2float(__float2half_rn(", "= (float)((", 1)),
        prog.units[2]))
    assert wrong.units[1].source != unit.source
    bad = check_program(w, stages["torch"], wrong, device="cpu", seeds=(0,))
    assert bad.verdict == "incorrect" and not bad.cases[0].errors[0].native


def test_topk_positions_pass_against_float64_by_the_values_they_pick():
    # bf16 logits: about one row in twelve orders two experts otherwise than float64 does
    w = load_file(EXAMPLES / "moe_router.py")
    stages = compile_to(w, "cuda")
    check = check_program(w, stages["torch"], stages["cuda"], device="cpu", seeds=(3,))
    assert check.verdict == "ok", check.reasons
    positions = check.errors[1]
    assert positions.dtype == "i64" and not positions.native and positions.max_abs > 0


class _FinfoMinSoftmax(torch.nn.Module):
    """Hugging Face's masking: finfo(dtype).min added, softmax in float32. In float64 the
    mask is float64's finfo.min, -inf once the softmax casts it to float32: a row masked
    everywhere is NaN there, and its average in the model's own dtype."""

    def forward(self, x):
        mask = torch.zeros(4, 6, dtype=x.dtype)
        mask[0] = torch.finfo(x.dtype).min
        return torch.softmax(x + mask, dim=-1, dtype=torch.float32).to(x.dtype)


def test_a_float64_reference_is_nan_only_where_the_model_is():
    """The float64 reference's NaN rows where the model in its own dtype is finite take the
    model's values, so that a program NaN there fails, in the harness and in `emmy run
    --check`'s float64 fallback alike."""
    from types import SimpleNamespace

    from emmy.check import _compare_outputs
    from emmy.frontend.workload import Workload

    x = torch.randn(4, 6).bfloat16()
    w = Workload(name="finfo", model=_FinfoMinSoftmax(), inputs=(x,), source="", origin="<t>")
    stages = compile_to(w, "torch")
    case = make_cases(w, stages["torch"], seeds=(0,), distributions=("normal",))[0]
    assert case.reference_dtype == "f64" and not torch.isnan(case.expected[0]).any()
    got = w.model(x).float().numpy()
    out = SimpleNamespace(name="out0", type=SimpleNamespace(dtype=DType.BF16))
    assert _compare_outputs([out], [got], w).ok
    got[0] = float("nan")
    report = _compare_outputs([out], [got], w)
    assert not report.ok and report.outputs[0].reference == "eager"


def test_an_f32_output_of_an_f16_model_is_held_to_f16s_tolerance():
    """`(x * 3 + 1).float()` of an f16 x: eager rounds after each f16 op, a fused kernel once;
    both are about an f16 unit from the exact result, which f32's tolerance would call wrong.
    The output is held to the tolerance of the least precise type the model starts in, by the
    harness and by `emmy run --check` alike; a wrong kernel still fails."""
    from emmy.check import check_cuda_program
    from emmy.dtypes import tolerance

    assert tolerance(DType.F32, floor=DType.F16) == tolerance(DType.F16)
    assert tolerance(DType.F16, floor=DType.F32) == tolerance(DType.F16)
    assert tolerance(DType.I64, floor=DType.F16) == tolerance(DType.I64)
    w = load_expr("(torch.randn(4096).half() * 3 + 1).float()")
    stages = compile_to(w, "cuda")
    report, _ = check_cuda_program(w, stages["torch"], stages["cuda"])
    assert report.ok and report.outputs[0].atol == tolerance(DType.F16)[0]
    assert check_program(w, stages["torch"], stages["cuda"], device="cpu").verdict == "ok"
    wrong = edited(stages["cuda"], "3.0f", "3.1f")
    assert check_program(w, stages["torch"], wrong, device="cpu").verdict == "incorrect"


class _NewtonSchulz(torch.nn.Module):
    """Muon's orthogonalization: five Newton-Schulz steps in bfloat16 between float32 tensors;
    its second output never goes through bfloat16."""

    def forward(self, p, g):
        x = g.to(torch.bfloat16)
        x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
        for _ in range(5):
            a = x @ x.mT
            x = 3.4445 * x + (-4.7750 * a + 2.0315 * a @ a) @ x
        return p - 0.02 * x.float(), p * 2


def test_an_f32_output_computed_through_bf16_is_held_to_bf16s_tolerance():
    """The check's floor is per output: the least precise float type the model starts in or
    the output is computed through. emmy rounds the bf16 steps at other points than eager
    (one bf16 unit here and there), which the update carries into the float32 result."""
    from emmy.check import check_cuda_program
    from emmy.dtypes import tolerance
    from emmy.frontend.workload import Workload
    from emmy.selections import graph_dtypes

    w = Workload("muon", _NewtonSchulz(), (torch.randn(32, 64), torch.randn(32, 64)), "",
                 "<test>")
    stages = compile_to(w, "cuda")
    assert graph_dtypes(stages["torch"]) == (DType.BF16, DType.F32)
    report, failed = check_cuda_program(w, stages["torch"], stages["cuda"])
    assert report is not None, failed.log[-2000:]
    assert report.ok, report.outputs
    assert [o.atol for o in report.outputs] == [tolerance(DType.BF16)[0], tolerance(DType.F32)[0]]
    cases = make_cases(w, stages["torch"], seeds=(0,))
    assert cases[0].floor == (DType.BF16, DType.F32)
    assert check_program(w, stages["torch"], stages["cuda"], device="cpu").verdict == "ok"
    prog = stages["cuda"]                  # p * 2.001: f32's tolerance holds for that output
    (i,) = [i for i, u in enumerate(prog.units) if "* 2.0f)" in u.source]
    wrong = dataclasses.replace(prog, units=tuple(
        dataclasses.replace(u, source=u.source.replace("* 2.0f)", "* 2.001f)")) if j == i
        else u for j, u in enumerate(prog.units)))
    check = check_program(w, stages["torch"], wrong, device="cpu")
    assert check.verdict == "incorrect" and not check.errors[1].ok and check.errors[0].ok


def test_same_bits_reads_8_bit_floats_and_complex_tensors_as_the_kernels_hold_them():
    """An fp8 input is one byte an element; a complex input is compared as its (real,
    imaginary) pairs, the view the kernels read, not cast to a real type (which would drop
    the imaginary parts and call an untouched input written)."""
    from emmy.bench.harness import same_bits

    x8 = (torch.randn(8, 4) * 100).to(torch.float8_e4m3fn)
    assert same_bits(x8, x8.clone())
    changed = x8.clone()
    changed.view(torch.uint8)[0, 0] ^= 1
    assert not same_bits(x8, changed)
    z = torch.randn(4, 3, dtype=torch.complex64)
    assert same_bits(torch.view_as_real(z).clone(), z) and same_bits(z, z.clone())
    w = z.clone()
    w[1, 1] += 1j
    assert not same_bits(torch.view_as_real(z).clone(), w)


def test_an_ill_conditioned_output_may_be_as_far_from_float64_as_eager_twice():
    """f32 attention over inputs a hundred times the usual: eager f32 itself is ~0.4 from the
    float64 result (rel 1e-3, ten times f32's tolerance), and any other order of f32 sums is
    too. An output within twice eager's distance passes; one beyond it does not."""
    from emmy.bench.harness import _conditioned, _or_native

    g = torch.Generator().manual_seed(0)
    ref = torch.randn(64, 64, generator=g, dtype=torch.float64) * 300
    own = ref + (torch.rand(64, 64, generator=g, dtype=torch.float64) - 0.5) * 0.8
    near = ref + (torch.rand(64, 64, generator=g, dtype=torch.float64) - 0.5) * 1.2
    far = near.clone()
    far[3, 5] += 2.0

    def verdict(got):
        f64 = compare_output("out0", DType.F32, got.float(), ref)
        assert not f64.ok
        return _or_native(compare_output("out0", DType.F32, got.float(), own), f64,
                          lambda: compare_output("out0", DType.F32, got.float(), ref,
                                                 slack=_conditioned(own, ref)))

    ok = verdict(near)
    assert ok.ok and ok.native
    assert not verdict(far).ok
    widened = compare_output("out0", DType.F32, far.float(), ref, slack=_conditioned(own, ref))
    assert widened.bad == 1 and "[3, 5]" in widened.worst
    assert _conditioned(ref, ref) == (0.0, 0.0)
