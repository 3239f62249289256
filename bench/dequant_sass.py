"""SASS instructions a K step of an int8 (int4, GPTQ, AWQ) linear layer's product issues (CPU
only: NVRTC and cuobjdump, no GPU): the counts behind emmy/runtime/costmodel/gemm.py's
per-element costs of a computed operand (an int8 weight dequantized as its tiles are filled),
against the same row of a plain f16 product.

    .venv/bin/python bench/dequant_sass.py [--json counts.json]

How it counts: the longest loop of the kernel's SASS (emmy.cuda.sass.longest_loop) is its K
loop, which may hold several K steps (its HMMA / HGMMA count over a step's); its instructions a
K step, less the plain product's, over the weight elements a thread computes a K step (BN x BK
/ threads), are the cost an element. The counts say what a thread issues, not
how long it takes (I2F, int to float, issues at 16 a clock an SM).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from emmy.cuda.nvrtc import compile_cuda  # noqa: E402
from emmy.cuda.sass import disassemble, longest_loop  # noqa: E402
from emmy.errors import UserError  # noqa: E402
from emmy.frontend.workload import load_expr  # noqa: E402
from emmy.pipeline import Options, compile_to  # noqa: E402
from emmy.schedule.targets import get_target  # noqa: E402


def linear(m: int, k: int, n: int, weight: str, dtype: str = "half") -> str:
    """F.linear(x, weight) with x (m, k) and q an int8 (n, k) weight, s a scale per row."""
    return (f"(lambda x, q, s: torch.nn.functional.linear(x, {weight}))(torch.randn({m}, {k})."
            f"{dtype}(), torch.randint(-127, 128, ({n}, {k})).to(torch.int8), "
            f"torch.rand({n}, 1).{dtype}())")


def linear4(m: int, k: int, n: int, dtype: str = "half") -> str:
    """F.linear(x, weight) with int4 weights two to a byte (p, (n, k / 2) bytes, the low nibble
    first), less 8, times a scale per group of 128 along k (s, (n, k / 128, 1))."""
    weight = (f"((torch.stack([p & 15, p >> 4], -1).reshape({n}, {k}).{dtype}() - 8)"
              f".view({n}, {k // 128}, 128) * s).view({n}, {k})")
    return (f"(lambda x, p, s: torch.nn.functional.linear(x, {weight}))(torch.randn({m}, {k})."
            f"{dtype}(), torch.randint(0, 256, ({n}, {k // 2}), dtype=torch.uint8), "
            f"torch.rand({n}, {k // 128}, 1).{dtype}())")


def gptq(m: int, k: int, n: int, group: int = 128) -> str:
    """x @ w with GPTQ's int32 words (q, (k / 8, n): eight weights along k, the low nibble
    first), less zero points packed the same way along n (z, (k / group, n / 8)), times a scale
    per group (s, (k / group, n)). Zero points every 4 k cannot go into the pairs' bias (one a
    vector of 8): those weights are computed one at a time."""
    shifts = "torch.arange(0, 32, 4, dtype=torch.int32)"
    weight = (f"(((q.unsqueeze(1) >> {shifts}.view(1, 8, 1)) & 15).reshape({k // group}, "
              f"{group}, {n}) - ((z.unsqueeze(2) >> {shifts}.view(1, 1, 8)) & 15)"
              f".reshape({k // group}, 1, {n})).half() * s.unsqueeze(1)")
    return (f"(lambda x, q, z, s: x @ ({weight}).reshape({k}, {n}))(torch.randn({m}, {k})"
            f".half(), torch.randint(-2**31, 2**31 - 1, ({k // 8}, {n}), dtype=torch.int32), "
            f"torch.randint(-2**31, 2**31 - 1, ({k // group}, {n // 8}), dtype=torch.int32), "
            f"torch.rand({k // group}, {n}).half())")


def awq(m: int, k: int, n: int, group: int = 128) -> str:
    """x @ w with AWQ's int32 words (q, (k, n / 8): eight weights along n in the interleaved
    order 0, 4, 1, 5, 2, 6, 3, 7, undone by indexing with that list), less zero points packed
    the same way (z, (k / group, n / 8)), times a scale per group (s, (k / group, n))."""
    order = f"[:, torch.arange({n}).view(-1, 8)[:, [0, 4, 1, 5, 2, 6, 3, 7]].view(-1)]"
    shifts = "torch.arange(0, 32, 4)"
    weight = (f"((((q[:, :, None] >> {shifts}) & 15).view({k}, {n}){order} - "
              f"((z[:, :, None] >> {shifts}) & 15).view({k // group}, {n}){order}"
              f".repeat_interleave({group}, dim=0)).half() * s.repeat_interleave({group}, dim=0))")
    return (f"(lambda x, q, z, s: x @ {weight})(torch.randn({m}, {k}).half(), "
            f"torch.randint(-2**31, 2**31 - 1, ({k}, {n // 8}), dtype=torch.int32), "
            f"torch.randint(-2**31, 2**31 - 1, ({k // group}, {n // 8}), dtype=torch.int32), "
            f"torch.rand({k // group}, {n}).half())")


def plain(m: int, k: int, n: int, dtype: str = "half") -> str:
    """F.linear(x, w) with a 16-bit (n, k) weight: the product without computing it."""
    return (f"(lambda x, w: torch.nn.functional.linear(x, w))(torch.randn({m}, {k}).{dtype}(), "
            f"torch.randn({n}, {k}).{dtype}())")


MMA = "WORK=warps:2x2 TILE=mma:64x64x32 REDUCE=serial STAGE=async:{} RASTER=row"
WGMMA = "WORK=warps:2x4 TILE=wgmma:128x128x64 REDUCE=serial STAGE=async:4 RASTER=group:8"
# (name, workload, row, the plain product, weight elements a thread computes a K step)
CASES = [
    ("f16 pairs, held (async:2)", linear(256, 512, 256, "q.half() * s"), MMA.format(2),
     plain(256, 512, 256), 64 * 32 // 128),
    ("f16 pairs, raw ring (async:3)", linear(256, 512, 256, "q.half() * s"), MMA.format(3),
     plain(256, 512, 256), 64 * 32 // 128),
    ("bf16 pairs, held (async:2)", linear(256, 512, 256, "q.bfloat16() * s", "bfloat16"),
     MMA.format(2), plain(256, 512, 256, "bfloat16"), 64 * 32 // 128),
    ("bf16 pairs, raw ring (async:3)", linear(256, 512, 256, "q.bfloat16() * s", "bfloat16"),
     MMA.format(3), plain(256, 512, 256, "bfloat16"), 64 * 32 // 128),
    ("f16 unpaired (an I2F each), held (async:2)", linear(256, 512, 256, "q.half() * 0.1"),
     MMA.format(2), plain(256, 512, 256), 64 * 32 // 128),
    ("f16 unpaired (an I2F each), ring (async:3)", linear(256, 512, 256, "q.half() * 0.1"),
     MMA.format(3), plain(256, 512, 256), 64 * 32 // 128),
    ("f16 pairs, wgmma (async:4)", linear(1024, 4096, 4096, "q.half() * s"), WGMMA,
     plain(1024, 4096, 4096), 128 * 64 // 256),
    ("int4 f16 pairs, held (async:2)", linear4(256, 512, 256), MMA.format(2),
     plain(256, 512, 256), 64 * 32 // 128),
    ("int4 f16 pairs, raw ring (async:3)", linear4(256, 512, 256), MMA.format(3),
     plain(256, 512, 256), 64 * 32 // 128),
    ("int4 bf16 pairs, raw ring (async:3)", linear4(256, 512, 256, "bfloat16"), MMA.format(3),
     plain(256, 512, 256, "bfloat16"), 64 * 32 // 128),
    ("int4 f16 pairs, wgmma (async:4)", linear4(1024, 4096, 4096), WGMMA,
     plain(1024, 4096, 4096), 128 * 64 // 256),
    ("GPTQ f16 pairs, zero points, ring (async:3)", gptq(256, 512, 256), MMA.format(3),
     plain(256, 512, 256), 64 * 32 // 128),
    ("GPTQ f16, zero points every 4 k, unpaired, ring", gptq(256, 512, 256, 4), MMA.format(3),
     plain(256, 512, 256), 64 * 32 // 128),
    ("AWQ f16 pairs along n, zero points, ring (async:3)", awq(256, 512, 256), MMA.format(3),
     plain(256, 512, 256), 64 * 32 // 128),
]


def k_loop(expr: str, row: str, place: bool) -> list[str]:
    """The K loop's opcodes of the product of `expr` under `row` (sm_90a)."""
    rows = {"": row + (" PLACE=fuse" if place else "")}
    program = compile_to(load_expr(expr), "cuda", Options(target="sm_90a", rows=rows, db=None))
    unit = program["cuda"].units[-1]
    return longest_loop(disassemble(compile_cuda(unit.source, get_target("sm_90a")).cubin))


def per_step(ops: list[str], row: str) -> float:
    """Instructions a K step: the loop's, over the K steps its tensor-core instructions make
    (an mma.sync row's warp issues (BM/WM/16) x (BN/WN/8) x (BK/16) a step, a wgmma row's
    warpgroup BK/16)."""
    wm, wn = map(int, re.search(r"warps:(\d+)x(\d+)", row).groups())
    inst, bm, bn, bk = re.search(r"TILE=(\w+):(\d+)x(\d+)x(\d+)", row).groups()
    bm, bn, bk = int(bm), int(bn), int(bk)
    step = bk // 16 if inst == "wgmma" else (bm // wm // 16) * (bn // wn // 8) * (bk // 16)
    mmas = sum(o.startswith(("HMMA", "HGMMA")) for o in ops)
    return len(ops) * step / mmas


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the counts here too")
    args = ap.parse_args()
    if args.json and not args.json.parent.is_dir():
        print(f"dequant_sass: error: --json {args.json}: no directory {args.json.parent}",
              file=sys.stderr)
        return 2
    try:
        out = _counts()
    except UserError as e:          # no cuobjdump / nvdisasm
        print(f"dequant_sass: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


def _counts() -> dict:
    """Each case's counts, printed as they come."""
    out = {}
    for name, expr, row, plain, elements in CASES:
        ops, base = k_loop(expr, row, True), k_loop(plain, row, False)
        step, plain_step = per_step(ops, row), per_step(base, row)
        i2f = sum(o.startswith("I2F") for o in ops) * step / len(ops)
        each = (step - plain_step) / elements
        out[name] = {"k_step": step, "plain": plain_step, "i2f": i2f, "per_element": each,
                     "row": row}
        print(f"{name:44s} {step:5.1f} a K step ({plain_step:.1f} plain, {i2f:.0f} I2F): "
              f"{each:.2f} an element   {row}", flush=True)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
