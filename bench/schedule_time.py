"""Time the schedule half of the compiler on RMSNorm (32 x 2048, sm_90a), per row.

    .venv/bin/python bench/schedule_time.py [--rows 50]

Wall-clock on this machine's CPU (time.perf_counter), medians over sampled legal rows:
legality check (Space.check), lower + emit (apply row -> Kernel IR -> CUDA text),
NVRTC compile to a cubin (cache bypassed), and the full enumeration of the space.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from emmy.cuda.emit import emit_program  # noqa: E402
from emmy.cuda.nvrtc import compile_cuda  # noqa: E402
from emmy.frontend.workload import load_file  # noqa: E402
from emmy.kernel_ir.lower import lower_applied  # noqa: E402
from emmy.pipeline import compile_to  # noqa: E402
from emmy.schedule.facts import facts  # noqa: E402
from emmy.schedule.space import Space  # noqa: E402
from emmy.schedule.targets import get_target  # noqa: E402
from emmy.tile_ir.apply import apply_row  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def ms(seconds: list[float]) -> str:
    return f"{statistics.median(seconds) * 1e3:8.3f} ms (median of {len(seconds)})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=50)
    args = ap.parse_args()
    target = get_target("sm_90a")
    kernel = compile_to(load_file(ROOT / "examples" / "rmsnorm.py"), "tile")["tile"].program.kernels[0]

    t0 = time.perf_counter()
    facts.cache_clear()
    space = Space(kernel, target)
    count = sum(1 for _ in space.rows())
    enumerate_s = time.perf_counter() - t0
    rows = space.sample(args.rows, seed=1)

    check, emit, nvrtc = [], [], []
    for row in rows:
        t0 = time.perf_counter()
        assert not space.check(row)
        check.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        source = emit_program(lower_applied(kernel.name, apply_row(kernel, row, target)))
        emit.append(time.perf_counter() - t0)
        result = compile_cuda(source, target, use_cache=False)
        assert result.ok, result.log
        nvrtc.append(result.seconds)

    print(f"kernel {kernel.name}: {count} legal rows on {target.name}")
    print(f"full enumeration          {enumerate_s * 1e3:8.1f} ms")
    print(f"legality check per row    {ms(check)}")
    print(f"lower + emit per row      {ms(emit)}")
    print(f"NVRTC compile per row     {ms(nvrtc)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
