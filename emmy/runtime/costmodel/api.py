"""The entry points: model a compiled program, one Tile IR kernel under a row, or a row by
its text; rank rows; format an estimate. NVRTC's ptxas reports are cached here by source."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from emmy.cuda.emit import emit_program
from emmy.cuda.nvrtc import Resources, compile_cuda
from emmy.cuda.program import LaunchSpec
from emmy.kernel_ir import ir as K
from emmy.kernel_ir.lower import lower_applied
from emmy.memo import ByIdentity
from emmy.runtime.costmodel.constants import L2_USABLE_FRACTION, METHOD
from emmy.runtime.costmodel.timing import LaunchEstimate, estimate_launch, memset_estimate
from emmy.runtime.costmodel.traffic import L2Residency
from emmy.runtime.costmodel.work import launch_work
from emmy.schedule.row import Row, parse
from emmy.schedule.targets import Target
from emmy.tile_ir.apply import apply_row
from emmy.tile_ir.cut import cut_in_two
from emmy.tile_ir.ir import KernelKind, TileKernel


@dataclass(frozen=True, slots=True)
class ProgramEstimate:
    """The launches of a program in order and their total."""

    launches: tuple[LaunchEstimate, ...]
    seconds: float
    target: str
    method: str = METHOD

    def by_kernel(self) -> dict[str, float]:
        """Seconds per Tile IR kernel (its launches and memsets together)."""
        out: dict[str, float] = {}
        for launch in self.launches:
            out[launch.kernel] = out.get(launch.kernel, 0.0) + launch.seconds
        return out


# --- resources -----------------------------------------------------------------------------

_RESOURCES: dict[tuple[str, str], dict[str, Resources]] = {}
_RESOURCES_KEPT = 4096           # sources whose reports stay in memory (a search's worth)


def resources_of(source: str, target: Target, *, nvrtc: bool = True) -> dict[str, Resources]:
    """ptxas's report per function of `source` (NVRTC, cached in memory by source hash).
    Without `nvrtc` none: occupancy then ignores registers (a quick, rougher estimate)."""
    if not nvrtc:
        return {}
    key = (hashlib.sha256(source.encode()).hexdigest(), target.name)
    if key not in _RESOURCES:
        result = compile_cuda(source, target)
        if not result.ok:
            raise RuntimeError(f"NVRTC could not compile the kernel for {target.name}:\n"
                               f"{result.log}")
        if len(_RESOURCES) >= _RESOURCES_KEPT:
            _RESOURCES.clear()
        _RESOURCES[key] = dict(result.resources)
    return _RESOURCES[key]


# --- programs, kernels, rows ---------------------------------------------------------------

def _unit_launches(tk: TileKernel, row: Row, kp: K.KProgram, source: str, target: Target,
                   zero_fill: Iterable[str], l2: L2Residency, *, nvrtc: bool = True
                   ) -> list[LaunchEstimate]:
    """The estimates of one Tile IR kernel's launches under `row`, memsets first."""
    if tk.kind is KernelKind.CONTRACT:
        return _contract_launches(tk, row, kp, source, target, zero_fill, nvrtc=nvrtc)
    if tk.kind in (KernelKind.CHAIN, KernelKind.ATTENTION):
        from emmy.runtime.costmodel import gemm as model
        from emmy.schedule import b2b, flash
        from emmy.schedule.space import template_config

        profile, estimate = ((b2b, model.estimate_chain_launch) if tk.kind is KernelKind.CHAIN
                             else (flash, model.estimate_attention_launch))
        problem, config = template_config(profile, tk, row, target)
        res = resources_of(source, target, nvrtc=nvrtc)
        return [estimate(tk.name, f.name, problem, config, f.grid, f.threads, f.shared_bytes,
                         res.get(f.name), target) for f in kp.functions]
    launched = {launch.function for launch in kp.launches}
    functions = {f.name: f for f in kp.functions if f.name in launched}
    works = _WORKS(tk, (str(row), target), lambda: _launch_works(tk, row, target, functions))
    res = resources_of(source, target, nvrtc=nvrtc)
    sizes = {b.name: b.type.numel * b.type.dtype.itemsize for b in tk.outputs}
    out = [memset_estimate(tk.name, name, sizes.get(name, 0), target) for name in zero_fill]
    for launch in kp.launches:
        fn = functions[launch.function]
        spec = LaunchSpec(fn.name, fn.grid, fn.threads, fn.shared_bytes, launch.args)
        out.append(estimate_launch(works[fn.name], spec, res.get(fn.name), target, l2,
                                   kernel=tk.name))
    return out


# A kernel's work counts under a row, per function: the Kernel IR functions are those the row
# lowers to, so (kernel, row, target) decides them; only the L2 state varies between programs.
_WORKS = ByIdentity()


def _launch_works(tk: TileKernel, row: Row, target: Target, functions) -> dict[str, Any]:
    parts = {p.kernel.name: p for p in apply_row(tk, row, target).parts}
    return {name: launch_work(parts[name], fn) for name, fn in functions.items()}


def _contract_launches(tk: TileKernel, row: Row, kp: K.KProgram, source: str, target: Target,
                       zero_fill: Iterable[str], *, nvrtc: bool) -> list[LaunchEstimate]:
    from emmy.runtime.costmodel.gemm import estimate_combine_launch, estimate_gemm_launch
    from emmy.schedule import gemm
    from emmy.schedule.space import template_config

    problem, config = template_config(gemm, tk, row, target)
    res = resources_of(source, target, nvrtc=nvrtc)
    sizes = {b.name: b.type.numel * b.type.dtype.itemsize for b in tk.outputs}
    out = [memset_estimate(tk.name, name, sizes.get(name, 0), target) for name in zero_fill]
    for f in kp.functions:
        if f.name.endswith("_combine"):
            out.append(estimate_combine_launch(tk.name, f.name, problem, config, f.grid,
                                               f.threads, target))
        else:
            out.append(estimate_gemm_launch(tk.name, f.name, problem, config, f.grid, f.threads,
                                            f.shared_bytes, res.get(f.name), target))
    return out


def estimate_program(prog, target: Target, materialized) -> ProgramEstimate:
    """Model a CudaProgram; `materialized` is the "kernel" stage it was emitted from."""
    scheduled = materialized.scheduled
    l2 = L2Residency(target.l2_bytes * L2_USABLE_FRACTION)
    launches: list[LaunchEstimate] = []
    for tk, kp, unit in zip(scheduled.program.kernels, materialized.kernels, prog.units):
        launches += _unit_launches(tk, scheduled.rows[tk.name], kp, unit.source, target,
                                   unit.zero_fill, l2)
    return ProgramEstimate(tuple(launches), sum(e.seconds for e in launches), target.name)


def estimate_compiled(results: Mapping[str, Any]) -> ProgramEstimate:
    """Model the result of `compile_to(workload, "cuda", options)`."""
    scheduled = results["tile"]
    return estimate_program(results["cuda"], scheduled.target, results["kernel"])


def estimate_kernel(tk: TileKernel, row: Row | str, target: Target, *, nvrtc: bool = True
                    ) -> ProgramEstimate:
    """Model one Tile IR kernel under `row` on its own (its inputs start outside L2)."""
    row = parse(row) if isinstance(row, str) else row
    if row.get("PLACE") == "cut" and (cut := cut_in_two(tk)) is not None:
        # two kernels, each at its default row (the pipeline gives each its own row)
        from emmy.schedule.space import space_of

        parts = cut[:2]
        launches = tuple(e for part in parts for e in estimate_kernel(
            part, space_of(part, target).default(), target, nvrtc=nvrtc).launches)
        return ProgramEstimate(launches, sum(e.seconds for e in launches), target.name)
    kp = lower_applied(tk.name, apply_row(tk, row, target))
    l2 = L2Residency(target.l2_bytes * L2_USABLE_FRACTION)
    source = emit_program(kp) if nvrtc else ""
    launches = _unit_launches(tk, row, kp, source, target, kp.zero_fill, l2, nvrtc=nvrtc)
    return ProgramEstimate(tuple(launches), sum(e.seconds for e in launches), target.name)


_SCHEDULED = ByIdentity(8)   # a workload's "tile" stage, per target (emmy.memo)


def _tile_kernel(source, kernel_name: str, target: Target) -> TileKernel:
    """The Tile IR kernel `kernel_name` of a workload, a Scheduled, a TileProgram or a kernel."""
    if isinstance(source, TileKernel):
        return source
    program = getattr(source, "program", source)
    if not hasattr(program, "kernels"):            # a Workload: lift it once per object
        from emmy.pipeline import Options, compile_to

        program = _SCHEDULED(source, target.name, lambda: compile_to(
            source, "tile", Options(target=target.name))["tile"]).program
    kernels = {k.name: k for k in program.kernels}
    if kernel_name == "" and len(kernels) == 1:
        return next(iter(kernels.values()))
    if kernel_name not in kernels:
        raise KeyError(f"no kernel `{kernel_name}`; the kernels are {', '.join(kernels)}")
    return kernels[kernel_name]


def estimate_row(source, kernel_name: str, row_text: str, target: Target, *,
                 nvrtc: bool = True) -> float:
    """Modeled seconds of one kernel under one row. `source`: a Workload, the "tile" stage
    (Scheduled), a TileProgram or a TileKernel; "" names the only kernel."""
    from emmy.schedule.space import space_of

    tk = _tile_kernel(source, kernel_name, target)
    row = parse(row_text)
    refusals = space_of(tk, target).check(row)
    if refusals:
        raise ValueError(f"row `{row_text}` is illegal for `{tk.name}`: "
                         + "; ".join(str(r) for r in refusals))
    return estimate_kernel(tk, row, target, nvrtc=nvrtc).seconds


def rank_rows(tk: TileKernel, rows: Iterable[Row | str], target: Target, *, nvrtc: bool = True
              ) -> list[tuple[Row, float]]:
    """Rows fastest first by modeled seconds (ties keep the given order)."""
    scored = []
    for row in rows:
        row = parse(row) if isinstance(row, str) else row
        scored.append((row, estimate_kernel(tk, row, target, nvrtc=nvrtc).seconds))
    return sorted(scored, key=lambda rs: rs[1])


def format_estimate(est: ProgramEstimate) -> str:
    """One line per launch and a total, every figure labelled modeled."""
    lines = []
    for e in est.launches:
        lines.append(f"{e.function:<32} {e.seconds * 1e6:10.2f} us  {e.limiter:<8} "
                     f"dram {e.bytes_dram / 2**20:9.2f} MiB  l2 {e.bytes_l2 / 2**20:9.2f} MiB  "
                     f"occupancy {e.occupancy:4.0%} ({e.blocks_per_sm} blocks/SM, "
                     f"{e.waves} wave{'s' if e.waves != 1 else ''})")
    lines.append(f"{'total':<32} {est.seconds * 1e6:10.2f} us  ({est.method} for {est.target})")
    return "\n".join(lines)
