"""Compare the `search` and `random` policies with the exhaustive best, per kernel.

    .venv/bin/python bench/search_vs_random.py [FILE ...] [--set [STEM:]NAME=VALUE]
        [--budget N] [--seeds 5] [--check] [--jobs 2] [--device auto|cpu|gpu] [--json PATH]

For every kernel of every workload file (default: rmsnorm, layernorm, softmax, log_softmax,
reductions, scan, matmul, linear; examples/norms.py is left out because it alone costs ~6
minutes on a cold cache: pass it by name):

1. The exhaustive best: the time of EVERY legal row (Evaluator.all_rows), then the minimum.
   On the CPU the time is the cost model's (modeled, as Evaluator.estimate_us computes it; the
   row-independent stages capture -> loop run once per file, and the result is checked equal
   to Evaluator.estimate_us on a few rows per kernel). With a GPU (--device gpu, or auto when
   one is there) every legal row goes through Evaluator.evaluate and the measured time counts
   (slow: an evaluation per row; pass few files). The exhaustive reference is a property of
   the timing method: correctness is not checked for it (with --check the best row is).
2. `search` (seed 0) and `random` (--seeds seeds) run on a Session, as `emmy-agent optimize`
   drives them, with an evaluation budget: 10 per reduction-style kernel, 30 per matmul-style
   kernel (the targets of issue 6), or --budget N for all. Each kernel is optimized alone (a
   Session that sees only that kernel), so "evaluations to best" is per kernel. An evaluation
   reaches the best when its verdict is ok and its time is within --tol of the exhaustive best
   (ties count: several rows can share the best modeled time).

By default evaluate() does NOT run the emitted CUDA on the CPU emulator for correctness: a
legal row's evaluation is verdict ok with the cost model's time (the output says so). --check
runs the real Evaluator.evaluate (NVRTC compile + CPU-emulated correctness + time, ~1-2 s a
row); evaluations are memoized across the runs of one benchmark (search, every random seed).
Cost-model estimates are memoized too, so the search's ranking is not cut by its 60 s
deadline here as it can be in a cold `optimize` run on a big space.

Time on 2 CPU cores: the default run takes ~7 minutes on a cold NVRTC cache (every legal row
is compiled once, for its register count) and ~20 s once ~/.cache/emmy (or $EMMY_CACHE_DIR)
holds them. --check costs ~2-4 s per distinct evaluated row (scan ~3 minutes, matmul ~12).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.api import Session  # noqa: E402
from agent.budget import Budget  # noqa: E402
from agent.evaluator import open_evaluator  # noqa: E402
from agent.policies.random import RandomPolicy  # noqa: E402
from agent.policies.search import SearchPolicy  # noqa: E402

DEFAULT_FILES = ("rmsnorm", "layernorm", "softmax", "log_softmax", "reductions", "scan",
                 "matmul", "linear")
MATMUL_STEMS = {"matmul", "linear", "bmm", "matvec", "mlp", "chained_matmul"}
REDUCTION_TARGET, MATMUL_TARGET = 10, 30    # evaluations (issue 6)
CHECKED_ROWS = 3                            # rows per kernel compared with estimate_us


# --- the exhaustive reference -----------------------------------------------------------------

_WORKER: dict = {}   # in forked workers: the evaluator and the Loop IR prefix of one file


def _prefix(ev) -> dict:
    """The row-independent stages (capture -> loop), computed once per file."""
    from emmy.pipeline import Options, compile_to

    return compile_to(ev.workload, "loop", Options(ev.target))


def _modeled_us(ev, prefix: dict, kernel: str, row: str) -> float:
    """Evaluator.estimate_us(kernel, row), from the Loop IR on: the same stages and model."""
    from emmy.pipeline import STAGE_NAMES, STAGES, Options
    from emmy.runtime.costmodel import estimate_compiled

    options = Options(ev.target, {kernel: row})
    results, value = dict(prefix), prefix["loop"]
    for stage in STAGES[STAGE_NAMES.index("loop") + 1:]:
        value = stage.run(value, options)
        results[stage.name] = value
    return estimate_compiled(results).seconds * 1e6


def _worker_init(tmp: str) -> None:
    import emmy.cuda.nvrtc as nvrtc

    tempfile.tempdir = tmp               # this worker's NVRTC PCH folder, removed by the parent
    nvrtc.pch_options.cache_clear()


def _worker_times(kernel: str, rows: list[str]) -> list[float | str]:
    ev, prefix = _WORKER["ev"], _WORKER["prefix"]
    out: list[float | str] = []
    for row in rows:
        try:
            out.append(_modeled_us(ev, prefix, kernel, row))
        except Exception as e:   # a legal row the model cannot time: reported, not the best
            out.append(f"{type(e).__name__}: {e}"[:300])
    return out


def modeled_times(ev, kernels: list[str], jobs: int) -> tuple[dict, dict]:
    """Every legal row's modeled time per kernel, and the failures, on `jobs` processes."""
    prefix = _prefix(ev)
    work = [(k, ev.all_rows(k)) for k in kernels]
    chunks = [(k, rows[i:i + 40]) for k, rows in work for i in range(0, len(rows), 40)]
    if jobs > 1:
        _WORKER.update(ev=ev, prefix=prefix)
        tmp = tempfile.mkdtemp(prefix="emmy-bench-")
        try:
            with ProcessPoolExecutor(jobs, mp_context=get_context("fork"),
                                     initializer=_worker_init, initargs=(tmp,)) as pool:
                parts = list(pool.map(_worker_times, *zip(*chunks)))
        finally:
            _WORKER.clear()
            shutil.rmtree(tmp, ignore_errors=True)
    else:
        _WORKER.update(ev=ev, prefix=prefix)
        parts = [_worker_times(k, rows) for k, rows in chunks]
        _WORKER.clear()
    times: dict[str, dict[str, float]] = {k: {} for k in kernels}
    failed: dict[str, dict[str, str]] = {k: {} for k in kernels}
    for (k, rows), values in zip(chunks, parts):
        for row, v in zip(rows, values):
            (failed if isinstance(v, str) else times)[k][row] = v
    # the shortcut must give Evaluator.estimate_us's numbers: compare on a few rows per kernel
    for k in kernels:
        info = next(i for i in ev.kernels() if i.name == k)
        sample = [info.default_row] + [r for r in ev.sample_rows(k, CHECKED_ROWS, 1)
                                       if r != info.default_row][:CHECKED_ROWS - 1]
        for row in sample:
            if row in times[k] and ev.estimate_us(k, row) != times[k][row]:
                raise SystemExit(f"{k}: {row}: the exhaustive shortcut gives {times[k][row]} µs, "
                                 f"Evaluator.estimate_us {ev.estimate_us(k, row)} µs")
    return times, failed


def measured_times(ev, kernels: list[str]) -> tuple[dict, dict, dict]:
    """Every legal row through Evaluator.evaluate (a GPU): the time of the ok ones."""
    times: dict[str, dict[str, float]] = {k: {} for k in kernels}
    failed: dict[str, dict[str, str]] = {k: {} for k in kernels}
    done: dict[tuple[str, str], object] = {}
    for k in kernels:
        for row in ev.all_rows(k):
            e = done[(k, row)] = ev.evaluate(k, row)
            if e.verdict == "ok" and e.timing and e.timing.get("median_us") is not None:
                times[k][row] = float(e.timing["median_us"])
            else:
                failed[k][row] = e.verdict
    return times, failed, done


# --- the policies' view of the compiler ----------------------------------------------------------

class KernelEvaluator:
    """The real Evaluator seen through one kernel, with memoized estimates and evaluations.

    check=False: evaluate() is legality + the modeled time, verdict ok WITHOUT the correctness
    run; check=True: the real Evaluator.evaluate.
    """

    def __init__(self, ev, kernel: str, times: dict[str, float], memo: dict, check: bool):
        self.ev, self.kernel, self.times, self.memo, self.check_correctness = (
            ev, kernel, times, memo, check)
        self.workload, self.workload_name = getattr(ev, "workload", None), ev.workload_name
        self.target, self.device = ev.target, ev.device
        self._info = [k for k in ev.kernels() if k.name == kernel]

    def kernels(self):
        return list(self._info)

    def decision_points(self, kernel):
        return self.ev.decision_points(kernel)

    def sample_rows(self, kernel, n, seed=0):
        return self.ev.sample_rows(kernel, n, seed)

    def all_rows(self, kernel):
        return self.ev.all_rows(kernel)

    def check(self, kernel, row):
        return self.ev.check(kernel, row)

    def read_ir(self, stage, kernel=None, row=None):
        return self.ev.read_ir(stage, kernel, row)

    def estimate_us(self, kernel, row):
        key = ("estimate", kernel, row)
        if key not in self.memo:
            self.memo[key] = (self.times[row] if row in self.times and self.ev.device != "gpu"
                              else self.ev.estimate_us(kernel, row))
        return self.memo[key]

    def evaluate(self, kernel, row):
        from emmy.evaluate import Evaluation

        key = ("evaluate", kernel, row)
        if key not in self.memo:
            if self.check_correctness:
                self.memo[key] = self.ev.evaluate(kernel, row)
            elif reasons := self.ev.check(kernel, row):
                self.memo[key] = Evaluation(kernel, row, "illegal", tuple(reasons),
                                            self._info[0].identity)
            else:
                us = self.estimate_us(kernel, row)
                self.memo[key] = Evaluation(
                    kernel, row, "ok", (), self._info[0].identity,
                    timing={"method": "modeled", "median_us": us, "p10_us": us, "p90_us": us,
                            "n": 1})
        return self.memo[key]


@dataclass
class Run:
    policy: str
    seed: int
    budget: int
    evaluations: int
    to_best: int | None        # evaluations until one reached the exhaustive best (1-based)
    ratio: float | None        # best time found / exhaustive best
    rows: list[str] = field(default_factory=list)
    verdicts: dict[str, int] = field(default_factory=dict)


def run_policy(policy, ev: KernelEvaluator, budget: int, best_us: float, tol: float) -> Run:
    session = Session(ev, Budget(evaluations=budget))
    policy.run(session)
    to_best, found = None, math.inf
    verdicts: dict[str, int] = {}
    for i, r in enumerate(session.results, 1):
        verdicts[r.verdict] = verdicts.get(r.verdict, 0) + 1
        if r.verdict != "ok" or r.timing is None:
            continue
        found = min(found, r.timing.median_us)
        if to_best is None and r.timing.median_us <= best_us * (1 + tol):
            to_best = i
    return Run(policy.name, policy.seed, budget, len(session.results), to_best,
               None if found == math.inf else found / best_us,
               [r.row for r in session.results], verdicts)


# --- one kernel, one file -------------------------------------------------------------------------

@dataclass
class KernelResult:
    file: str
    kernel: str
    legal_rows: int
    timed_rows: int
    method: str
    best_us: float
    best_rows: list[str]
    default_row: str
    default_us: float | None
    budget: int
    search: Run
    random: list[Run]
    best_verdict: str | None = None    # --check: the exhaustive best row's own verdict

    @property
    def random_expected(self) -> float:
        """Expected evaluations for uniform sampling without replacement: (N+1)/(m+1)."""
        return (self.timed_rows + 1) / (len(self.best_rows) + 1)


def bench_file(path: Path, sets: list[str], args) -> tuple[list[KernelResult], dict]:
    t0 = time.perf_counter()
    ev = open_evaluator(path, sets, args.target, args.device)
    infos = ev.kernels()
    t_open = time.perf_counter() - t0
    names = [k.name for k in infos]
    measured = ev.device == "gpu"
    done = {}
    if measured:
        times, failed, done = measured_times(ev, names)
    else:
        times, failed = modeled_times(ev, names, args.jobs)
    t_exhaustive = time.perf_counter() - t0 - t_open
    out = []
    memo: dict = {("evaluate",) + k: v for k, v in done.items()}
    check = args.check or measured
    for info in infos:
        k = info.name
        if not times[k]:
            print(f"  {path.stem}:{k}: no legal row could be timed; skipped", file=sys.stderr)
            continue
        # the exhaustive times' method: modeled on the CPU; on a GPU what evaluate() gave
        methods = {"modeled"} if not measured else {
            e.timing["method"] for (kk, _), e in done.items()
            if kk == k and e.verdict == "ok" and e.timing}
        method = "/".join(sorted(methods))
        best_us = min(times[k].values())
        tol = args.tol if args.tol is not None else (0.02 if "measured" in methods else 1e-9)
        best_rows = sorted(r for r, t in times[k].items() if t <= best_us * (1 + tol))
        budget = args.budget or (MATMUL_TARGET if path.stem in MATMUL_STEMS else REDUCTION_TARGET)
        view = KernelEvaluator(ev, k, times[k], memo, check)
        search = run_policy(SearchPolicy(seed=0), view, budget, best_us, tol)
        random_runs = [run_policy(RandomPolicy(seed=s), view, budget, best_us, tol)
                       for s in range(args.seeds)]
        verdict = view.evaluate(k, best_rows[0]).verdict if check else None
        out.append(KernelResult(path.stem, k, info.count, len(times[k]), method, best_us,
                                best_rows, info.default_row, times[k].get(info.default_row),
                                budget, search, random_runs, verdict))
        if failed[k]:
            print(f"  {path.stem}:{k}: {len(failed[k])} legal rows not timed "
                  f"(e.g. {next(iter(failed[k].values()))})", file=sys.stderr)
    t_total = time.perf_counter() - t0
    return out, {"file": path.stem, "open_s": round(t_open, 1),
                 "exhaustive_s": round(t_exhaustive, 1),
                 "policies_s": round(t_total - t_open - t_exhaustive, 1),
                 "total_s": round(t_total, 1),
                 "rows": sum(len(times[k]) + len(failed[k]) for k in names)}


# --- output ---------------------------------------------------------------------------------------

def ratio(x: float) -> str:
    return f"{x:.4f}x" if x < 1.01 else f"{x:.3f}x"


def search_cell(run: Run) -> str:
    if run.to_best is not None:
        return f"{run.to_best}"
    return f"miss ({ratio(run.ratio)})" if run.ratio else "miss (nothing ok)"


def random_cell(runs: list[Run]) -> str:
    hits = [r.to_best for r in runs if r.to_best is not None]
    misses = [r.ratio for r in runs if r.to_best is None and r.ratio]
    text = f"{len(hits)}/{len(runs)}"
    if hits:
        text += f", mean {statistics.mean(hits):.1f}"
    if misses:
        text += f"; misses {ratio(statistics.mean(misses))}"
    return text


def table(results: list[KernelResult]) -> str:
    head = ("| kernel | legal rows | exhaustive best (µs) | default / best | budget "
            "| search: evals to best | random: seeds reaching best, mean evals | "
            "random: expected evals (N+1)/(m+1) | method |")
    lines = [head, "|" + "---|" * head.count(" |")]
    for r in results:
        gain = ratio(r.default_us / r.best_us) if r.default_us else "-"
        lines.append(f"| {r.file}:{r.kernel} | {r.legal_rows} | {r.best_us:.2f} | {gain} "
                     f"| {r.budget} | {search_cell(r.search)} | {random_cell(r.random)} "
                     f"| {r.random_expected:.0f} | {r.method} |")
    return "\n".join(lines)


def method_label(results: list[KernelResult], check: bool) -> str:
    methods = {r.method for r in results}
    if methods == {"modeled"}:
        text = "times MODELED by the cost model (no GPU here), not measured"
    else:
        text = "times " + "/".join(sorted(methods))
    if not check:
        text += ("; correctness not re-checked in this benchmark (evaluations of legal rows "
                 "count as verdict ok; --check runs the CPU-emulated check); the ranking is "
                 "the cost model's")
    else:
        text += "; every policy evaluation ran the real Evaluator.evaluate (verdict ok to count)"
    return text


def split_sets(items: list[str], files: list[Path]) -> dict[Path, list[str]]:
    """`--set NAME=V` goes to every file defining NAME; `--set STEM:NAME=V` to that file."""
    out: dict[Path, list[str]] = {f: [] for f in files}
    for item in items:
        target, _, rest = item.partition(":") if re.match(r"^\w+:\w+=", item) else ("", "", item)
        name = rest.partition("=")[0].strip()
        chosen = [f for f in files if (f.stem == target if target else re.search(
            rf"^{re.escape(name)}\s*=", f.read_text(), re.M))]
        if not chosen:
            what = f"named {target}" if target else f"defines {name}"
            raise SystemExit(f"--set {item}: no workload file {what}")
        for f in chosen:
            out[f].append(rest)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", help="workload files (default: "
                    + ", ".join(f"examples/{s}.py" for s in DEFAULT_FILES) + ")")
    ap.add_argument("--set", action="append", default=[], metavar="[STEM:]NAME=VALUE",
                    help="override a module-level constant (all files defining it, or one)")
    ap.add_argument("--budget", type=int, default=None,
                    help=f"evaluations per kernel (default {REDUCTION_TARGET}, "
                         f"{MATMUL_TARGET} for matmul-style files)")
    ap.add_argument("--seeds", type=int, default=5, help="random runs per kernel")
    ap.add_argument("--check", action="store_true",
                    help="run the real Evaluator.evaluate (CPU-emulated correctness) for "
                         "every evaluation")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                    help="processes for the exhaustive modeled pass")
    ap.add_argument("--tol", type=float, default=None,
                    help="relative tolerance for 'reached the best' (default 1e-9 modeled, "
                         "0.02 measured)")
    ap.add_argument("--target", default="sm_90a")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "gpu"))
    ap.add_argument("--json", default=None, help="also write every run here")
    args = ap.parse_args()
    files = [Path(f) for f in args.files] or [ROOT / "examples" / f"{s}.py" for s in DEFAULT_FILES]
    sets = split_sets(args.set, files)

    t0 = time.perf_counter()
    results, timings = [], []
    for f in files:
        rows, t = bench_file(f, sets[f], args)
        results += rows
        timings.append(t)
        print(f"{f.stem}: {t['rows']} legal rows; open {t['open_s']} s, exhaustive "
              f"{t['exhaustive_s']} s, policies {t['policies_s']} s", file=sys.stderr, flush=True)
    total = time.perf_counter() - t0

    print(f"search vs random vs the exhaustive best; target {args.target}; "
          f"{method_label(results, args.check)}")
    if any(sets.values()):
        print("sets: " + "; ".join(f"{f.stem}: {' '.join(s)}" for f, s in sets.items() if s))
    print(f"search seed 0; random seeds 0..{args.seeds - 1}; each kernel optimized alone; "
          f"targets: best within {REDUCTION_TARGET} evaluations (reductions), "
          f"{MATMUL_TARGET} (matmul)\n")
    print(table(results))
    misses = [r for r in results if r.search.to_best is None]
    print(f"\nsearch reached the exhaustive best on {len(results) - len(misses)}/{len(results)} "
          f"kernels within the budget" + (": missed " + ", ".join(
              f"{r.file}:{r.kernel} ({ratio(r.search.ratio)})" for r in misses) if misses else ""))
    bad = [r for r in results if r.best_verdict not in (None, "ok")]
    for r in bad:
        print(f"note: {r.file}:{r.kernel}: the exhaustive best row {r.best_rows[0]} is "
              f"{r.best_verdict}, so no policy can reach it")
    print(f"wall time {total:.0f} s ({os.cpu_count()} CPUs, --jobs {args.jobs})")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "method": method_label(results, args.check), "wall_s": round(total, 1),
            "timings": timings,
            "kernels": [asdict(r) | {"random_expected": r.random_expected} for r in results]},
            indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
