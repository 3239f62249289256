"""The GPU performance suites: `run_suite("core" | "matmul" | "attention" | "conv" | "gather" |
"all")`.

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
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emmy.bench.baselines import Baseline
from emmy.bench.harness import DISTRIBUTIONS
from emmy.bench.report import (_BASELINE_NAMES, COPY_BYTES, ROOT, DeviceInfo, PlannedRow,
                               Prepared, RowResult, SuiteReport, WorkloadResult, _assemble,
                               append_benchmarks, render_notes, render_table, write_json)
from emmy.bench.timing import Timing
from emmy.errors import UserError

EXAMPLES = ROOT / "examples"
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"
SUITE_NAMES = ("core", "matmul", "attention", "conv", "rows", "gather", "block", "all")

# The report's names stay importable from here (emmy.cli, tests): they live in emmy.bench.report.
__all__ = ["SUITES", "SUITE_NAMES", "WorkloadSpec", "BenchOptions", "suite_specs", "cast_workload",
           "compile_rows", "plan_rows", "bytes_moved", "bench_item", "device_info", "copy_ceiling",
           "run_suite", "run_specs", "select_specs", "PlannedRow", "Prepared", "RowResult", "DeviceInfo",
           "WorkloadResult", "SuiteReport", "render_table", "render_notes", "append_benchmarks",
           "write_json"]


@dataclass(frozen=True)
class WorkloadSpec:
    """A workload the suite builds: an example file, its size overrides, an element type."""

    name: str
    example: str                              # examples/<example>.py
    sets: tuple[tuple[str, Any], ...] = ()
    dtype: str = "f32"                        # f32 or fp8: as the file makes it; bf16/f16 cast
    #                                           its model and inputs
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
        return w if self.dtype in ("f32", "fp8") else cast_workload(w, self.dtype)


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
_RESNET = (("batch_size", 32), ("in_channels", 64), ("out_channels", 64), ("height", 56),
           ("width", 56), ("kernel_size", 3), ("stride", 1), ("padding", 1))
SUITES: dict[str, tuple[WorkloadSpec, ...]] = {
    "core": (*_both("rmsnorm", "rmsnorm", {"batch_size": N, "dim": N}, f"{N}x{N}"),
             *_both("layernorm", "layernorm", {"batch_size": N, "seq_len": 1, "hidden": N},
                    f"{N}x{N}"),
             *_both("softmax", "softmax", {"batch_size": N, "dim": N}, f"{N}x{N}"),
             *_both("log_softmax", "log_softmax", {"batch_size": N, "dim": N}, f"{N}x{N}"),
             *_both("elementwise_chain", "elementwise_chain", {"batch_size": N, "dim": N},
                    f"2x {N}x{N}")),
    # The targets: fp16/bf16 4096^3 against cuBLAS (mma.sync and wgmma rows), f32 on
    # CUDA cores, a linear layer with a fused bias + ReLU epilogue, a batched product.
    "matmul": (WorkloadSpec("matmul", "matmul", (("M", 4096), ("K", 4096), ("N", 4096)),
                            "f16", "4096^3"),
               WorkloadSpec("matmul", "matmul", (("M", 4096), ("K", 4096), ("N", 4096)),
                            "bf16", "4096^3"),
               WorkloadSpec("matmul", "matmul", (("M", 2048), ("K", 2048), ("N", 2048)),
                            "f32", "2048^3"),
               WorkloadSpec("linear+relu", "linear", (("batch_size", 4096), ("in_features", 4096),
                                                      ("out_features", 4096)), "bf16", "4096^3"),
               WorkloadSpec("bmm", "bmm", (("batch_size", 16), ("M", 1024), ("K", 1024),
                                           ("N", 1024)), "f16", "16x1024^3"),
               # weight-only int8 linear layers (per-row f16 scales, a bias) against eager (the
               # f16 weight dequantized, then cuBLAS) and cuBLAS on an f16 weight: a decoding
               # batch of 16 rows (dequantized inside an mma.sync product by default) and 4,096
               # rows (inside a wgmma product on sm_90a; on sm_80 the default cuts from about
               # 16,384 rows)
               *(WorkloadSpec("int8 linear", "int8_linear",
                              (("batch", b), ("in_features", 4096), ("out_features", 4096)),
                              "f16", f"{b}x4096 -> 4096") for b in (16, 4096)),
               # weight-only int4 (two to a byte, a scale per group of 128), the same shapes:
               # inside an mma.sync product at 16 rows, a wgmma product at 4,096
               *(WorkloadSpec("int4 linear", "int4_linear",
                              (("batch", b), ("in_features", 4096), ("out_features", 4096)),
                              "f16", f"{b}x4096 -> 4096") for b in (16, 4096)),
               # GPTQ's checkpoint format (eight weights an int32 along k, zero points packed
               # along n): a decoding batch, the zero point taken away on the weight pairs
               WorkloadSpec("gptq linear", "gptq_linear",
                            (("batch", 16), ("in_features", 4096), ("out_features", 4096)),
                            "f16", "16x4096 -> 4096"),
               # AWQ's (eight weights an int32 along n in its interleaved order, undone by a
               # constant list): neighbouring outputs' nibbles paired, their zero points too
               WorkloadSpec("awq linear", "awq_linear",
                            (("batch", 16), ("in_features", 4096), ("out_features", 4096)),
                            "f16", "16x4096 -> 4096"),
               # torchao's float8 linear layer (e4m3 weights and a dynamic per-row activation
               # scale, torch._scaled_mm, bf16 out) against eager's _scaled_mm (cuBLASLt on
               # Hopper's fp8 tensor cores): emmy's product widens the fp8 operands to bf16
               *(WorkloadSpec("fp8 linear", "fp8_linear",
                              (("batch", b), ("in_features", 4096), ("out_features", 4096)),
                              "fp8", f"{b}x4096 -> 4096") for b in (16, 4096))),
    # batch 4, 32 heads, sequence 4096, head dim 128
    "attention": tuple(WorkloadSpec(f"attention{'' if causal else ' (full)'}", "attention",
                                    (("batch_size", 4), ("heads", 32), ("seq_len", 4096),
                                     ("head_dim", 128), ("is_causal", causal)), d,
                                    f"4x32x4096x128{' causal' if causal else ''}")
                       for causal, d in ((True, "f16"), (False, "f16"),
                                         (True, "f32"),      # f32: on CUDA cores
                                         (True, "bf16"))) + (
        # a decoding step of Llama-3-8B's attention: one query a head, 32 heads sharing 8
        # key/value heads, a 4,096-token cache (split-KV rows against SDPA's decode kernel)
        WorkloadSpec("decode attention", "decode_attention",
                     (("batch_size", 1), ("n_heads", 32), ("n_kv_heads", 8),
                      ("cache_len", 4096), ("head_dim", 128)), "f16",
                     "1x32 (8 kv) x 4096 x 128"),),
    # implicit GEMMs against cuDNN: a ResNet-50 stage-1 3x3 convolution (batch 32, 64 -> 64
    # channels, 56x56) in f16 (mma.sync) and f32 (SIMT), and a strided one
    "conv": (*(WorkloadSpec("conv3x3+relu", "conv2d", _RESNET, d, "32x64x56x56 k3")
               for d in ("f16", "f32")),
             WorkloadSpec("conv3x3/2+relu", "conv2d",
                          (*_RESNET[:2], ("out_channels", 128), *_RESNET[3:], ("stride", 2)),
                          "f16", "32x64x56x56 k3 s2 -> 128")),
    # a few long rows, fewer than the SMs (each row's blocks share it: clusters on sm_90a):
    # a decoding step's softmax over GPT-2's vocabulary for 8 sequences, log_softmax over
    # Llama-3's 128,256 words for 4, a LayerNorm over 4 rows of 8,192
    "rows": (WorkloadSpec("softmax", "softmax", (("batch_size", 8), ("dim", 50257)), "f32",
                          "8x50257"),
             WorkloadSpec("log_softmax", "log_softmax", (("batch_size", 4), ("dim", 128256)),
                          "bf16", "4x128256"),
             WorkloadSpec("layernorm", "layernorm",
                          (("batch_size", 4), ("seq_len", 1), ("hidden", 8192)), "f32",
                          "4x8192")),
    # memory-bound reads at run-time positions: GPT-2's input (token and position embeddings,
    # the first LayerNorm; batch 8, sequence 1024, hidden 768, vocabulary 50257)
    "gather": _both("embedding+layernorm", "embedding",
                    {"batch_size": 8, "seq_len": 1024, "vocab": 50257, "hidden": 768},
                    "8x1024x768 vocab 50257"),
    # a whole decoder layer against eager and torch.compile: Llama-3-8B's sizes (width 4096, 32
    # query heads, 8 key/value heads, feed-forward 14336) over 2048 tokens, bf16; twelve kernels
    # (examples/llama_block.py), timed together
    # and DeepSeek-V3's mixture-of-experts router over 4096 tokens: a bf16 gate projection
    # (7168 -> 256 experts), softmax in f32, the top 8, weights renormalized (two kernels), and
    # a decoding step's sampling filters over GPT-2's vocabulary (top 50 selected, top-p over
    # the merge-sorted probabilities)
    "block": (WorkloadSpec("llama layer", "llama_block",
                           (("batch_size", 1), ("seq_len", 2048), ("dim", 4096), ("n_heads", 32),
                            ("n_kv_heads", 8), ("hidden", 14336), ("dtype", "bfloat16")),
                           "bf16", "1x2048x4096 ffn 14336"),
              WorkloadSpec("moe router", "moe_router",
                           (("tokens", 4096), ("hidden", 7168), ("experts", 256), ("top_k", 8)),
                           "bf16", "4096x7168 -> 256 experts, top 8"),
              WorkloadSpec("sampling filters", "sampling", (("batch_size", 8), ("vocab", 50257)),
                           "f32", "8x50257, top 50 and top-p 0.9")),
}


def suite_specs(name: str) -> tuple[WorkloadSpec, ...]:
    if name == "all":
        return tuple(s for k in SUITE_NAMES[:-1] for s in SUITES[k])
    if name not in SUITES:
        raise UserError(f"unknown suite {name!r}; the suites are {', '.join(SUITE_NAMES)}")
    return SUITES[name]


def select_specs(specs: tuple[WorkloadSpec, ...], only: tuple[str, ...]) -> tuple[WorkloadSpec, ...]:
    """The workloads whose name starts with one of `only` (all of them when `only` is empty)."""
    if not only:
        return specs
    kept = tuple(s for s in specs if any(s.name.startswith(o) for o in only))
    if not kept:
        raise UserError(f"--only {' '.join(only)} matches no workload of this suite; its "
                        f"workloads are {', '.join(dict.fromkeys(s.name for s in specs))}")
    return kept


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
    rows: tuple[tuple[str | None, str], ...] = ()   # given rows: (kernel or None = any, row)


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


def given_rows(spaces, default: dict[str, str],
               given: tuple[tuple[str | None, str], ...]) -> tuple[list[dict], list[str]]:
    """The rows a person gave (kernel None: every kernel whose space holds it), each with the
    default rows of the other kernels; notes say which were refused and why."""
    from emmy.schedule.row import RowError, parse

    out: list[dict] = []
    notes: list[str] = []
    for kernel, text in given:
        names = [kernel] if kernel is not None else list(spaces)
        if kernel is not None and kernel not in spaces:
            notes.append(f"row `{text}` for kernel `{kernel}`: no such kernel; the kernels are "
                         f"{', '.join(spaces)}")
            continue
        why = []
        for name in names:
            try:
                refusals = spaces[name].check(parse(text))
            except RowError as e:
                refusals = [e]
            if refusals:
                why.append(f"`{name}`: {refusals[0]}")
                continue
            cand = {**default, name: text}
            if cand not in out:
                out.append(cand)
        if len(why) == len(names):
            notes.append(f"row `{text}`: refused ({'; '.join(why)})")
    return out, notes


def plan_rows(loop_program, tile_program, target: str, *, top_k: int, sample: int,
              seed: int = 0, given: tuple[tuple[str | None, str], ...] = ()
              ) -> tuple[tuple[PlannedRow, ...], tuple[str, ...]]:
    """The default row, the given rows, then the cost model's top_k of a sample, then the rest
    as the sweep."""
    from emmy.schedule.space import Space
    from emmy.schedule.targets import get_target

    spaces = {k.name: Space(k, get_target(target)) for k in tile_program.kernels}
    default = {name: str(sp.default()) for name, sp in spaces.items()}
    chosen, notes = given_rows(spaces, default, given)
    chosen = [c for c in chosen if c != default]
    candidates = []
    for name, sp in spaces.items():
        for row in sp.sample(sample, seed):
            cand = {**default, name: str(row)}
            if cand != default and cand not in candidates and cand not in chosen:
                candidates.append(cand)
    candidates = chosen + candidates
    estimate = _estimator()
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
    plan += [PlannedRow(key(c), "given", modeled.get(j + 1)) for j, c in enumerate(chosen)]
    ranked = sorted((i for i in modeled if i > len(chosen)), key=lambda i: modeled[i])[:top_k]
    plan += [PlannedRow(key(candidates[i - 1]), "modeled", modeled[i]) for i in ranked]
    plan += [PlannedRow(key(c), "sweep", modeled.get(j + 1)) for j, c in enumerate(candidates)
             if j + 1 > len(chosen) and j + 1 not in ranked]
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


def bytes_moved(prog, loop=None) -> int:
    """The fewest bytes a program must move: each input (parameters too) and output once; with
    its Loop IR (`loop`), an input only gathered from (an embedding table) counts the elements
    its gathers read, at most all of them."""
    gathered = _gathered_elements(loop) if loop is not None else {}
    return sum(min(b.type.numel, gathered.get(b.name, b.type.numel)) * b.type.dtype.itemsize
               for b in (*prog.inputs, *prog.outputs))


def _gathered_elements(loop) -> dict[str, int]:
    """Per buffer read only by gathers (loads at run-time positions): how many elements those
    loads read, one per iteration of the loops around them; loads at the same positions
    (LayerNorm's passes over one gathered row) count once."""
    from emmy.loop_ir.ir import Load, Loop

    runs_at: dict[tuple, int] = {}   # (kernel, buffer, positions' values) -> most iterations
    affine: set[str] = set()

    def walk(name: str, body, runs: int) -> None:
        for s in body:
            if isinstance(s, Loop):
                walk(name, s.body, runs * s.extent)
            elif isinstance(s, Load) and s.dyn:
                key = (name, s.buffer, s.dyn)
                runs_at[key] = max(runs_at.get(key, 0), runs)
            elif isinstance(s, Load):
                affine.add(s.buffer)
    for k in loop.kernels:
        walk(k.name, k.body, 1)
    counts: dict[str, int] = {}
    for (_, buffer, _), n in runs_at.items():
        counts[buffer] = counts.get(buffer, 0) + n
    return {b: n for b, n in counts.items() if b not in affine}


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
                                     top_k=opt.top_k, sample=opt.sample, given=opt.rows)
        where = "cuda" if opt.device == "gpu" else "cpu"
        self.cases = make_cases(workload, self.graph, seeds=opt.seeds,
                                distributions=opt.distributions, device=where)
        self.model = workload.model.to(where).eval()
        default = compile_rows(self.loop, dict(self.plan[0].rows), opt.target)["cuda"]
        self.prepared = Prepared(spec.label, self.plan, bytes_moved(default, self.loop),
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
              only: tuple[str, ...] = (), **options) -> SuiteReport:
    """Run a suite on this machine's GPU; the report is returned, appended to BENCHMARKS.md and
    written as JSON to `json_out` when given. `only`: workload name prefixes to keep."""
    from emmy.runtime.gpu import gpu_available

    specs = select_specs(suite_specs(name), only)
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
        rows_per_spec = 1 + opt.top_k + (opt.sample + len(opt.rows)) * 4
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
        write_json(report, json_out)
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
