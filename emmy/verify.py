"""Legal => correct: compile sampled legal rows of every kernel and check each against PyTorch.

Each row is compiled with NVRTC for every target asked for (a compile failure is a bug: the
space listed the row) and run through the CPU emulator on the workload's inputs, the other
kernels keeping their default rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from emmy.check import check_cuda_program
from emmy.pipeline import Options, compile_to, resume_from
from emmy.tile_ir.cut import splits


@dataclass(frozen=True)
class RowResult:
    kernel: str
    row: str
    verdict: str        # ok | compile_error | incorrect | crash | timeout | error
    detail: str = ""


def verify_rows(workload, *, per_kernel: int = 20, targets=("sm_90a", "sm_80"), seed: int = 0,
                kernels: tuple[str, ...] | None = None, where=None) -> list[RowResult]:
    """Sampled rows of every kernel; a fused chain of products is also cut (PLACE=cut) and
    rows of each of its two kernels sampled in turn. `where(row)`: sample only among the rows
    it accepts (e.g. the wgmma tiles, rare in a uniform sample)."""
    from emmy.schedule.space import Space
    from emmy.schedule.targets import get_target

    from emmy.tile_ir.lift import lift_program

    # what no row changes is computed once: every row resumes from the loop program
    base = compile_to(workload, "loop", Options(target=targets[0]))
    # the kernels as lifted, before any default row cuts a chain: their fused rows count too
    tp = lift_program(base["loop"])
    results: list[RowResult] = []
    for k in tp.kernels:
        if kernels is not None and k.name not in kernels:
            continue
        space = Space(k, get_target(targets[0]))
        for row in space.sample(per_kernel, seed, where):
            results.append(_verify_row(workload, base, k, str(row), {k.name: str(row)}, targets))
        if not splits(k):
            continue
        cut = str(next(r for r in space.all_rows if r.get("PLACE") == "cut"))
        parts = resume_from(base, "tile", Options(target=targets[0], rows={k.name: cut}))
        for part in parts["tile"].program.kernels:
            if not part.name.startswith(f"{k.name}_cut"):
                continue
            for row in Space(part, get_target(targets[0])).sample(per_kernel, seed):
                results.append(_verify_row(workload, base, part, str(row),
                                           {k.name: cut, part.name: str(row)}, targets))
    return results


def _verify_row(workload, base, k, text: str, rows: dict[str, str], targets) -> RowResult:
    """Compile with `rows` (every unit the row makes, for each target where it is legal) and
    check the program against PyTorch on the emulator."""
    from emmy.cuda.nvrtc import compile_cuda
    from emmy.evaluate import units_of
    from emmy.schedule.row import parse
    from emmy.schedule.space import Space
    from emmy.schedule.targets import get_target

    prog = resume_from(base, "cuda", Options(target=targets[0], rows=rows))["cuda"]
    units = units_of(prog, k.name)
    for t in targets:
        if t != targets[0] and Space(k, get_target(t)).check(parse(text)):
            continue  # not legal on this target: nothing to compile
        for unit in units:
            compiled = compile_cuda(unit.source, get_target(t))
            if not compiled.ok:
                return RowResult(k.name, text, "compile_error",
                                 f"{t}: " + "\n".join(compiled.errors[:5]))
    report, run = check_cuda_program(workload, base["torch"], prog)
    if report is None:
        return RowResult(k.name, text, run.status, run.log[-1500:])
    if not report.ok:
        worst = max(report.outputs, key=lambda o: o.max_abs)
        return RowResult(k.name, text, "incorrect", f"{worst.name}: max abs err {worst.max_abs:.3g}")
    return RowResult(k.name, text, "ok")
