"""The compiler's stages, in order. Each stage takes the previous stage's result.

    workload --capture--> torch --decompose--> tensor --fuse+normalize--> loop
             --lift+rows--> tile --materialize--> kernel --emit--> cuda
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from emmy.frontend.workload import Workload
from emmy.memo import ByIdentity

# a loop program's Tile IR, and a Tile IR kernel's Kernel IR under a row (emmy.memo)
_LIFTED, _APPLIED = ByIdentity(8), ByIdentity()


@dataclass(frozen=True)
class Options:
    target: str = "sm_90a"
    rows: Mapping[str, str] = field(default_factory=dict)   # kernel name ("" = only one) -> row
    db: str | None = None    # schedule database: a path, "" the default one, None not used


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[Any, Options], Any]   # previous stage's result -> this stage's result
    show: Callable[[Any], str]           # this stage's result -> text


@dataclass(frozen=True)
class Scheduled:
    """Tile IR with the row chosen for each kernel."""

    program: Any          # TileProgram
    rows: dict            # kernel name -> Row
    target: Any           # Target


@dataclass(frozen=True)
class Materialized:
    scheduled: Scheduled
    kernels: tuple        # one KProgram per Tile IR kernel


def _capture(w: Workload, o: Options):
    from emmy.torch_ir.capture import capture

    return capture(w.model, w.inputs, name=w.name,
                   origin=w.origin if w.origin != "<expr>" else None, tf32=w.tf32)


def _to_tensor(graph, o: Options):
    from emmy.tensor_ir.lower import lower

    return lower(graph)


def _to_loop(program, o: Options):
    from emmy.loop_ir.lower import lower

    return lower(program)


def _to_tile(lp, o: Options) -> Scheduled:
    from emmy.schedule.choose import choose_rows
    from emmy.schedule.targets import get_target
    from emmy.tile_ir.lift import lift_program

    target = get_target(o.target)
    tp, rows = choose_rows(_LIFTED(lp, None, lambda: lift_program(lp)), target, o.rows, db=o.db)
    return Scheduled(tp, rows, target)


def _to_kernel(s: Scheduled, o: Options) -> Materialized:
    from emmy.kernel_ir.lower import lower_applied
    from emmy.tile_ir.apply import apply_row

    def materialize(k):
        row = s.rows[k.name]
        return _APPLIED(k, (str(row), s.target.name),
                        lambda: lower_applied(k.name, apply_row(k, row, s.target)))

    return Materialized(s, tuple(materialize(k) for k in s.program.kernels))


def _to_cuda(m: Materialized, o: Options):
    from emmy.cuda.program import build_program

    return build_program(m)


def _show_torch(g) -> str:
    from emmy.torch_ir.printer import print_graph

    return print_graph(g)


def _show_tensor(p) -> str:
    from emmy.tensor_ir.printer import print_program

    return print_program(p)


def _show_loop(lp) -> str:
    from emmy.loop_ir.printer import print_program

    return print_program(lp)


def _show_tile(s: Scheduled) -> str:
    from emmy.tile_ir.printer import print_program

    return print_program(s.program, s.rows)


def _show_kernel(m: Materialized) -> str:
    from emmy.kernel_ir.printer import print_program

    return "\n".join(print_program(k) for k in m.kernels)


def _show_cuda(c) -> str:
    return "\n".join(u.source for u in c.units)


STAGES: tuple[Stage, ...] = (
    Stage("torch", _capture, _show_torch),
    Stage("tensor", _to_tensor, _show_tensor),
    Stage("loop", _to_loop, _show_loop),
    Stage("tile", _to_tile, _show_tile),
    Stage("kernel", _to_kernel, _show_kernel),
    Stage("cuda", _to_cuda, _show_cuda),
)
STAGE_NAMES = tuple(s.name for s in STAGES)


def compile_to(workload: Workload, stage: str, options: Options | None = None) -> dict[str, Any]:
    """Run the stages up to and including `stage`; return every result by stage name."""
    return resume_from({}, stage, options, workload=workload)


def resume_from(done: dict[str, Any], stage: str, options: Options | None = None, *,
                workload: Workload | None = None) -> dict[str, Any]:
    """Continue from stage results already computed (`done`, e.g. up to "loop", which no row
    changes) to `stage`; returns `done` plus the new results."""
    if stage not in STAGE_NAMES:
        raise ValueError(f"unknown stage {stage!r}")
    options = options or Options()
    results = dict(done)
    value: Any = results[STAGES[len(done) - 1].name] if done else workload
    for s in STAGES[len(done):]:
        value = s.run(value, options)
        results[s.name] = value
        if s.name == stage:
            break
    return results


def show(stage: str, result: Any) -> str:
    return next(s for s in STAGES if s.name == stage).show(result)
