"""Fixtures for the CUDA toolchain tests: a fresh compile cache per test run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def cache_dir(tmp_path_factory) -> Path:
    """One cache for the whole run: programs built by one test are reused by the next. Under
    pytest-xdist the workers share it (the run's temporary folder is the parent of each
    worker's); the cache's writes are atomic renames, so concurrent writers are safe."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        path = tmp_path_factory.getbasetemp().parent / "emmy-cache"
        path.mkdir(exist_ok=True)
    else:
        path = tmp_path_factory.mktemp("emmy-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EMMY_CACHE_DIR", str(path))
        yield path
