"""What one `bench/device_check.sh` run found, as markdown for BENCHMARKS.md and the session's
note: the GPU, each step's exit status and time, the GPU tests per file (counts, failures, the
template speed tests' TFLOP/s against torch), the `emmy run --bench` rows, and the sections
the suites appended to the BENCHMARKS.md the run packed (those this checkout's lacks).

    python bench/device_summary.py device.tgz          # or the folder it was unpacked into

Every time in it was measured on the GPU by the run (CUDA events); nothing is modeled.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
import tempfile
from pathlib import Path

_COUNTS = re.compile(r"^=*\s*(\d+ (passed|failed|skipped|error|deselected).*?)\s*=*$")


def summarize(folder: Path, local: Path = Path(__file__).resolve().parents[1] / "BENCHMARKS.md"
              ) -> str:
    """The markdown summary of an unpacked device_check run; the suites' sections are those of
    the packed BENCHMARKS.md that `local` does not have."""
    out = ["## device_check run", ""]
    gpu = folder / "gpu.txt"
    if gpu.exists():
        out += ["GPU (nvidia-smi): " + " / ".join(gpu.read_text().split("\n")[1:2]), ""]
    steps = folder / "steps.tsv"
    if steps.exists():
        out += ["| step | exit status | seconds |", "|---|---|---|"]
        for line in steps.read_text().splitlines():
            name, rc, seconds = line.split("\t")
            out.append(f"| {name} | {rc}{' (stopped at its limit)' if rc in ('124', '137') else ''}"
                       f" | {seconds} |")
        out.append("")
    tests = folder / "gpu_tests.log"
    if tests.exists():
        out += _gpu_tests(tests.read_text())
    for bench in sorted(folder.glob("*_bench.json")):
        out += _bench(bench.stem, json.loads(bench.read_text()))
    packed = folder / "BENCHMARKS.md"
    if packed.exists():
        out += _new_sections(packed.read_text(), local.read_text() if local.exists() else "")
    return "\n".join(out).rstrip() + "\n"


def _gpu_tests(log: str) -> list[str]:
    """Per test file: its pytest counts; then every failure and every speed line."""
    out = ["GPU tests (`pytest -m gpu`, one process per file):", ""]
    current = None
    for line in log.splitlines():
        if line.startswith("-- "):
            current = line[3:].strip()
        elif (m := _COUNTS.match(line.strip())) and current:
            out.append(f"- {current}: {m.group(1)}")
            current = None
    if current:
        out.append(f"- {current}: no summary (the step was stopped here)")
    failures = [line for line in log.splitlines() if line.startswith(("FAILED", "ERROR"))]
    speeds = [line.strip() for line in log.splitlines() if "TFLOP/s" in line]
    if failures:
        out += ["", "Failures:", "", *(f"- `{line}`" for line in failures)]
    if speeds:
        out += ["", "Template speed tests (CUDA events, mean of back-to-back launches):", "",
                *(f"- {line}" for line in speeds)]
    return out + [""]


def _bench(name: str, report: dict) -> list[str]:
    """An `emmy run --bench` report: verdict, per kernel row and time, speedups."""
    out = [f"`emmy run --bench` ({name}): verdict {report.get('verdict')}, on {report.get('device')}"]
    for k in report.get("kernels", []):
        t = k.get("timing")
        time = f"{t['median_us']:.2f} µs {t['method']}" if t else "no time (check failed)"
        out.append(f"- {k['name']}: {time}, `{k['row']}`")
    for base, speedup in report.get("speedups", {}).items():
        out.append(f"- speedup vs {base}: {speedup:.2f}×")
    for reason in report.get("reasons", []):
        out.append(f"- {reason}")
    return out + [""]


def _new_sections(packed: str, local: str) -> list[str]:
    """The `## ...` sections of the packed BENCHMARKS.md (the suites append one per run) that
    are not in the local one."""
    sections = re.split(r"(?m)^(?=## )", packed)
    return [sec.rstrip() + "\n" for sec in sections
            if sec.startswith("## ") and sec.splitlines()[0] not in local]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="device.tgz, or the folder it was unpacked into")
    args = ap.parse_args()
    if not args.run.exists():
        print(f"device_summary: error: {args.run} does not exist", file=sys.stderr)
        return 2
    if args.run.is_dir():
        print(summarize(args.run), end="")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        try:
            with tarfile.open(args.run) as tar:
                tar.extractall(tmp, filter="data")
        except tarfile.TarError as e:
            print(f"device_summary: error: {args.run} is not a device_check archive ({e})",
                  file=sys.stderr)
            return 2
        print(summarize(Path(tmp)), end="")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
