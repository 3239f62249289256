"""What a person sees during a run: a live table of evaluations, a budget bar, a final summary."""

from __future__ import annotations

import sys

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from agent.models import (AgentErrorEvent, BestEntry, EvaluationEvent, EvaluationResult,
                          LlmErrorEvent, NoteEvent, SummaryEvent)

LIVE_ROWS = 15
COLOURS = {"ok": "green", "illegal": "yellow", "incorrect": "red", "compile_error": "red",
           "crash": "red", "timeout": "red"}


def time_text(r: EvaluationResult) -> str:
    return f"{r.timing.median_us:.3f} µs {r.timing.method}" if r.timing else "—"


def speedup_text(x: float | None) -> str:
    return f"{x:.2f}×" if x else "—"


class View:
    """A session sink that draws the run; silent when quiet."""

    def __init__(self, budget: int, *, quiet: bool = False, stderr: bool = False):
        self.quiet = quiet
        self.console = Console(file=sys.stderr if stderr else sys.stdout, highlight=False)
        self.rows: list[tuple[int, EvaluationResult, str]] = []
        self.progress = Progress(TextColumn("evaluations"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=self.console)
        self.task = self.progress.add_task("budget", total=budget)
        self.live: Live | None = None

    def say(self, text: str) -> None:
        if not self.quiet:
            self.console.print(text)

    def __enter__(self) -> "View":
        if not self.quiet:
            self.live = Live(self._render(), console=self.console, refresh_per_second=4)
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.update(self._render())
            self.live.__exit__(*exc)
            self.live = None
            if exc and exc[0] is not None and not self.console.is_terminal:
                self.console.line()    # an error message follows the last rendered line

    def start_at(self, used: int) -> None:
        self.progress.update(self.task, completed=used)

    def __call__(self, event) -> None:
        if isinstance(event, EvaluationEvent):
            self.rows.append((event.index, event.result, event.source))
            self.progress.advance(self.task)
        elif isinstance(event, (AgentErrorEvent, LlmErrorEvent, NoteEvent)) and self.live:
            text = (f"[dim]{event.text}[/]" if isinstance(event, NoteEvent) else
                    f"[yellow]{event.type.replace('_', ' ')}: {event.kind}[/] "
                    f"{getattr(event, 'detail', '') or getattr(event, 'message', '')}"[:200])
            self.live.console.print(text)
        if self.live is not None:
            self.live.update(self._render())

    def _render(self) -> Group:
        many = len({r.kernel for _, r, _ in self.rows}) > 1
        table = Table(box=box.SIMPLE_HEAD, expand=False)
        for col in ("#", "verdict", "time", "× default") + (("kernel",) if many else ()):
            table.add_column(col, no_wrap=True)
        table.add_column("row", min_width=20)
        for index, r, _ in self.rows[-LIVE_ROWS:]:
            colour = COLOURS.get(r.verdict, "white")
            best = " ★" if r.new_best else ""
            reused = " [dim](same program)[/]" if r.same_program_as else ""
            table.add_row(str(index), f"[{colour}]{r.verdict}[/]{reused}", time_text(r),
                          speedup_text(r.speedup_vs_default) + best,
                          *((r.kernel,) if many else ()), r.row)
        return Group(table, self.progress)

    def summary(self, event: SummaryEvent, trace: str | None) -> None:
        if self.quiet:
            return
        self.console.print()
        self.console.print("[bold]best row per kernel[/] (times: the whole program with that row)")
        for b in event.best:
            if b.row is None:
                self.console.print(f"  {b.kernel}: [dim]{b.note}[/] ({b.evaluations} evaluations)")
                continue
            vs = "".join(f", {v:.2f}× {k}" for k, v in b.speedup_vs_baselines.items())
            self.console.print(f"  {b.kernel}: {best_time(b)}, {speedup_text(b.speedup_vs_default)} "
                               f"default{vs}, {b.evaluations} evaluations")
            self.console.print(f"    {b.row}", soft_wrap=True)
        used = event.budget
        errors = ", ".join(f"{k} ×{n}" for k, n in event.errors.items()) or "none"
        self.console.print(f"stopped: {event.reason}\nbudget: {used.evaluations_used}/"
                           f"{used.evaluations_limit} evaluations, {used.turns_used} turns, "
                           f"{used.tokens_used} tokens, {used.seconds_used:.1f} s\n"
                           f"errors: {errors}" + (f"\ntrace: {trace}" if trace else ""))


def best_time(b: BestEntry) -> str:
    return f"{b.median_us:.3f} µs {b.method}" if b.median_us is not None else "—"
