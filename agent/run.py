"""`optimize` and `propose`: open a Session on a workload, drive it, trace it, keep the best."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.api import Session
from agent.budget import Budget
from agent.db import ScheduleDb
from agent.evaluator import (EXPR_PATH, GRAPH_PATH, BadInput, check_workload_args, gpu_name,
                             open_evaluator, versions, workload_record)
from agent.models import (BestEntry, DbEntry, HeaderEvent, NoteEvent, ResumeEvent,
                          SummaryEvent, WorkloadRecord)
from agent.trace import Trace, TraceWriter, default_path
from emmy.errors import WorkloadFails

POLICIES = ("llm", "search", "random")
DEFAULT_MODEL = "gpt-4o-mini"


@dataclass
class RunConfig:
    file: str | None
    sets: list[str] = field(default_factory=list)
    target: str = "sm_90a"
    device: str = "auto"
    policy: str | None = None           # None: llm when one is configured, else search
    model: str | None = None
    base_url: str | None = None
    budget: int = 20
    max_turns: int | None = None
    max_tokens: int | None = None
    time_limit: float | None = None
    trace: str | None = None
    resume: str | None = None
    db: str | None = None
    seed: int = 0
    backoff: float = 1.0
    timeout: float = 120.0
    expr: str | None = None             # a -c expression instead of a file


@dataclass
class Outcome:
    summary: SummaryEvent
    trace: Path
    policy: str
    model: str | None
    device: str
    kept: list[DbEntry]


def choose_policy(cfg: RunConfig) -> tuple[str, str]:
    """The policy to run and a sentence saying why."""
    base_url = cfg.base_url or os.environ.get("OPENAI_BASE_URL")
    configured = bool(base_url or os.environ.get("OPENAI_API_KEY"))
    if cfg.policy == "llm" and not configured:
        raise BadInput("--policy llm needs a model server: set OPENAI_API_KEY (and OPENAI_BASE_URL "
                       "for a local server) or give --base-url")
    if cfg.policy:
        return cfg.policy, f"policy {cfg.policy} (asked for)"
    if configured:
        return "llm", f"policy llm: a model server is configured ({base_url or 'api.openai.com'})"
    return "search", ("policy search: no LLM configured (set OPENAI_API_KEY or OPENAI_BASE_URL, "
                      "or give --base-url, to use one)")


def device_sentence(device: str) -> str:
    if device == "gpu":
        return "device: GPU; times are measured with CUDA events"
    return ("device: CPU (no GPU here); correctness runs the emitted CUDA on the CPU and every "
            "time is MODELED by the cost model, not measured")


def optimize(cfg: RunConfig, view_factory, evaluator=None,
             record: WorkloadRecord | None = None) -> Outcome:
    """Run one optimization (or continue one with cfg.resume); return its outcome.

    `evaluator` replaces the compiler's Evaluator for the workload (tests pass a fake; the
    torch.compile backend passes one over the graph it captured, with that graph's `record`).
    """
    previous = Trace.read(cfg.resume) if cfg.resume else None
    if previous is not None:
        if previous.header.command != "optimize":
            raise BadInput(f"{cfg.resume} records `{previous.header.command}`, not an optimize run")
        if previous.finished:
            raise BadInput(f"{cfg.resume} is a finished run (it has a summary); nothing to resume")
        cfg = _from_header(cfg, previous.header)
    policy_name, why = choose_policy(cfg)
    if previous is None and record is None:
        check_workload_args(cfg.file, cfg.expr, cfg.sets)
        record = workload_record(cfg.file, cfg.sets, cfg.expr)
    elif previous is not None:
        record = previous.header.workload
    ev = evaluator or open_recorded(record, cfg.target, cfg.device)
    budget = Budget(cfg.budget, cfg.max_turns, cfg.max_tokens, cfg.time_limit)
    trace_path = Path(cfg.resume or cfg.trace or default_path(ev.workload_name, policy_name))
    writer = TraceWriter(trace_path, append=previous is not None)
    view = view_factory(budget.evaluations)
    session = Session(ev, budget, sinks=[writer, view])
    session.recorded = recorded_rows(session, cfg.db)
    for kernel, row in session.recorded.items():
        view.say(f"{kernel}: starting from the schedule database's row `{row}`")
    model = (cfg.model or os.environ.get("OPENAI_MODEL") or DEFAULT_MODEL) if policy_name == "llm" else None
    view.say(why)
    view.say(device_sentence(ev.device))
    if previous is None:
        session.emit(header(session, "optimize", _args(cfg), record, policy_name, model,
                            cfg.base_url or os.environ.get("OPENAI_BASE_URL")))
    else:
        session.recover(previous.evaluations)
        budget.elapsed_before = previous.elapsed
        view.start_at(budget.used_evaluations)
        session.emit(ResumeEvent(command="optimize --resume", args=_args(cfg),
                                 evaluations_recovered=len(previous.evaluations)))
        view.say(f"resuming {cfg.resume}: {len(previous.evaluations)} evaluations recovered")
    policy = _policy(policy_name, cfg, session, model, previous)
    try:
        with view:
            reason = policy.run(session)
    except WorkloadFails as e:   # no row can be checked: the trace ends, saying why
        session.emit(session.summary_event(f"stopped: {e}"))
        writer.close()
        raise
    except BaseException as e:   # Ctrl-C or a crash: no summary, so --resume can continue
        session.emit(NoteEvent(text=f"stopped by {type(e).__name__}; --resume continues the run"))
        writer.close()
        raise
    summary = session.emit(session.summary_event(reason))
    writer.close()
    kept = keep_best(session, cfg.db, str(trace_path))
    return Outcome(summary, trace_path, policy_name, model, ev.device, kept)


def header(session: Session, command: str, args: dict, record: WorkloadRecord, policy: str,
           model: str | None = None, base_url: str | None = None) -> HeaderEvent:
    """The run header: what ran, on what, with which versions."""
    ev = session.ev
    return HeaderEvent(command=command, args=args, workload=record, target=ev.target,
                       device=ev.device, gpu=gpu_name(ev), policy=policy, model=model,
                       base_url=base_url, versions=versions(), kernels=session.kernel_summaries(),
                       budget=session.budget.state())


def _policy(name: str, cfg: RunConfig, session: Session, model: str | None, previous):
    if name == "search":
        from agent.policies.search import SearchPolicy

        return SearchPolicy(seed=cfg.seed)
    if name == "random":
        from agent.policies.random import RandomPolicy

        return RandomPolicy(seed=cfg.seed)
    from agent.allocate import allocate, expected_gains
    from agent.policies.chat import OpenAIChat
    from agent.policies.llm import LlmPolicy
    from agent.policies.replay import CassetteChat

    def on_error(event):
        session.errors[f"llm_{event.kind}"] += 1
        session.emit(event)

    chat = OpenAIChat(model, base_url=cfg.base_url or os.environ.get("OPENAI_BASE_URL"),
                      api_key=os.environ.get("OPENAI_API_KEY"), timeout=cfg.timeout,
                      backoff=cfg.backoff, on_error=on_error)
    if previous is not None:
        chat = CassetteChat(previous.llm_responses, then=chat)
    kernels = list(session.kernel_infos.values())
    shares = allocate(session.budget.evaluations, expected_gains(session.ev, kernels)) \
        if len(kernels) > 1 else None
    return LlmPolicy(chat, shares=shares)


def recorded_rows(session: Session, db_path: str | None) -> dict[str, str]:
    """The database's best row for each kernel identity on this target, where still legal."""
    out = {}
    db = ScheduleDb(db_path)
    for info in session.kernel_infos.values():
        entry = db.lookup(info.identity, session.ev.target)
        if entry and entry.row != info.default_row and not session.ev.check(info.name, entry.row):
            out[info.name] = entry.row
    return out


def keep_best(session: Session, db_path: str | None, trace: str) -> list[DbEntry]:
    """Offer each kernel's best timed row to the schedule database."""
    from agent.api import utc_now

    entries = []
    for b in worth_keeping(session.best().kernels):
        info = session.kernel_infos[b.kernel]
        entries.append(DbEntry(identity=info.identity, target=session.ev.target, kernel=b.kernel,
                               workload=session.ev.workload_name, row=b.row,
                               median_us=b.median_us, method=b.method, trace=trace,
                               time=utc_now()))
    return ScheduleDb(db_path).offer(entries) if entries else []


def worth_keeping(best: list[BestEntry]) -> list[BestEntry]:
    """The timed bests, less a chain's where a row of one of its halves (`<chain>_cut0`,
    `<chain>_cut1`, under the default cut) made the whole program faster: recorded, the chain's
    row would replace the cut that those rows apply to. Each time is the whole program's."""
    timed = [b for b in best if b.row is not None and b.median_us is not None and b.method]
    by_name = {b.kernel: b for b in timed}
    def beaten(b: BestEntry) -> bool:
        halves = [by_name.get(f"{b.kernel}_cut{i}") for i in (0, 1)]
        return any(h is not None and h.method == b.method and h.median_us < b.median_us
                   for h in halves)
    return [b for b in timed if not beaten(b)]


def _args(cfg: RunConfig) -> dict[str, Any]:
    return {k: v for k, v in vars(cfg).items()}


def _from_header(cfg: RunConfig, header: HeaderEvent) -> RunConfig:
    """The interrupted run's settings, with only the output options of this command kept."""
    args = dict(header.args)
    known = set(RunConfig.__dataclass_fields__)
    resumed = RunConfig(**{k: v for k, v in args.items() if k in known})
    resumed.policy, resumed.model = header.policy, header.model
    resumed.resume, resumed.db, resumed.trace = cfg.resume, cfg.db or resumed.db, None
    resumed.backoff, resumed.timeout = cfg.backoff, cfg.timeout
    resumed.base_url = cfg.base_url or resumed.base_url   # the server may have moved
    return resumed


def open_recorded(w: WorkloadRecord, target: str, device: str = "auto"):
    """The Evaluator of the workload a record names: its expression, or its file as recorded."""
    if w.path == GRAPH_PATH:
        raise BadInput(f"{w.name} is a graph torch.compile captured (its FX code is in the "
                       "trace); run the program again with the emmy backend to re-run it")
    ev = open_evaluator(None, [], target, device, expr=w.source) if w.path == EXPR_PATH \
        else open_evaluator(materialize(w), list(w.sets), target, device)
    if not ev.kernels():
        raise BadInput(f"{ev.workload_name} has no kernels to schedule (none of its outputs has "
                       "an element)")
    return ev


def materialize(w: WorkloadRecord) -> str:
    """A path holding the recorded workload source: the original file when unchanged."""
    import hashlib

    original = Path(w.path)
    if original.is_file() and hashlib.sha256(original.read_text().encode()).hexdigest() == w.sha256:
        return str(original)
    folder = Path(tempfile.mkdtemp(prefix="emmy-agent-"))
    copy = folder / f"{w.name}.py"
    copy.write_text(w.source)
    return str(copy)


def propose(file: str | None, sets: list[str], target: str, kernel: str | None, row: str,
            trace: str | None, db: str | None, device: str = "auto", expr: str | None = None):
    """Evaluate one row a person proposes, through the same checked tools; trace it."""
    check_workload_args(file, expr, sets)
    record = workload_record(file, sets, expr)
    ev = open_recorded(record, target, device)
    names = [k.name for k in ev.kernels()]
    if kernel is None:
        if len(names) != 1:
            raise BadInput(f"the workload has {len(names)} kernels; say which with --kernel "
                           f"({', '.join(names)})")
        kernel = names[0]
    previous = Trace.read(trace) if trace and Path(trace).exists() else None
    if previous is not None and previous.header.workload.sha256 != record.sha256:
        raise BadInput(f"{trace} records another workload ({previous.header.workload.path}); "
                       "propose appends only to a trace of the same workload")
    path = Path(trace or default_path(ev.workload_name, "human"))
    writer = TraceWriter(path, append=previous is not None)
    session = Session(ev, Budget(evaluations=10**9), sinks=[writer])
    args = {"file": file, "sets": sets, "target": target, "kernel": kernel, "row": row,
            **({"expr": expr} if expr is not None else {})}
    if previous is None:
        session.emit(header(session, "propose", args, record, "human"))
    else:
        session.recover(previous.evaluations)
        session.emit(ResumeEvent(command="propose", args=args,
                                 evaluations_recovered=len(previous.evaluations)))
    try:
        result, _ = session.call("evaluate_row", {"kernel": kernel, "row": row}, source="human")
    finally:
        session.emit(session.summary_event("propose"))
        writer.close()
    keep_best(session, db, str(path))
    return result, path, session
