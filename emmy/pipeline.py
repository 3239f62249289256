"""The compiler's stages, in order. Each stage takes the previous stage's result.

    workload --capture--> torch IR --decompose--> tensor IR --fuse+normalize--> loop IR

Later stages (tile, kernel, cuda) append here as they are built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from emmy.frontend.workload import Workload


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[Any], Any]      # previous stage's result -> this stage's result
    show: Callable[[Any], str]     # this stage's result -> text


def _capture(w: Workload):
    from emmy.torch_ir.capture import capture

    return capture(w.model, w.inputs, name=w.name,
                   origin=w.origin if w.origin != "<expr>" else None)


def _to_tensor(graph):
    from emmy.tensor_ir.lower import lower

    return lower(graph)


def _to_loop(program):
    from emmy.loop_ir.lower import lower

    return lower(program)


def _show_torch(g) -> str:
    from emmy.torch_ir.printer import print_graph

    return print_graph(g)


def _show_tensor(p) -> str:
    from emmy.tensor_ir.printer import print_program

    return print_program(p)


def _show_loop(lp) -> str:
    from emmy.loop_ir.printer import print_program

    return print_program(lp)


STAGES: tuple[Stage, ...] = (
    Stage("torch", _capture, _show_torch),
    Stage("tensor", _to_tensor, _show_tensor),
    Stage("loop", _to_loop, _show_loop),
)
STAGE_NAMES = tuple(s.name for s in STAGES)


def compile_to(workload: Workload, stage: str) -> dict[str, Any]:
    """Run the stages up to and including `stage`; return every result by stage name."""
    if stage not in STAGE_NAMES:
        raise ValueError(f"unknown stage {stage!r}")
    results: dict[str, Any] = {}
    value: Any = workload
    for s in STAGES:
        value = s.run(value)
        results[s.name] = value
        if s.name == stage:
            break
    return results


def show(stage: str, result: Any) -> str:
    return next(s for s in STAGES if s.name == stage).show(result)
