"""Read the schedule database: the best known row per (kernel identity, target).

The file is JSON, `{"version": 1, "entries": {"<identity>@<target>": {"row": …, "median_us": …,
"method": …, …}}}`; `emmy-agent` writes it (agent/db.py), the compiler only reads it. Its path is
$EMMY_SCHEDULE_DB, else schedules.json in the cache folder ($EMMY_CACHE_DIR or ~/.cache/emmy).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from emmy.errors import UserError

DB_ENV = "EMMY_SCHEDULE_DB"


def default_db_path() -> Path:
    from emmy.cuda.cache import cache_root

    env = os.environ.get(DB_ENV)
    return Path(env) if env else cache_root() / "schedules.json"


def db_key(identity: str, target: str) -> str:
    return f"{identity}@{target}"


def read_entries(path: str | Path | None = None) -> dict[str, dict]:
    """Every entry by key; an absent file is an empty database."""
    path = Path(path) if path else default_db_path()
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        return dict(data.get("entries", {}))
    except (ValueError, AttributeError) as e:
        raise UserError(f"schedule database {path} is unreadable: {e}") from None


def recorded_row(identity: str, target: str, path: str | Path | None = None) -> dict | None:
    """The record for one kernel identity on one target, or None."""
    return read_entries(path).get(db_key(identity, target))
