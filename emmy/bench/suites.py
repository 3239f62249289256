"""The GPU performance suites: `run_suite("core" | "matmul" | "attention" | "all")`.

For each workload: the default row, the cost model's top rows and a sweep of sampled legal rows
under a fixed time budget, each compiled, checked by the harness (2 seeds x 3 distributions vs
float64, poisoned outputs, inputs unchanged) and only then timed, and checked once more after
timing; eager, torch.compile and cuBLAS timed by the same function in the same run; a
device-to-device copy gives the bandwidth ceiling. All GPU work runs in a worker process
(`emmy.bench.worker`), so a crash or a hang costs one row, not the suite.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emmy.bench.baselines import Baseline
from emmy.bench.harness import DISTRIBUTIONS
from emmy.bench.timing import Timing
from emmy.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"
COPY_BYTES = 1 << 30
SUITE_NAMES = ("core", "matmul", "attention", "all")


@dataclass(frozen=True)
class WorkloadSpec:
    """A workload the suite builds: an example file, its size overrides, an element type."""

    name: str
    example: str                              # examples/<example>.py
    sets: tuple[tuple[str, Any], ...] = ()
    dtype: str = "f32"                        # f32 as the file makes it; bf16 casts model+inputs
    shape: str = ""

    @property
    def label(self) -> str:
        return f"{self.name} {self.dtype} {self.shape}".strip()

    def load(self):
        """The Workload, cast to `dtype` when it is not f32."""
        from emmy.frontend.workload import load_file

        path = EXAMPLES / f"{self.example}.py"
        if not path.is_file():
            raise UserError(f"the bench suites need the repository's examples/ folder; "
                            f"{path} is missing")
        w = load_file(path, self.sets)
        return w if self.dtype == "f32" else cast_workload(w, self.dtype)


def cast_workload(w, dtype: str):
    """The workload with its model and floating inputs in `dtype` (e.g. bf16)."""
    import torch

    from emmy.dtypes import DType, to_torch

    t = to_torch(DType(dtype))

    def cast(xs):
        return tuple(x.to(t) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                     for x in xs)

    make = w.make_inputs
    return dataclasses.replace(w, name=f"{w.name}_{dtype}", model=w.model.to(t),
                               inputs=cast(w.inputs),
                               make_inputs=(lambda: cast(make())) if make else None)


def _both(name, example, sets, shape) -> tuple[WorkloadSpec, ...]:
    sets = tuple(sets.items())
    return tuple(WorkloadSpec(name, example, sets, d, shape) for d in ("f32", "bf16"))


N = 8192
SUITES: dict[str, tuple[WorkloadSpec, ...]] = {
    "core": (*_both("rmsnorm", "rmsnorm", {"batch_size": N, "dim": N}, f"{N}x{N}"),
             *_both("layernorm", "layernorm", {"batch_size": N, "seq_len": 1, "hidden": N},
                    f"{N}x{N}"),
             *_both("softmax", "softmax", {"batch_size": N, "dim": N}, f"{N}x{N}"),
             *_both("log_softmax", "log_softmax", {"batch_size": N, "dim": N}, f"{N}x{N}"),
             *_both("elementwise_chain", "elementwise_chain", {"batch_size": N, "dim": N},
                    f"2x {N}x{N}")),
    "matmul": (*_both("matmul", "matmul", {"M": 2048, "K": 2048, "N": 2048}, "2048^3"),
               *_both("linear+relu", "linear", {"batch_size": 4096, "in_features": 4096,
                                                "out_features": 4096}, "4096^3")),
    "attention": _both("attention", "attention", {"batch_size": 4, "heads": 16, "seq_len": 1024,
                                                  "head_dim": 64}, "4x16x1024x64 causal"),
}


def suite_specs(name: str) -> tuple[WorkloadSpec, ...]:
    if name == "all":
        return tuple(s for k in ("core", "matmul", "attention") for s in SUITES[k])
    if name not in SUITES:
        raise UserError(f"unknown suite {name!r}; the suites are {', '.join(SUITE_NAMES)}")
    return SUITES[name]


@dataclass(frozen=True)
class BenchOptions:
    """How much each workload gets; `deadline` (wall clock, time.time()) bounds the suite."""

    deadline: float
    target: str = "sm_90a"
    seeds: tuple[int, ...] = (0, 1)
    distributions: tuple[str, ...] = DISTRIBUTIONS
    top_k: int = 3                # modeled-best rows timed besides the default
    sample: int = 16              # rows sampled per kernel: ranked by the model, then swept
    sweep_s: float = 6.0          # wall-clock budget for the sweep of one workload
    row_timing_s: float = 0.5     # time_cuda budget for one row
    baseline_timing_s: float = 1.0
    scratch: str = ""             # a JSON file the workers share (when each sweep started)
    device: str = "gpu"           # "cpu": a dry run on the emulator, checks only, no timing


# ---------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class PlannedRow:
    rows: tuple[tuple[str, str], ...]         # (kernel, row) for every kernel
    source: str                               # default | modeled | sweep
    modeled_us: float | None = None


@dataclass(frozen=True)
class Prepared:
    label: str
    plan: tuple[PlannedRow, ...]
    bytes_moved: int                          # each input and output once
    reference_dtype: str
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class RowResult:
    index: int
    rows: tuple[tuple[str, str], ...]
    source: str
    verdict: str        # ok | incorrect | crash | compile_error | timeout | skipped
    reasons: tuple[str, ...] = ()
    timing: Timing | None = None
    modeled_us: float | None = None
    worst_rel_l2: float | None = None

    @property
    def row_text(self) -> str:
        return "; ".join(r if len(self.rows) == 1 else f"{k}: {r}" for k, r in self.rows)


@dataclass(frozen=True)
class DeviceInfo:
    gpu: str
    driver: str
    cuda_runtime: str
    torch: str
    cupy: str
    emmy: str
    sm_count: int
    l2_bytes: int
    memory_bytes: int


@dataclass(frozen=True)
class WorkloadResult:
    spec: WorkloadSpec
    prepared: Prepared | None
    rows: tuple[RowResult, ...]
    baselines: tuple[Baseline, ...]
    notes: tuple[str, ...] = ()

    @property
    def best(self) -> RowResult | None:
        timed = [r for r in self.rows if r.verdict == "ok" and r.timing is not None]
        return min(timed, key=lambda r: r.timing.median_us) if timed else None

    def baseline(self, name: str) -> Baseline | None:
        return next((b for b in self.baselines if b.name == name), None)


@dataclass(frozen=True)
class SuiteReport:
    suite: str
    date: str
    command: str
    device: DeviceInfo | None
    copy: Timing | None
    copy_gbps: float | None
    workloads: tuple[WorkloadResult, ...]
    seconds: float
    notes: tuple[str, ...] = ()
    seeds: tuple[int, ...] = (0, 1)
    distributions: tuple[str, ...] = DISTRIBUTIONS

    def table(self) -> str:
        return render_table(self)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------
# Planning: which rows to time (CPU only)


def compile_rows(loop_program, rows: dict[str, str], target: str) -> dict[str, Any]:
    """The tile, kernel and cuda stages for these rows, from an already lowered Loop IR."""
    from emmy.pipeline import STAGES, Options

    opts = Options(target=target, rows=dict(rows))
    names = [s.name for s in STAGES]
    value, out = loop_program, {}
    for stage in STAGES[names.index("loop") + 1:]:
        value = stage.run(value, opts)
        out[stage.name] = value
    return out


def plan_rows(loop_program, tile_program, target: str, *, top_k: int, sample: int,
              seed: int = 0) -> tuple[tuple[PlannedRow, ...], tuple[str, ...]]:
    """The default row, then the cost model's top_k of a sample, then the rest as the sweep."""
    from emmy.schedule.space import Space
    from emmy.schedule.targets import get_target

    spaces = {k.name: Space(k, get_target(target)) for k in tile_program.kernels}
    default = {name: str(sp.default()) for name, sp in spaces.items()}
    candidates = []
    for name, sp in spaces.items():
        for row in sp.sample(sample, seed):
            cand = {**default, name: str(row)}
            if cand != default and cand not in candidates:
                candidates.append(cand)
    estimate, notes = _estimator(), []
    modeled: dict[int, float] = {}
    if estimate is None:
        notes.append("cost model unavailable: the rows after the default are a random sample")
    else:
        failed = 0
        for i, cand in enumerate([default, *candidates]):
            try:
                modeled[i] = estimate(compile_rows(loop_program, cand, target)) * 1e6
            except Exception as e:  # a model gap must not stop the measurement
                failed += 1
                last = f"{type(e).__name__}: {e}"
        if failed:
            notes.append(f"cost model failed on {failed} rows (last: {last[:200]})")
    key = lambda c: tuple(sorted(c.items()))  # noqa: E731
    plan = [PlannedRow(key(default), "default", modeled.get(0))]
    ranked = sorted((i for i in modeled if i > 0), key=lambda i: modeled[i])[:top_k]
    plan += [PlannedRow(key(candidates[i - 1]), "modeled", modeled[i]) for i in ranked]
    plan += [PlannedRow(key(c), "sweep", modeled.get(j + 1)) for j, c in enumerate(candidates)
             if j + 1 not in ranked]
    return tuple(plan), tuple(notes)


def _estimator():
    """results (tile/kernel/cuda stages) -> modeled seconds, or None without a cost model."""
    try:
        from emmy.runtime import costmodel
    except Exception:
        return None
    if hasattr(costmodel, "estimate_compiled"):
        return lambda results: costmodel.estimate_compiled(results).seconds
    if hasattr(costmodel, "estimate_program"):
        return lambda results: costmodel.estimate_program(
            results["cuda"], results["tile"].target, results["kernel"]).seconds
    return None


def bytes_moved(prog) -> int:
    """The fewest bytes a program must move: each input (parameters too) and output once."""
    return sum(b.type.numel * b.type.dtype.itemsize for b in (*prog.inputs, *prog.outputs))


# ---------------------------------------------------------------------------------------------
# The worker side: one item at a time, the prepared workload kept between items


class _State:
    """What the worker holds for the workload it is on (one at a time, to bound memory)."""

    def __init__(self, spec: WorkloadSpec, opt: BenchOptions):
        from emmy.bench.harness import make_cases
        from emmy.pipeline import Options, compile_to

        self.spec = spec
        workload = spec.load()
        stages = compile_to(workload, "tile", Options(target=opt.target))
        self.graph, self.loop = stages["torch"], stages["loop"]
        self.plan, notes = plan_rows(self.loop, stages["tile"].program, opt.target,
                                     top_k=opt.top_k, sample=opt.sample)
        where = "cuda" if opt.device == "gpu" else "cpu"
        self.cases = make_cases(workload, self.graph, seeds=opt.seeds,
                                distributions=opt.distributions, device=where)
        self.model = workload.model.to(where).eval()
        default = compile_rows(self.loop, dict(self.plan[0].rows), opt.target)["cuda"]
        self.prepared = Prepared(spec.label, self.plan, bytes_moved(default),
                                 self.cases[0].reference_dtype, notes)


_STATE: dict[str, Any] = {}     # "current": the _State; "mark …": times without a scratch file


def _state(spec: WorkloadSpec, opt: BenchOptions) -> _State:
    current = _STATE.get("current")
    if current is None or current.spec != spec:
        import torch

        _STATE.pop("current", None)
        if opt.device == "gpu":
            torch.cuda.empty_cache()
        _STATE["current"] = _State(spec, opt)
    return _STATE["current"]


def first_time(opt: BenchOptions, key: str) -> float:
    """When `key` was first marked, by this worker or an earlier one (now, if never)."""
    now = time.time()
    if not opt.scratch:
        return _STATE.setdefault(f"mark {key}", now)
    path = Path(opt.scratch)
    marks = json.loads(path.read_text()) if path.exists() else {}
    if key not in marks:
        marks[key] = now
        path.write_text(json.dumps(marks))
    return marks[key]


def bench_item(item: tuple) -> Any:
    """One unit of GPU work, run inside the worker: device | copy | prepare | baseline | row."""
    kind = item[0]
    if kind == "device":
        return device_info()
    if kind == "copy":
        return copy_ceiling(item[1])
    spec, opt = item[1], item[-1]
    current = _STATE.get("current")
    if time.time() > opt.deadline and (current is None or current.spec != spec):
        return None                       # past the suite's budget: do not even load it
    if kind == "prepare":
        return _state(spec, opt).prepared
    if kind == "baseline":
        return _baseline(spec, item[2], opt)
    if kind == "row":
        return _row(spec, item[2], opt)
    raise ValueError(f"unknown bench item {kind!r}")


def device_info() -> DeviceInfo:
    import cupy
    import torch

    import emmy

    dev = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(dev)
    return DeviceInfo(torch.cuda.get_device_name(dev), _driver_version(),
                      _cuda_version(cupy.cuda.runtime.runtimeGetVersion()), torch.__version__,
                      cupy.__version__, getattr(emmy, "__version__", _package_version()),
                      props.multi_processor_count, int(getattr(props, "L2_cache_size", 0)),
                      props.total_memory)


def _driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    import cupy

    return f"CUDA {_cuda_version(cupy.cuda.runtime.driverGetVersion())} (driver API)"


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def _package_version() -> str:
    try:
        from importlib.metadata import version

        return version("emmy-agent")
    except Exception:
        return "unknown"


def copy_ceiling(nbytes: int = COPY_BYTES) -> tuple[Timing, float]:
    """A device-to-device copy of `nbytes`: its timing and GB/s counting bytes read + written."""
    import torch

    from emmy.bench.timing import time_cuda

    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    t = time_cuda(lambda: dst.copy_(src), budget_s=1.0)
    return t, 2 * nbytes / (t.median_us * 1e-6) / 1e9


def _baseline(spec: WorkloadSpec, name: str, opt: BenchOptions) -> Baseline | None:
    from emmy.bench import baselines

    if opt.device != "gpu":
        return None
    if time.time() > opt.deadline:
        return Baseline(_BASELINE_NAMES[name], None, "skipped: suite time budget spent")
    st = _state(spec, opt)
    args = st.cases[0].args
    budget = {"budget_s": opt.baseline_timing_s}
    if name == "eager":
        return baselines.eager(st.model, args, **budget)
    if name == "compile":
        return baselines.compiled(st.model, args, **budget)
    if name == "cublas":
        return baselines.cublas(st.graph, **budget)
    raise ValueError(f"unknown baseline {name!r}")


_BASELINE_NAMES = {"eager": "eager", "compile": "torch.compile", "cublas": "cuBLAS"}


def _row(spec: WorkloadSpec, index: int, opt: BenchOptions) -> RowResult | None:
    """Compile, check, time and check again one planned row; None past the end of the plan."""
    from emmy.bench.harness import CpuExecutor, GpuExecutor, check_case, check_cases
    from emmy.bench.timing import time_cuda
    from emmy.bench.worker import RestartAfter

    st = _state(spec, opt)
    if index >= len(st.plan):
        return None
    planned = st.plan[index]
    result = RowResult(index, planned.rows, planned.source, "skipped",
                       modeled_us=planned.modeled_us)
    now = time.time()
    if planned.source == "sweep" and now - first_time(opt, f"sweep {spec}") > opt.sweep_s:
        return dataclasses.replace(result, reasons=("sweep budget spent",))
    if now > opt.deadline:
        return dataclasses.replace(result, reasons=("suite time budget spent",))
    prog = compile_rows(st.loop, dict(planned.rows), opt.target)["cuda"]
    run = GpuExecutor(prog) if opt.device == "gpu" else CpuExecutor(prog)
    check = check_cases(run, prog, st.cases, device=opt.device)
    worst = max((e.rel_l2 for e in check.errors), default=None)
    result = dataclasses.replace(result, verdict=check.verdict, reasons=check.reasons,
                                 worst_rel_l2=worst)
    if check.verdict == "crash" and opt.device == "gpu":
        raise RestartAfter(result)          # the CUDA context may be unusable now
    if not check.ok or opt.device != "gpu":
        return result
    program = run.program
    program.bind({n: t.clone() for n, t in st.cases[0].inputs.items()})
    timing = time_cuda(program.launch, budget_s=opt.row_timing_s)
    after = check_case(run, prog, st.cases[0])
    if after.verdict != "ok":
        return dataclasses.replace(result, verdict=after.verdict, timing=timing,
                                   reasons=("wrong when run again after timing",) + after.reasons)
    return dataclasses.replace(result, timing=timing)


# ---------------------------------------------------------------------------------------------
# The parent side


ROW_TIMEOUT_S = 60.0         # one row: compile, 6 checked runs, timing, a check after
SLOW_TIMEOUT_S = 240.0       # the first item (imports, CUDA start), preparing a workload
BASELINE_TIMEOUT_S = 180.0   # torch.compile's compilation and autotuning


def run_suite(name: str, json_out: str | Path | None = None, *, budget_s: float = 400.0,
              benchmarks_md: Path | None = BENCHMARKS_MD, command: str | None = None,
              **options) -> SuiteReport:
    """Run a suite on this machine's GPU; the report is returned, appended to BENCHMARKS.md and
    written as JSON to `json_out` when given."""
    from emmy.runtime.gpu import gpu_available

    specs = suite_specs(name)
    if not gpu_available():
        raise UserError("emmy bench needs a CUDA GPU; none is usable here (cupy could not see "
                        "a device, or torch.cuda is unavailable)",
                        hint="on a machine with an NVIDIA GPU: pip install -e \".[gpu]\"; without "
                             "one, `emmy run --check` checks on the CPU emulator and the cost "
                             "model gives modeled times")
    return run_specs(name, specs, json_out, budget_s=budget_s, benchmarks_md=benchmarks_md,
                     command=command, **options)


def run_specs(name: str, specs, json_out=None, *, budget_s: float = 400.0,
              benchmarks_md: Path | None = None, command: str | None = None,
              device: str = "gpu", **options) -> SuiteReport:
    """Run these workloads in worker processes and assemble the report; device="cpu" is a
    dry run on the emulator (plans and correctness, no timing, no baselines)."""
    from emmy.bench.worker import run_each

    start = time.time()
    with tempfile.TemporaryDirectory(prefix="emmy-bench-") as tmp:
        opt = BenchOptions(deadline=start + budget_s, scratch=str(Path(tmp) / "marks.json"),
                           device=device, **options)
        items: list[tuple] = [("device",), ("copy", COPY_BYTES)] if device == "gpu" else []
        limits = [SLOW_TIMEOUT_S, 120.0] if device == "gpu" else []
        rows_per_spec = 1 + opt.top_k + opt.sample * 4
        for spec in specs:
            items.append(("prepare", spec, opt))
            items += [("baseline", spec, b, opt) for b in ("eager", "compile", "cublas")]
            items += [("row", spec, i, opt) for i in range(rows_per_spec)]
            limits += [SLOW_TIMEOUT_S, *[BASELINE_TIMEOUT_S] * 3, *[ROW_TIMEOUT_S] * rows_per_spec]
        outcomes = run_each(bench_item, items, timeout=limits,
                            on_failure=lambda i, o: _skip_after(items, i))
    report = _assemble(name, specs, items, outcomes, start, command or _command(name, json_out))
    report = dataclasses.replace(report, seeds=opt.seeds, distributions=opt.distributions)
    if json_out:
        Path(json_out).write_text(json.dumps(report.to_dict(), indent=1, default=str) + "\n")
    if benchmarks_md:
        append_benchmarks(report, Path(benchmarks_md))
    return report


def _skip_after(items: list[tuple], i: int) -> list[int]:
    """Items not worth a fresh worker after item i failed: all when the device is unusable,
    the rest of a workload that could not be prepared."""
    kind = items[i][0]
    if kind == "device":
        return list(range(i + 1, len(items)))
    if kind == "prepare":
        return [j for j in range(i + 1, len(items)) if len(items[j]) > 1
                and items[j][1] == items[i][1]]
    return []


def _command(name: str, json_out) -> str:
    return f"emmy bench --suite {name}" + (f" --json {json_out}" if json_out else "")


def _assemble(name, specs, items, outcomes, start, command) -> SuiteReport:
    by_kind = {i[0]: o for i, o in zip(items, outcomes) if len(i) <= 2}
    device = by_kind["device"].value if "device" in by_kind and by_kind["device"].ok else None
    copy = gbps = None
    if "copy" in by_kind and by_kind["copy"].ok:
        copy, gbps = by_kind["copy"].value
    notes = [f"{k} failed ({o.status}): {o.log.strip()[-300:]}" for k, o in by_kind.items()
             if not o.ok]
    if "device" not in by_kind:
        notes.append("dry run on the CPU emulator: correctness only, nothing timed")
    workloads = []
    for spec in specs:
        mine = [(i, o) for i, o in zip(items, outcomes) if len(i) > 1 and i[1] == spec]
        prepared, rows, base, wnotes = None, [], [], []
        for item, o in mine:
            if item[0] == "prepare":
                prepared = o.value if o.ok else None
                if not o.ok:
                    wnotes.append(f"preparing failed ({o.status}): {o.log.strip()[-500:]}")
            elif item[0] == "baseline":
                if o.ok and o.value is not None:
                    base.append(o.value)
                elif not o.ok:
                    base.append(Baseline(_BASELINE_NAMES[item[2]], None, f"{o.status}: "
                                         f"{o.log.strip()[-300:]}"))
            elif o.ok and o.value is not None:
                rows.append(o.value)
            elif not o.ok and prepared is not None and item[2] < len(prepared.plan):
                p = prepared.plan[item[2]]
                verdict = {"timeout": "timeout", "skipped": "skipped"}.get(o.status, "crash")
                rows.append(RowResult(item[2], p.rows, p.source, verdict,
                                      (o.log.strip()[-1500:],), modeled_us=p.modeled_us))
        if prepared is not None:
            wnotes += list(prepared.notes)
        elif all(o.ok and o.value is None for _, o in mine):
            wnotes.append("not run: the suite's time budget was spent before it")
        workloads.append(WorkloadResult(spec, prepared, tuple(rows), tuple(base), tuple(wnotes)))
    if not any("mma" in r.row_text for w in workloads for r in w.rows) and any(
            w.baseline("cuBLAS") for w in workloads):
        notes.append("emmy's schedule space has no tensor-core (mma/wgmma) rows yet: its matrix "
                     "products run on CUDA cores, cuBLAS on tensor cores")
    return SuiteReport(name, time.strftime("%Y-%m-%d %H:%M:%S %Z"), command, device, copy, gbps,
                       tuple(workloads), time.time() - start, tuple(notes))


# ---------------------------------------------------------------------------------------------
# The report


def _us(t: Timing | None) -> str:
    return "—" if t is None else f"{t.median_us:,.1f} ({t.p10_us:,.1f}–{t.p90_us:,.1f})"


def _speedup(base: Baseline | None, best: RowResult | None) -> str:
    if base is None or base.timing is None or best is None:
        return "—"
    return f"{base.timing.median_us / best.timing.median_us:.2f}×"


def render_table(report: SuiteReport) -> str:
    """One markdown table: best emmy row against the baselines, bandwidth against the copy."""
    head = ("| workload | best emmy row | emmy µs | eager µs | torch.compile µs | cuBLAS µs "
            "| vs eager | vs compile | emmy GB/s | of copy | rows ok / checked |")
    lines = [head, "|" + "---|" * 11]
    for w in report.workloads:
        best = w.best
        eager, comp, blas = w.baseline("eager"), w.baseline("torch.compile"), w.baseline("cuBLAS")
        gbps = frac = "—"
        if best is not None and w.prepared is not None:
            rate = w.prepared.bytes_moved / (best.timing.median_us * 1e-6) / 1e9
            gbps = f"{rate:,.0f}"
            if report.copy_gbps:
                frac = f"{rate / report.copy_gbps:.0%}"
        checked = [r for r in w.rows if r.verdict != "skipped"]
        ok = sum(r.verdict == "ok" for r in checked)
        row = f"`{best.row_text}`" if best else ("not timed" if ok else "none passed")
        times = [_us(x.timing if x else None) for x in (best, eager, comp, blas)]
        lines.append(f"| {w.spec.label} | {row} | {' | '.join(times)} | {_speedup(eager, best)} "
                     f"| {_speedup(comp, best)} | {gbps} | {frac} | {ok} / {len(checked)} |")
    return "\n".join(lines)


_DISTRIBUTION_TEXT = {"normal": "normal", "uniform": "uniform [-1,1]", "large": "normal×100"}


def render_notes(report: SuiteReport) -> list[str]:
    notes = []
    if report.copy is not None:
        notes.append(f"copy ceiling: {report.copy_gbps:,.0f} GB/s (device-to-device copy of "
                     f"{COPY_BYTES >> 20} MiB, bytes read + written; {report.copy})")
    dists = ", ".join(_DISTRIBUTION_TEXT.get(d, d) for d in report.distributions)
    if report.device is not None:
        notes.append("times: median of CUDA-event timings, p10–p90 in parentheses, L2 flushed "
                     "(a read of 3× L2) before every repetition; all timed in the same run")
        notes.append("GB/s: each input (parameters too) and output counted once, over emmy's "
                     "median")
    notes.append(f"correctness: every row counted ok passed {len(report.seeds)} seed(s) × "
                 f"{len(report.distributions)} input distribution(s) ({dists}) against the "
                 "eager model in float64, with NaN-poisoned outputs and inputs checked "
                 "unchanged" + (", and passed again after timing" if report.device else ""))
    for w in report.workloads:
        notes += [f"{w.spec.label}: {b.name}: {b.note}" for b in w.baselines if b.note]
        notes += [f"{w.spec.label}: {n}" for n in w.notes]
        for r in w.rows:
            if r.verdict not in ("ok", "skipped"):
                why = r.reasons[0][:300] if r.reasons else ""
                notes.append(f"{w.spec.label}: row `{r.row_text}` ({r.source}): {r.verdict}: {why}")
    notes += list(report.notes)
    return notes


def append_benchmarks(report: SuiteReport, path: Path) -> None:
    """Append the report to BENCHMARKS.md: when, on what, the exact command, table, notes."""
    d = report.device
    where = d.gpu if d else "the CPU emulator (dry run, nothing timed)"
    lines = [f"## {report.date}: suite `{report.suite}` on {where}", "",
             f"- command: `{report.command}`"]
    if d is not None:
        lines.append(f"- GPU: {d.gpu}, {d.sm_count} SMs, L2 {d.l2_bytes >> 20} MiB, "
                     f"{d.memory_bytes / 2**30:.0f} GiB; driver {d.driver}; CUDA runtime "
                     f"{d.cuda_runtime}")
        lines.append(f"- versions: torch {d.torch}, cupy {d.cupy}, emmy {d.emmy} "
                     f"(commit {_git_commit()}), Python {sys.version.split()[0]}")
    lines += [f"- wall time: {report.seconds:.0f} s", "", report.table(), ""]
    lines += [f"- {n}" for n in render_notes(report)]
    text = "\n".join(lines) + "\n\n"
    old = path.read_text() if path.exists() else ""
    path.write_text(old + ("\n" if old and not old.endswith("\n") else "") + text)


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"
