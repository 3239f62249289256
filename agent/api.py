"""The tool API: one Session per workload; every tool takes and returns a pydantic model.

Policies (llm, search, random, replay) and the `propose` command all call tools through
`Session.call`, which never raises for the caller's mistakes: bad JSON, an unknown tool or
kernel, a non-canonical or illegal row all come back as a result with `ok=False`.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timezone
from typing import Any, Callable

from pydantic import BaseModel, ValidationError

from agent.budget import Budget
from agent.models import (AgentErrorEvent, BestEntry, BestRows, CheckResult, CudaText,
                          DecisionPoint, EvaluationEvent, EvaluationResult, Event, FinishArgs,
                          FinishResult, History, HistoryArgs, HistoryEntry, IrText, KernelArgs,
                          KernelList, KernelSummary, NoArgs, NoteEvent, ReadIrArgs, RowArgs,
                          SpaceInfo, SummaryEvent, Timing, ToolCallEvent, ToolError,
                          ToolResultEvent, WorkloadInfo)
from agent.tools import TOOL_NAMES, tool
from emmy.check import SLOW_EMULATION_S, slow_emulation_note
from emmy.errors import WorkloadFails

MAX_TEXT = 16000   # characters of IR or CUDA handed back by one call


class ToolFailure(Exception):
    """A tool refused its input; becomes a ToolError result."""

    def __init__(self, kind: str, message: str, hint: str = ""):
        super().__init__(message)
        self.kind, self.hint = kind, hint


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class Session:
    """Schedules of one workload, explored through typed tools under a budget."""

    def __init__(self, evaluator, budget: Budget | None = None, *,
                 sinks: list[Callable[[Event], None]] | None = None):
        self.ev = evaluator
        self.budget = budget or Budget()
        self.sinks = list(sinks or [])
        self.kernel_infos = {k.name: k for k in evaluator.kernels()}
        self.recorded: dict[str, str] = {}   # kernel -> the schedule database's row, if any
        self.cache: dict[tuple[str, str], EvaluationResult] = {}
        self.results: list[EvaluationResult] = []
        self.errors: Counter[str] = Counter()
        self.summary: str | None = None
        self._reference: dict[str, Timing | None] = {}
        self._calls = 0
        self._source = "policy"
        self._slow_noted = False

    # --- events -----------------------------------------------------------------------------

    def emit(self, event: Event) -> Event:
        """Stamp the event with the time and send it to every sink (trace, console)."""
        if not event.time:
            event.time = utc_now()
        event.elapsed = round(self.budget.elapsed, 4)
        for sink in self.sinks:
            sink(event)
        return event

    def error(self, kind: str, detail: str) -> None:
        """Count one mistake of the agent (or its model) and trace it."""
        self.errors[kind] += 1
        self.emit(AgentErrorEvent(kind=kind, detail=detail[:2000]))

    # --- dispatch ---------------------------------------------------------------------------

    def call(self, name: str, arguments: str | dict | None, *, source: str,
             call_id: str | None = None) -> tuple[BaseModel, bool]:
        """Run one tool call; return its result (or ToolError) and whether it succeeded."""
        self._calls += 1
        call_id = call_id or f"{source}-{self._calls}"
        args, raw = (arguments, None) if isinstance(arguments, dict) else (None, arguments)
        if raw is not None:
            try:
                parsed = json.loads(raw) if raw.strip() else {}
                args, raw = (parsed, None) if isinstance(parsed, dict) else (None, raw)
            except (json.JSONDecodeError, AttributeError):
                pass
        self.emit(ToolCallEvent(call_id=call_id, name=str(name), arguments=args,
                                raw_arguments=raw, source=source))
        self._source = source
        try:
            result = self._run(name, args, raw)
            ok = not (isinstance(result, EvaluationResult) and result.verdict == "illegal")
        except WorkloadFails:   # the model fails in eager: no row can be checked; stop the run
            raise
        except ToolFailure as f:
            self.error(f.kind, f"{name}: {f}")
            result, ok = ToolError(error=str(f), kind=f.kind, hint=f.hint), False
        except Exception as e:  # a bug below the API must not end the session
            self.error("tool_crash", f"{name}: {type(e).__name__}: {e}")
            result, ok = ToolError(error=f"{type(e).__name__}: {e}", kind="internal"), False
        self.emit(ToolResultEvent(call_id=call_id, name=str(name), ok=ok,
                                  result=result.model_dump(mode="json")))
        return result, ok

    def invoke(self, name: str, source: str, **arguments: Any) -> BaseModel:
        """Typed convenience for built-in policies: call a tool with keyword arguments."""
        return self.call(name, arguments, source=source)[0]

    def _run(self, name: str, args: dict | None, raw: str | None) -> BaseModel:
        spec = tool(name) if isinstance(name, str) else None
        if spec is None:
            raise ToolFailure("unknown_tool", f"there is no tool `{name}`",
                              hint="tools: " + ", ".join(TOOL_NAMES))
        if args is None:
            raise ToolFailure("malformed_json", f"arguments are not a JSON object: {raw!r:.300}",
                              hint="send the arguments as one JSON object, e.g. "
                                   '{"kernel": "k0", "row": "WORK=block:256 TILE=v4x1"}')
        try:
            parsed = spec.args.model_validate(args)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, x['loc'])) or 'arguments'}: {x['msg']}"
                                 for x in e.errors())
            raise ToolFailure("bad_arguments", f"{name}: {problems}",
                              hint=f"fields: {', '.join(spec.args.model_fields) or 'none'}") from None
        return getattr(self, name)(parsed)

    # --- tools ------------------------------------------------------------------------------

    def describe_workload(self, _: NoArgs) -> WorkloadInfo:
        workload = getattr(self.ev, "workload", None)
        return WorkloadInfo(workload=self.ev.workload_name, target=self.ev.target,
                            device=self.ev.device, timing_method=self.timing_method,
                            source=getattr(workload, "source", ""),
                            kernels=self.kernel_summaries(), budget=self.budget.state())

    def list_kernels(self, _: NoArgs) -> KernelList:
        return KernelList(kernels=self.kernel_summaries())

    def read_ir(self, a: ReadIrArgs) -> IrText:
        self._kernel(a.kernel)
        return IrText(kernel=a.kernel, stage=a.stage,
                      text=_clip(self._compiler(lambda: self.ev.read_ir(a.stage, a.kernel))))

    def schedule_space(self, a: KernelArgs) -> SpaceInfo:
        info = self._kernel(a.kernel)
        grammar = self.ev.grammar_text(a.kernel)
        points = [DecisionPoint(key=k, grammar=grammar.get(k, ""), options=list(v))
                  for k, v in self.ev.decision_points(a.kernel)]
        examples = [info.default_row] + [r for r in self.ev.sample_rows(a.kernel, 5, 0)
                                         if r != info.default_row][:4]
        return SpaceInfo(kernel=a.kernel, legal_rows=info.count, default_row=info.default_row,
                         decision_points=points, examples=examples)

    def check_row(self, a: RowArgs) -> CheckResult:
        self._kernel(a.kernel)
        self._parse(a.row)
        reasons = self.ev.check(a.kernel, a.row)
        return CheckResult(kernel=a.kernel, row=a.row, legal=not reasons, reasons=list(reasons))

    def evaluate_row(self, a: RowArgs) -> EvaluationResult:
        self._kernel(a.kernel)
        self._parse(a.row)
        if self.summary is not None:
            raise ToolFailure("finished", "the session is finished; nothing more is evaluated")
        if (a.kernel, a.row) in self.cache:
            hit = self.cache[(a.kernel, a.row)]
            return hit.model_copy(update={"cached": True, "new_best": False,
                                          "evaluations_left": self.budget.evaluations_left})
        reasons = self.ev.check(a.kernel, a.row)
        if reasons:
            self.error("illegal_row", f"{a.kernel}: {a.row}: " + "; ".join(reasons))
            return EvaluationResult(kernel=a.kernel, row=a.row, verdict="illegal",
                                    reasons=list(reasons),
                                    evaluations_left=self.budget.evaluations_left)
        stop = self.budget.exhausted()
        if stop:
            raise ToolFailure("budget_exhausted", f"no evaluation left: {stop}",
                              hint="call finish with your summary")
        result = self._evaluate(a.kernel, a.row)
        self.record(result, source=self._source)
        if self.ev.device != "gpu" and result.seconds >= SLOW_EMULATION_S and not self._slow_noted:
            self._slow_noted = True
            self.emit(NoteEvent(text=slow_emulation_note(result.seconds)))
        return result

    def show_cuda(self, a: RowArgs) -> CudaText:
        self._kernel(a.kernel)
        self._parse(a.row)
        reasons = self.ev.check(a.kernel, a.row)
        if reasons:
            raise ToolFailure("illegal_row", f"`{a.row}` is illegal for {a.kernel}: "
                              + "; ".join(reasons), hint="check_row explains legality for free")
        text = self._compiler(lambda: self.ev.read_ir("cuda", a.kernel, a.row))
        return CudaText(kernel=a.kernel, row=a.row, source=_clip(text))

    def history(self, a: HistoryArgs) -> History:
        if a.kernel is not None:
            self._kernel(a.kernel)
        return History(evaluations=[
            HistoryEntry(index=i, kernel=r.kernel, row=r.row, verdict=r.verdict,
                         median_us=r.timing.median_us if r.timing else None,
                         method=r.timing.method if r.timing else None,
                         speedup_vs_default=self.speedup(r))
            for i, r in enumerate(self.results) if a.kernel in (None, r.kernel)])

    def best(self, _: NoArgs | None = None) -> BestRows:
        return BestRows(kernels=[self.best_entry(k) for k in self.kernel_infos],
                        budget=self.budget.state())

    def finish(self, a: FinishArgs) -> FinishResult:
        self.summary = a.summary
        return FinishResult(finished=True, best=self.best())

    # --- state ------------------------------------------------------------------------------

    @property
    def timing_method(self) -> str:
        return "measured" if self.ev.device == "gpu" else "modeled"

    def kernel_summaries(self) -> list[KernelSummary]:
        return [KernelSummary(name=k.name, kind=str(k.kind), identity=k.identity,
                              keys=list(k.keys), legal_rows=k.count, default_row=k.default_row)
                for k in self.kernel_infos.values()]

    def record(self, result: EvaluationResult, source: str) -> None:
        """Keep a fresh evaluation: cache it, spend one evaluation (none when it is the program
        of one evaluated before), trace it."""
        self.cache[(result.kernel, result.row)] = result
        self.results.append(result)
        self.budget.used_evaluations += result.same_program_as is None
        result.evaluations_left = self.budget.evaluations_left
        self.emit(EvaluationEvent(index=len(self.results) - 1, source=source, result=result))

    def recover(self, results: list[EvaluationResult]) -> None:
        """Take back evaluations a killed run made (--resume): cached and already paid for."""
        for r in results:
            self.cache[(r.kernel, r.row)] = r
            self.results.append(r)
            self.budget.used_evaluations += r.same_program_as is None

    def best_entry(self, kernel: str) -> BestEntry:
        mine = [r for r in self.results if r.kernel == kernel]
        timed = [r for r in mine if r.verdict == "ok" and r.timing is not None]
        if not timed:
            note = ("no row evaluated ok yet" if not any(r.verdict == "ok" for r in mine)
                    else "rows evaluated ok, but no time is available (no GPU, no cost model)")
            return BestEntry(kernel=kernel, row=None, median_us=None, method=None,
                             speedup_vs_default=None, evaluations=len(mine), note=note)
        top = min(timed, key=lambda r: (r.timing.method != "measured", r.timing.median_us))
        return BestEntry(kernel=kernel, row=top.row, median_us=top.timing.median_us,
                         method=top.timing.method, speedup_vs_default=self.speedup(top),
                         speedup_vs_baselines=top.speedup_vs_baselines, evaluations=len(mine))

    def summary_event(self, reason: str) -> SummaryEvent:
        return SummaryEvent(reason=reason, summary=self.summary or "",
                            best=self.best().kernels, budget=self.budget.state(),
                            errors=dict(self.errors))

    # --- helpers ----------------------------------------------------------------------------

    def _kernel(self, name: str):
        if name not in self.kernel_infos:
            raise ToolFailure("unknown_kernel", f"no kernel `{name}`",
                              hint="kernels: " + ", ".join(self.kernel_infos))
        return self.kernel_infos[name]

    def _parse(self, text: str) -> None:
        from emmy.schedule.row import RowError, parse

        try:
            parse(text)
        except RowError as e:
            raise ToolFailure("bad_row", str(e), hint="rows are canonical text; "
                              "schedule_space lists the options and example rows") from None

    def _compiler(self, fn):
        try:
            return fn()
        except Exception as e:
            if type(e).__name__ in ("UserError", "UnsupportedOp", "RowError"):
                raise ToolFailure("refused", str(e)) from None
            raise

    def _evaluate(self, kernel: str, row: str) -> EvaluationResult:
        try:
            e = self.ev.evaluate(kernel, row)
        except WorkloadFails:
            raise
        except Exception as exc:  # the compiler broke on a legal row: a crash verdict
            return EvaluationResult(kernel=kernel, row=row, verdict="crash",
                                    reasons=[f"internal error: {type(exc).__name__}: {exc}"])
        timing = _timing(e.timing) if e.verdict == "ok" else None
        baselines = {k: t for k, v in (e.baselines or {}).items() if (t := _timing(v))}
        result = EvaluationResult(
            kernel=kernel, row=row, verdict=e.verdict, reasons=list(e.reasons),
            kernel_hash=e.kernel_hash, resources=e.resources, max_abs_error=e.max_abs_error,
            max_rel_error=e.max_rel_error, timing=timing, baselines=baselines,
            seconds=round(e.seconds, 4), same_program_as=getattr(e, "same_program_as", None))
        if timing:
            result.speedup_vs_default = self.speedup(result)
            result.speedup_vs_baselines = {
                k: round(t.median_us / timing.median_us, 4) for k, t in baselines.items()
                if t.method == timing.method == "measured" and timing.median_us > 0}
            best = self.best_entry(kernel)
            result.new_best = (best.median_us is None or best.method != timing.method
                               or timing.median_us < best.median_us)
        return result

    def speedup(self, r: EvaluationResult) -> float | None:
        """How many times faster than the default row, by the same method (None: unknown)."""
        if r.timing is None or r.timing.median_us <= 0:
            return None
        if r.row == self.kernel_infos[r.kernel].default_row:
            return 1.0
        ref = self.reference(r.kernel, r.timing.method)
        return round(ref.median_us / r.timing.median_us, 4) if ref and ref.median_us > 0 else None

    def reference(self, kernel: str, method: str) -> Timing | None:
        """The default row's time by `method`: evaluated, or the cost model's when modeled."""
        default = self.kernel_infos[kernel].default_row
        done = self.cache.get((kernel, default))
        if done and done.timing and done.timing.method == method:
            return done.timing
        if method != "modeled":
            return None
        if kernel not in self._reference:
            try:
                us = self.ev.estimate_us(kernel, default)
            except Exception:
                us = None
            self._reference[kernel] = Timing(method="modeled", median_us=us) if us else None
        return self._reference[kernel]


def _timing(t: dict | None) -> Timing | None:
    if not t or t.get("median_us") is None:
        return None
    return Timing(method=t.get("method", "modeled"), median_us=float(t["median_us"]),
                  p10_us=t.get("p10_us"), p90_us=t.get("p90_us"), n=int(t.get("n", 1)))


def _clip(text: str) -> str:
    if len(text) <= MAX_TEXT:
        return text
    return text[:MAX_TEXT] + f"\n… ({len(text) - MAX_TEXT} more characters cut)"


def content(result: BaseModel) -> str:
    """A result as the JSON text a model reads."""
    return result.model_dump_json(exclude_none=False)
