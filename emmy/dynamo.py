"""emmy as a `torch.compile` backend:

    compiled = torch.compile(model, backend="emmy", dynamic=False)
    compiled = torch.compile(model, backend="emmy", dynamic=False,
                             options={"run": "emulate", "target": "sm_80", "db": "tuned.json"})

TorchDynamo hands each captured graph (the parts between graph breaks) to `backend`, which
compiles it through every emmy stage with the schedule database's rows (`emmy.compile`) and
returns the callable that runs its kernels. Options: `run` (auto, gpu, emulate, eager: as
`emmy.compile`'s; auto runs on the GPU where there is one and eagerly elsewhere), `target`,
`db` (a schedule database path; "" the default one, None for the default rows only),
`check` (True: kernels that are to run pass the tuner's check on fresh inputs first),
`tune` (N evaluations of emmy-agent's search policy per graph before it is compiled;
mode="max-autotune" gives AUTOTUNE_BUDGET) and `fallback` (True: a graph emmy refuses, one
whose kernels fail the check and a call that autograd must see run the captured graph eagerly,
with a warning saying why; False: a refused or failing graph raises). A graph traced with
symbolic shapes is compiled for each set of input shapes its calls bring (kept per shape).

Each graph's outcome is appended to `graphs` (a `Graph`: its kernels and rows, or why it runs
eagerly), so a program can say what emmy compiled.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from emmy.api import Compiled, check_run
from emmy.errors import UserError

OPTIONS = ("run", "target", "db", "fallback", "tune", "check")
AUTOTUNE_BUDGET = 20   # evaluations a graph's kernels share under mode="max-autotune"


@dataclass
class Graph:
    """One graph TorchDynamo captured and what emmy made of it."""

    name: str
    ops: int                                       # calls (functions, methods, modules) in it
    compiled: Any = None                           # emmy.api.Compiled, or None
    eager_reason: str = ""                         # why it runs eagerly (empty when compiled)
    tuned: str = ""                                # what tuning it did, and where its trace is
    check: str = ""                                # the kernels' check verdict (when checked)
    dynamic: bool = False                          # traced with symbolic shapes
    shapes: int = 0                                # ... and compiled for this many shapes so far
    calls: dict[str, int] = field(default_factory=lambda: {"kernels": 0, "eager": 0})

    def __str__(self) -> str:
        shapes = f", dynamic shapes: compiled for {self.shapes} so far" if self.dynamic else ""
        if self.compiled is None:
            return f"{self.name}: {self.ops} op(s){shapes}, eager: {self.eager_reason}"
        return (f"{self.name}: {self.ops} op(s){shapes} -> {len(self.compiled.rows)} kernel(s), "
                f"{self.compiled.backend}" + (f", check {self.check}" if self.check else "")
                + (f"; tuned: {self.tuned}" if self.tuned else ""))


graphs: list[Graph] = []


def backend(gm, example_inputs, options: dict | None = None, mode: str | None = None
            ) -> Callable:
    """The backend TorchDynamo calls with one captured graph (`gm`, an FX GraphModule whose
    outputs are a tuple) and its example inputs; returns the callable dynamo runs instead."""
    opts = dict(options or {})
    unknown = sorted(set(opts) - set(OPTIONS))
    if unknown:
        raise UserError(f"unknown emmy backend option(s) {', '.join(unknown)}; the options are "
                        f"{', '.join(OPTIONS)}")
    fallback = opts.pop("fallback", True)
    run = opts.get("run", "auto")
    check_run(run)
    tune = opts.get("tune", AUTOTUNE_BUDGET if (mode or "").startswith("max-autotune") else 0)
    if not isinstance(tune, int) or isinstance(tune, bool) or tune < 0:
        raise UserError(f"tune is a number of evaluations (0 to tune nothing), not `{tune!r}`")
    if tune and opts.get("db", "") is None:
        raise UserError("tune keeps the rows it finds in a schedule database: give db a path, "
                        "or leave it out for the default one")
    graph = Graph(name=f"graph{len(graphs)}", ops=sum(
        n.op in ("call_function", "call_method", "call_module") for n in gm.graph.nodes))
    graphs.append(graph)
    settings = dict(opts, run=run, tune=tune, fallback=fallback)
    if _dynamic(example_inputs):
        graph.dynamic = True
        return _per_shape(gm, graph, settings)
    try:
        graph.compiled, reason = _compile(gm, tuple(example_inputs), graph, settings)
    except UserError:
        graphs.remove(graph)
        raise
    if reason is not None or graph.compiled.run == "eager":
        graph.eager_reason = reason or graph.compiled.backend
        return _counted(gm.forward, graph, "eager")
    return _runner(gm, graph, lambda args: graph.compiled)


def _compile(gm, inputs: tuple, graph: Graph, settings: dict) -> tuple[Any, str | None]:
    """(the graph compiled for these inputs' shapes, tuned first and checked, None) or (None,
    why it runs eagerly), warning with the reason; raises where `fallback` is False."""
    try:
        if settings["tune"]:
            graph.tuned = _tune(gm, inputs, graph, settings["tune"], settings)
        compiled = Compiled(gm, inputs, target=settings.get("target", "sm_90a"),
                            db=settings.get("db", ""), run=settings["run"],
                            name=f"dynamo_{graph.name}")
    except UserError as e:
        if not settings["fallback"]:
            raise
        reason = f"emmy refused it: {e}"
    else:
        reason = _checked(graph, compiled, settings.get("check", True), settings["fallback"])
        if reason is None:
            return compiled, None
    warnings.warn(f"emmy: {graph.name} runs eagerly: {reason}", stacklevel=3)
    return None, reason


def _checked(graph: Graph, compiled, check: bool, fallback: bool) -> str | None:
    """Check the kernels that are to run (not eager ones) as the tuner does; why they may not
    run, or None."""
    if not check or compiled.run == "eager":
        return None
    result = compiled.check()
    graph.check = result.verdict
    if result.ok:
        return None
    reason = f"its kernels failed the check ({result.verdict}): " + "; ".join(result.reasons[:3])
    if not fallback:
        raise UserError(f"emmy: {graph.name}: {reason}")
    return reason


def _per_shape(gm, graph: Graph, settings: dict) -> Callable:
    """A graph TorchDynamo traced with symbolic shapes: compiled (tuned, checked) for each
    distinct set of input shapes the first time a call brings it, then taken from the cache."""
    import torch

    cache: dict[tuple, Any] = {}

    def compiled_for(args):
        key = tuple((tuple(a.shape), a.dtype, a.device) if isinstance(a, torch.Tensor) else a
                    for a in args)
        if key not in cache:
            cache[key], reason = _compile(gm, tuple(args), graph, settings)
            graph.compiled = cache[key] or graph.compiled
            graph.eager_reason = reason or graph.eager_reason
            graph.shapes = sum(c is not None for c in cache.values())
        return cache[key]

    return _runner(gm, graph, compiled_for)


def _dynamic(example_inputs) -> bool:
    """Whether TorchDynamo traced the graph with symbolic shapes."""
    import torch

    return any(isinstance(x, torch.SymInt) or (
        isinstance(x, torch.Tensor) and any(isinstance(s, torch.SymInt)
                                            for s in (*x.shape, *x.stride())))
        for x in example_inputs)


def _counted(fn: Callable, graph: Graph, how: str) -> Callable:
    def run(*args):
        graph.calls[how] += 1
        return fn(*args)

    return run


def _runner(gm, graph: Graph, compiled_for: Callable) -> Callable:
    """The kernels `compiled_for(args)` gives (eagerly where it gives None), or the captured
    graph where autograd must record the call."""
    import torch

    warned = []

    def run(*args):
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad
                                           for a in args):
            if not warned:
                warned.append(True)
                warnings.warn(f"emmy: {graph.name} runs eagerly while autograd records it (emmy "
                              "compiles inference: use torch.no_grad() or inputs that need no "
                              "gradient)", stacklevel=2)
            graph.calls["eager"] += 1
            return gm.forward(*args)
        compiled = compiled_for(args)
        if compiled is None or compiled.run == "eager":
            graph.calls["eager"] += 1
            return gm.forward(*args)
        graph.calls["kernels"] += 1
        return compiled.outputs(*args)

    return run


def _tune(gm, example_inputs, graph: Graph, budget: int, opts: dict) -> str:
    """Search the graph's schedules (emmy-agent's built-in search policy, `budget`
    evaluations: correctness on fresh inputs, then measured on a GPU or modeled elsewhere);
    its best rows go to the schedule database, where the compile that follows finds them."""
    import hashlib

    from agent.console import View
    from agent.models import WorkloadRecord
    from agent.run import GRAPH_PATH, RunConfig, optimize
    from emmy.evaluate import Evaluator
    from emmy.frontend.workload import Workload

    name = f"dynamo_{graph.name}"
    code = gm.code
    workload = Workload(name=name, model=gm.eval(), inputs=tuple(example_inputs), source=code,
                        origin=GRAPH_PATH)
    ev = Evaluator(workload, opts.get("target", "sm_90a"))
    ev.time_baselines = False           # torch.compile is not to be called from its backend
    record = WorkloadRecord(name=name, path=GRAPH_PATH, source=code,
                            sha256=hashlib.sha256(code.encode()).hexdigest(), sets=[])
    cfg = RunConfig(file=None, target=ev.target, policy="search", budget=budget,
                    db=opts.get("db") or None)
    out = optimize(cfg, lambda n: View(n, quiet=True), evaluator=ev, record=record)
    timing = "measured" if ev.device == "gpu" else "modeled"
    return (f"{out.summary.budget.evaluations_used} evaluation(s) by the search policy "
            f"({timing}), {len(out.kept)} row(s) kept; trace {out.trace}")
