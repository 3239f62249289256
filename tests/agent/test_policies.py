"""Built-in policies on the fake Evaluator: budget kept, optimum found, deterministic."""

from __future__ import annotations

from agent.allocate import allocate, expected_gains
from agent.api import Session
from agent.budget import Budget
from agent.policies.random import RandomPolicy
from agent.policies.search import SearchPolicy
from tests.agent.fakes import FakeEvaluator

BEST = "WORK=block:256 TILE=v4x1 REDUCE=shuffle"


def run(policy, budget: int, **kw) -> tuple[Session, str]:
    s = Session(FakeEvaluator(**kw), Budget(evaluations=budget))
    return s, policy.run(s)


def test_search_finds_the_optimum_within_budget():
    s, reason = run(SearchPolicy(), 6)
    assert s.budget.used_evaluations <= 6
    assert s.results[0].row == "WORK=block:256 TILE=v1x1 REDUCE=shuffle"   # the reference first
    best = s.best().kernels[0]
    assert best.row == BEST and best.method == "modeled" and best.speedup_vs_default > 2


def test_search_without_cost_model_still_moves_locally():
    s, _ = run(SearchPolicy(), 12, cost_model=False)
    assert s.budget.used_evaluations <= 12
    assert s.best().kernels[0].median_us <= s.results[0].timing.median_us


def test_search_stops_when_no_neighbour_improves():
    s, reason = run(SearchPolicy(), 100)
    assert reason.startswith("search: no neighbour")
    assert s.budget.used_evaluations < 30
    assert s.best().kernels[0].row == BEST


def test_search_is_deterministic():
    a, _ = run(SearchPolicy(seed=3), 5)
    b, _ = run(SearchPolicy(seed=3), 5)
    assert [r.row for r in a.results] == [r.row for r in b.results]


def test_random_samples_legal_rows_only():
    s, _ = run(RandomPolicy(seed=1), 8)
    assert s.budget.used_evaluations == 8
    assert all(r.verdict != "illegal" for r in s.results)
    assert len({r.row for r in s.results}) == 8
    again, _ = run(RandomPolicy(seed=1), 8)
    assert [r.row for r in again.results] == [r.row for r in s.results]


def test_multi_kernel_budget_follows_expected_gain():
    ev = FakeEvaluator(two=True)
    gains = expected_gains(ev, ev.kernels())
    shares = allocate(7, gains)
    assert sum(shares.values()) == 7 and min(shares.values()) >= 1
    s, _ = run(SearchPolicy(), 7, two=True)
    assert s.budget.used_evaluations <= 7
    assert {r.kernel for r in s.results} == {"k0_norm", "k1_map"}
    assert all(b.row for b in s.best().kernels)


def test_a_default_row_whose_program_was_evaluated_spends_nothing():
    """Every kernel's default row, the others on theirs, is one program: evaluated once. With
    a budget of one evaluation a kernel, the search spends none on the second default and
    evaluates a row of its own for each kernel instead."""
    s, _ = run(SearchPolicy(), 2, two=True, programs=True)
    assert s.budget.used_evaluations == 2
    defaults = [r for r in s.results if r.row == s.kernel_infos[r.kernel].default_row]
    assert [r.same_program_as for r in defaults] == [None, f"{defaults[0].kernel}: "
                                                           f"{defaults[0].row}"]
    assert defaults[1].timing == defaults[0].timing
    fresh = [(r.kernel, r.row) for r in s.results if r.same_program_as is None]
    assert fresh == s.ev.evaluated and len(fresh) == 2
    assert any(r.kernel == defaults[1].kernel and r.row != defaults[1].row for r in s.results)
    # before: both evaluations went to the two defaults, one program
    s, _ = run(SearchPolicy(), 2, two=True)
    assert all(r.row == s.kernel_infos[r.kernel].default_row for r in s.results)


def test_allocate_edge_cases():
    assert allocate(1, {"a": 5.0, "b": 1.0}) == {"a": 1, "b": 0}
    assert allocate(10, {"a": 0.0, "b": 0.0}) == {"a": 5, "b": 5}
    assert sum(allocate(11, {"a": 3.0, "b": 1.0, "c": 1.0}).values()) == 11


def test_a_chains_fused_row_is_not_kept_when_a_row_of_its_half_did_better():
    """mlp's chain is cut by default: a fused row for the chain (whole program 26.7 us) and a
    row for its second half (19.4 us, under the cut) cannot both apply; the database keeps the
    halves' rows, not the chain's, so the next compile reproduces the 19.4 us program."""
    from agent.models import BestEntry
    from agent.run import worth_keeping

    def best(kernel, us, row="WORK=warps:2x2"):
        return BestEntry(kernel=kernel, row=row, median_us=us, method="modeled",
                         speedup_vs_default=1.0, evaluations=1)
    kept = worth_keeping([best("k0_mlp", 26.7), best("k0_mlp_cut0", 53.0),
                          best("k0_mlp_cut1", 19.4), best("k1_relu", 5.0),
                          best("k2_sum", None, row=None)])
    assert [b.kernel for b in kept] == ["k0_mlp_cut0", "k0_mlp_cut1", "k1_relu"]
    kept = worth_keeping([best("k0_mlp", 12.0), best("k0_mlp_cut1", 19.4)])
    assert [b.kernel for b in kept] == ["k0_mlp", "k0_mlp_cut1"]


def test_search_ranks_a_products_cut_row_that_its_sample_missed():
    """PLACE=cut is one row of a dequantizing product's thousands (its other decisions read
    their unused values): the search ranks it whatever its sample holds."""
    from emmy.evaluate import Evaluator
    from emmy.frontend.workload import load_file

    session = Session(Evaluator(load_file("examples/int8_linear.py"), device="cpu"),
                      Budget(evaluations=4))
    ranked = SearchPolicy(pool=4, rank_seconds=0)._rank(session, "k0_int8_linear", 4)
    assert sum(r.endswith("PLACE=cut") for r in ranked) == 1
    assert len(ranked) == 5       # the sample's four fused rows, and the cut
