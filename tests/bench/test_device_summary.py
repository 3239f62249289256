"""bench/device_summary.py: a device_check archive (synthetic here) as markdown."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from device_summary import summarize  # noqa: E402

LOG = """-- tests/bench/test_gpu.py
...
3 passed, 3 deselected in 2.1s
-- tests/cuda/test_sm90.py
..F.

128x256x64_s4 TMA: 702 TFLOP/s (0.196 ms); torch.matmul 771 TFLOP/s (0.178 ms); regs
FAILED tests/cuda/test_sm90.py::test_gpu_cluster_gemm_matches_numpy[c2x1_k_major] - assert
=========== 1 failed, 40 passed, 120 deselected in 30.2s ===========
-- tests/cuda/test_attention_sm90.py
..
"""


def run_folder(tmp: Path) -> Path:
    tmp.mkdir()
    (tmp / "gpu.txt").write_text("name, driver_version\nNVIDIA H200, 580.159.04\n")
    (tmp / "steps.tsv").write_text("gpu_tests\t124\t210\ntma_bench\t0\t41\n")
    (tmp / "gpu_tests.log").write_text(LOG)
    (tmp / "tma_bench.json").write_text(json.dumps({
        "verdict": "ok", "device": "gpu", "reasons": [], "speedups": {"cuBLAS": 0.91},
        "kernels": [{"name": "k0_matmul_half", "row": "WORK=warps:2x4 TILE=wgmma:128x256x64",
                     "timing": {"median_us": 190.5, "method": "measured"}}]}))
    (tmp / "BENCHMARKS.md").write_text("# Benchmarks\n\n## 2026-11-30 01:25:22 UTC: suite `core` "
                                       "on NVIDIA H200\n\nold\n\n## 2030-01-01 00:00:00 UTC: "
                                       "suite `matmul` on NVIDIA H200\n\n| new table |\n")
    return tmp


def test_the_summary_names_what_the_run_found(tmp_path):
    local = tmp_path / "local.md"
    local.write_text("## 2026-11-30 01:25:22 UTC: suite `core` on NVIDIA H200\n")
    text = summarize(run_folder(tmp_path / "run"), local)
    assert "NVIDIA H200, 580.159.04" in text
    assert "| gpu_tests | 124 (stopped at its limit) | 210 |" in text
    assert "- tests/bench/test_gpu.py: 3 passed, 3 deselected in 2.1s" in text
    assert "- tests/cuda/test_sm90.py: 1 failed, 40 passed, 120 deselected in 30.2s" in text
    assert "- tests/cuda/test_attention_sm90.py: no summary (the step was stopped here)" in text
    assert "FAILED tests/cuda/test_sm90.py::test_gpu_cluster_gemm_matches_numpy" in text
    assert "- 128x256x64_s4 TMA: 702 TFLOP/s" in text
    assert "k0_matmul_half: 190.50 µs measured" in text and "speedup vs cuBLAS: 0.91×" in text
    assert "suite `matmul`" in text and "| new table |" in text
    assert "suite `core`" not in text                 # already in the local BENCHMARKS.md


def test_the_command_reads_an_archive_and_refuses_a_wrong_path(tmp_path):
    folder = run_folder(tmp_path / "run")
    archive = tmp_path / "device.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        for f in folder.iterdir():
            tar.add(f, arcname=f"./{f.name}")
    script = ROOT / "bench" / "device_summary.py"
    ok = subprocess.run([sys.executable, str(script), str(archive)], capture_output=True,
                        text=True)
    assert ok.returncode == 0, ok.stderr
    assert "702 TFLOP/s" in ok.stdout
    for bad in (tmp_path / "missing.tgz", folder / "gpu.txt"):
        r = subprocess.run([sys.executable, str(script), str(bad)], capture_output=True,
                           text=True)
        assert r.returncode == 2 and "device_summary: error:" in r.stderr, r
        assert "Traceback" not in r.stderr
