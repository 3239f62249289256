"""emmy as a torch.compile backend: graphs compiled through every stage with the schedule
database's rows, run on the CPU emulator here (run=emulate) and compared with eager."""

import warnings

import pytest
import torch
import torch.nn as nn

import emmy.dynamo
from emmy.runtime.gpu import gpu_available

EMULATE = {"run": "emulate", "db": None}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    emmy.dynamo.graphs.clear()
    yield
    torch._dynamo.reset()


def compiled(fn, options=EMULATE, **kw):
    return torch.compile(fn, backend=emmy.dynamo.backend, dynamic=False, options=dict(options),
                         **kw)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.norm = nn.Linear(16, 32), nn.LayerNorm(32)

    def forward(self, x):
        return self.norm(nn.functional.gelu(self.up(x))), x.softmax(-1)


def test_the_backend_name_runs_the_kernels_of_each_graph():
    """backend="emmy" (the entry point pip installs) compiles the graph; its kernels, run on
    the emulator, agree with eager, and every call returns new tensors."""
    model = Block().eval()
    f = torch.compile(model, backend="emmy", dynamic=False, options=dict(EMULATE))
    x = torch.randn(4, 16)
    with torch.no_grad():
        got, want = f(x), model(x)
        again = f(torch.randn(4, 16))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)
    assert not torch.equal(got[0], again[0])          # the second call did not overwrite the first
    (graph,) = emmy.dynamo.graphs
    assert graph.compiled is not None and len(graph.compiled.rows) >= 2
    assert graph.calls == {"kernels": 2, "eager": 0}
    assert "kernel(s), cpu emulator" in str(graph)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_outputs_keep_their_dtype(dtype):
    model = nn.LayerNorm(32).to(dtype).eval()
    x = torch.randn(4, 32).to(dtype)
    with torch.no_grad():
        got = compiled(model)(x)
        want = model(x)
    assert got.dtype == dtype
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


def test_a_graph_break_gives_two_compiled_graphs():
    def fn(x):
        y = x.softmax(-1)
        torch._dynamo.graph_break()
        return (y * 2).relu()

    x = torch.randn(3, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(fn)(x), fn(x))
    assert len(emmy.dynamo.graphs) == 2
    assert all(g.compiled is not None for g in emmy.dynamo.graphs)


def test_outputs_that_repeat_or_view_the_input_come_back_right():
    def fn(x):
        y = x * 2
        return y, y, x.t(), x[1:]

    x = torch.randn(3, 4)
    with torch.no_grad():
        got = compiled(fn)(x)
    for g, w in zip(got, fn(x)):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w)


def test_autograd_calls_run_the_captured_graph_eagerly():
    """Kernels compiled for inference give no gradient: where autograd records the call the
    graph runs eagerly (with a warning), so backward still works."""
    model = nn.Linear(8, 4)
    f = compiled(model)
    x = torch.randn(2, 8)
    with pytest.warns(UserWarning, match="runs eagerly while autograd records it"):
        y = f(x)
    y.sum().backward()
    assert model.weight.grad is not None
    assert emmy.dynamo.graphs[-1].calls["eager"] == 1


def test_a_graph_with_dynamic_shapes_is_compiled_for_each_shape_it_meets():
    """TorchDynamo traces a graph with symbolic shapes after a shape changes (or with
    dynamic=True); emmy compiles it for each set of input shapes a call brings (checked each
    time), then takes that shape's kernels from its cache."""
    model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32)).eval()
    f = torch.compile(model, backend=emmy.dynamo.backend, options=dict(EMULATE))
    with torch.no_grad():
        for n in (3, 5, 7, 5):
            x = torch.randn(n, 16)
            torch.testing.assert_close(f(x), model(x), atol=1e-4, rtol=1e-4)
    first, traced = emmy.dynamo.graphs          # n = 3 static, then n symbolic
    assert not first.dynamic and first.calls["kernels"] == 1
    assert traced.dynamic and traced.shapes == 2 and traced.calls == {"kernels": 3, "eager": 0}
    assert "dynamic shapes: compiled for 2 so far" in str(traced)


def test_a_refused_graph_runs_eagerly_or_raises_when_asked():
    def fn(x):
        return torch.linalg.inv(x) + 1          # 5 x 5: past the closed forms

    x = torch.randn(5, 5) + 5 * torch.eye(5)
    with pytest.warns(UserWarning, match="emmy refused it"), torch.no_grad():
        torch.testing.assert_close(compiled(fn)(x), fn(x))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="linalg"), torch.no_grad():
        compiled(fn, options={**EMULATE, "fallback": False})(x)


@pytest.mark.parametrize("options, message", [
    ({"bogus": 1}, "unknown emmy backend option"),
    ({"run": "fast"}, "run must be one of auto, gpu, emulate, eager"),
])
def test_bad_options_are_refused_with_the_accepted_ones(options, message):
    with pytest.raises(Exception, match=message), torch.no_grad():
        compiled(lambda x: x + 1, options)(torch.randn(3))


def test_rows_come_from_the_schedule_database(tmp_path):
    """A row tuned for a kernel (here written into the database directly, as emmy-agent keeps
    its best) is the row torch.compile's graph gets for the same kernel."""
    from agent.db import ScheduleDb
    from agent.evaluator import open_evaluator
    from agent.models import DbEntry

    ev = open_evaluator(None, [], "sm_90a", device="cpu",
                        expr="nn.RMSNorm(64)(torch.randn(4, 64))")
    (kernel,) = ev.kernels()
    row = next(r for r in ev.all_rows(kernel.name) if r != kernel.default_row)
    db = tmp_path / "db.json"
    ScheduleDb(db).offer([DbEntry(identity=kernel.identity, target="sm_90a", kernel=kernel.name,
                                  workload="w", row=row, median_us=1.0, method="modeled",
                                  trace=None, time="t")])
    model = nn.RMSNorm(64).eval()
    x = torch.randn(4, 64)
    with torch.no_grad():
        torch.testing.assert_close(compiled(model, {"run": "emulate", "db": str(db)})(x),
                                   model(x))
    (graph,) = emmy.dynamo.graphs
    assert list(graph.compiled.rows.values()) == [row]


@pytest.mark.skipif(gpu_available(), reason="checks the no-GPU default")
def test_without_a_gpu_auto_compiles_and_runs_eagerly():
    model = nn.RMSNorm(64).eval()
    x = torch.randn(4, 64)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(compiled(model, {"db": None})(x), model(x))
    (graph,) = emmy.dynamo.graphs
    assert graph.compiled is not None and graph.eager_reason.startswith("eager torch")
    assert graph.calls == {"kernels": 0, "eager": 1}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gpu_kernels_of_a_compiled_block_match_eager(dtype):
    """On a GPU, run=auto runs the kernels (tensor cores for the f16 product) on torch's
    stream, into new outputs at each call."""
    model = Block().to("cuda", dtype).eval()
    f = compiled(model, {"db": None})
    x = torch.randn(64, 16, device="cuda", dtype=dtype)
    with torch.no_grad():
        got, want = f(x), model(x)
        f(torch.randn(64, 16, device="cuda", dtype=dtype))
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    for g, w in zip(got, want):
        assert g.is_cuda and g.dtype == dtype
        torch.testing.assert_close(g, w, atol=tol, rtol=tol)
    (graph,) = emmy.dynamo.graphs
    assert graph.compiled.backend.startswith("cuda") and graph.calls["kernels"] == 2


def test_tune_searches_the_graph_and_compiles_the_rows_it_kept(tmp_path, monkeypatch):
    """options={"tune": N}: emmy-agent's search policy spends N evaluations on the graph's
    kernels (checked on the emulator, modeled here), keeps its best rows in the database and
    the graph is compiled with them; the trace records the graph's FX code, and replaying it
    says why it cannot run again from the trace."""
    import json

    from agent.cli import main as agent_main

    monkeypatch.chdir(tmp_path)
    db = tmp_path / "db.json"
    model = nn.Sequential(nn.LayerNorm(128), nn.GELU()).eval()
    x = torch.randn(8, 128)
    with torch.no_grad():
        got = compiled(model, {"run": "emulate", "db": str(db), "tune": 3})(x)
        torch.testing.assert_close(got, model(x), atol=1e-4, rtol=1e-4)
    (graph,) = emmy.dynamo.graphs
    assert graph.tuned.startswith("3 evaluation(s) by the search policy (modeled)")
    kept = {e["kernel"]: e["row"] for e in json.loads(db.read_text())["entries"].values()}
    assert kept and all(graph.compiled.rows[k] == row for k, row in kept.items())
    (trace,) = (tmp_path / "traces").glob("*-dynamo_graph0-search.jsonl")
    assert "def forward" in json.loads(trace.read_text().splitlines()[0])["workload"]["source"]
    assert agent_main(["replay", str(trace), "--render"]) == 0
    assert agent_main(["replay", str(trace)]) == 2


def test_max_autotune_mode_tunes_with_the_default_budget(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(emmy.dynamo, "AUTOTUNE_BUDGET", 2)
    monkeypatch.setenv("EMMY_SCHEDULE_DB", str(tmp_path / "schedules.json"))   # the default one
    model = nn.RMSNorm(64).eval()
    x = torch.randn(4, 64)
    f = torch.compile(model, backend=emmy.dynamo.backend, dynamic=False, mode="max-autotune")
    with torch.no_grad():
        torch.testing.assert_close(f(x), model(x))
    (graph,) = emmy.dynamo.graphs
    assert graph.tuned.startswith("2 evaluation(s)")
    assert (tmp_path / "schedules.json").exists()


@pytest.mark.parametrize("options, message", [
    ({"tune": 3, "db": None}, "tune keeps the rows it finds in a schedule database"),
    ({"tune": "many"}, "tune is a number of evaluations"),
])
def test_bad_tune_options_say_why(options, message):
    with pytest.raises(Exception, match=message), torch.no_grad():
        compiled(lambda x: x + 1, options)(torch.randn(3))


@pytest.mark.gpu
def test_gpu_tune_measures_the_graphs_rows(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = nn.Sequential(nn.Linear(256, 512), nn.LayerNorm(512)).to("cuda", torch.float16).eval()
    x = torch.randn(128, 256, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        got = compiled(model, {"db": str(tmp_path / "db.json"), "tune": 4})(x)
        torch.testing.assert_close(got, model(x), atol=2e-2, rtol=2e-2)
    (graph,) = emmy.dynamo.graphs
    assert "(measured)" in graph.tuned and graph.compiled.backend.startswith("cuda")


def test_kernels_are_checked_before_they_run_and_a_failure_runs_eagerly(monkeypatch):
    """The graph's kernels pass the tuner's check (fresh inputs against a float64 reference)
    before they replace it; kernels that fail it (none should: here the check is made to
    answer so) leave the graph eager, or raise with fallback=False."""
    from types import SimpleNamespace

    model = nn.RMSNorm(32).eval()
    x = torch.randn(4, 32)
    with torch.no_grad():
        compiled(model)(x)
    assert emmy.dynamo.graphs[-1].check == "ok" and "check ok" in str(emmy.dynamo.graphs[-1])

    failed = SimpleNamespace(ok=False, verdict="incorrect", reasons=("out0: max abs err 3",))
    monkeypatch.setattr(emmy.dynamo.Compiled, "check", lambda self: failed)
    torch._dynamo.reset()
    with pytest.warns(UserWarning, match=r"failed the check \(incorrect\): out0: max abs err 3"), \
            torch.no_grad():
        torch.testing.assert_close(compiled(model)(x), model(x))
    assert emmy.dynamo.graphs[-1].compiled is None and emmy.dynamo.graphs[-1].calls["eager"] == 1
    torch._dynamo.reset()
    with pytest.raises(Exception, match="failed the check"), torch.no_grad():
        compiled(model, {**EMULATE, "fallback": False})(x)
