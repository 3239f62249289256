"""Legal => correct sweep: sampled legal rows of every kernel of every example, compiled with
NVRTC (sm_90a and sm_80) and checked on the CPU emulator against PyTorch.

    .venv/bin/python bench/legal_correct.py [--rows 20] [--set NAME=VALUE ...] [--tile PREFIX]
        [--stage TEXT] [--reduce PREFIX] [examples/*.py]

Prints one line per example (rows tried, failures, seconds) and the totals.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from emmy.errors import UserError  # noqa: E402
from emmy.frontend.workload import load_file, parse_sets  # noqa: E402
from emmy.verify import verify_rows  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--rows", type=int, default=20, help="legal rows sampled per kernel")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tile", metavar="PREFIX", default="",
                    help="sample only rows whose TILE starts with PREFIX (e.g. wgmma)")
    ap.add_argument("--stage", metavar="TEXT", default="",
                    help="sample only rows whose STAGE contains TEXT (e.g. cluster)")
    ap.add_argument("--reduce", metavar="PREFIX", default="",
                    help="sample only rows whose REDUCE starts with PREFIX (e.g. split)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="NAME=VALUE",
                    help="override a module-level constant of every file (e.g. dtype=bfloat16)")
    args = ap.parse_args()
    files = args.files or sorted(Path(__file__).resolve().parents[1].glob("examples/*.py"))
    totals: Counter = Counter()
    for path in files:
        t0 = time.perf_counter()
        where = (lambda r: r.get("TILE", "").startswith(args.tile)
                 and args.stage in r.get("STAGE", "")
                 and r.get("REDUCE", "").startswith(args.reduce)) if any(
            (args.tile, args.stage, args.reduce)) else None
        results = verify_rows(load_file(path, parse_sets(args.sets)), per_kernel=args.rows,
                              seed=args.seed, where=where)
        verdicts = Counter(r.verdict for r in results)
        totals.update(verdicts)
        kernels = len({r.kernel for r in results})
        print(f"{path.stem:<20} kernels {kernels:>2}  rows {len(results):>4}  ok {verdicts['ok']:>4}  "
              f"failed {len(results) - verdicts['ok']:>3}  {time.perf_counter() - t0:6.1f} s", flush=True)
        for r in results:
            if r.verdict != "ok":
                print(f"    {r.kernel}: {r.row}: {r.verdict}: {r.detail[:300]}")
    tried = sum(totals.values())
    print(f"total: {tried} rows, {totals['ok']} correct, {tried - totals['ok']} failed")
    if tried == 0:
        raise UserError("no legal row was sampled"
                        + (f" (no legal row has a TILE starting with {args.tile!r}, a STAGE "
                           f"containing {args.stage!r} and a REDUCE starting with "
                           f"{args.reduce!r})" if any((args.tile, args.stage, args.reduce))
                           else ""))
    return 0 if totals["ok"] == tried else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as e:           # a wrong file or --set: the message, not a traceback
        print(f"legal_correct: error: {e}", file=sys.stderr)
        sys.exit(2)
