"""The LLM policy: a chat model drives the Session through OpenAI tool calls.

The loop survives what models and servers do wrong: malformed arguments and unknown tools
come back as tool results; a text reply or a refusal gets a nudge; server errors are retried by
the chat client; a context that grows too long is compacted into a summary of older turns.
Every such event is counted in the session's errors and written to the trace.
"""

from __future__ import annotations

import json

from agent.api import Session, content
from agent.models import LlmRequestEvent, NoteEvent
from agent.policies.chat import Chat, ContextTooLong, LlmUnavailable, arguments_text
from agent.prompts import system_prompt, task_prompt
from agent.tools import openai_tools

NUDGE = ("Answer with a tool call. Use evaluate_row to try a row, check_row to test legality for "
         "free, and finish(summary) when you are done.")
MALFORMED = ("malformed_json", "unknown_tool", "bad_arguments")   # calls that made no progress
FINISH_NOW = "The evaluation budget is spent. Call finish now with your summary."


class CassetteExhausted(Exception):
    """Replay asked for more responses than the trace recorded."""


class LlmPolicy:
    name = "llm"

    def __init__(self, chat: Chat, *, shares: dict[str, int] | None = None,
                 context_tokens: int = 60000, keep_recent: int = 16, max_idle: int = 4,
                 grace_turns: int = 2):
        self.chat = chat
        self.shares = shares
        self.context_tokens = context_tokens
        self.keep_recent = keep_recent
        self.max_idle = max_idle
        self.grace_turns = grace_turns

    def run(self, session: Session) -> str:
        messages = [{"role": "system", "content": system_prompt(session)},
                    {"role": "user", "content": task_prompt(session, self.shares)}]
        tools = openai_tools()
        sent, reset, idle, grace, turn, last_prompt = 0, True, 0, self.grace_turns, 0, 0
        while True:
            stop = session.budget.exhausted()
            if stop:
                if session.budget.evaluations_left or grace <= 0 or not _only_evaluations(session):
                    return stop
                if grace == self.grace_turns:
                    messages.append({"role": "user", "content": FINISH_NOW})
                grace -= 1
            if self._too_long(messages, last_prompt):
                reset = self._compact(messages, session) or reset
            turn += 1
            session.emit(LlmRequestEvent(turn=turn, reset=reset, n_messages=len(messages),
                                         messages=messages if reset else messages[sent:]))
            sent, reset = len(messages), False
            try:
                reply = self.chat.complete(messages, tools, turn)
            except ContextTooLong:
                session.error("context_length", "the server refused the context as too long")
                if not self._compact(messages, session, keep=max(4, self.keep_recent // 2)):
                    return "the conversation does not fit the model's context"
                reset = True
                continue
            except LlmUnavailable as e:
                return f"LLM unavailable: {e}"
            except CassetteExhausted:
                return "replay: no recorded response left"
            session.emit(reply)
            session.budget.used_turns += 1
            session.budget.used_tokens += reply.prompt_tokens + reply.completion_tokens
            last_prompt = reply.prompt_tokens
            if reply.refusal or not reply.tool_calls:
                kind = "refusal" if reply.refusal else "text_reply"
                session.error(kind, (reply.refusal or reply.content or "(empty reply)")[:500])
                messages.append({"role": "assistant",
                                 "content": reply.refusal or reply.content or ""})
                messages.append({"role": "user", "content": NUDGE})
                idle += 1
            else:
                messages.append({"role": "assistant", "content": reply.content,
                                 "tool_calls": [
                                     {"id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": arguments_text(c)}}
                                     for c in reply.tool_calls]})
                progress = False
                for c in reply.tool_calls:
                    args = c.arguments if c.arguments is not None else c.raw_arguments
                    result, _ = session.call(c.name, args, source="llm", call_id=c.id)
                    messages.append({"role": "tool", "tool_call_id": c.id,
                                     "content": content(result)})
                    progress = progress or getattr(result, "kind", "") not in MALFORMED
                idle = 0 if progress else idle + 1
                if session.summary is not None:
                    return "finished by the model"
            if idle >= self.max_idle:
                session.error("stalled", f"{idle} turns in a row without a well-formed tool call")
                return f"the model made no progress in {idle} turns"

    # --- context ----------------------------------------------------------------------------

    def _too_long(self, messages: list[dict], last_prompt: int) -> bool:
        estimate = sum(len(json.dumps(m)) for m in messages) // 4
        return max(estimate, last_prompt) > self.context_tokens

    def _compact(self, messages: list[dict], session: Session, keep: int | None = None) -> bool:
        """Replace older turns by a summary of the session's state; keep the last few whole."""
        keep = keep or self.keep_recent
        start = max(2, len(messages) - keep)
        while start < len(messages) and messages[start]["role"] == "tool":
            start += 1   # never orphan a tool result from the call that asked for it
        if start <= 2:
            return False
        cut = messages[2:start]
        summary = {"role": "user", "content": _summary(session, len(cut))}
        messages[:] = messages[:2] + [summary] + messages[start:]
        session.emit(NoteEvent(text=f"context compacted: {len(cut)} older messages summarized"))
        return True


def _only_evaluations(session: Session) -> bool:
    """True when the evaluations are the only limit reached (the model may still finish)."""
    b = session.budget
    return not ((b.max_turns is not None and b.used_turns >= b.max_turns)
                or (b.max_tokens is not None and b.used_tokens >= b.max_tokens)
                or (b.time_limit is not None and b.elapsed >= b.time_limit))


def _summary(session: Session, n_cut: int) -> str:
    lines = [f"Summary of earlier turns ({n_cut} messages cut to save context).",
             "Evaluations so far:"]
    for i, r in enumerate(session.results):
        t = f"{r.timing.median_us:.3f} us {r.timing.method}" if r.timing else "no time"
        lines.append(f"  {i}. {r.kernel}: `{r.row}` -> {r.verdict}, {t}")
    for b in session.best().kernels:
        lines.append(f"Best for {b.kernel}: "
                     + (f"`{b.row}` {b.median_us:.3f} us {b.method}" if b.row else b.note))
    if session.errors:
        lines.append("Mistakes so far: " + ", ".join(f"{k} x{n}" for k, n in session.errors.items()))
    lines.append(f"Budget: {session.budget.evaluations_left} evaluations left.")
    return "\n".join(lines)
