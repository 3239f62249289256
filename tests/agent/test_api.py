"""The Session's tools: typed results, errors as results, budget, cache, best."""

from __future__ import annotations

from agent.api import Session
from agent.budget import Budget
from agent.models import (CheckResult, EvaluationEvent, KernelArgs, SpaceInfo, ToolError,
                          WorkloadInfo)
from tests.agent.fakes import FakeEvaluator

K = "k0_norm"
DEFAULT = "WORK=block:256 TILE=v1x1 REDUCE=shuffle"
FAST = "WORK=block:256 TILE=v4x1 REDUCE=shuffle"


def session(**kw) -> tuple[Session, list]:
    events: list = []
    return Session(FakeEvaluator(**kw), Budget(evaluations=3), sinks=[events.append]), events


def test_describe_and_space():
    s, _ = session()
    info = s.invoke("describe_workload", "test")
    assert isinstance(info, WorkloadInfo) and info.timing_method == "modeled"
    assert info.kernels[0].default_row == DEFAULT
    space = s.invoke("schedule_space", "test", kernel=K)
    assert isinstance(space, SpaceInfo)
    assert [p.key for p in space.decision_points] == ["WORK", "TILE", "REDUCE"]
    assert space.examples[0] == DEFAULT and len(space.examples) == 5
    assert "block:T" in space.decision_points[0].grammar


def test_check_row_is_free_and_explains():
    s, _ = session()
    res = s.invoke("check_row", "test", kernel=K, row="WORK=block:32 TILE=v1x1 REDUCE=smem")
    assert isinstance(res, CheckResult) and not res.legal and "64 threads" in res.reasons[0]
    assert s.budget.used_evaluations == 0 and s.ev.evaluated == []


def test_evaluate_spends_once_and_caches():
    s, events = session()
    first = s.invoke("evaluate_row", "test", kernel=K, row=FAST)
    again = s.invoke("evaluate_row", "test", kernel=K, row=FAST)
    assert first.verdict == "ok" and not first.cached and again.cached
    assert s.budget.used_evaluations == 1 and len(s.ev.evaluated) == 1
    assert first.timing.method == "modeled" and first.speedup_vs_default > 1
    assert sum(isinstance(e, EvaluationEvent) for e in events) == 1


def test_illegal_row_costs_nothing():
    s, _ = session()
    res, ok = s.call("evaluate_row", {"kernel": K, "row": "WORK=block:32 TILE=v1x1 REDUCE=smem"},
                     source="test")
    assert not ok and res.verdict == "illegal" and s.budget.used_evaluations == 0
    assert s.errors["illegal_row"] == 1


def test_non_canonical_row_names_the_canonical_spelling():
    s, _ = session()
    res, ok = s.call("evaluate_row", {"kernel": K, "row": "tile=v4x1 WORK=block:0256 REDUCE=shuffle"},
                     source="test")
    assert not ok and isinstance(res, ToolError) and res.kind == "bad_row"
    assert f"`{FAST}`" in res.error


def test_caller_mistakes_come_back_as_results():
    s, _ = session()
    cases = {
        ("nope", "{}"): "unknown_tool",
        ("evaluate_row", "{not json"): "malformed_json",
        ("evaluate_row", "[1, 2]"): "malformed_json",
        ("evaluate_row", '{"kernel": "k0_norm"}'): "bad_arguments",
        ("evaluate_row", '{"kernel": "k0_norm", "row": "WORK=block:256", "x": 1}'): "bad_arguments",
        ("read_ir", '{"kernel": "k0_norm", "stage": "ptx"}'): "bad_arguments",
        ("check_row", '{"kernel": "k9", "row": "WORK=block:256"}'): "unknown_kernel",
    }
    for (name, raw), kind in cases.items():
        res, ok = s.call(name, raw, source="test")
        assert not ok and isinstance(res, ToolError) and res.kind == kind, (name, raw, res)
    assert sum(s.errors.values()) == len(cases)


def test_budget_exhausted_then_finish():
    s, _ = session()
    for row in (DEFAULT, FAST, "WORK=block:128 TILE=v4x1 REDUCE=shuffle"):
        s.invoke("evaluate_row", "test", kernel=K, row=row)
    res = s.invoke("evaluate_row", "test", kernel=K, row="WORK=block:64 TILE=v4x1 REDUCE=shuffle")
    assert isinstance(res, ToolError) and res.kind == "budget_exhausted"
    done = s.invoke("finish", "test", summary="v4 + shuffle")
    assert done.finished and done.best.kernels[0].row == FAST
    after = s.invoke("evaluate_row", "test", kernel=K, row=FAST)
    assert isinstance(after, ToolError) and after.kind == "finished"
    assert s.summary == "v4 + shuffle"


def test_only_ok_rows_count_as_fast():
    s, _ = session()
    bad = s.invoke("evaluate_row", "test", kernel=K, row="WORK=block:256 TILE=v2x1 REDUCE=serial")
    assert bad.verdict == "incorrect" and bad.timing is None
    best = s.best().kernels[0]
    assert best.row is None and "no row evaluated ok" in best.note


def test_measured_times_carry_baseline_speedups():
    s, _ = session(device="gpu")
    res = s.invoke("evaluate_row", "test", kernel=K, row=FAST)
    assert res.timing.method == "measured" and res.speedup_vs_baselines["eager"] > 1
    assert res.speedup_vs_default is None   # the default row was not measured
    s.invoke("evaluate_row", "test", kernel=K, row=DEFAULT)
    assert s.invoke("history", "test", kernel=None).evaluations[1].speedup_vs_default == 1.0


def test_compiler_crash_is_a_verdict():
    s, _ = session()

    def boom(kernel, row):
        raise RuntimeError("lowering failed")
    s.ev.evaluate = boom
    res = s.invoke("evaluate_row", "test", kernel=K, row=FAST)
    assert res.verdict == "crash" and "lowering failed" in res.reasons[0]
    assert s.budget.used_evaluations == 1


def test_template_kernels_show_their_own_grammar():
    """A matrix product's space speaks its keys (warps, mma/simt/wgmma tiles, stages, raster),
    in the schedule_space tool and in the LLM's system prompt."""
    from agent.prompts import system_prompt
    from emmy.evaluate import Evaluator
    from emmy.frontend.workload import load_file

    session = Session(Evaluator(load_file("examples/matmul_half.py"), device="cpu"))
    (kernel,) = session.kernel_summaries()
    assert kernel.kind == "contract"
    space = session.schedule_space(KernelArgs(kernel=kernel.name))
    grammar = {p.key: p.grammar for p in space.decision_points}
    assert "mma:BMxBNxBK" in grammar["TILE"] and "group:G" in grammar["RASTER"]
    prompt = system_prompt(session)
    assert "Matrix-product kernels (kind contract)" in prompt and "async:N" in prompt


def test_a_second_default_row_is_the_same_program_and_spends_nothing():
    """Each kernel's default row, the other kernels on theirs, is one program: the compiler
    checks and times it once; the second kernel's default gets that check and time (and its
    own kernel's ptxas resources) without spending an evaluation. A new row is run."""
    from emmy.evaluate import Evaluator
    from emmy.frontend.workload import load_expr

    ev = Evaluator(load_expr("torch.softmax(torch.randn(8, 32) @ torch.randn(32, 16), -1)"),
                   device="cpu")
    s = Session(ev, Budget(evaluations=3))
    first, second = s.kernel_summaries()
    a = s.invoke("evaluate_row", "test", kernel=first.name, row=first.default_row)
    b = s.invoke("evaluate_row", "test", kernel=second.name, row=second.default_row)
    assert a.verdict == b.verdict == "ok" and a.same_program_as is None
    assert b.same_program_as == f"{first.name}: {first.default_row}"
    assert b.timing == a.timing and b.speedup_vs_default == 1.0
    assert b.kernel_hash == second.identity and b.resources != a.resources
    assert s.budget.used_evaluations == 1 and len(s.results) == 2
    other = next(r for r in ev.sample_rows(second.name, 4, 1) if r != second.default_row)
    c = s.invoke("evaluate_row", "test", kernel=second.name, row=other)
    assert c.verdict == "ok" and c.same_program_as is None and s.budget.used_evaluations == 2


class _SlowEvaluator(FakeEvaluator):
    def evaluate(self, kernel, row):
        import dataclasses

        return dataclasses.replace(super().evaluate(kernel, row), seconds=45.0)


def test_one_note_when_emulated_evaluations_are_slow():
    """On the CPU a slow evaluation earns one note that says why (the emulator runs the full
    size) and what to do (--set); on a GPU, and for fast evaluations, there is none."""
    from agent.models import NoteEvent

    for ev, expected in ((_SlowEvaluator(), 1), (_SlowEvaluator(device="gpu"), 0),
                         (FakeEvaluator(), 0)):
        events = []
        s = Session(ev, Budget(10), sinks=[events.append])
        for row in (FAST, "WORK=block:128 TILE=v4x1 REDUCE=shuffle"):
            s.invoke("evaluate_row", "test", kernel=K, row=row)
        notes = [e.text for e in events if isinstance(e, NoteEvent)]
        assert len(notes) == expected, notes
        if expected:
            assert "took 45 s" in notes[0] and "--set NAME=VALUE" in notes[0]
