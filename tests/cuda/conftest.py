"""Fixtures for the CUDA toolchain tests: a fresh compile cache per session, GPU detection."""

from __future__ import annotations

from pathlib import Path

import pytest


def gpu_available() -> bool:
    """True when the CUDA driver loads and sees at least one device."""
    try:
        from cuda.bindings import driver

        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return False
        err, count = driver.cuDeviceGetCount()
        return err == driver.CUresult.CUDA_SUCCESS and count > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if any("gpu" in item.keywords for item in items) and not gpu_available():
        skip = pytest.mark.skip(reason="no CUDA GPU on this machine")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def cache_dir(tmp_path_factory) -> Path:
    """One cache for the whole session: programs built by one test are reused by the next."""
    path = tmp_path_factory.mktemp("emmy-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EMMY_CACHE_DIR", str(path))
        yield path

