"""Every example passes `emmy run --check --engine loop` (the Loop IR reference interpreter)."""

from pathlib import Path

import pytest

from emmy.cli import main

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_loop_engine_matches_eager(path, capsys):
    rc = main(["run", str(path), "--check", "--engine", "loop"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "PASS" in out
