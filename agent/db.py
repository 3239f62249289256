"""The schedule database: the best row per (kernel identity, target), with its evidence.

One JSON file (default ~/.cache/emmy/schedules.json, or $EMMY_CACHE_DIR/schedules.json),
rewritten atomically: a temporary file in the same folder renamed over the old one.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from pathlib import Path

from pydantic import ValidationError

from agent.evaluator import BadInput
from emmy.schedule.db import db_key, default_db_path
from agent.models import Db, DbEntry


def default_path() -> Path:
    return default_db_path()


def key(identity: str, target: str) -> str:
    return db_key(identity, target)


def better(new: DbEntry, old: DbEntry | None) -> bool:
    """A measured time beats a modeled one; within one method, the faster wins."""
    if old is None:
        return True
    if new.method != old.method:
        return new.method == "measured"
    return new.median_us < old.median_us


class ScheduleDb:
    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else default_path()

    def load(self) -> Db:
        if not self.path.exists():
            return Db()
        try:
            return Db.model_validate_json(self.path.read_text())
        except (ValidationError, ValueError) as e:
            raise BadInput(f"schedule database {self.path} is unreadable: {e}") from None

    def lookup(self, identity: str, target: str) -> DbEntry | None:
        return self.load().entries.get(key(identity, target))

    def offer(self, entries: list[DbEntry]) -> list[DbEntry]:
        """Keep each entry that beats what the database holds; return the ones kept."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)   # two runs finishing together both count
            db = self.load()
            kept = [e for e in entries if better(e, db.entries.get(key(e.identity, e.target)))]
            for e in kept:
                db.entries[key(e.identity, e.target)] = e
            if kept:
                self._write(db)
        return kept

    def _write(self, db: Db) -> None:
        fd, tmp = tempfile.mkstemp(prefix=".schedules-", suffix=".json", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(db.model_dump(mode="json"), f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
