"""bench/sass_counts.py: SASS instructions per element of the core suite's row kernels."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from emmy.bench.suites import SUITES

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from sass_counts import ROWS, per_element  # noqa: E402


def test_every_core_workload_has_its_row():
    assert {(s.name, s.dtype) for s in SUITES["core"]} == set(ROWS)


def test_bf16_softmax_issues_two_exps_and_few_instructions_an_element():
    from emmy.cuda.sass import cuobjdump

    if cuobjdump() is None:
        pytest.skip("cuobjdump is not installed (pip install nvidia-cuda-cuobjdump)")
    (spec,) = [s for s in SUITES["core"] if (s.name, s.dtype) == ("softmax", "bf16")]
    counts = per_element(spec, ROWS[("softmax", "bf16")])
    assert counts["loops"] == 4         # cp.async fill, max, sum, output
    assert counts["mufu"] == 2          # one ex2 in the sum pass, one in the output pass
    assert counts["instructions"] < 28  # 50.5 with the library exp and a division an element


def test_an_unknown_workload_is_a_message_and_exit_code_2():
    import subprocess

    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "sass_counts.py"), "--only",
                           "nosuch"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "matches none of" in proc.stderr
    assert "Traceback" not in proc.stderr
