"""The compiler as the agent sees it: the Evaluator contract, and opening one for a workload file."""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform
from pathlib import Path
from typing import Any, Protocol

from agent.models import WorkloadRecord


class EvaluatorLike(Protocol):
    """What a Session needs from emmy.evaluate.Evaluator (tests pass a fake)."""

    workload_name: str
    target: str
    device: str

    def kernels(self) -> list[Any]: ...
    def decision_points(self, kernel: str) -> list[tuple[str, list[str]]]: ...
    def sample_rows(self, kernel: str, n: int, seed: int = 0) -> list[str]: ...
    def all_rows(self, kernel: str) -> list[str]: ...
    def first_row(self, kernel: str, fixed: dict[str, str]) -> str | None: ...
    def check(self, kernel: str, row: str) -> list[str]: ...
    def evaluate(self, kernel: str, row: str) -> Any: ...
    def estimate_us(self, kernel: str, row: str) -> float | None: ...
    def read_ir(self, stage: str, kernel: str | None = None, row: str | None = None) -> str: ...


class BadInput(Exception):
    """The user's input is wrong (file, flag, trace); the CLI prints it and exits 2."""


EXPR_PATH = "<expr>"   # a WorkloadRecord's path for a -c expression (its source: the expression)
GRAPH_PATH = "<torch.compile>"   # ... for a graph the emmy backend got (its source: FX code)


def workload_record(path: str | Path | None, sets: list[str],
                    expr: str | None = None) -> WorkloadRecord:
    """The workload file's text and hash (or the -c expression's), as the trace header keeps
    them."""
    if expr is not None:
        from emmy.frontend.workload import expr_name

        return WorkloadRecord(name=expr_name(expr), path=EXPR_PATH, source=expr,
                              sha256=hashlib.sha256(expr.encode()).hexdigest(), sets=[])
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"no such workload file: {path}")
    source = path.read_text()
    return WorkloadRecord(name=path.stem, path=str(path), source=source,
                          sha256=hashlib.sha256(source.encode()).hexdigest(), sets=list(sets))


def check_workload_args(file: str | None, expr: str | None, sets: list[str]) -> None:
    """A workload is a FILE or a -c EXPR, and --set applies to a file only."""
    if bool(file) == bool(expr):
        raise BadInput("give a workload FILE or -c EXPR (exactly one)")
    if expr and sets:
        raise BadInput("--set overrides constants of a workload file; it does not apply to -c")


def open_evaluator(path: str | Path | None, sets: list[str], target: str, device: str = "auto",
                   expr: str | None = None):
    """Load the workload file (or the -c expression) and build the compiler's Evaluator for
    it."""
    try:
        from emmy.errors import UserError
    except ImportError as e:  # pragma: no cover - the compiler is part of this distribution
        raise BadInput(f"the emmy compiler is not importable: {e}") from None
    try:
        from emmy.evaluate import Evaluator
    except ImportError as e:
        raise BadInput(f"this emmy has no emmy.evaluate.Evaluator yet ({e})") from None
    from emmy.frontend.workload import load_expr, load_file, parse_sets

    try:
        workload = load_expr(expr) if expr is not None else load_file(path, parse_sets(sets))
        return Evaluator(workload, target, device=device)
    except UserError as e:
        raise BadInput(str(e)) from None


def gpu_name(evaluator) -> str:
    """The GPU's name, or "none" when the evaluator runs on the CPU."""
    if getattr(evaluator, "device", "cpu") != "gpu":
        return "none"
    try:
        from emmy.runtime import gpu

        return str(gpu.gpu_name())
    except Exception:
        pass
    try:
        import torch

        return torch.cuda.get_device_name(0)
    except Exception:
        return "unknown GPU"


def versions() -> dict[str, str]:
    """Versions of the packages that shape a result."""
    out = {"python": platform.python_version()}
    for dist in ("emmy-agent", "torch", "numpy", "pydantic", "openai", "cuda-bindings",
                 "nvidia-cuda-nvrtc", "cupy-cuda13x"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out
