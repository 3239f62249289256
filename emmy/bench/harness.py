"""The correctness harness, the same on the CPU (emulator) and the GPU.

Every check draws fresh inputs and parameters (several seeds, several distributions; each
parameter at the scale the model initialized it), poisons the outputs with
NaN before each run (an element the kernel never writes fails), checks that the inputs come back
bit for bit unchanged (a kernel that writes its inputs fails), and compares with the eager model
run in float64 where it can be (else in its own dtype), with a tolerance from the output dtype:
elementwise (`atol + rtol*|ref| + stol*rms(ref)`) and normwise (`||out - ref|| / ||ref||`).
An output outside that tolerance of the float64 result passes when it is inside it of the
model run in its own dtype (`OutputError.native`): a program that rounds to f16 between
ill-conditioned steps (attention written out by hand: scores rounded, then exponentiated) is
that far from float64 itself, and computing what it says is correct.
No row counts as `ok` unless every case passed.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

from emmy.check import flatten_tensors, mended_reference, per_output, run_eager
from emmy.cuda.program import CudaProgram
from emmy.dtypes import DType, as_stored, checked_as, to_torch, tolerance
from emmy.errors import UserError

DISTRIBUTIONS = ("normal", "uniform", "large")   # N(0,1), U[-1,1], N(0,1)*100
CPU_DISTRIBUTIONS = DISTRIBUTIONS[:1]             # the emulator takes ~1 s a launch: keep it cheap
VERDICTS = ("ok", "incorrect", "crash", "compile_error", "timeout")


@dataclass(frozen=True)
class Case:
    """One check's inputs (as the model takes them and by program input name) and reference."""

    seed: int
    distribution: str
    args: tuple                       # the model's call arguments, on the check's device
    inputs: Mapping[str, Any]         # program input name -> tensor (inputs and parameters)
    expected: tuple                   # reference outputs, flattened
    reference_dtype: str              # "f64", or the model's own dtype when f64 failed
    overflow: tuple = ()              # per output: the model's own result where it has inf/NaN
    native: tuple = ()                # the model's outputs in its own dtype (f64 reference)
    tf32: bool = False                # the workload allows tf32 products: f32 outputs as f16's
    selections: tuple = ()            # per output: the selection (topk, argmax, ...) whose
                                      # positions it is, else None (emmy.selections)
    floor: DType | tuple | None = None   # the least precise float type the model starts in
                                         # or an output goes through (one, or one per output)


@dataclass(frozen=True)
class OutputError:
    """How one output compares with the reference."""

    name: str
    dtype: str
    max_abs: float
    max_rel: float                    # over elements of the reference at least atol in size
    rel_l2: float                     # ||out - ref|| / ||ref||
    atol: float
    rtol: float
    bad: int                          # elements outside the elementwise tolerance
    unwritten: int                    # NaN where the reference is a number: poison left
    total: int
    ok: bool
    worst: str = ""                   # where the worst element is, and its values
    native: bool = False              # passed against the model in its own dtype (see
                                      # check_case), not the float64 reference


@dataclass(frozen=True)
class CaseResult:
    seed: int
    distribution: str
    verdict: str
    errors: tuple[OutputError, ...] = ()
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class HarnessCheck:
    """The verdict of one program over all its cases; `errors` is each output's worst case."""

    verdict: str                      # ok | incorrect | crash | compile_error | timeout
    errors: tuple[OutputError, ...]
    reasons: tuple[str, ...]
    cases: tuple[CaseResult, ...]
    device: str                       # cpu | gpu
    reference_dtype: str

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"


@dataclass(frozen=True)
class Executed:
    """One run of a program: its outputs (torch tensors) and which inputs it changed."""

    status: str                       # ok | compile_error | crash | timeout
    outputs: tuple = ()
    changed_inputs: tuple[str, ...] = ()
    log: str = ""


# ---------------------------------------------------------------------------------------------
# Cases: fresh inputs and the float64 reference


def make_cases(workload, graph, *, seeds: Sequence[int] = (0, 1),
               distributions: Sequence[str] = CPU_DISTRIBUTIONS, device: str = "cpu",
               randomize_params: bool = True) -> list[Case]:
    """Inputs for each (seed, distribution) and the reference outputs on them."""
    import torch

    for d in distributions:
        if d not in DISTRIBUTIONS:
            raise UserError(f"unknown input distribution {d!r}; known: {', '.join(DISTRIBUTIONS)}")
    from emmy.selections import graph_dtypes, least_precise, model_dtype

    dev = torch.device(device)
    computes = graph_dtypes(graph)      # per output: the least precise type it goes through
    reference = _Reference(workload.model, dev, graph.updates)
    cases = []
    for seed in seeds:
        template = _template_inputs(workload, seed)
        for d in distributions:
            gen = torch.Generator(device=dev)
            gen.manual_seed(seed * 1009 + DISTRIBUTIONS.index(d) * 101 + 17)
            args = tuple(_draw_like(x, d, gen, dev) if isinstance(x, torch.Tensor) else x
                         for x in template)
            inputs, params = _bind(graph, args, d, gen, dev, randomize_params)
            expected, overflow, native, selections = reference.outputs(args, params)
            start = model_dtype(reference.native, args)
            cases.append(Case(seed, d, args, inputs, expected, reference.dtype, overflow, native,
                              tf32=graph.tf32, selections=selections,
                              floor=tuple(least_precise((start, c)) for c in computes)))
    return cases


def _template_inputs(workload, seed: int) -> tuple:
    """The workload's inputs drawn under `seed`: shapes, dtypes and the discrete inputs to keep."""
    import numpy as np
    import torch

    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    if workload.make_inputs is not None:
        return tuple(workload.make_inputs())
    return tuple(workload.inputs)


def _draw(shape, dtype, distribution: str, gen, dev):
    import torch

    if dtype.is_complex:        # each part drawn as a real value is
        return torch.view_as_complex(_draw((*shape, 2), dtype.to_real(), distribution, gen, dev))
    work = torch.float64 if dtype == torch.float64 else torch.float32
    if distribution == "uniform":
        x = torch.rand(shape, generator=gen, device=dev, dtype=work) * 2 - 1
    else:
        x = torch.randn(shape, generator=gen, device=dev, dtype=work)
        if distribution == "large":
            x = x * 100
    return x.to(dtype)


def is_discrete(t) -> bool:
    """Integer, bool, or float holding only whole numbers (labels, signs, masks): keep as drawn."""
    import torch

    if t.is_complex():
        return is_discrete(torch.view_as_real(t))
    if not t.is_floating_point():
        return True
    t = _widened(t)
    return bool(torch.all(t == torch.round(t)))


def _draw_like(x, distribution: str, gen, dev):
    if is_discrete(x):
        return x.to(dev)
    return _draw(tuple(x.shape), x.dtype, distribution, gen, dev)


def _scale(param) -> float:
    """The root mean square of a parameter as the model initialized it (1 where that is 0): its
    fresh draw takes that scale, so that a deep model (a decoder layer, whose projections the
    model initializes at 1/sqrt(fan-in)) stays as well-conditioned as the model itself. Drawn at
    N(0, 1), a 4,096-wide layer's scores would saturate every softmax, and a rounding step
    would decide which key wins, in eager as in any kernel."""
    rms = float(param.double().pow(2).mean().sqrt()) if param.numel() else 0.0
    return rms if rms > 0 and rms == rms else 1.0


def _bind(graph, args, distribution, gen, dev, randomize_params):
    """Program inputs by name; float parameters drawn fresh too, at the scale of the model's own
    (returned by module path)."""
    import torch

    from emmy.torch_ir.ir import InputKind

    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if len(tensors) != len(graph.inputs):
        raise UserError(f"the model takes {len(graph.inputs)} tensor inputs, "
                        f"get_inputs() gave {len(tensors)}")
    inputs = {p.name: t.to(to_torch(p.type.dtype)) for p, t in zip(graph.inputs, tensors)}
    params = {}
    for p in graph.placeholders:
        if p.kind is InputKind.INPUT:
            continue
        value = graph.values[p.name].to(dev)
        if randomize_params and p.kind is InputKind.PARAM and value.is_floating_point():
            value = _draw(tuple(value.shape), value.dtype, distribution, gen, dev) \
                * _scale(value)
            params[p.target] = value
        inputs[p.name] = value.to(to_torch(p.type.dtype))
    return inputs, params


class _Reference:
    """The eager model on the check's device, in float64 when it runs there, else as it is."""

    def __init__(self, model, dev, updates: tuple[str, ...] = ()):
        self.native = copy.deepcopy(model).to(dev)      # in its own mode, as compiled
        self.f64 = copy.deepcopy(self.native).double()
        self.dtype: str | None = None
        self.updates = updates          # buffers the model writes: each run on a fresh copy

    def outputs(self, args, params) -> tuple[tuple, tuple, tuple, tuple]:
        """(reference outputs, the model's own outputs where they hold inf or NaN, else None,
        the model's own outputs where the reference is float64, else (), and per output the
        selection whose positions it is, else None)."""
        import torch

        from emmy.selections import model_dtype, of_outputs

        floor = model_dtype(self.native, args)
        with torch.no_grad():
            if self.dtype in (None, "f64"):
                recorded: list = []
                try:
                    out = self._run(self.f64, args, params, torch.float64, recorded,
                                    self.updates)
                    self.dtype = "f64"
                except Exception:
                    if self.dtype == "f64":
                        raise
                else:
                    mine: list = []
                    own = self._run(self.native, args, params, None, mine, self.updates)
                    out = mended_reference(out, own)
                    return (out, tuple(None if bool(torch.isfinite(o).all()) else o for o in own),
                            own, of_outputs(out, recorded, mine, floor))
            recorded = []
            out = self._run(self.native, args, params, None, recorded, self.updates)
            self.dtype = self.dtype or _native_dtype(self.native, args)
            return out, (None,) * len(out), (), of_outputs(out, recorded, floor=floor)

    @staticmethod
    def _run(model, args, params, dtype, selections: list,
             updates: tuple[str, ...] = ()) -> tuple:
        import torch

        from emmy.check import with_updates

        for target, value in params.items():
            model.get_parameter(target).copy_(value)
        model = with_updates(model, updates)
        if dtype is not None:
            args = tuple(a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point()
                         else a for a in args)
        # complex outputs as the kernels store them: (real, imaginary) pairs; 8-bit floats
        # as float32 (the same values: torch computes nothing in those types, not even isnan)
        return tuple(_widened(as_stored(t.detach()))
                     for t in flatten_tensors(run_eager(model, args, selections)))


def _widened(t):
    return t.float() if t.is_floating_point() and t.element_size() == 1 else t


def _native_dtype(model, args) -> str:
    import torch

    from emmy.dtypes import from_torch

    for t in (*model.parameters(), *(a for a in args if isinstance(a, torch.Tensor))):
        if t.is_floating_point():
            return str(from_torch(t.dtype))
    return "native"


# ---------------------------------------------------------------------------------------------
# Comparing one output


@dataclass(frozen=True)
class Tolerance:
    """Pass when |out - ref| <= atol + rtol*|ref| + stol*rms(ref) everywhere and
    ||out - ref|| / ||ref|| <= l2. The rms term admits rounding on cancelling sums (a dot
    product of large terms with a small result) that a float64 reference exposes."""

    atol: float
    rtol: float
    stol: float
    l2: float


def output_tolerance(dtype: DType, *, tf32: bool = False,
                     floor: DType | None = None) -> Tolerance:
    """The tolerance for an output of this dtype against a float64 reference (f32 outputs of a
    workload that allows tf32 products are held to f16's; a float output of a model whose
    values start in a less precise float type, `floor`, to that type's)."""
    dtype = checked_as(dtype, tf32=tf32, floor=floor)
    atol, rtol = tolerance(dtype)
    stol, l2 = {DType.F64: (1e-9, 1e-10), DType.F32: (1e-3, 1e-4), DType.F16: (1e-2, 5e-3),
                DType.BF16: (2e-2, 2e-2), DType.F8E4M3: (0.125, 0.07),
                DType.F8E5M2: (0.25, 0.14)}.get(dtype, (0.0, 0.0))
    return Tolerance(atol, rtol, stol, l2)


def compare_output(name: str, dtype: DType, got, expected, own=None, *,
                   tf32: bool = False, selection=None, floor: DType | None = None,
                   slack: tuple[float, float] = (0.0, 0.0)) -> OutputError:
    """Compare one output with its reference; NaN or inf fails unless the reference has it,
    or the model run in its own dtype (`own`) has the same there (an honest overflow).
    Positions a selection took (`selection`) that differ from the reference's are compared by
    the values they pick. `slack`: (absolute, normwise) error allowed besides the tolerance's
    (_conditioned)."""
    import torch

    if selection is not None and got.numel() == expected.numel() and \
            not torch.equal(got.to(expected.device).reshape(expected.shape), expected):
        return _by_picked_values(name, dtype, got, expected, selection)

    tol = output_tolerance(dtype, tf32=tf32, floor=floor)
    ref = expected.detach().to(torch.float64)
    val = got.detach().to(device=ref.device, dtype=torch.float64)
    total = ref.numel()
    if val.numel() != total:
        return OutputError(name, str(dtype), float("inf"), float("inf"), float("inf"), tol.atol,
                           tol.rtol, total, 0, total, False,
                           f"shape {tuple(got.shape)}, expected {tuple(ref.shape)}")
    if total == 0:
        return OutputError(name, str(dtype), 0.0, 0.0, 0.0, tol.atol, tol.rtol, 0, 0, 0, True)
    val = val.reshape(ref.shape)
    nan_v, nan_r = torch.isnan(val), torch.isnan(ref)
    unwritten = int((nan_v & ~nan_r).sum())
    same = _same_nonfinite(val, ref)
    if own is not None:
        same |= _same_nonfinite(val, own.detach().to(device=ref.device, dtype=torch.float64)
                                .reshape(ref.shape))
        unwritten = int((nan_v & ~nan_r & ~same).sum())
    same |= _rounds_to_overflow(val, ref, dtype, tol)
    finite_ref = torch.isfinite(ref)
    diff = torch.where(same, 0.0, (val - ref).abs())
    diff = torch.where(torch.isnan(diff), float("inf"), diff)
    scale = torch.where(finite_ref, ref.abs(), 0.0)
    rms = float(scale.square().mean().sqrt())
    bad_mask = diff > tol.atol + slack[0] + tol.rtol * scale + tol.stol * rms
    bad = int(bad_mask.sum())
    max_abs = float(diff.max())
    max_rel = float(torch.where((diff == 0) | (scale < max(tol.atol, 1e-30)), 0.0,   # see check
                                diff / scale.clamp_min(1e-30)).max())
    rel_l2 = _rel_l2(val, ref, same)
    ok = bad == 0 and rel_l2 <= max(tol.l2, slack[1])
    worst = _worst(bad_mask, diff, val, ref) if bad else ""
    if bad == 0 and not ok:
        worst = f"||out - ref|| / ||ref|| = {rel_l2:.3g} > {max(tol.l2, slack[1]):g}"
    return OutputError(name, str(dtype), max_abs, max_rel, rel_l2, tol.atol, tol.rtol, bad,
                       unwritten, total, ok, worst)


def _by_picked_values(name: str, dtype: DType, got, expected, selection) -> OutputError:
    """Positions (topk, argmax, ...) that differ from the reference's: right where each picks
    the value the reference's picks (emmy.selections.positions_agree)."""
    import torch

    from emmy.selections import check_positions

    c = check_positions(got, expected, selection)
    worst = ""
    if c.bad:
        flat = int(torch.argmax((~c.ok).reshape(-1).to(torch.int8)))
        worst = (f"position {int(got.reshape(-1)[flat])} where the reference took "
                 f"{int(expected.reshape(-1)[flat])}: their values differ by "
                 f"{float(c.gap.reshape(-1)[flat]):.3g}, or the position is out of range or "
                 "taken twice")
    return OutputError(name, str(dtype), c.max_abs, c.max_rel, 0.0, 0.0, c.rtol, c.bad, 0,
                       expected.numel(), c.bad == 0, worst)


def _rounds_to_overflow(val, ref, dtype: DType, tol: Tolerance):
    """Infinities where the tolerance band around a finite reference reaches past the dtype's
    largest finite value: a result within tolerance may round to inf there (f16's 65504)."""
    import torch

    if not dtype.is_float:
        return torch.zeros_like(val, dtype=torch.bool)
    top = torch.finfo(to_torch(dtype)).max
    near = torch.isfinite(ref) & (ref.abs() * (1 + tol.rtol) + tol.atol >= top)
    return near & torch.isinf(val) & (val.sign() == ref.sign())


def _same_nonfinite(val, ref):
    import torch

    nan = torch.isnan(val) & torch.isnan(ref)
    return nan | (torch.isinf(val) & torch.isinf(ref) & (val.sign() == ref.sign()))


def _rel_l2(val, ref, same) -> float:
    import torch

    if bool((~same & ~(torch.isfinite(val) & torch.isfinite(ref))).any()):
        return float("inf")
    num = float(torch.where(same, 0.0, val - ref).norm())
    den = float(torch.where(same, 0.0, ref).norm())
    return num / den if den > 0 else (0.0 if num == 0 else float("inf"))


def _worst(bad_mask, diff, val, ref) -> str:
    import numpy as np
    import torch

    flat = int(torch.argmax(torch.where(bad_mask, diff, -1.0).reshape(-1)))
    at = [int(i) for i in np.unravel_index(flat, tuple(ref.shape))] if ref.dim() else []
    return (f"at {at}: got {float(val.reshape(-1)[flat]):.6g}, "
            f"expected {float(ref.reshape(-1)[flat]):.6g}")


# ---------------------------------------------------------------------------------------------
# Running a program: on the CPU emulator or on the GPU


class CpuExecutor:
    """Runs the emitted CUDA on the CPU emulator, keeping the input buffers to check them."""

    device = "cpu"

    def __init__(self, prog: CudaProgram, *, timeout: float = 120.0):
        self.prog = prog
        self.timeout = timeout

    def __call__(self, inputs: Mapping[str, Any]) -> Executed:
        import torch

        from emmy.runtime.cpu import run_program

        res = run_program(self.prog, inputs, timeout=self.timeout)
        if not res.ok:
            status = res.status if res.status in ("compile_error", "timeout") else "crash"
            return Executed(status, log=f"{res.failed}: {res.status}\n{res.log}")
        outs = tuple(torch.from_numpy(o.copy()) for o in res.outputs)
        return Executed("ok", outs, res.changed_inputs)


class GpuExecutor:
    """Runs the program on the GPU (one load, buffers reused), on clones of the case inputs."""

    device = "gpu"

    def __init__(self, prog: CudaProgram):
        from emmy.runtime.gpu import CompileFailed, GpuError, GpuProgram

        self.prog = prog
        self.program = None
        self.failure: Executed | None = None
        try:
            self.program = GpuProgram(prog)
        except CompileFailed as e:
            self.failure = Executed("compile_error", log=str(e))
        except GpuError as e:
            self.failure = Executed("crash", log=str(e))

    def __call__(self, inputs: Mapping[str, Any]) -> Executed:
        from emmy.runtime.gpu import GpuError

        if self.failure is not None:
            return self.failure
        work = {n: t.clone() for n, t in inputs.items()}
        try:
            outs = self.program.run(work)
        except GpuError as e:
            return Executed("crash", log=str(e))
        changed = tuple(b.name for b in self.prog.inputs
                        if not same_bits(self.program.buffers[b.name], inputs[b.name]))
        return Executed("ok", outs, changed)


def same_bits(a, b) -> bool:
    """True when two tensors hold the same bytes (NaN payloads and -0.0 included); a complex
    tensor as its (real, imaginary) pairs, as the kernels hold it (as_stored)."""
    import torch

    a, b = as_stored(a), as_stored(b)
    b = b.to(device=a.device, dtype=a.dtype)
    if a.numel() != b.numel():
        return False
    if a.is_floating_point():
        view = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}[a.element_size()]
        a, b = a.contiguous().view(view), b.contiguous().view(view)
    return bool(torch.equal(a.reshape(-1), b.reshape(-1)))


# ---------------------------------------------------------------------------------------------
# Checking


def check_cases(run: Callable[[Mapping[str, Any]], Executed], prog: CudaProgram,
                cases: Sequence[Case], *, device: str) -> HarnessCheck:
    """Run `prog` on every case; stop at the first failing one."""
    results: list[CaseResult] = []
    for case in cases:
        result = check_case(run, prog, case)
        results.append(result)
        if result.verdict != "ok":
            break
    return _summarize(results, device, cases[0].reference_dtype if cases else "")


def check_case(run, prog: CudaProgram, case: Case) -> CaseResult:
    """One run on one case: status, inputs unchanged, every output within tolerance."""
    done = run(case.inputs)
    if done.status != "ok":
        return CaseResult(case.seed, case.distribution, done.status,
                          reasons=(f"{done.status}: {_tail(done.log)}",))
    if len(case.expected) != len(prog.outputs):
        raise UserError(f"the model returns {len(case.expected)} tensors; the program has "
                        f"{len(prog.outputs)}")
    own = case.overflow or (None,) * len(case.expected)
    picks = case.selections or (None,) * len(case.expected)
    errors = tuple(compare_output(b.name, b.type.dtype, g, e, o, tf32=case.tf32, selection=p,
                                  floor=per_output(case.floor, i))
                   for i, (b, g, e, o, p) in enumerate(zip(prog.outputs, done.outputs,
                                                           case.expected, own, picks)))
    if case.native:
        # A program that rounds to f16/bf16 between ill-conditioned steps (attention written
        # out by hand: its scores rounded, then exponentiated) can sit far from the float64
        # result exactly as the model does in its own dtype. Matching that model within the
        # same tolerance is correct too: it is what the program computes.
        # An ill-conditioned function computed in f32 throughout (f32 attention over inputs a
        # hundred times the usual) is far from float64 in any order of f32 sums, eager's too:
        # within twice eager's own distance from float64 is correct there (_conditioned). Not
        # where the model rounds to 16 bits on the way: the program must round as it says.
        errors = tuple(e if e.ok else _or_native(
            compare_output(b.name, b.type.dtype, g, n, tf32=case.tf32,
                           floor=per_output(case.floor, i)), e,
            None if (per_output(case.floor, i) or b.type.dtype) is not DType.F32 else
            lambda: compare_output(b.name, b.type.dtype, g, r, tf32=case.tf32,
                                   floor=per_output(case.floor, i), slack=_conditioned(n, r)))
            for i, (b, g, n, r, e) in enumerate(zip(prog.outputs, done.outputs, case.native,
                                                    case.expected, errors)))
    reasons = [f"the kernel wrote into its input `{n}`" for n in done.changed_inputs]
    for e in errors:
        if e.unwritten:
            reasons.append(f"{e.name}: {e.unwritten} of {e.total} elements never written "
                           f"(still NaN poison)")
        if e.bad:
            reasons.append(f"{e.name}: {e.bad} of {e.total} elements outside tolerance; "
                           f"max abs err {e.max_abs:.3g}, worst {e.worst}")
        elif not e.ok:
            reasons.append(f"{e.name}: {e.worst}")
    verdict = "ok" if not reasons else "incorrect"
    where = f"seed {case.seed}, {case.distribution} inputs"
    return CaseResult(case.seed, case.distribution, verdict, errors,
                      tuple(f"{where}: {r}" for r in reasons))


def _or_native(native: OutputError, f64: OutputError, conditioned=None) -> OutputError:
    if native.ok:
        return replace(native, native=True)
    if conditioned is not None and (widened := conditioned()).ok:
        return replace(widened, native=True)
    return f64


CONDITIONING = 2.0     # times eager's own distance from float64 that an output may be from it


def _conditioned(own, ref) -> tuple[float, float]:
    """(absolute, normwise) slack for an output whose model, run in its own dtype, is itself
    that far from the float64 reference: CONDITIONING times eager's largest absolute and its
    normwise distance (as PyTorch's own tests set tolerances for low-precision attention)."""
    import torch

    own = own.detach().to(device=ref.device, dtype=torch.float64).reshape(ref.shape)
    ref = ref.detach().to(torch.float64)
    both = torch.isfinite(own) & torch.isfinite(ref)
    if not bool(both.any()):
        return 0.0, 0.0
    diff = torch.where(both, own - ref, 0.0)
    norm = float(torch.where(both, ref, 0.0).norm())
    return (CONDITIONING * float(diff.abs().max()),
            CONDITIONING * float(diff.norm()) / norm if norm > 0 else 0.0)


def _summarize(results: list[CaseResult], device: str, reference_dtype: str) -> HarnessCheck:
    verdict = next((r.verdict for r in results if r.verdict != "ok"), "ok")
    if not results:
        verdict = "incorrect"
    worst: dict[str, OutputError] = {}
    for r in results:
        for e in r.errors:
            w = worst.get(e.name)
            if w is None or (e.bad, e.max_abs) > (w.bad, w.max_abs):
                worst[e.name] = e
    reasons = tuple(x for r in results for x in r.reasons) or (
        () if results else ("no cases were run",))
    return HarnessCheck(verdict, tuple(worst.values()), reasons, tuple(results), device,
                        reference_dtype)


def resolve_device(device: str) -> str:
    """"auto" -> "gpu" when a CUDA GPU is usable here, else "cpu"."""
    if device not in ("auto", "cpu", "gpu"):
        raise UserError(f"unknown device {device!r}; use auto, cpu or gpu")
    if device != "auto":
        return device
    from emmy.runtime.gpu import gpu_available

    return "gpu" if gpu_available() else "cpu"


def check_program(workload, graph, prog: CudaProgram, *, seeds: Sequence[int] = (0, 1),
                  distributions: Sequence[str] | None = None, device: str = "auto",
                  timeout: float = 120.0) -> HarnessCheck:
    """Check `prog` on fresh inputs: default 2 seeds x normal on the CPU, x all on the GPU."""
    where = resolve_device(device)
    if where == "gpu":
        from emmy.runtime.gpu import gpu_available

        if not gpu_available():
            raise UserError("device='gpu' needs a CUDA GPU with cupy and torch.cuda; none here")
    if distributions is None:
        distributions = DISTRIBUTIONS if where == "gpu" else CPU_DISTRIBUTIONS
    cases = make_cases(workload, graph, seeds=seeds, distributions=distributions,
                       device="cuda" if where == "gpu" else "cpu")
    run = GpuExecutor(prog) if where == "gpu" else CpuExecutor(prog, timeout=timeout)
    return check_cases(run, prog, cases, device=where)


def _tail(text: str, n: int = 1500) -> str:
    text = text.strip()
    return text if len(text) <= n else "…" + text[-n:]
