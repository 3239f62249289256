"""A compiled program: CUDA source per kernel, and the launches and buffers that run it."""

from __future__ import annotations

from dataclasses import dataclass

from emmy.cuda.emit import emit_program
from emmy.loop_ir.ir import Buffer


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    function: str
    grid: int
    threads: int
    shared_bytes: int
    args: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Unit:
    """One Tile IR kernel with its row: source, launches in order, scratch buffers."""

    kernel: str
    row: str
    source: str
    launches: tuple[LaunchSpec, ...]
    temporaries: tuple[tuple[str, str, int], ...]
    zero_fill: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CudaProgram:
    name: str
    inputs: tuple[Buffer, ...]
    intermediates: tuple[Buffer, ...]
    outputs: tuple[Buffer, ...]
    units: tuple[Unit, ...]
    target: str


def build_program(m) -> CudaProgram:
    """Emit the CUDA of every materialized kernel (m: pipeline.Materialized)."""
    tp = m.scheduled.program
    units = []
    for k, kp in zip(tp.kernels, m.kernels):
        fns = {f.name: f for f in kp.functions}
        launches = tuple(LaunchSpec(l.function, fns[l.function].grid, fns[l.function].threads,
                                    fns[l.function].shared_bytes, l.args) for l in kp.launches)
        units.append(Unit(k.name, str(m.scheduled.rows[k.name]), emit_program(kp), launches,
                          kp.temporaries, kp.zero_fill))
    return CudaProgram(tp.name, tp.inputs, tp.intermediates, tp.outputs, tuple(units),
                       m.scheduled.target.name)
