"""The suite report: its dataclasses, assembling it from the workers' outcomes, the markdown table
and notes, the BENCHMARKS.md entry and the JSON file.

Nothing here touches a GPU; `emmy.bench.suites` runs the suites and builds these.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from emmy.bench.baselines import Baseline
from emmy.bench.harness import DISTRIBUTIONS
from emmy.bench.timing import Timing

if TYPE_CHECKING:
    from emmy.bench.suites import WorkloadSpec

ROOT = Path(__file__).resolve().parents[2]
COPY_BYTES = 1 << 30
_BASELINE_NAMES = {"eager": "eager", "compile": "torch.compile", "cublas": "cuBLAS"}


# ---------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class PlannedRow:
    rows: tuple[tuple[str, str], ...]         # (kernel, row) for every kernel
    source: str                               # default | given | modeled | sweep
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
    return SuiteReport(name, time.strftime("%Y-%m-%d %H:%M:%S %Z"), command, device, copy, gbps,
                       tuple(workloads), time.time() - start, tuple(notes))


def write_json(report: SuiteReport, path: str | Path) -> None:
    Path(path).write_text(json.dumps(report.to_dict(), indent=1, default=str) + "\n")


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
                 "eager model in float64 (or, where that model rounds to f16/bf16 as far from "
                 "float64, against it in its own dtype), with NaN-poisoned outputs and inputs "
                 "checked unchanged" + (", and passed again after timing" if report.device else ""))
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
