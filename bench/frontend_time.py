"""Time the front half of the compiler: exported graph -> Tensor IR -> Loop IR, per example.

    .venv/bin/python bench/frontend_time.py [examples/*.py] [--repeat N]

Times are wall-clock on this machine's CPU (time.perf_counter), the median of N runs of
`lower` + `fuse/normalize`, excluding torch.export itself (reported apart, once).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from emmy.frontend.workload import load_file  # noqa: E402
from emmy.loop_ir.lower import lower as lower_loop  # noqa: E402
from emmy.tensor_ir.lower import lower as lower_tensor  # noqa: E402
from emmy.torch_ir.capture import capture  # noqa: E402


def time_example(path: Path, repeat: int) -> tuple[float, float, float, int]:
    w = load_file(path)
    t0 = time.perf_counter()
    graph = capture(w.model, w.inputs, name=w.name)
    export_s = time.perf_counter() - t0
    tensor_times, loop_times = [], []
    kernels = 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        program = lower_tensor(graph)
        t1 = time.perf_counter()
        lp = lower_loop(program)
        t2 = time.perf_counter()
        tensor_times.append(t1 - t0)
        loop_times.append(t2 - t1)
        kernels = len(lp.kernels)
    return export_s, statistics.median(tensor_times), statistics.median(loop_times), kernels


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    files = args.files or sorted(Path(__file__).resolve().parents[1].glob("examples/*.py"))
    print(f"{'example':<20} {'export ms':>10} {'->tensor ms':>12} {'->loop ms':>10} "
          f"{'graph->loop ms':>15} {'kernels':>8}")
    for path in files:
        export_s, tensor_s, loop_s, kernels = time_example(path, args.repeat)
        print(f"{path.stem:<20} {export_s * 1e3:>10.1f} {tensor_s * 1e3:>12.2f} "
              f"{loop_s * 1e3:>10.2f} {(tensor_s + loop_s) * 1e3:>15.2f} {kernels:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
