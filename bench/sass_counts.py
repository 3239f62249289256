"""SASS instructions per element of the `core` suite's row kernels (CPU only: NVRTC and
cuobjdump, no GPU), at the best rows BENCHMARKS.md measured for them on an H200.

    .venv/bin/python bench/sass_counts.py [--json counts.json] [--only NAME]

How it counts: every lane loop of the emitted source gets `#pragma unroll 1`, so each loop
body in the SASS is one iteration, V*N elements of a lane's row (TILE=vVxN); the instructions
of the innermost loops (backward branches) are summed over the kernel's passes and divided by
V*N. Map kernels (the elementwise chain) have no loop: all their instructions over V*N. The
counts say what a lane issues per element, not how long it takes; at the H200's issue rate
(132 SMs x 4 schedulers x 32 lanes x 1.98 GHz) a bf16 row kernel moving 4 bytes an element
keeps up with its DRAM bandwidth below about 28 instructions an element.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from emmy.bench.suites import SUITES  # noqa: E402
from emmy.cuda.nvrtc import compile_cuda  # noqa: E402
from emmy.cuda.sass import disassemble, instructions  # noqa: E402
from emmy.pipeline import Options, compile_to  # noqa: E402
from emmy.schedule.targets import get_target  # noqa: E402

# the best row of each core workload in BENCHMARKS.md's H200 run of 2026-11-30
ROWS = {
    ("rmsnorm", "f32"): "WORK=block:512 TILE=v2x2 REDUCE=smem STAGE=smem:async PLACE=fuse",
    ("rmsnorm", "bf16"): "WORK=block:512 TILE=v4x1 REDUCE=shuffle STAGE=smem PLACE=fuse",
    ("layernorm", "f32"): "WORK=block:256 TILE=v2x1 REDUCE=smem STAGE=smem PLACE=fuse",
    ("layernorm", "bf16"): "WORK=block:256 TILE=v4x1 REDUCE=shuffle STAGE=direct PLACE=fuse",
    ("softmax", "f32"): "WORK=block:256 TILE=v2x1 REDUCE=smem STAGE=smem PLACE=fuse",
    ("softmax", "bf16"): "WORK=block:128 TILE=v4x1 REDUCE=shuffle STAGE=smem:async PLACE=fuse",
    ("log_softmax", "f32"): "WORK=block:512 TILE=v2x2 REDUCE=smem STAGE=smem:async PLACE=fuse",
    ("log_softmax", "bf16"): "WORK=block:128 TILE=v4x1 REDUCE=shuffle STAGE=smem:async "
                             "PLACE=fuse",
    ("elementwise_chain", "f32"): "WORK=thread:64 TILE=v4x2",
    ("elementwise_chain", "bf16"): "WORK=thread:512 TILE=v8x2",
}
_ADDRESS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")


def per_element(spec, row: str, target: str = "sm_90a") -> dict:
    """{"instructions": per element, "mufu": special-function ops per element, "loops": n}."""
    program = compile_to(spec.load(), "cuda", Options(target=target, rows={"": row}, db=None))
    (unit,) = program["cuda"].units
    vec, n = map(int, re.search(r"TILE=v(\d+)x(\d+)", row).groups())
    source = re.sub(r"(\n\s*)for \(", r"\1#pragma unroll 1\n  for (", unit.source)
    sass = disassemble(compile_cuda(source, get_target(target)).cubin)
    code = [(int(m[1], 16), m[2], line) for line in sass.splitlines()
            if (m := _ADDRESS.search(line))]
    loops = [(int(m[1], 16), at) for at, text, _ in code
             if (m := re.search(r"BRA (0x[0-9a-f]+)", text)) and int(m[1], 16) < at]
    inner = [lp for lp in loops if not any(o != lp and lp[0] <= o[1] <= lp[1] for o in loops)]
    body = [line for at, _, line in code if any(lo <= at <= hi for lo, hi in inner)]
    ops = instructions("\n".join(body) if inner else sass)
    return {"instructions": len(ops) / (vec * n),
            "mufu": sum(o.startswith("MUFU") for o in ops) / (vec * n), "loops": len(inner)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the counts here too")
    ap.add_argument("--only", default="", help="workloads whose name starts with this")
    args = ap.parse_args()
    names = sorted({spec.name for spec in SUITES["core"]})
    if not any(name.startswith(args.only) for name in names):
        print(f"sass_counts: error: --only {args.only!r} matches none of {', '.join(names)}",
              file=sys.stderr)
        return 2
    out = {}
    for spec in SUITES["core"]:
        if not spec.name.startswith(args.only):
            continue
        row = ROWS[(spec.name, spec.dtype)]
        c = per_element(spec, row)
        out[f"{spec.name} {spec.dtype}"] = {**c, "row": row}
        print(f"{spec.name + ' ' + spec.dtype:24s} {c['instructions']:6.2f} instructions "
              f"({c['mufu']:.2f} MUFU) an element   {row}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
