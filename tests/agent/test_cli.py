"""`emmy-agent` end to end on the real compiler (rmsnorm at a CPU size), and bad input."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.cli import main
from agent.trace import Trace
from tests.agent.chat_server import ScriptedServer, call

ROOT = Path(__file__).resolve().parents[2]
RMSNORM = str(ROOT / "examples" / "rmsnorm.py")
SMALL = ["--set", "batch_size=4", "--set", "dim=256"]
DEFAULT = "WORK=block:256 TILE=v4x1 REDUCE=shuffle STAGE=direct PLACE=fuse"



@pytest.fixture(autouse=True)
def no_llm(monkeypatch):
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_MODEL"):
        monkeypatch.delenv(var, raising=False)


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def search_run(tmp_path_factory):
    """One real optimize run shared by the tests that read its trace."""
    folder = tmp_path_factory.mktemp("e2e")
    trace, db, js = folder / "run.jsonl", folder / "db.json", folder / "out.json"
    rc = main(["optimize", RMSNORM, *SMALL, "--budget", "3", "--trace", str(trace),
               "--db", str(db), "--json", str(js), "--quiet"])
    return rc, trace, db, json.loads(js.read_text())


def test_optimize_end_to_end(search_run):
    rc, trace, _, out = search_run
    t = Trace.read(trace)
    assert t.header.policy == "search" and t.header.device == "cpu" and t.header.gpu == "none"
    assert "rms_norm" in t.header.workload.source and t.header.workload.sets == SMALL[1::2]
    assert 1 <= len(t.evaluations) <= 3 and t.finished
    assert t.evaluations[0].row == DEFAULT
    assert all(r.verdict == "ok" for r in t.evaluations), [r.reasons for r in t.evaluations]
    for r in t.evaluations:
        assert r.timing is None or r.timing.method == "modeled"
    assert rc == (0 if out["best"][0]["row"] else 1)
    assert out["policy"] == "search" and out["device"] == "cpu"


def test_console_says_policy_and_modeled(tmp_path, capsys):
    rc, out, _ = run(capsys, "optimize", RMSNORM, *SMALL, "--policy", "random", "--budget", "1",
                     "--trace", tmp_path / "r.jsonl", "--db", tmp_path / "db.json")
    assert "policy random" in out and "MODELED" in out and "best row per kernel" in out


def test_replay_reproduces_and_renders(search_run, capsys):
    _, trace, _, _ = search_run
    rc, out, _ = run(capsys, "replay", trace)
    assert rc == 0, out
    assert "evaluations reproduce" in out
    rc, out, _ = run(capsys, "replay", trace, "--render")
    assert rc == 0 and "policy search" in out and "summary:" in out


def test_propose_appends_to_a_trace(search_run, tmp_path, capsys):
    _, trace, _, _ = search_run
    copy = tmp_path / "copy.jsonl"
    copy.write_text(trace.read_text())
    before = len(Trace.read(copy).events)
    row = "WORK=block:128 TILE=v2x1 REDUCE=shuffle STAGE=direct PLACE=fuse"
    rc, out, _ = run(capsys, "propose", RMSNORM, *SMALL, "--row", row, "--trace", copy,
                     "--db", tmp_path / "db.json")
    t = Trace.read(copy)
    assert len(t.events) > before and t.evaluations[-1].row == row
    assert t.evaluation_events[-1].source == "human"
    assert rc == (0 if t.evaluations[-1].verdict == "ok" else 1)
    rc, out, err = run(capsys, "propose", RMSNORM, *SMALL, "--row", row.replace("TILE=v2x1 ", "") + " TILE=v2x1",
                       "--trace", copy)
    assert rc == 2 and f"canonical spelling is `{row}`" in err
    illegal = row.replace("TILE=v2x1", "TILE=v8x1")
    rc, out, _ = run(capsys, "propose", RMSNORM, *SMALL, "--row", illegal, "--trace", copy)
    assert rc == 2 and "illegal" in out and "[tile.vector_bytes]" in out


def test_report_writes_html(search_run, tmp_path, capsys):
    _, trace, _, _ = search_run
    rc, out, _ = run(capsys, "report", trace, "-o", tmp_path / "r.html")
    assert rc == 0 and (tmp_path / "r.html").read_text().startswith("<!doctype html>")


def test_llm_through_the_cli(tmp_path, capsys):
    script = [call("schedule_space", {"kernel": "k0_rmsnorm"}),
              call("evaluate_row", {"kernel": "k0_rmsnorm", "row": DEFAULT}),
              call("finish", {"summary": "the default row is fine"})]
    with ScriptedServer(script) as server:
        rc, out, _ = run(capsys, "optimize", RMSNORM, *SMALL, "--base-url", server.base_url,
                         "--model", "scripted", "--budget", "2", "--trace", tmp_path / "l.jsonl",
                         "--db", tmp_path / "db.json")
        assert server.leftover() == []
    assert "policy llm" in out
    t = Trace.read(tmp_path / "l.jsonl")
    assert t.header.model == "scripted" and t.summary.summary == "the default row is fine"
    rc, out, _ = run(capsys, "replay", tmp_path / "l.jsonl", "--llm", "--trace-out", tmp_path / "re.jsonl")
    assert rc == 0, out


def test_kill_then_resume(tmp_path):
    trace = tmp_path / "killed.jsonl"
    cmd = [sys.executable, "-m", "agent", "optimize", RMSNORM, *SMALL, "--policy", "random",
           "--budget", "8", "--trace", str(trace), "--db", str(tmp_path / "db.json"), "--quiet"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if trace.exists() and '"type":"evaluation"' in trace.read_text():
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    cut = Trace.read(trace)
    done = len(cut.evaluations)
    assert 1 <= done < 8 and not cut.finished
    resumed = subprocess.run([sys.executable, "-m", "agent", "optimize", "--resume", str(trace),
                              "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert resumed.returncode in (0, 1), resumed.stderr
    t = Trace.read(trace)
    rows = [r.row for r in t.evaluations]
    assert t.finished and len(rows) == 8 and len(set(rows)) == 8


BAD = [
    ([], "usage"),
    (["frobnicate"], "invalid choice"),
    (["optimize"], "give a workload FILE"),
    (["optimize", "no/such/file.py"], "no such workload file"),
    (["optimize", RMSNORM, "--budget", "0"], "must be > 0"),
    (["optimize", RMSNORM, "--policy", "llm"], "needs a model server"),
    (["optimize", RMSNORM, "--set", "nonsense=1"], "no module-level constant"),
    (["optimize", "--resume", "x.jsonl", "--trace", "y.jsonl"], "drop --trace"),
    (["optimize", "--resume", "missing.jsonl"], "no such trace"),
    (["replay", "missing.jsonl"], "no such trace"),
    (["report", "missing.jsonl"], "no such trace"),
    (["propose", RMSNORM], "--row"),
    (["optimize", RMSNORM, "-c", "torch.exp(torch.randn(4))"], "exactly one"),
    (["optimize", "-c", "torch.exp(torch.randn(4))", "--set", "a=1"], "does not apply to -c"),
    (["optimize", "--resume", "x.jsonl", "-c", "torch.exp(torch.randn(4))"], "drop the workload"),
    (["optimize", "-c", "torch.exp(x)"], "`x` is not defined"),
    (["propose", "--row", DEFAULT], "exactly one"),
    (["optimize", "-c", "F.softmax(torch.randn(0, 5), dim=1)"], "softmax has no kernels to schedule"),
]


@pytest.mark.parametrize("argv,message", BAD, ids=[" ".join(a) or "none" for a, _ in BAD])
def test_bad_input_exits_2(argv, message, capsys, tmp_path):
    rc, out, err = run(capsys, *argv, *(["--db", tmp_path / "db.json"] if argv[:1] == ["optimize"] else []))
    assert rc == 2
    assert message in out + err and "Traceback" not in err


EXPR = "nn.RMSNorm(256)(torch.randn(4, 256))"


def test_an_expression_workload_is_optimized_proposed_and_replayed(tmp_path, capsys):
    """-c instead of a file: the trace records the expression, and replay rebuilds it."""
    trace, db = tmp_path / "expr.jsonl", tmp_path / "db.json"
    rc, _, _ = run(capsys, "optimize", "-c", EXPR, "--budget", "2", "--trace", trace,
                   "--db", db, "--quiet")
    t = Trace.read(trace)
    assert rc == 0 and t.finished and t.header.workload.path == "<expr>"
    assert t.header.workload.source == EXPR and t.header.workload.name == "rmsnorm"
    assert [r.verdict for r in t.evaluations] == ["ok"] * len(t.evaluations)
    rc, out, _ = run(capsys, "replay", trace)
    assert rc == 0 and f"{len(t.evaluations)}/{len(t.evaluations)} evaluations reproduce" in out
    proposed = tmp_path / "human.jsonl"
    rc, out, _ = run(capsys, "propose", "-c", EXPR, "--row", DEFAULT, "--trace", proposed,
                     "--db", db)
    assert rc == 0 and f"`{DEFAULT}`: ok" in out
    assert Trace.read(proposed).header.workload.source == EXPR


def test_not_a_trace_is_bad_input(tmp_path, capsys):
    (tmp_path / "x.jsonl").write_text("not json\n")
    rc, _, err = run(capsys, "replay", tmp_path / "x.jsonl")
    assert rc == 2 and "not a trace event" in err


def test_report_formats(tmp_path, capsys):
    from agent.run import RunConfig, optimize
    from tests.agent.fakes import FakeEvaluator
    from tests.agent.test_trace import Quiet

    w = tmp_path / "fake.py"
    w.write_text("# fake\n")
    out = optimize(RunConfig(file=str(w), policy="random", budget=3, trace=str(tmp_path / "f.jsonl"),
                             db=str(tmp_path / "db.json")), Quiet, FakeEvaluator())
    rc, text, _ = run(capsys, "report", out.trace, "-o", tmp_path / "r.svg")
    assert rc == 0 and "<path" in (tmp_path / "r.svg").read_text() and "modeled" in text
    rc, _, err = run(capsys, "report", out.trace, "-o", tmp_path / "r.gif")
    assert rc == 2 and ".html, .svg or .png" in err
    if importlib.util.find_spec("matplotlib") is None:
        rc, _, err = run(capsys, "report", out.trace, "-o", tmp_path / "r.png")
        assert rc == 2 and "matplotlib" in err


def test_optimize_starts_from_the_schedule_database(tmp_path, monkeypatch):
    """A second run evaluates the row the first one kept, right after the default."""
    from agent.db import ScheduleDb
    from agent.run import recorded_rows
    from agent.api import Session
    from tests.agent.fakes import FakeEvaluator

    ev = FakeEvaluator()
    session = Session(ev)
    kernel = next(iter(session.kernel_infos.values()))
    other = next(r for r in ev.all_rows(kernel.name) if r != kernel.default_row)
    db = tmp_path / "db.json"
    from agent.models import DbEntry

    ScheduleDb(db).offer([DbEntry(identity=kernel.identity, target=ev.target, kernel=kernel.name,
                                  workload="w", row=other, median_us=1.0, method="modeled",
                                  trace=None, time="t")])
    assert recorded_rows(session, str(db)) == {kernel.name: other}


BAD_INDEX = "nn.Embedding(10, 4)(torch.randint(0, 20, (3,)))"


@pytest.mark.parametrize("command", ["optimize", "propose"])
def test_a_model_failing_in_eager_stops_the_run_as_bad_input(command, tmp_path, capsys):
    """An embedding index out of range makes torch itself fail: no row is to blame, so the run
    stops with exit 2 and torch's reason (not a `crash` verdict per row), and the trace ends
    with a summary that says why."""
    trace = tmp_path / "bad.jsonl"
    extra = ["--budget", "2"] if command == "optimize" else ["--row", "WORK=thread:256 TILE=v4x1"]
    rc, out, err = run(capsys, command, "-c", BAD_INDEX, *extra, "--trace", trace,
                       "--db", tmp_path / "db.json", "--quiet")
    assert rc == 2 and "Traceback" not in err
    assert "fails on its inputs in eager PyTorch: IndexError" in err
    t = Trace.read(trace)
    assert t.finished and t.evaluations == []
    assert command == "propose" or "fails on its inputs" in t.summary.reason
