"""bench/ptxas_sweep.py: the rows whose code spills or draws a ptxas performance note."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from emmy.frontend.workload import load_file

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from ptxas_sweep import flagged_rows  # noqa: E402


def test_spilling_rows_are_flagged_and_clean_ones_are_not():
    w = load_file(ROOT / "examples" / "attention_half.py", (("head_dim", 128),))
    found, counts = flagged_rows(w, where="TILE=flash:128x64")
    assert counts["k0_attention_half"] >= 2
    rows = {row: spill for _, row, spill, _ in found}
    assert rows["WORK=warps:4 TILE=flash:128x64 REDUCE=serial STAGE=async:2"] > 0   # O, S and P: over 255
    found, counts = flagged_rows(w, where="TILE=wgmma:128x128", limit=4)
    assert counts["k0_attention_half"] == 4 and found == []


@pytest.mark.parametrize("args, message", [
    (["nosuch.py"], "no such workload file"),
    (["examples/rmsnorm.py", "--set", "nope=3"], "no module-level constant `nope`"),
    (["examples/rmsnorm.py", "--target", "sm_70"], "unknown target `sm_70`"),
    (["examples/rmsnorm.py", "--where", "TILE=wgmma"], "no legal row of examples/rmsnorm.py"),
    (["examples/rmsnorm.py", "--limit", "0"], "--limit 0"),
])
def test_bad_input_is_a_message_and_exit_code_2(args, message):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "ptxas_sweep.py"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
