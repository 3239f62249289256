"""Chat completions against any OpenAI-compatible server, with bounded retries and backoff.

Retried: timeouts, dropped connections, 429 and 5xx (each failure is reported as an
LlmErrorEvent). Anything else (401, 404, a bad request) ends the run: retrying cannot fix it.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable, Protocol

from agent.models import ChatToolCall, LlmErrorEvent, LlmResponseEvent


class LlmUnavailable(Exception):
    """The server refused for good, or kept failing past the retries."""


class ContextTooLong(Exception):
    """The server says the conversation no longer fits its context window."""


class Chat(Protocol):
    def complete(self, messages: list[dict], tools: list[dict], turn: int) -> LlmResponseEvent: ...


class OpenAIChat:
    """One model on one server; `on_error` receives every failed attempt."""

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 timeout: float = 120.0, retries: int = 4, backoff: float = 1.0,
                 max_backoff: float = 30.0, on_error: Callable[[LlmErrorEvent], None] | None = None):
        from openai import OpenAI

        self.model = model
        self.client = OpenAI(base_url=base_url, api_key=api_key or "none", timeout=timeout,
                             max_retries=0)
        self.retries, self.backoff, self.max_backoff = retries, backoff, max_backoff
        self.on_error = on_error or (lambda e: None)

    def complete(self, messages: list[dict], tools: list[dict], turn: int) -> LlmResponseEvent:
        import openai

        for attempt in range(1, self.retries + 2):
            t0 = time.monotonic()
            status, wait = None, None
            try:
                reply = self.client.chat.completions.create(
                    model=self.model, messages=messages, tools=tools, tool_choice="auto")
                return to_event(reply, turn, time.monotonic() - t0)
            except openai.APITimeoutError as e:
                kind, message = "timeout", str(e)
            except openai.APIConnectionError as e:
                kind, message = "connection", str(e)
            except openai.RateLimitError as e:
                kind, message, status = "rate_limit", _message(e), 429
                wait = _retry_after(e)
            except openai.InternalServerError as e:
                kind, message, status = "server_error", _message(e), e.status_code
            except openai.APIStatusError as e:
                message = _message(e)
                if e.status_code == 400 and "context" in message.lower():
                    self.on_error(LlmErrorEvent(turn=turn, kind="context_length", status=400,
                                                message=message[:1000], attempt=attempt))
                    raise ContextTooLong(message) from None
                self.on_error(LlmErrorEvent(turn=turn, kind="fatal", status=e.status_code,
                                            message=message[:1000], attempt=attempt))
                raise LlmUnavailable(f"HTTP {e.status_code}: {message[:300]}") from None
            last = attempt > self.retries
            delay = None if last else min(self.max_backoff,
                                          wait if wait is not None else self.backoff * 2 ** (attempt - 1))
            self.on_error(LlmErrorEvent(turn=turn, kind=kind, status=status,
                                        message=message[:1000], attempt=attempt, retry_in_s=delay))
            if last:
                raise LlmUnavailable(f"{kind} ({message[:200]}) after {attempt} attempts")
            time.sleep(delay)
        raise AssertionError("unreachable")


def _message(e) -> str:
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
    return str(e)


def _retry_after(e) -> float | None:
    try:
        return float(e.response.headers.get("retry-after"))
    except (AttributeError, TypeError, ValueError):
        return None


def to_event(reply: Any, turn: int, latency: float) -> LlmResponseEvent:
    """A chat completion as a trace event (tool-call arguments parsed when they are JSON)."""
    choice = reply.choices[0] if getattr(reply, "choices", None) else None
    msg = choice.message if choice else None
    calls = []
    for tc in (getattr(msg, "tool_calls", None) or []):
        fn = tc.function
        calls.append(tool_call(tc.id, fn.name, fn.arguments))
    usage = getattr(reply, "usage", None)
    return LlmResponseEvent(
        turn=turn, content=getattr(msg, "content", None), refusal=getattr(msg, "refusal", None),
        tool_calls=calls, finish_reason=getattr(choice, "finish_reason", None),
        prompt_tokens=getattr(usage, "prompt_tokens", 0) or 0,
        completion_tokens=getattr(usage, "completion_tokens", 0) or 0,
        latency_s=round(latency, 4))


def tool_call(call_id: str, name: str, arguments: str | None) -> ChatToolCall:
    try:
        parsed = json.loads(arguments) if arguments and arguments.strip() else {}
    except json.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict):
        return ChatToolCall(id=call_id, name=name, arguments=parsed)
    return ChatToolCall(id=call_id, name=name, raw_arguments=arguments)


def arguments_text(call: ChatToolCall) -> str:
    """The call's arguments as the model wrote them (re-serialized when they were JSON)."""
    return call.raw_arguments if call.arguments is None else json.dumps(call.arguments)
