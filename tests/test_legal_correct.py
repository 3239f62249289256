"""Legal => correct: every example runs correctly with its default rows (emitted CUDA on the
CPU emulator vs PyTorch), and sampled legal rows of each kernel do too. The fast sample runs
in the default suite; the full sweep (20 rows per kernel) is marked slow."""

from pathlib import Path

import pytest

from emmy.check import check_cuda_program
from emmy.frontend.workload import load_expr, load_file
from emmy.pipeline import compile_to
from emmy.verify import verify_rows
from tests.rows import without_clusters

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_default_rows_are_correct(path):
    w = load_file(path)
    results = compile_to(w, "cuda")
    report, failed = check_cuda_program(w, results["torch"], results["cuda"])
    assert report is not None, f"{failed.failed}: {failed.status}\n{failed.log[-2000:]}"
    assert report.ok, [o for o in report.outputs if not o.ok]


# (reductions, a dozen kernels and the slowest to emulate, is in the full sweep only)
FAST = ["rmsnorm", "softmax", "layernorm", "log_softmax", "scan", "norms",
        "losses", "elementwise_chain", "transpose", "attention", "half_precision",
        # windows: convolutions (plain, depthwise, transposed) with pools
        "conv",
        # templates: ragged f16 tensor-core products, a batched bf16 linear with a fused
        # epilogue, flash attention at a ragged length, a chain cut into two products
        "matmul_half", "linear_half", "bmm", "attention_half", "chained_matmul", "matmul_tf32", "mlp_half",
        # attention written out by hand (f16 scores, a tril mask) as one flash kernel
        # (minGPT's block, attention_block, is checked by its default rows here, by
        # tests/tile_ir/test_attention_lift.py, and sampled in the full sweep)
        "attention_manual",
        # one query a head over grouped k and v (a decoding step, split-KV rows among them),
        # and seven kernels with a cut chain (a ResNet block)
        "decode_attention", "resnet_block",
        # a bf16 gate projection, then softmax and top-k over the experts (positions checked
        # by the values they pick)
        "moe_router"]


# each example's rows sampled and compiled for one target, sm_90a and sm_80 in turn (NVRTC's
# compiles are a third of the suite's time); the full sweep compiles every row for both
TARGET = {name: ("sm_90a",) if i % 2 == 0 else ("sm_80",) for i, name in enumerate(FAST)}


@pytest.mark.parametrize("name", FAST)
def test_sampled_legal_rows_are_correct(name):
    w = load_file(Path(__file__).resolve().parents[1] / "examples" / f"{name}.py")
    results = verify_rows(w, per_kernel=2, seed=7, targets=TARGET[name], where=without_clusters)
    assert results
    bad = [r for r in results if r.verdict != "ok"]
    assert not bad, bad


WGMMA = (("K", 64), ("N", 256))      # 16-byte aligned rows: wgmma (cp.async and TMA) rows legal


def _wgmma(stage: str):
    return lambda row: row.get("TILE", "").startswith("wgmma") and row["STAGE"].startswith(stage)


@pytest.mark.parametrize("stage", ["async", "tma"])
def test_sampled_wgmma_rows_are_correct(stage):
    """wgmma rows are a few hundred of several thousand: sampled on their own."""
    w = load_file(Path(__file__).resolve().parents[1] / "examples" / "matmul_half.py", WGMMA)
    results = verify_rows(w, per_kernel=2, seed=3, targets=("sm_90a",), where=_wgmma(stage))
    assert len(results) == 2
    bad = [r for r in results if r.verdict != "ok"]
    assert not bad, bad


def _wgmma_attention(row) -> bool:
    return row.get("TILE", "").startswith("wgmma")


@pytest.mark.parametrize("sets", [(), (("dtype", "bfloat16"), ("head_dim", 128),
                                       ("seq_len", 100), ("is_causal", False))],
                         ids=["f16_d64_causal", "bf16_d128_full"])
def test_sampled_wgmma_attention_rows_are_correct(sets):
    """The sm_90a attention rows on wgmma (emmy.cuda.attention_sm90), sampled on their own."""
    w = load_file(Path(__file__).resolve().parents[1] / "examples" / "attention_half.py", sets)
    results = verify_rows(w, per_kernel=2, seed=5, targets=("sm_90a",), where=_wgmma_attention)
    assert len(results) == 2
    bad = [r for r in results if r.verdict != "ok"]
    assert not bad, bad


def _overlapped_attention(row) -> bool:
    return _wgmma_attention(row) and row["STAGE"] == "async:2:overlap"


@pytest.mark.parametrize("sets", [(("seq_len", 200),), (("dtype", "bfloat16"), ("head_dim", 128),
                                                        ("seq_len", 150), ("is_causal", False))],
                         ids=["f16_d64_causal", "bf16_d128_full"])
def test_sampled_overlapped_attention_rows_are_correct(sets):
    """The wgmma attention rows with STAGE=async:2:overlap (S of a key block issued with P V of
    the block before, the softmax between their waits), sampled on their own at lengths of
    several key blocks."""
    w = load_file(Path(__file__).resolve().parents[1] / "examples" / "attention_half.py", sets)
    results = verify_rows(w, per_kernel=2, seed=11, targets=("sm_90a",),
                          where=_overlapped_attention)
    assert len(results) == 2
    assert all("overlap" in str(r.row) for r in results), results
    bad = [r for r in results if r.verdict != "ok"]
    assert not bad, bad


def _tma_attention(row) -> bool:
    return _wgmma_attention(row) and row["STAGE"].startswith("tma:")


@pytest.mark.parametrize("sets", [(("seq_len", 200),), (("dtype", "bfloat16"), ("head_dim", 128),
                                                        ("seq_len", 150), ("is_causal", False))],
                         ids=["f16_d64_causal", "bf16_d128_full"])
def test_sampled_tma_attention_rows_are_correct(sets):
    """The warp-specialized wgmma attention rows (STAGE=tma:2[:overlap]: a TMA producer
    warpgroup, tensor maps passed by the runtime), sampled on their own."""
    w = load_file(Path(__file__).resolve().parents[1] / "examples" / "attention_half.py", sets)
    results = verify_rows(w, per_kernel=2, seed=13, targets=("sm_90a",), where=_tma_attention)
    assert len(results) == 2
    assert all("STAGE=tma:" in str(r.row) for r in results), results
    bad = [r for r in results if r.verdict != "ok"]
    assert not bad, bad


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_tma_attention_sweep(dtype, head_dim):
    """Every legal warp-specialized row."""
    w = load_file(Path(__file__).resolve().parents[1] / "examples" / "attention_half.py",
                  (("dtype", dtype), ("head_dim", head_dim), ("seq_len", 200)))
    results = verify_rows(w, per_kernel=40, targets=("sm_90a",), where=_tma_attention)
    assert results
    bad = [r for r in results if r.verdict != "ok"]
    assert not bad, bad


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_wgmma_attention_sweep(dtype, head_dim):
    w = load_file(Path(__file__).resolve().parents[1] / "examples" / "attention_half.py",
                  (("dtype", dtype), ("head_dim", head_dim)))
    results = verify_rows(w, per_kernel=40, targets=("sm_90a",), where=_wgmma_attention)
    assert results
    bad = [r for r in results if r.verdict != "ok"]
    assert not bad, bad


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_overlapped_attention_sweep(dtype, head_dim):
    """Every legal overlapped row."""
    w = load_file(Path(__file__).resolve().parents[1] / "examples" / "attention_half.py",
                  (("dtype", dtype), ("head_dim", head_dim), ("seq_len", 200)))
    results = verify_rows(w, per_kernel=40, targets=("sm_90a",), where=_overlapped_attention)
    assert results
    bad = [r for r in results if r.verdict != "ok"]
    assert not bad, bad


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_wgmma_sweep(dtype):
    w = load_file(Path(__file__).resolve().parents[1] / "examples" / "matmul_half.py",
                  WGMMA + (("dtype", dtype),))
    results = verify_rows(w, per_kernel=40, targets=("sm_90a",), where=_wgmma(""))
    bad = [r for r in results if r.verdict != "ok"]
    assert not bad, bad


# int8 weights dequantized inside wgmma products: K-major at a ragged shape, and a (k, n)
# weight (MN-major, a bf16 zero point) whose columns are whole vectors of 8; int4 weights two to
# a byte with a scale per group of 128
INT8_WGMMA = {
    "k_major": ("examples/int8_linear.py", (("batch", 37), ("in_features", 136),
                                            ("out_features", 72))),
    "int4": ("examples/int4_linear.py", (("batch", 37), ("in_features", 256),
                                         ("out_features", 72))),
    "mn_major": "(lambda x, q, z, s: x @ ((q.bfloat16() - z) * s))(torch.randn(40, 72)."
                "bfloat16(), torch.randint(-127, 128, (72, 264)).to(torch.int8), "
                "torch.randint(-3, 4, (1, 264)).bfloat16(), torch.rand(1, 264).bfloat16())",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", INT8_WGMMA)
def test_int8_wgmma_sweep(name):
    source = INT8_WGMMA[name]
    w = load_file(Path(__file__).resolve().parents[1] / source[0], source[1]) \
        if isinstance(source, tuple) else load_expr(source)
    results = verify_rows(w, per_kernel=30, targets=("sm_90a",),
                          where=lambda r: _wgmma("")(r) and r.get("PLACE") == "fuse")
    # and 30 rows of each half of the cut
    assert sum("wgmma" in r.row and "_cut" not in r.kernel for r in results) == 30
    bad = [r for r in results if r.verdict != "ok"]
    assert not bad, bad


# products whose K split each tile's last block sums (REDUCE=split:S:last), at ragged shapes
SPLIT_LAST = {
    "int4": ("examples/int4_linear.py", (("batch", 37), ("in_features", 512),
                                         ("out_features", 72))),
    "bmm": ("examples/bmm.py", (("batch_size", 3), ("M", 33), ("K", 200), ("N", 40))),
    "tf32": ("examples/matmul_tf32.py", ()),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", SPLIT_LAST)
def test_split_last_sweep(name):
    path, sets = SPLIT_LAST[name]
    w = load_file(Path(__file__).resolve().parents[1] / path, sets)
    results = verify_rows(w, per_kernel=20, targets=("sm_80",),
                          where=lambda r: r.get("REDUCE", "").endswith(":last"))
    assert sum(r.row.find(":last") > 0 for r in results) >= 20     # (and a cut half's)
    bad = [r for r in results if r.verdict != "ok"]
    assert not bad, bad


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_full_sweep(path):
    results = verify_rows(load_file(path), per_kernel=20)
    bad = [r for r in results if r.verdict != "ok"]
    assert not bad, bad


# An operand that is a slice starting off a 16-byte boundary: the products' synchronous copies
# move it element by element (cp.async and TMA rows are refused), in one product and in a
# fused chain whose intermediate is sliced (found by bench/fuzz.py: 16-byte copies had read it
# misaligned)
MISALIGNED = {
    "matmul_f32": "torch.randn(16, 24) @ torch.randn(30, 68)[3:27, 2:66]",
    "matmul_f16": "torch.randn(16, 24).half() @ torch.randn(30, 72).half()[3:27, 2:66]",
    "chain_f32": "(torch.randn(4, 32, 16) @ torch.randn(16, 64))[..., 22:46] @ torch.randn(24, 64)",
    "chain_f16": "(torch.randn(2, 32, 16).half() @ torch.randn(16, 64).half())[..., 22:46] "
                 "@ torch.randn(24, 64).half()",
}


# A chain whose first product reads what the job computes before the products (a norm of A's
# rows, here over an extent-1 axis): the intermediate keeps the axes that value reads, so the
# cut kernels compile and compute each row (found by bench/fuzz.py: the cut had lost the row
# axis and read an undeclared loop variable)
PROLOGUE = {
    "rms_norm_f16": "((F.rms_norm(torch.randn(32, 1).half(), (1,)) @ torch.randn(1, 3).half()) "
                    "@ torch.randn(3, 17).half()) @ torch.randn(17, 3).half()",
    "layer_norm_bmm_f32": "torch.bmm(torch.bmm(F.layer_norm(torch.randn(4, 32, 1), (1,)) "
                          "@ torch.randn(1, 8), torch.randn(4, 8, 40)), torch.randn(4, 40, 3))",
}


@pytest.mark.parametrize("name", sorted(MISALIGNED))
def test_operands_starting_off_a_16_byte_boundary(name):
    _check_expr_and_sampled_rows(MISALIGNED[name])


@pytest.mark.parametrize("name", sorted(PROLOGUE))
def test_chains_reading_a_value_computed_before_the_products(name):
    _check_expr_and_sampled_rows(PROLOGUE[name])


def _check_expr_and_sampled_rows(expr: str) -> None:
    w = load_expr(expr)
    results = compile_to(w, "cuda")
    report, failed = check_cuda_program(w, results["torch"], results["cuda"])
    assert report is not None and report.ok, failed and failed.log[-1000:]
    sampled = verify_rows(w, per_kernel=2, seed=1, targets=("sm_90a",), where=without_clusters)
    bad = [r for r in sampled if r.verdict != "ok"]
    assert sampled and not bad, bad
