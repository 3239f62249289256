"""The trace file: JSON Lines of versioned events, appended and flushed one at a time.

A run killed mid-way leaves every event written before the kill; a half-written last line is
ignored by the reader and cut off by a writer that appends (`--resume`, `propose --trace`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from agent.evaluator import BadInput
from agent.models import (TRACE_VERSION, EvaluationEvent, EvaluationResult, HeaderEvent,
                          LlmResponseEvent, SummaryEvent, TraceEvent)

_EVENT = TypeAdapter(TraceEvent)
TRACES = Path("traces")


def default_path(workload: str, policy: str, folder: Path = TRACES) -> Path:
    """traces/<UTC time>-<workload>-<policy>.jsonl"""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path, n = folder / f"{stamp}-{workload}-{policy}.jsonl", 1
    while path.exists():
        n += 1
        path = folder / f"{stamp}-{workload}-{policy}-{n}.jsonl"
    return path


class TraceWriter:
    """A sink that appends each event as one line and flushes it."""

    def __init__(self, path: str | Path, *, append: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if append:
            _cut_partial_line(self.path)
        elif self.path.exists() and self.path.stat().st_size:
            raise BadInput(f"trace {self.path} exists; give another --trace or --resume it")
        self._file = open(self.path, "a", encoding="utf-8")

    def __call__(self, event) -> None:
        self._file.write(event.model_dump_json(exclude_defaults=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _cut_partial_line(path: Path) -> None:
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with open(path, "r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)
            f.flush()
            os.fsync(f.fileno())


def read_events(path: str | Path) -> list:
    """Every event of a trace; a half-written last line (a killed run) is skipped."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"no such trace: {path}")
    lines = path.read_text(encoding="utf-8").split("\n")
    events = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            event = _EVENT.validate_json(line)
        except ValidationError as e:
            if i == len(lines):   # no newline after it: the write was cut short
                break
            version = _version_of(line)
            if version is not None and version > TRACE_VERSION:
                raise BadInput(f"{path}:{i}: trace format v{version} is newer than this "
                               f"emmy-agent reads (v{TRACE_VERSION})") from None
            raise BadInput(f"{path}:{i}: not a trace event: {e.errors()[0]['msg']}") from None
        events.append(event)
    if not events or not isinstance(events[0], HeaderEvent):
        raise BadInput(f"{path}: not an emmy-agent trace (the first line is not a run header)")
    return events


def _version_of(line: str) -> int | None:
    import json

    try:
        v = json.loads(line).get("v")
        return v if isinstance(v, int) else None
    except (ValueError, AttributeError):
        return None


@dataclass
class Trace:
    """A read trace, with the views replay, resume and report need."""

    path: Path
    events: list

    @classmethod
    def read(cls, path: str | Path) -> "Trace":
        return cls(Path(path), read_events(path))

    @property
    def header(self) -> HeaderEvent:
        return self.events[0]

    @property
    def evaluations(self) -> list[EvaluationResult]:
        return [e.result for e in self.events if isinstance(e, EvaluationEvent)]

    @property
    def evaluation_events(self) -> list[EvaluationEvent]:
        return [e for e in self.events if isinstance(e, EvaluationEvent)]

    @property
    def llm_responses(self) -> list[LlmResponseEvent]:
        """The model's replies in order, each once (re-served copies after --resume left out)."""
        replies = [e for e in self.events if isinstance(e, LlmResponseEvent)]
        return [e for e in replies if not e.replayed] or replies   # a replay's own trace: all

    @property
    def summary(self) -> SummaryEvent | None:
        return next((e for e in reversed(self.events) if isinstance(e, SummaryEvent)), None)

    @property
    def finished(self) -> bool:
        return self.summary is not None

    @property
    def elapsed(self) -> float:
        return max((e.elapsed for e in self.events), default=0.0)
