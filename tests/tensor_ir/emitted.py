"""The whole pipeline on one expression: its kernels emitted as CUDA, run on the CPU emulator
and compared with eager PyTorch."""

from emmy.check import check_cuda_program
from emmy.frontend.workload import load_expr
from emmy.pipeline import compile_to


def assert_emitted_cuda_matches_eager(expr: str):
    """Compile `expr` (an `emmy -c` expression) to CUDA with its default rows and assert the
    emulated result matches eager; returns the compiled stages."""
    return assert_workload_cuda_matches_eager(load_expr(expr))


def assert_workload_cuda_matches_eager(w):
    """The same for a Workload."""
    stages = compile_to(w, "cuda")
    report, failed = check_cuda_program(w, stages["torch"], stages["cuda"])
    assert report is not None, failed.log[-2000:]
    assert report.ok, report.outputs
    return stages
