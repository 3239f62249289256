"""What a run may spend: evaluations, LLM turns, LLM tokens and wall time."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from agent.models import BudgetState


@dataclass
class Budget:
    evaluations: int = 20
    max_turns: int | None = None
    max_tokens: int | None = None
    time_limit: float | None = None      # seconds
    used_evaluations: int = 0
    used_turns: int = 0
    used_tokens: int = 0
    elapsed_before: float = 0.0          # seconds spent by the run this one resumes
    _start: float = field(default_factory=time.monotonic, repr=False)

    @property
    def elapsed(self) -> float:
        return self.elapsed_before + time.monotonic() - self._start

    @property
    def evaluations_left(self) -> int:
        return max(0, self.evaluations - self.used_evaluations)

    def exhausted(self) -> str | None:
        """Why the run must stop now, or None."""
        if self.used_evaluations >= self.evaluations:
            return f"evaluation budget spent ({self.evaluations})"
        if self.max_turns is not None and self.used_turns >= self.max_turns:
            return f"turn limit reached ({self.max_turns})"
        if self.max_tokens is not None and self.used_tokens >= self.max_tokens:
            return f"token limit reached ({self.used_tokens} >= {self.max_tokens})"
        if self.time_limit is not None and self.elapsed >= self.time_limit:
            return f"time limit reached ({self.time_limit:g} s)"
        return None

    def state(self) -> BudgetState:
        return BudgetState(evaluations_used=self.used_evaluations,
                           evaluations_limit=self.evaluations,
                           turns_used=self.used_turns, turns_limit=self.max_turns,
                           tokens_used=self.used_tokens, tokens_limit=self.max_tokens,
                           seconds_used=round(self.elapsed, 3), seconds_limit=self.time_limit)
