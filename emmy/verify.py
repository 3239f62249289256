"""Legal => correct: compile sampled legal rows of every kernel and check each against PyTorch.

Each row is compiled with NVRTC for every target asked for (a compile failure is a bug: the
space listed the row) and run through the CPU emulator on the workload's inputs, the other
kernels keeping their default rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from emmy.check import check_cuda_program
from emmy.pipeline import Options, compile_to


@dataclass(frozen=True)
class RowResult:
    kernel: str
    row: str
    verdict: str        # ok | compile_error | incorrect | crash | timeout | error
    detail: str = ""


def verify_rows(workload, *, per_kernel: int = 20, targets=("sm_90a", "sm_80"), seed: int = 0,
                kernels: tuple[str, ...] | None = None) -> list[RowResult]:
    from emmy.cuda.nvrtc import compile_cuda
    from emmy.schedule.space import Space
    from emmy.schedule.targets import get_target

    base = compile_to(workload, "tile", Options(target=targets[0]))
    graph, tp = base["torch"], base["tile"].program
    results: list[RowResult] = []
    for k in tp.kernels:
        if kernels is not None and k.name not in kernels:
            continue
        rows = Space(k, get_target(targets[0])).sample(per_kernel, seed)
        for row in rows:
            text = str(row)
            prog = compile_to(workload, "cuda", Options(target=targets[0], rows={k.name: text}))["cuda"]
            unit = next(u for u in prog.units if u.kernel == k.name)
            failed = None
            for t in targets:
                if t != targets[0] and Space(k, get_target(t)).check(row):
                    continue  # not legal on this target: nothing to compile
                compiled = compile_cuda(unit.source, get_target(t))
                if not compiled.ok:
                    failed = RowResult(k.name, text, "compile_error", f"{t}: " + "\n".join(compiled.errors[:5]))
                    break
            if failed:
                results.append(failed)
                continue
            report, run = check_cuda_program(workload, graph, prog)
            if report is None:
                results.append(RowResult(k.name, text, run.status, run.log[-1500:]))
            elif not report.ok:
                worst = max(report.outputs, key=lambda o: o.max_abs)
                results.append(RowResult(k.name, text, "incorrect",
                                         f"{worst.name}: max abs err {worst.max_abs:.3g}"))
            else:
                results.append(RowResult(k.name, text, "ok"))
    return results
