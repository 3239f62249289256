"""Compile every legal row of a workload's kernels (NVRTC, no GPU) and list the rows whose code
ptxas reports as slow: register spills, and its "potential performance loss" notes (C75xx:
wgmmas serialized, setmaxnreg ignored, ...).

    .venv/bin/python bench/ptxas_sweep.py examples/attention_half.py --set head_dim=128 \
        [--where TEXT] [--target sm_90a] [--limit N]

--where keeps the rows whose text contains TEXT (e.g. "TILE=wgmma"); --limit stops after N
rows per kernel (a matrix product has thousands). Prints one line per flagged row and a count
per kernel; exits 0 (it reports, it does not judge: spills at small tiles can be harmless).
The wgmma attention rows are held to none by tests/cuda/test_attention_sm90.py.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from emmy.cuda.nvrtc import compile_cuda  # noqa: E402
from emmy.errors import UserError  # noqa: E402
from emmy.frontend.workload import load_file, parse_sets  # noqa: E402
from emmy.pipeline import Options, compile_to  # noqa: E402
from emmy.schedule.space import Space  # noqa: E402
from emmy.schedule.targets import get_target  # noqa: E402
from emmy.tile_ir.lift import lift_program  # noqa: E402


def flagged_rows(workload, target: str = "sm_90a", where: str = "", limit: int | None = None):
    """(kernel, row, spill bytes, ptxas notes) for each row that spills or draws a note, and
    the number of rows compiled per kernel."""
    t = get_target(target)
    kernels = lift_program(compile_to(workload, "loop", Options(target=target))["loop"]).kernels
    found, counts = [], Counter()
    for k in kernels:
        rows = [r for r in Space(k, t).all_rows if where in str(r)][:limit]
        for row in rows:
            program = compile_to(workload, "cuda", Options(target=target, rows={k.name: str(row)},
                                                           db=None))["cuda"]
            for unit in (u for u in program.units if u.kernel == k.name):
                result = compile_cuda(unit.source, t)
                if not result.ok:
                    found.append((k.name, str(row), None, ("compile error",)))
                    continue
                for launch in unit.launches:
                    report = result.report_of(launch.function, launch.shared_bytes)
                    spill, notes = report["spill_bytes"], tuple(report["ptxas_warnings"])
                    if spill or notes:
                        found.append((k.name, str(row), spill, notes))
            counts[k.name] += 1
    return found, counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--where", default="", metavar="TEXT")
    ap.add_argument("--target", default="sm_90a")
    ap.add_argument("--limit", type=int, default=None, metavar="N")
    args = ap.parse_args()
    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit {args.limit}: give at least 1 row per kernel")
    workload = load_file(args.file, parse_sets(args.sets))
    found, counts = flagged_rows(workload, args.target, args.where, args.limit)
    if not counts:
        raise UserError(f"no legal row of {args.file} contains {args.where!r}"
                        if args.where else f"{args.file} has no kernel with legal rows")
    for kernel, row, spill, notes in found:
        what = [f"{spill} B spilled"] if spill else []
        print(f"{kernel}: {row}  {'; '.join(what + list(notes))}")
    for kernel, n in counts.items():
        flagged = len({f[1] for f in found if f[0] == kernel})
        print(f"{kernel}: {n} rows compiled, {flagged} flagged")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as e:           # a wrong file, --set, --target or --where: no traceback
        print(f"ptxas_sweep: error: {e}", file=sys.stderr)
        sys.exit(2)
