"""Suite-wide settings: tests never touch the user's schedule database, and tests marked
`gpu` skip cleanly where emmy's GPU runtime cannot run (no CUDA device, cupy or torch.cuda)."""

import pytest


@pytest.fixture(autouse=True)
def _private_schedule_db(tmp_path, monkeypatch):
    monkeypatch.setenv("EMMY_SCHEDULE_DB", str(tmp_path / "schedules.json"))


def pytest_collection_modifyitems(config, items):
    gpu_items = [i for i in items if "gpu" in i.keywords]
    if not gpu_items:
        return
    from emmy.runtime.gpu import gpu_available

    if not gpu_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU with cupy and torch.cuda; none here")
        for item in gpu_items:
            item.add_marker(skip)
