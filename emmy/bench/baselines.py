"""Baselines, timed by the same `time_cuda` as emmy's kernels, in the same run (GPU only):
torch eager, torch.compile (its compilation and autotuning happen in a warm-up that is kept
out of the timing, and the report says how long it took), and cuBLAS through torch for each
matrix product the workload contains (the products alone, on random operands)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from emmy.bench.timing import Timing, time_cuda

MATMUL_OPS = ("mm", "bmm", "matmul", "linear", "addmm", "baddbmm")


@dataclass(frozen=True)
class Baseline:
    name: str                    # eager | torch.compile | cuBLAS
    timing: Timing | None        # None when it could not run (see note)
    note: str = ""


def eager(model, args, **timing_options) -> Baseline:
    """The model as written, in eager PyTorch."""
    import torch

    try:
        with torch.no_grad():
            t = time_cuda(lambda: model(*args), **timing_options)
    except Exception as e:
        return Baseline("eager", None, f"failed: {type(e).__name__}: {_first_line(e)}")
    return Baseline("eager", t)


def compiled(model, args, **timing_options) -> Baseline:
    """torch.compile(model); the compile and autotune warm-up is excluded from the timing."""
    import torch

    try:
        with torch.no_grad():
            fn = torch.compile(model)
            start = time.perf_counter()
            for _ in range(3):
                fn(*args)
            torch.cuda.synchronize()
            warm = time.perf_counter() - start
            t = time_cuda(lambda: fn(*args), **timing_options)
    except Exception as e:
        return Baseline("torch.compile", None, f"failed: {type(e).__name__}: {_first_line(e)}")
    return Baseline("torch.compile", t,
                    f"compilation + autotuning warm-up ({warm:.1f} s) excluded from the timing")


def matrix_products(graph) -> list[tuple[str, tuple]]:
    """Each matrix-product node of the Torch IR graph: (op, operand TensorTypes)."""
    from emmy.torch_ir.ir import Ref

    out = []
    for node in graph.nodes:
        if node.op in MATMUL_OPS:
            types = tuple(graph.node(a.name).type for a in node.args if isinstance(a, Ref))
            out.append((node.op, types))
    return out


def cublas(graph, device=None, **timing_options) -> Baseline | None:
    """The workload's matrix products alone through torch (cuBLAS); None when there are none."""
    import torch
    import torch.nn.functional as F

    from emmy.dtypes import to_torch

    products = matrix_products(graph)
    if not products:
        return None
    fns = {"mm": torch.mm, "bmm": torch.bmm, "matmul": torch.matmul, "linear": F.linear,
           "addmm": torch.addmm, "baddbmm": torch.baddbmm}
    dev = device or torch.device("cuda", torch.cuda.current_device())
    calls = []
    for op, types in products:
        operands = tuple(torch.randn(t.shape, device=dev, dtype=torch.float32).to(to_torch(t.dtype))
                         for t in types)
        calls.append((fns[op], operands))

    def run():
        for fn, operands in calls:
            fn(*operands)

    try:
        with torch.no_grad():
            t = time_cuda(run, **timing_options)
    except Exception as e:
        return Baseline("cuBLAS", None, f"failed: {type(e).__name__}: {_first_line(e)}")
    ops = ", ".join(f"{op}{tuple(tuple(t.shape) for t in types)}" for op, types in products)
    return Baseline("cuBLAS", t, f"the matrix products alone, through torch: {ops}")


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else ""
