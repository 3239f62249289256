"""Timing statistics on the CPU; CUDA-event timing and the baselines on a GPU only."""

from __future__ import annotations

import pytest

from emmy.bench.timing import Timing, percentile, settled, summarize


def test_percentiles_interpolate():
    s = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert percentile(s, 50) == 3.0
    assert percentile(s, 10) == pytest.approx(1.4)
    assert percentile(s, 90) == pytest.approx(4.6)
    assert percentile([7.0], 10) == 7.0


def test_the_median_settles_only_when_the_later_half_agrees():
    assert not settled([10.0, 10.0, 10.0], 0.01)                 # too few
    assert settled([10.0, 10.1, 9.9, 10.0, 10.0, 10.05], 0.01)
    assert not settled([10.0] * 6 + [20.0] * 6, 0.01)            # drifting


def test_summary_is_measured_with_spread_and_count():
    t = summarize([3.0, 1.0, 2.0, 4.0, 5.0], l2_flushed=True)
    assert t == Timing("measured", 3.0, pytest.approx(1.4), pytest.approx(4.6), 5, True, "")
    assert "n=5" in str(t) and "measured" in str(t)


@pytest.mark.gpu
def test_time_cuda_measures_a_copy():
    import torch

    from emmy.bench.timing import time_cuda

    src = torch.randn(1 << 26, device="cuda")
    dst = torch.empty_like(src)
    t = time_cuda(lambda: dst.copy_(src), budget_s=0.5)
    assert t.method == "measured" and t.n >= 3 and t.l2_flushed
    assert 0 < t.p10_us <= t.median_us <= t.p90_us
    gbps = 2 * src.numel() * 4 / (t.median_us * 1e-6) / 1e9
    assert 100 < gbps < 20000          # a sane device bandwidth, not a cache or a no-op


@pytest.mark.gpu
def test_baselines_run_with_the_same_timer():
    import torch

    from emmy.bench import baselines
    from emmy.frontend.workload import load_expr
    from emmy.pipeline import compile_to

    w = load_expr("nn.Linear(256, 128)(torch.randn(64, 256))")
    graph = compile_to(w, "torch")["torch"]
    model = w.model.cuda()
    args = tuple(x.cuda() for x in w.inputs)
    eager = baselines.eager(model, args, budget_s=0.2)
    assert eager.timing is not None and eager.timing.method == "measured"
    comp = baselines.compiled(model, args, budget_s=0.2)
    assert comp.timing is not None or comp.note.startswith("failed")
    if comp.timing is not None:
        assert "excluded from the timing" in comp.note
    blas = baselines.cublas(graph, budget_s=0.2)
    assert blas is not None and blas.timing is not None and "linear" in blas.note
    assert baselines.cublas(compile_to(load_expr("nn.ReLU()(torch.randn(4, 4))"), "torch")
                            ["torch"]) is None
    torch.cuda.synchronize()


class _HostEvent:
    """Stands in for torch.cuda.Event on the CPU: records the host clock."""

    def __init__(self, enable_timing=False):
        self.at = None

    def record(self):
        import time

        self.at = time.perf_counter()

    def elapsed_time(self, end):
        return (end.at - self.at) * 1e3


def test_the_adaptive_loop_stops_when_the_median_settles(monkeypatch):
    """time_cuda's control flow with host-clock events (CUDA events need a GPU)."""
    import time

    import torch

    from emmy.bench.timing import time_cuda

    monkeypatch.setattr(torch.cuda, "Event", _HostEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    calls = []

    def work():
        calls.append(1)
        end = time.perf_counter() + 200e-6
        while time.perf_counter() < end:
            pass

    t = time_cuda(work, flush_l2=False, min_reps=10, budget_s=2.0, rtol=0.05)
    assert t.method == "measured" and not t.l2_flushed
    assert 10 <= t.n <= 1000 and len(calls) > t.n       # warm-up calls are not samples
    assert 150 < t.median_us < 2000 and t.p10_us <= t.median_us <= t.p90_us
    capped = time_cuda(work, flush_l2=False, min_reps=10, max_reps=12, rtol=0.0)
    assert capped.n == 12
