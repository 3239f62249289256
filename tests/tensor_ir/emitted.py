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


def assert_sampled_rows_match_eager(expr: str, per_kernel: int, seed: int):
    """Sampled legal rows of each kernel of `expr`, through NVRTC (both targets) and the
    emulator against eager (emmy.verify): every one correct."""
    from emmy.verify import verify_rows

    from tests.rows import without_clusters

    results = verify_rows(load_expr(expr), per_kernel=per_kernel, seed=seed, where=without_clusters)
    assert results
    bad = [r for r in results if r.verdict != "ok"]
    assert not bad, bad
