"""Suite-wide settings: tests never read or write the user's schedule database."""

import pytest


@pytest.fixture(autouse=True)
def _private_schedule_db(tmp_path, monkeypatch):
    monkeypatch.setenv("EMMY_SCHEDULE_DB", str(tmp_path / "schedules.json"))
