"""The llm policy against a real HTTP server with scripted replies, and its replay."""

from __future__ import annotations

import json

import pytest

from agent.api import Session
from agent.budget import Budget
from agent.models import LlmErrorEvent, NoteEvent
from agent.policies.chat import OpenAIChat
from agent.policies.llm import LlmPolicy
from agent.policies.replay import ReplayPolicy
from agent.run import header
from agent.trace import Trace, TraceWriter
from tests.agent.chat_server import ScriptedServer, call, refusal, sleep, status, text
from tests.agent.fakes import FAKE_WORKLOAD, FakeEvaluator

K = "k0_norm"
DEFAULT = "WORK=block:256 TILE=v1x1 REDUCE=shuffle"
FAST = "WORK=block:256 TILE=v4x1 REDUCE=shuffle"


def drive(server, tmp_path, budget=None, timeout=2.0, **policy_kw):
    trace = tmp_path / "llm.jsonl"
    writer = TraceWriter(trace)
    events = []
    session = Session(FakeEvaluator(), budget or Budget(evaluations=5), sinks=[writer, events.append])
    session.emit(header(session, "test", {}, FAKE_WORKLOAD, "llm", "scripted"))

    def on_error(e: LlmErrorEvent):
        session.errors[f"llm_{e.kind}"] += 1
        session.emit(e)

    chat = OpenAIChat("scripted", base_url=server.base_url, api_key="test", timeout=timeout,
                      retries=2, backoff=0.01, on_error=on_error)
    reason = LlmPolicy(chat, **policy_kw).run(session)
    session.emit(session.summary_event(reason))
    writer.close()
    return session, reason, events, trace


def tool_messages(request: dict) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


def test_llm_survives_model_and_server_mistakes(tmp_path):
    script = [
        call("describe_workload", {}),
        status(500),                                                   # retried
        call("evaluate_row", '{"kernel": "k0_norm", "row": '),         # malformed JSON
        call("optimize_everything", {}),                               # unknown tool
        text("I believe block:256 is best."),                          # text, no tool call
        call("evaluate_row", {"kernel": K, "row": "WORK=block:32 TILE=v1x1 REDUCE=smem"}),  # illegal
        call("evaluate_row", {"kernel": K, "row": "TILE=v4x1 WORK=block:256 REDUCE=shuffle"}),
        call(("evaluate_row", {"kernel": K, "row": DEFAULT}), ("evaluate_row", {"kernel": K, "row": FAST})),
        call("evaluate_row", {"kernel": K, "row": FAST}),              # cached: free
        refusal("I can't help with that."),
        call("finish", {"summary": "v4 vectors and shuffle reduction"}),
    ]
    with ScriptedServer(script) as server:
        session, reason, events, trace = drive(server, tmp_path)
        assert server.leftover() == [], "the policy stopped before the script ended"
    assert reason == "finished by the model"
    assert session.summary == "v4 vectors and shuffle reduction"
    assert session.budget.used_evaluations == 2
    assert session.ev.evaluated == [(K, DEFAULT), (K, FAST)]
    assert dict(session.errors) == {"llm_server_error": 1, "malformed_json": 1, "unknown_tool": 1,
                                    "text_reply": 1, "illegal_row": 1, "bad_row": 1, "refusal": 1}
    reqs = server.requests
    assert reqs[0]["tools"][0]["function"]["strict"] is True
    assert "not a JSON object" in tool_messages(reqs[3])[-1]
    assert "there is no tool `optimize_everything`" in tool_messages(reqs[4])[-1]
    assert reqs[5]["messages"][-1]["role"] == "user"            # the nudge after a text reply
    illegal = json.loads(tool_messages(reqs[6])[-1])
    assert illegal["verdict"] == "illegal" and "64 threads" in illegal["reasons"][0]
    assert f"the canonical spelling is `{FAST}`" in tool_messages(reqs[7])[-1]
    cached = json.loads(tool_messages(reqs[9])[-1])
    assert cached["cached"] is True and cached["timing"]["method"] == "modeled"
    best = session.best().kernels[0]
    assert best.row == FAST and best.speedup_vs_default > 1

    recorded = Trace.read(trace)
    assert recorded.finished and len(recorded.evaluations) == 2
    assert sum(isinstance(e, LlmErrorEvent) for e in recorded.events) == 1

    # Replay: the recorded replies drive the same loop to the same evaluations, with no server.
    replayed = Session(FakeEvaluator(), Budget(evaluations=5))
    policy = ReplayPolicy(recorded.llm_responses)
    assert policy.run(replayed) == "finished by the model"
    assert policy.chat.left == 0
    assert [(r.row, r.verdict) for r in replayed.results] == \
           [(r.row, r.verdict) for r in recorded.evaluations]


def test_rate_limit_and_timeouts_are_retried_then_give_up(tmp_path):
    script = [status(429, {"retry-after": "0"}), sleep(0.8), call("list_kernels", {}),
              status(503), status(502), status(500)]
    with ScriptedServer(script) as server:
        session, reason, events, _ = drive(server, tmp_path, timeout=0.5)
        assert server.leftover() == []
    assert reason.startswith("LLM unavailable: server_error")
    assert session.errors["llm_rate_limit"] == 1 and session.errors["llm_timeout"] == 1
    assert session.errors["llm_server_error"] == 3


def test_fatal_status_stops_at_once(tmp_path):
    with ScriptedServer([status(401)]) as server:
        session, reason, _, _ = drive(server, tmp_path)
    assert reason.startswith("LLM unavailable: HTTP 401")
    assert session.errors["llm_fatal"] == 1


def test_budget_spent_then_the_model_is_told_to_finish(tmp_path):
    script = [call("evaluate_row", {"kernel": K, "row": DEFAULT}),
              call("evaluate_row", {"kernel": K, "row": FAST}),
              call("finish", {"summary": "done"})]
    with ScriptedServer(script) as server:
        session, reason, _, _ = drive(server, tmp_path, budget=Budget(evaluations=1))
        assert server.leftover() == []
    assert reason == "finished by the model"
    assert session.errors["budget_exhausted"] == 1
    assert "budget is spent" in server.requests[1]["messages"][-1]["content"]


def test_stalled_model_is_stopped(tmp_path):
    with ScriptedServer([text("hmm")] * 3) as server:
        session, reason, _, _ = drive(server, tmp_path, max_idle=3)
        assert server.leftover() == []
    assert "no progress in 3 turns" in reason


def test_long_context_is_compacted(tmp_path):
    steps = [call("read_ir", {"kernel": K, "stage": "tile"})] * 6 + [call("finish", {"summary": "s"})]
    with ScriptedServer(steps) as server:
        session, reason, events, _ = drive(server, tmp_path, context_tokens=450, keep_recent=4)
        assert server.leftover() == []
    assert reason == "finished by the model"
    assert any(isinstance(e, NoteEvent) and "compacted" in e.text for e in events)
    last = server.requests[-1]["messages"]
    assert last[2]["content"].startswith("Summary of earlier turns")
    assert last[3]["role"] != "tool"


def test_turn_and_token_limits(tmp_path):
    with ScriptedServer([call("list_kernels", {})] * 2) as server:
        _, reason, _, _ = drive(server, tmp_path, budget=Budget(evaluations=5, max_turns=2))
        assert server.leftover() == []
    assert reason == "turn limit reached (2)"
    with ScriptedServer([call("list_kernels", {})] * 2) as server:
        _, reason, _, _ = drive(server, tmp_path / "t", budget=Budget(evaluations=5, max_tokens=250))
        assert server.leftover() == []
    assert reason.startswith("token limit reached")


@pytest.mark.parametrize("name", ["describe_workload", "evaluate_row", "history", "finish"])
def test_tool_schemas_are_strict(name):
    from agent.tools import openai_tools

    fn = next(t["function"] for t in openai_tools() if t["function"]["name"] == name)
    params = fn["parameters"]
    assert params["additionalProperties"] is False
    assert params["required"] == list(params["properties"])
    assert fn["description"] and "title" not in json.dumps(params)
