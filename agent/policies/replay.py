"""Replay: re-drive the LLM policy from the responses a trace recorded (a cassette), no LLM.

`CassetteChat(responses, then=live)` serves the recorded responses first and then a live
model: that is how `--resume` continues an interrupted LLM run.
"""

from __future__ import annotations

from collections import deque

from agent.models import LlmResponseEvent
from agent.policies.llm import CassetteExhausted, LlmPolicy


class CassetteChat:
    """A chat that answers each request with the next recorded response."""

    def __init__(self, responses: list[LlmResponseEvent], then=None):
        self.queue = deque(responses)
        self.then = then
        self.served = 0

    @property
    def left(self) -> int:
        return len(self.queue)

    def complete(self, messages: list[dict], tools: list[dict], turn: int) -> LlmResponseEvent:
        if self.queue:
            self.served += 1
            return self.queue.popleft().model_copy(
                update={"turn": turn, "time": "", "elapsed": 0.0, "replayed": True})
        if self.then is not None:
            return self.then.complete(messages, tools, turn)
        raise CassetteExhausted(f"all {self.served} recorded responses were served")


class ReplayPolicy(LlmPolicy):
    name = "replay"

    def __init__(self, responses: list[LlmResponseEvent], **kw):
        super().__init__(CassetteChat(responses), **kw)
