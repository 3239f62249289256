"""The compiler's checked API for exploring schedules: one Evaluator per workload.

Everything an explorer (a person, the built-in search, an LLM agent) may do goes through here:
list the kernels and their spaces, check a row (free), and evaluate one — legality, NVRTC
compile, correctness against PyTorch on fresh inputs, then a time: measured on a GPU (CUDA
events), else modeled by the cost model, and always labelled with its method.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from emmy.errors import UserError, unknown_kernel
from emmy.pipeline import STAGE_NAMES, Options, compile_to, resume_from, show
from emmy.schedule.row import RowError, parse
from emmy.schedule.choose import with_cut_chains
from emmy.schedule.space import Space, space_of
from emmy.schedule.targets import get_target


@dataclass(frozen=True)
class KernelInfo:
    name: str
    kind: str
    identity: str
    keys: tuple[str, ...]
    count: int
    default_row: str


@dataclass(frozen=True)
class Evaluation:
    kernel: str
    row: str
    verdict: str                    # illegal | compile_error | incorrect | crash | timeout | ok
    reasons: tuple[str, ...]
    kernel_hash: str
    resources: dict | None = None   # registers, shared_bytes, spill bytes, performance warnings
                                    # (from ptxas)
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    timing: dict | None = None      # method, median_us, p10_us, p90_us, n
    baselines: dict = field(default_factory=dict)
    seconds: float = 0.0
    same_program_as: str | None = None   # "kernel: row" whose program this row's is: its check
                                         # and time are that evaluation's, not run again

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"


class Evaluator:
    """Schedules of one workload's kernels on one target."""

    def __init__(self, workload, target: str = "sm_90a", *, device: str = "auto"):
        self.workload = workload
        self.target = get_target(target).name
        self._target = get_target(target)
        self.device = _pick_device(device)
        base = compile_to(workload, "tile", Options(target=self.target))
        self._front = {k: base[k] for k in ("torch", "tensor", "loop")}   # rows change none of these
        self._graph = base["torch"]
        self._tile = base["tile"].program
        self._kernels = with_cut_chains(self._tile.kernels, base["loop"])
        self._spaces = {k.name: space_of(k, self._target) for k in self._kernels}
        self._baselines: dict | None = None
        self.time_baselines = True   # eager and torch.compile timed next to a row (GPU only)
        # The evaluation of each program checked, by its rows: another kernel's default row
        # (the other kernels on theirs) is the same program, and is not run again.
        self._programs: dict[tuple, Evaluation] = {}

    @property
    def workload_name(self) -> str:
        return self.workload.name

    def kernels(self) -> list[KernelInfo]:
        return [KernelInfo(k.name, str(k.kind), k.identity, s.keys, s.count(), str(s.default()))
                for k, s in ((k, self._spaces[k.name]) for k in self._kernels)]

    def space(self, kernel: str) -> Space:
        if kernel not in self._spaces:
            raise unknown_kernel(kernel, self._spaces)
        return self._spaces[kernel]

    def decision_points(self, kernel: str) -> list[tuple[str, list[str]]]:
        return self.space(kernel).decision_points()

    def grammar_text(self, kernel: str) -> dict[str, str]:
        """What each of the kernel's keys may say (its kind's grammar), by key."""
        space = self.space(kernel)
        return {k: space.grammar_text[k] for k in space.keys}

    def sample_rows(self, kernel: str, n: int, seed: int = 0) -> list[str]:
        return [str(r) for r in self.space(kernel).sample(n, seed)]

    def all_rows(self, kernel: str) -> list[str]:
        return [str(r) for r in self.space(kernel).all_rows]

    def first_row(self, kernel: str, fixed: dict[str, str]) -> str | None:
        """The first legal row, in the default's order of preference, with these values at
        these keys (without listing the space); None when there is none."""
        row = self.space(kernel).first_row(fixed)
        return None if row is None else str(row)

    def check(self, kernel: str, row: str) -> list[str]:
        """Why `row` is illegal for `kernel` (empty when legal). Free: compiles nothing."""
        try:
            parsed = parse(row)
        except RowError as e:
            return [str(e)]
        return [str(r) for r in self.space(kernel).check(parsed)]

    def compiled(self, kernel: str, row: str) -> dict:
        """Every stage's result with `row` on `kernel` and the default rows elsewhere."""
        return resume_from(self._front, "cuda", Options(self.target, {kernel: row}))

    def program(self, kernel: str, row: str):
        """The CUDA program with `row` on `kernel` and the default rows elsewhere."""
        return self.compiled(kernel, row)["cuda"]

    def read_ir(self, stage: str, kernel: str | None = None, row: str | None = None) -> str:
        if stage not in STAGE_NAMES:
            raise UserError(f"unknown stage `{stage}`; stages are {', '.join(STAGE_NAMES)}")
        rows = {kernel: row} if kernel and row else {}
        if stage in self._front:
            return show(stage, self._front[stage])
        return show(stage, resume_from(self._front, stage, Options(self.target, rows))[stage])

    def estimate_us(self, kernel: str, row: str) -> float:
        """The cost model's time for the whole program with this row, in microseconds."""
        return self._estimate(self.compiled(kernel, row)).seconds * 1e6

    def evaluate(self, kernel: str, row: str) -> Evaluation:
        """Legality -> NVRTC compile -> correctness on fresh inputs -> time (measured on a GPU,
        modeled elsewhere). Only a row that passed its check gets a time."""
        t0 = time.perf_counter()
        k = next((k for k in self._kernels if k.name == kernel), None)
        if k is None:
            raise unknown_kernel(kernel, self._spaces)
        reasons = self.check(kernel, row)
        if reasons:
            return Evaluation(kernel, row, "illegal", tuple(reasons), k.identity,
                              seconds=time.perf_counter() - t0)
        compiled = self.compiled(kernel, row)
        prog = compiled["cuda"]
        resources: dict = {}
        for unit in units_of(prog, kernel):
            found, failure = self._compile(unit)
            if failure:
                return Evaluation(kernel, row, "compile_error", (failure,), k.identity,
                                  seconds=time.perf_counter() - t0)
            resources.update(found)
        key = tuple((name, str(r)) for name, r in compiled["tile"].rows.items())
        first = self._programs.get(key)
        if first is not None:
            return replace(first, kernel=kernel, row=row, kernel_hash=k.identity,
                           resources=resources, seconds=time.perf_counter() - t0,
                           same_program_as=f"{first.kernel}: {first.row}")
        verdict, reasons, abs_err, rel_err = self._check(prog)
        timing = self._time(compiled) if verdict == "ok" else None
        baselines = self.baselines() if timing is not None else {}
        result = Evaluation(kernel, row, verdict, reasons, k.identity, resources, abs_err,
                            rel_err, timing, baselines, time.perf_counter() - t0)
        if verdict in ("ok", "incorrect"):     # not a crash or a timeout: those may not recur
            self._programs[key] = result
        return result

    # --- the steps ----------------------------------------------------------------------------

    def _compile(self, unit) -> tuple[dict | None, str | None]:
        from emmy.cuda.nvrtc import compile_cuda

        result = compile_cuda(unit.source, self._target)
        if not result.ok:
            return None, "\n".join(result.errors[:8]) or result.log[-2000:]
        per_fn = {}
        for launch in unit.launches:
            per_fn[launch.function] = result.report_of(launch.function, launch.shared_bytes)
        return per_fn, None

    def _check(self, prog):
        """Fresh inputs (several seeds), NaN-poisoned outputs, inputs that must not change."""
        from emmy.bench.harness import check_program

        check = check_program(self.workload, self._graph, prog, device=self.device)
        abs_err = max((e.max_abs for e in check.errors), default=None)
        rel_err = max((e.max_rel for e in check.errors), default=None)
        return check.verdict, tuple(check.reasons), abs_err, rel_err

    def _time(self, compiled: dict) -> dict:
        if self.device == "gpu":
            return self._measure(compiled)
        us = self._estimate(compiled).seconds * 1e6
        return {"method": "modeled", "median_us": us, "p10_us": us, "p90_us": us, "n": 1}

    def _measure(self, compiled: dict) -> dict:
        from dataclasses import asdict

        from emmy.bench.timing import time_cuda
        from emmy.check import program_inputs
        from emmy.runtime.gpu import GpuProgram

        gp = GpuProgram(compiled["cuda"])
        gp.bind(program_inputs(self._graph, self.workload.inputs))
        return asdict(time_cuda(gp.launch))

    def baselines(self) -> dict:
        """eager and torch.compile times of the workload (measured; {} without a GPU)."""
        if self.device != "gpu" or not self.time_baselines:
            return {}
        if self._baselines is None:
            from dataclasses import asdict

            import torch

            from emmy.bench.baselines import compiled, eager

            args = tuple(x.cuda() if isinstance(x, torch.Tensor) else x
                         for x in self.workload.inputs)
            model = self.workload.model.cuda()
            self._baselines = {b.name: asdict(b.timing) for b in (eager(model, args),
                                                                  compiled(model, args))
                               if b.timing is not None}
        return self._baselines

    def _estimate(self, compiled: dict):
        from emmy.runtime.costmodel import estimate_compiled

        return estimate_compiled(compiled)


def units_of(prog, kernel: str) -> list:
    """The units a kernel's row made: its own, or after PLACE=cut on a chain of products, the
    two kernels it became (`<kernel>_cut0`, `<kernel>_cut1`)."""
    return [u for u in prog.units if u.kernel == kernel or u.kernel.startswith(f"{kernel}_cut")]


def _pick_device(device: str) -> str:
    if device not in ("auto", "cpu", "gpu"):
        raise UserError(f"device must be auto, cpu or gpu, not `{device}`")
    if device == "cpu":
        return "cpu"
    try:
        from emmy.runtime.gpu import gpu_available
    except ImportError:
        available = False
    else:
        available = gpu_available()
    if device == "gpu" and not available:
        raise UserError("no CUDA GPU is available here (device=gpu); use device=auto or cpu")
    return "gpu" if available else "cpu"
