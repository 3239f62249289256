"""The random policy: rows drawn uniformly from each kernel's legal rows (a baseline)."""

from __future__ import annotations

import math

from agent.allocate import allocate
from agent.api import Session


class RandomPolicy:
    name = "random"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def run(self, session: Session) -> str:
        kernels = list(session.kernel_infos.values())
        shares = allocate(session.budget.evaluations,
                          {k.name: math.log2(k.count + 1) for k in kernels})
        for k in kernels:
            for row in session.ev.sample_rows(k.name, shares[k.name], self.seed):
                stop = session.budget.exhausted()
                if stop:
                    return stop
                session.invoke("evaluate_row", "random", kernel=k.name, row=row)
                session.budget.used_turns += 1
        return "random: every sampled row evaluated"
