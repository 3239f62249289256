"""`replay`: show a trace, re-execute its rows through today's compiler, or re-drive its LLM.

A recorded evaluation reproduces when today's verdict and kernel hash are the same and its
time agrees within noise (measured: the p10..p90 spreads plus 10%; modeled: 1%). Times taken
by different methods (measured on a GPU then, modeled now) are shown but not compared.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from agent.api import Session
from agent.budget import Budget
from agent.models import (AgentErrorEvent, EvaluationEvent, EvaluationResult, HeaderEvent,
                          LlmErrorEvent, LlmResponseEvent, NoteEvent, ResumeEvent, SummaryEvent,
                          ToolCallEvent, ToolResultEvent)
from agent.run import open_recorded
from agent.trace import Trace, TraceWriter


class Difference(BaseModel):
    index: int
    kernel: str
    row: str
    changes: list[str]
    notes: list[str] = []


@dataclass
class ReplayReport:
    checked: int
    differences: list[Difference]
    notes: list[str]

    @property
    def ok(self) -> bool:
        return not any(d.changes for d in self.differences)


def open_for(trace: Trace, device: str = "auto"):
    """An Evaluator for the workload a trace recorded (its own source text and --set values)."""
    h = trace.header
    return open_recorded(h.workload, h.target, device)


def rerun(trace: Trace, ev) -> ReplayReport:
    """Evaluate every recorded row again and compare."""
    session = Session(ev, Budget(evaluations=10**9))
    diffs, notes = [], []
    if ev.device != trace.header.device:
        notes.append(f"recorded on {trace.header.device} ({trace.header.gpu}), "
                     f"replayed on {ev.device}")
    for event in trace.evaluation_events:
        old = event.result
        new = session.invoke("evaluate_row", "replay", kernel=old.kernel, row=old.row)
        if not isinstance(new, EvaluationResult):
            diffs.append(Difference(index=event.index, kernel=old.kernel, row=old.row,
                                    changes=[f"refused today: {getattr(new, 'error', new)}"]))
            continue
        changes, why = compare(old, new)
        if changes or why:
            diffs.append(Difference(index=event.index, kernel=old.kernel, row=old.row,
                                    changes=changes, notes=why))
    return ReplayReport(len(trace.evaluation_events), diffs, notes)


def compare(old: EvaluationResult, new: EvaluationResult) -> tuple[list[str], list[str]]:
    """(changes that break reproduction, notes that do not)."""
    changes, notes = [], []
    if old.verdict != new.verdict:
        changes.append(f"verdict {old.verdict} -> {new.verdict}")
    if old.kernel_hash and new.kernel_hash and old.kernel_hash != new.kernel_hash:
        changes.append(f"kernel hash {old.kernel_hash} -> {new.kernel_hash}")
    a, b = old.timing, new.timing
    if a and b:
        if a.method != b.method:
            notes.append(f"time {a.median_us:.3f} µs {a.method} then, {b.median_us:.3f} µs "
                         f"{b.method} now: not compared")
        elif abs(b.median_us - a.median_us) > tolerance(a, b):
            changes.append(f"time {a.median_us:.3f} -> {b.median_us:.3f} µs {a.method} "
                           f"(beyond noise ±{tolerance(a, b):.3f})")
    elif a and old.verdict == new.verdict == "ok":
        notes.append("no time today")
    return changes, notes


def tolerance(a, b) -> float:
    if a.method == "modeled":
        return 0.01 * a.median_us
    spread = lambda t: (t.p90_us - t.p10_us) if t.p10_us is not None and t.p90_us is not None else 0.0
    return 0.10 * a.median_us + spread(a) + spread(b)


def redrive(trace: Trace, ev, out_path) -> tuple[Session, list[str]]:
    """Run the LLM policy again on the recorded responses (no LLM); list what differs."""
    from agent.policies.replay import ReplayPolicy

    h = trace.header
    writer = TraceWriter(out_path)
    args = h.args
    budget = Budget(args.get("budget", 20), args.get("max_turns"), args.get("max_tokens"), None)
    session = Session(ev, budget, sinks=[writer])
    session.emit(h.model_copy(update={"command": "replay --llm", "time": "", "policy": "replay"}))
    policy = ReplayPolicy(trace.llm_responses, shares=None)
    try:
        reason = policy.run(session)
    finally:
        session.emit(session.summary_event("replay"))
        writer.close()
    problems = []
    before = [(r.kernel, r.row, r.verdict) for r in trace.evaluations]
    after = [(r.kernel, r.row, r.verdict) for r in session.results]
    if before != after:
        problems.append(f"evaluations differ: {len(before)} recorded, {len(after)} replayed; "
                        f"first difference at #{_first_difference(before, after)}")
    if policy.chat.left:
        problems.append(f"{policy.chat.left} recorded responses were not used (stopped: {reason})")
    return session, problems


def _first_difference(a: list, b: list) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def render(trace: Trace) -> list[str]:
    """The run as readable lines, without executing anything."""
    out = []
    for e in trace.events:
        out.extend(_render(e))
    return out


def _render(e) -> list[str]:
    at = f"[{e.elapsed:7.1f}s]"
    if isinstance(e, HeaderEvent):
        return [f"{e.command}: {e.workload.name} ({e.workload.path}, sha256 {e.workload.sha256[:12]})"
                f" sets={e.workload.sets}",
                f"  target {e.target}, device {e.device}, GPU {e.gpu}, policy {e.policy}"
                + (f", model {e.model}" if e.model else ""),
                f"  budget {e.budget.evaluations_limit} evaluations; kernels: "
                + ", ".join(f"{k.name} ({k.legal_rows} rows)" for k in e.kernels)]
    if isinstance(e, ResumeEvent):
        return [f"{at} -- {e.command}: {e.evaluations_recovered} evaluations recovered"]
    if isinstance(e, LlmResponseEvent):
        lines = [f"{at} llm turn {e.turn}: {e.prompt_tokens}+{e.completion_tokens} tokens, "
                 f"{e.latency_s:.2f}s"]
        if e.content:
            lines.append("    says: " + e.content.strip().replace("\n", " ")[:300])
        if e.refusal:
            lines.append("    refuses: " + e.refusal[:300])
        return lines
    if isinstance(e, LlmErrorEvent):
        return [f"{at} llm error ({e.kind}, attempt {e.attempt}): {e.message[:200]}"]
    if isinstance(e, ToolCallEvent):
        args = e.arguments if e.arguments is not None else repr(e.raw_arguments)
        return [f"{at} {e.source} -> {e.name}({args})"]
    if isinstance(e, ToolResultEvent) and not e.ok:
        return [f"{at}    ! {e.result.get('error') or e.result.get('verdict')}: "
                f"{e.result.get('hint') or '; '.join(e.result.get('reasons', []))}"[:400]]
    if isinstance(e, EvaluationEvent):
        r = e.result
        t = f"{r.timing.median_us:.3f} µs {r.timing.method}" if r.timing else "no time"
        s = f", {r.speedup_vs_default:.2f}× default" if r.speedup_vs_default else ""
        return [f"{at}    = #{e.index} {r.kernel} `{r.row}`: {r.verdict}, {t}{s}"]
    if isinstance(e, AgentErrorEvent):
        return [f"{at}    ~ {e.kind}: {e.detail[:200]}"]
    if isinstance(e, NoteEvent):
        return [f"{at}    note: {e.text}"]
    if isinstance(e, SummaryEvent):
        lines = [f"{at} summary: {e.reason}; {e.budget.evaluations_used} evaluations"]
        for b in e.best:
            t = f"{b.median_us:.3f} µs {b.method}" if b.median_us is not None else b.note
            lines.append(f"    best {b.kernel}: {b.row or '-'}  {t}")
        if e.summary:
            lines.append("    " + e.summary.replace("\n", " ")[:500])
        return lines
    return []
