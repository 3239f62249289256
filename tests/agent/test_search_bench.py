"""bench/search_vs_random.py on the fake Evaluator: counting, the no-check view, the table."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from agent.policies.random import RandomPolicy
from agent.policies.search import SearchPolicy
from tests.agent.fakes import FakeEvaluator

ROOT = Path(__file__).resolve().parents[2]
K = "k0_norm"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("search_vs_random",
                                                  ROOT / "bench" / "search_vs_random.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module            # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def exhaustive(ev):
    times = {r: ev.time_us(K, r) for r in ev.all_rows(K)}
    return times, min(times.values())


def test_search_reaches_the_exhaustive_best_and_is_counted(bench):
    ev = FakeEvaluator()
    times, best = exhaustive(ev)
    view = bench.KernelEvaluator(ev, K, times, {}, check=True)
    run = bench.run_policy(SearchPolicy(), view, 10, best, 1e-9)
    assert run.evaluations <= 10 and run.to_best is not None and run.ratio == 1.0
    assert run.rows[run.to_best - 1] in {r for r, t in times.items() if t == best}
    assert all(times[r] > best for r in run.rows[:run.to_best - 1])


def test_random_spends_its_budget_and_reports_a_ratio(bench):
    ev = FakeEvaluator()
    times, best = exhaustive(ev)
    view = bench.KernelEvaluator(ev, K, times, {}, check=True)
    run = bench.run_policy(RandomPolicy(seed=1), view, 4, best, 1e-9)
    assert run.evaluations == 4 and run.ratio >= 1.0
    assert (run.to_best is None) == (run.ratio > 1.0)


def test_without_check_a_legal_row_is_ok_with_its_modeled_time(bench):
    ev = FakeEvaluator()
    times, _ = exhaustive(ev)
    memo: dict = {}
    view = bench.KernelEvaluator(ev, K, times, memo, check=False)
    row = "WORK=block:64 TILE=v2x1 REDUCE=serial"          # the fake calls it incorrect
    e = view.evaluate(K, row)
    assert e.verdict == "ok" and e.timing == {"method": "modeled", "median_us": times[row],
                                              "p10_us": times[row], "p90_us": times[row], "n": 1}
    assert ev.evaluated == []                                # the real evaluate never ran
    assert view.evaluate(K, "WORK=block:32 TILE=v1x1 REDUCE=smem").verdict == "illegal"
    checked = bench.KernelEvaluator(ev, K, times, {}, check=True)
    assert checked.evaluate(K, row).verdict == "incorrect"
    assert [k.name for k in view.kernels()] == [K]


def test_table_and_labels(bench):
    ev = FakeEvaluator()
    times, best = exhaustive(ev)
    view = bench.KernelEvaluator(ev, K, times, {}, check=False)
    search = bench.run_policy(SearchPolicy(), view, 10, best, 1e-9)
    randoms = [bench.run_policy(RandomPolicy(seed=s), view, 10, best, 1e-9) for s in range(3)]
    info = view.kernels()[0]
    result = bench.KernelResult("fake", K, info.count, len(times), "modeled", best,
                                sorted(r for r, t in times.items() if t == best),
                                info.default_row, times[info.default_row], 10, search, randoms)
    text = bench.table([result])
    assert f"| fake:{K} | {info.count} | {best:.2f} |" in text
    assert f"| {search.to_best} |" in text and "/3" in text
    assert "correctness not re-checked" in bench.method_label([result], check=False)
    assert "MODELED" in bench.method_label([result], check=True)


def test_sets_go_to_the_files_that_define_the_name(bench, tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("dim = 8\nrows = 2\n")
    b.write_text("dim = 4\n")
    out = bench.split_sets(["dim=16", "a:rows=3"], [a, b])
    assert out == {a: ["dim=16", "rows=3"], b: ["dim=16"]}
    with pytest.raises(SystemExit):
        bench.split_sets(["cols=3"], [a, b])


def test_measured_exhaustive_keeps_only_ok_rows(bench):
    ev = FakeEvaluator(device="gpu")
    times, failed, done = bench.measured_times(ev, [K])
    assert set(times[K]) | set(failed[K]) == set(ev.all_rows(K))
    assert failed[K] and set(failed[K].values()) == {"incorrect"}
    assert all(done[(K, r)].timing["method"] == "measured" for r in times[K])
