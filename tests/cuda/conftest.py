"""Fixtures for the CUDA toolchain tests: a fresh compile cache per session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def cache_dir(tmp_path_factory) -> Path:
    """One cache for the whole session: programs built by one test are reused by the next."""
    path = tmp_path_factory.mktemp("emmy-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EMMY_CACHE_DIR", str(path))
        yield path

