"""The built-in search (no LLM): rank rows with the cost model, evaluate the most promising,
then move around the best row one decision at a time until nothing improves.

Kernels share the evaluation budget by expected gain; what one kernel leaves unused (it
converged) passes to the next.
"""

from __future__ import annotations

import time

from agent.allocate import allocate, expected_gains
from agent.api import Session
from agent.models import EvaluationResult, NoteEvent


class SearchPolicy:
    name = "search"

    def __init__(self, seed: int = 0, pool: int = 128, top: int = 8, rank_seconds: float = 60.0):
        self.seed = seed
        self.top = top                    # best-ranked rows evaluated before the local moves
        self.pool = pool                  # rows ranked by the cost model per kernel, at most
        self.rank_seconds = rank_seconds  # time for ranking per kernel, at most
        self._estimates: dict[tuple[str, str], float | None] = {}
        self._no_model = False            # the cost model gave no estimate: stop asking

    def run(self, session: Session) -> str:
        kernels = list(session.kernel_infos.values())
        if len(kernels) == 1:
            shares = {kernels[0].name: session.budget.evaluations}
        else:
            shares = allocate(session.budget.evaluations, expected_gains(session.ev, kernels))
            session.emit(NoteEvent(text="search: budget by expected gain: " + ", ".join(
                f"{k} {n}" for k, n in shares.items())))
        carry = 0
        for name in sorted(shares, key=lambda k: -shares[k]):
            share = shares[name] + carry
            used = self._search_kernel(session, name, share)
            carry = share - used
            stop = session.budget.exhausted()
            if stop:
                return stop
        return "search: no neighbour of the best rows improves"

    def _search_kernel(self, session: Session, kernel: str, share: int) -> int:
        """Spend at most `share` evaluations on one kernel; return how many it used. A row
        whose program was evaluated before (the default row, after another kernel's default)
        spends none."""
        tried: dict[str, EvaluationResult] = {}
        spent = 0

        def evaluate(row: str) -> EvaluationResult | None:
            nonlocal spent
            if row in tried or spent >= share or session.budget.exhausted():
                return tried.get(row)
            result = session.invoke("evaluate_row", "search", kernel=kernel, row=row)
            session.budget.used_turns += 1
            if isinstance(result, EvaluationResult) and result.verdict != "illegal":
                tried[row] = result
                spent += result.same_program_as is None   # cached: paid when first made (--resume)
                return result
            return None

        if share <= 0:
            return 0
        info = session.kernel_infos[kernel]
        evaluate(info.default_row)
        if kernel in session.recorded:        # the schedule database's best row so far
            evaluate(session.recorded[kernel])
        ranked = self._rank(session, kernel, share)
        for row in ranked[: max(1, min(share // 2, self.top))]:
            evaluate(row)
        center = session.best_entry(kernel).row
        while center and spent < share and not session.budget.exhausted():
            before = session.best_entry(kernel)
            for row in self._neighbours(session, kernel, center):
                if row in tried:
                    continue
                evaluate(row)
                now = session.best_entry(kernel)
                if now.row != before.row:
                    break
                if spent >= share or session.budget.exhausted():
                    break
            after = session.best_entry(kernel).row
            if after == center:
                break   # every neighbour tried (or the share spent) without improvement
            center = after
        return spent

    def _rank(self, session: Session, kernel: str, share: int) -> list[str]:
        """Rows by the cost model's estimate, fastest first; sample order when it has none."""
        ev = session.ev
        info = session.kernel_infos[kernel]
        size = min(self.pool, max(32, 8 * share))
        rows = ev.all_rows(kernel) if info.count <= size else ev.sample_rows(kernel, size, self.seed)
        # a product's PLACE=cut is one row of thousands (its other decisions unused): each
        # PLACE value the sample missed is ranked too
        if "PLACE" in info.keys:
            for value in ("fuse", "cut"):
                if not any(f"PLACE={value}" in r for r in rows) and \
                        (first := ev.first_row(kernel, {"PLACE": value})) is not None:
                    rows.append(first)
        seconds = self.rank_seconds
        if session.budget.time_limit is not None:   # keep half the time left for evaluations
            seconds = min(seconds, (session.budget.time_limit - session.budget.elapsed) / 2)
        deadline = time.monotonic() + seconds
        scored: list[tuple[float, int, str]] = []
        for i, row in enumerate(rows):
            if time.monotonic() > deadline:
                break
            est = self._estimate(session, kernel, row)
            if est is None:
                return [r for r in rows if r != info.default_row]
            scored.append((est, i, row))
        order = [r for _, _, r in sorted(scored)] + rows[len(scored):]
        # The ranked sample can miss the best rows; walk the default and the rows about to be
        # evaluated downhill on the model alone (no evaluations spent), and try where they end.
        starts = [info.default_row] + order[: max(1, min(share // 2, self.top))]
        ends = []
        for row in starts:
            end = self._descend(session, kernel, row, deadline)
            if end not in ends and end != info.default_row:
                ends.append(end)
        order = ends + [r for r in order if r not in ends]
        return [r for r in order if r != info.default_row]

    def _descend(self, session: Session, kernel: str, row: str, deadline: float) -> str:
        """Follow the model's best single-decision change while it improves the estimate."""
        while time.monotonic() < deadline:
            neighbours = self._neighbours(session, kernel, row)
            if not neighbours:
                break
            best, here = self._estimate(session, kernel, neighbours[0]), self._estimate(session, kernel, row)
            if best is None or here is None or best >= here:
                break
            row = neighbours[0]
        return row

    def _neighbours(self, session: Session, kernel: str, center: str) -> list[str]:
        """Legal rows that change one decision of `center`, by estimate when there is one."""
        from emmy.schedule.row import parse

        row = parse(center)
        out = []
        for key, options in session.ev.decision_points(kernel):
            for value in options:
                if value == row.get(key):
                    continue
                text = str(row.replace(key, value))
                if not session.ev.check(kernel, text):
                    out.append(text)
        estimates = [self._estimate(session, kernel, r) for r in out]
        if all(e is not None for e in estimates):
            out = [r for _, r in sorted(zip(estimates, out), key=lambda p: p[0])]
        return out

    def _estimate(self, session: Session, kernel: str, row: str) -> float | None:
        key = (kernel, row)
        if self._no_model:
            return None
        if key not in self._estimates:
            try:
                self._estimates[key] = session.ev.estimate_us(kernel, row)
            except Exception:
                self._estimates[key] = None
            self._no_model = self._estimates[key] is None
        return self._estimates[key]
