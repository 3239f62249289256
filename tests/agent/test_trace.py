"""Trace round trip, a cut-short trace, --resume (built-in and LLM policies), the schedule db."""

from __future__ import annotations

import json

import pytest

from agent.db import ScheduleDb
from agent.evaluator import BadInput
from agent.models import DbEntry, EvaluationEvent, HeaderEvent, SummaryEvent
from agent.run import RunConfig, optimize
from agent.trace import Trace, read_events
from tests.agent.chat_server import ScriptedServer, call
from tests.agent.fakes import FakeEvaluator


class Quiet:
    def __init__(self, n):
        pass

    def say(self, text):
        pass

    def start_at(self, n):
        pass

    def __call__(self, event):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


@pytest.fixture
def workload(tmp_path):
    path = tmp_path / "fake.py"
    path.write_text("# a fake workload\n")
    return path


def config(tmp_path, workload, **kw) -> RunConfig:
    return RunConfig(file=str(workload), trace=str(tmp_path / "run.jsonl"),
                     db=str(tmp_path / "db.json"), **kw)


def cut_after_evaluations(path, n: int) -> None:
    """Keep the trace up to its n-th evaluation event, plus half a line (as a kill leaves it)."""
    lines = path.read_text().splitlines(keepends=True)
    seen, keep = 0, []
    for line in lines:
        keep.append(line)
        seen += json.loads(line)["type"] == "evaluation"
        if seen == n:
            break
    path.write_text("".join(keep) + '{"v":1,"type":"tool_ca')


def test_round_trip(tmp_path, workload):
    out = optimize(config(tmp_path, workload, policy="search", budget=4), Quiet, FakeEvaluator())
    events = read_events(out.trace)
    assert isinstance(events[0], HeaderEvent) and isinstance(events[-1], SummaryEvent)
    assert events[0].workload.source == "# a fake workload\n"
    assert events[0].gpu == "none" and events[0].versions["python"]
    again = [type(e).model_validate_json(e.model_dump_json()) for e in events]
    assert again == events
    assert [e.index for e in events if isinstance(e, EvaluationEvent)] == [0, 1, 2, 3]


def test_cut_trace_reads_back_and_resume_finishes(tmp_path, workload):
    cfg = config(tmp_path, workload, policy="random", budget=5)
    first = FakeEvaluator()
    out = optimize(cfg, Quiet, first)
    full = [r.row for r in Trace.read(out.trace).evaluations]
    cut_after_evaluations(out.trace, 2)
    cut = Trace.read(out.trace)
    assert len(cut.evaluations) == 2 and not cut.finished
    again = FakeEvaluator()
    resumed = optimize(RunConfig(file=None, resume=str(out.trace)), Quiet, again)
    trace = Trace.read(resumed.trace)
    assert trace.finished and [r.row for r in trace.evaluations] == full
    assert [row for _, row in again.evaluated] == full[2:]      # nothing evaluated twice
    assert resumed.summary.budget.evaluations_used == 5
    with pytest.raises(BadInput, match="finished run"):
        optimize(RunConfig(file=None, resume=str(out.trace)), Quiet, FakeEvaluator())


def test_resume_does_not_charge_evaluations_that_reused_a_program(tmp_path, workload):
    """A row whose program was evaluated before spent nothing; taken back by --resume, it
    still spends nothing, and the resumed run ends where the whole one did."""
    cfg = config(tmp_path, workload, policy="search", budget=4)
    out = optimize(cfg, Quiet, FakeEvaluator(two=True, programs=True))
    whole = Trace.read(out.trace).evaluations
    assert sum(r.same_program_as is not None for r in whole) == 1 and len(whole) == 5
    reused = next(i for i, r in enumerate(whole) if r.same_program_as)
    cut_after_evaluations(out.trace, reused + 1)
    resumed = optimize(RunConfig(file=None, resume=str(out.trace)), Quiet,
                       FakeEvaluator(two=True, programs=True))
    assert resumed.summary.budget.evaluations_used == 4
    assert [r.row for r in Trace.read(resumed.trace).evaluations] == [r.row for r in whole]


def test_llm_resume_replays_then_goes_live(tmp_path, workload):
    k, rows = "k0_norm", ["WORK=block:256 TILE=v1x1 REDUCE=shuffle",
                          "WORK=block:256 TILE=v4x1 REDUCE=shuffle",
                          "WORK=block:128 TILE=v4x1 REDUCE=shuffle"]
    steps = [call("evaluate_row", {"kernel": k, "row": r}) for r in rows]
    finish = call("finish", {"summary": "done"})
    with ScriptedServer(steps + [finish]) as server:
        cfg = config(tmp_path, workload, policy="llm", budget=5, base_url=server.base_url)
        out = optimize(cfg, Quiet, FakeEvaluator())
        assert server.leftover() == []
    cut_after_evaluations(out.trace, 2)
    with ScriptedServer([steps[2], finish]) as live:
        again = FakeEvaluator()
        cfg = RunConfig(file=None, resume=str(out.trace), base_url=live.base_url, backoff=0.01)
        resumed = optimize(cfg, Quiet, again)
        assert live.leftover() == []
    assert again.evaluated == [(k, rows[2])]
    assert resumed.summary.reason == "finished by the model"
    after = Trace.read(out.trace)
    assert [r.row for r in after.evaluations] == rows
    assert [c.tool_calls[0].name for c in after.llm_responses] == ["evaluate_row"] * 3 + ["finish"]


def test_bad_traces_are_bad_input(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"hello": 1}\n')
    with pytest.raises(BadInput, match="not a trace event"):
        read_events(tmp_path / "x.jsonl")
    (tmp_path / "y.jsonl").write_text('{"v": 99, "type": "header"}\n{}\n')
    with pytest.raises(BadInput, match="newer"):
        read_events(tmp_path / "y.jsonl")
    with pytest.raises(BadInput, match="no such trace"):
        read_events(tmp_path / "missing.jsonl")


def test_db_keeps_the_best(tmp_path):
    db = ScheduleDb(tmp_path / "db" / "schedules.json")

    def entry(row, us, method="modeled"):
        return DbEntry(identity="abc", target="sm_90a", kernel="k0", workload="w", row=row,
                       median_us=us, method=method, trace="t.jsonl", time="now")
    assert db.offer([entry("A", 5.0)]) and db.lookup("abc", "sm_90a").row == "A"
    assert not db.offer([entry("B", 6.0)])
    assert db.offer([entry("C", 4.0)]) and db.lookup("abc", "sm_90a").row == "C"
    assert db.offer([entry("D", 9.0, "measured")])             # measured beats modeled
    assert not db.offer([entry("E", 1.0)])
    assert db.lookup("abc", "sm_90a").row == "D" and db.lookup("abc", "sm_80") is None
    assert sorted(p.name for p in db.path.parent.iterdir()) == ["schedules.json", "schedules.json.lock"]


def test_optimize_writes_the_db(tmp_path, workload):
    out = optimize(config(tmp_path, workload, policy="search", budget=6), Quiet, FakeEvaluator())
    assert out.kept and out.kept[0].row == "WORK=block:256 TILE=v4x1 REDUCE=shuffle"
    assert ScheduleDb(tmp_path / "db.json").lookup("id-k0_norm", "sm_90a").method == "modeled"


def test_rerun_reports_changes(tmp_path, workload):
    from agent import reproduce

    out = optimize(config(tmp_path, workload, policy="search", budget=3), Quiet, FakeEvaluator())
    assert reproduce.rerun(Trace.read(out.trace), FakeEvaluator()).ok
    lines = out.trace.read_text().splitlines()
    for i, line in enumerate(lines):
        event = json.loads(line)
        if event["type"] == "evaluation" and event["index"] == 1:
            event["result"]["timing"]["median_us"] *= 1.5
            event["result"]["kernel_hash"] = "other"
            lines[i] = json.dumps(event)
    out.trace.write_text("\n".join(lines) + "\n")
    report = reproduce.rerun(Trace.read(out.trace), FakeEvaluator())
    assert not report.ok and [d.index for d in report.differences] == [1]
    changes = " ".join(report.differences[0].changes)
    assert "kernel hash other" in changes and "beyond noise" in changes
    text = "\n".join(reproduce.render(Trace.read(out.trace)))
    assert "policy search" in text and "#1 k0_norm" in text and "summary:" in text


def test_measured_then_modeled_is_noted_not_failed():
    from agent.models import EvaluationResult, Timing
    from agent.reproduce import compare

    old = EvaluationResult(kernel="k", row="r", verdict="ok", kernel_hash="h",
                           timing=Timing(method="measured", median_us=2.0, p10_us=1.9, p90_us=2.1))
    new = old.model_copy(update={"timing": Timing(method="modeled", median_us=3.0)})
    changes, notes = compare(old, new)
    assert changes == [] and "not compared" in notes[0]
    within = old.model_copy(update={"timing": Timing(method="measured", median_us=2.15,
                                                     p10_us=2.0, p90_us=2.3)})
    assert compare(old, within) == ([], [])
