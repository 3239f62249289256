"""`emmy run --bench`: per kernel, the verdict, the error, the resources and a time — measured
with CUDA events on a GPU (with eager, torch.compile and cuBLAS baselines from the same run), or
modeled by the cost model elsewhere. Every time says which."""

from __future__ import annotations

from dataclasses import asdict

from emmy.bench.harness import check_program, resolve_device
from emmy.cuda.nvrtc import compile_cuda
from emmy.schedule.targets import get_target


def bench_program(workload, results: dict, *, device: str = "auto") -> dict:
    """A report for the program in `results` (what compile_to(..., "cuda") returned)."""
    device = resolve_device(device)
    prog = results["cuda"]
    target = get_target(prog.target)
    check = check_program(workload, results["torch"], prog, device=device)
    errors = {e.name: {"max_abs": e.max_abs, "max_rel": e.max_rel} for e in check.errors}
    kernels = []
    for unit in prog.units:
        compiled = compile_cuda(unit.source, target)
        resources = {}
        if compiled.ok:
            for launch in unit.launches:
                resources[launch.function] = {
                    **compiled.report_of(launch.function, launch.shared_bytes),
                    "grid": launch.grid, "compiled_grid": launch.grid,
                    "threads": launch.threads}
        kernels.append({"name": unit.kernel, "row": unit.row, "resources": resources})
    report = {"workload": workload.name, "target": prog.target, "device": device,
              "verdict": check.verdict, "reasons": list(check.reasons), "errors": errors,
              "kernels": kernels, "baselines": {}, "speedups": {}}
    if not check.ok:
        return report       # no time is reported for a program that did not pass its check
    if device == "gpu":
        _measure(workload, results, report)
    else:
        _model(results, report)
    return report


def _model(results: dict, report: dict) -> None:
    from emmy.runtime.costmodel import estimate_compiled

    estimate = estimate_compiled(results)
    for k in report["kernels"]:
        seconds = sum(l.seconds for l in estimate.launches if l.kernel == k["name"])
        k["timing"] = _modeled(seconds)
    report["timing"] = _modeled(estimate.seconds)


def _modeled(seconds: float) -> dict:
    us = seconds * 1e6
    return {"method": "modeled", "median_us": us, "p10_us": us, "p90_us": us, "n": 1}


def _measure(workload, results: dict, report: dict) -> None:
    import torch

    from emmy.bench.baselines import compiled, cublas, eager
    from emmy.bench.timing import time_cuda
    from emmy.check import program_inputs
    from emmy.runtime.gpu import GpuProgram

    prog, graph = results["cuda"], results["torch"]
    gp = GpuProgram(prog)
    launched = gp.grids()
    for k in report["kernels"]:
        for fn, r in k["resources"].items():
            r["grid"] = launched.get(fn, r["grid"])     # a persistent grid as fitted to this GPU
    gp.bind(program_inputs(graph, workload.inputs))
    for i, k in enumerate(report["kernels"]):
        k["timing"] = asdict(time_cuda(lambda i=i: gp.launch((i,))))
    total = time_cuda(gp.launch)
    report["timing"] = asdict(total)
    args = tuple(x.cuda() if isinstance(x, torch.Tensor) else x for x in workload.inputs)
    model = workload.model.cuda()
    found = [eager(model, args), compiled(model, args), cublas(graph)]
    for b in found:
        if b is None:
            continue
        report["baselines"][b.name] = asdict(b.timing) if b.timing else {"note": b.note}
        if b.timing:
            report["speedups"][b.name] = b.timing.median_us / total.median_us
