"""Reductions, softmax and scans against eager PyTorch."""

import pytest
import torch

REDUCTIONS = {
    "sum_all": lambda x: x.sum(),
    "sum_dim": lambda x: x.sum(1),
    "sum_dims_keepdim": lambda x: x.sum((0, 2), keepdim=True),
    "sum_neg_dim": lambda x: torch.sum(x, -1),
    "mean_all": lambda x: x.mean(),
    "mean_dims": lambda x: x.mean((1, 2)),
    "mean_keepdim": lambda x: x.mean(-1, keepdim=True),
    "prod": lambda x: torch.prod(x, 1),
    "prod_all": lambda x: torch.prod(x * 0.5 + 1),
    "max_all": lambda x: x.max(),
    "min_all": lambda x: x.min(),
    "amax": lambda x: torch.amax(x, (0, 1)),
    "amin_keepdim": lambda x: torch.amin(x, 2, keepdim=True),
    "max_dim": lambda x: torch.max(x, 1),
    "min_dim_keepdim": lambda x: torch.min(x, -1, keepdim=True),
    "argmax": lambda x: torch.argmax(x, 2),
    "argmin_keepdim": lambda x: torch.argmin(x, 0, keepdim=True),
    "argmax_flat": lambda x: torch.argmax(x),
    "var": lambda x: x.var(1),
    "std_keepdim": lambda x: x.std(-1, keepdim=True),
    "var_biased": lambda x: torch.var(x, (0, 2), correction=0),
    "any_all": lambda x: ((x > 1).any(1), (x > -3).all()),
    "count_positive": lambda x: (x > 0).sum(1),
    "logsumexp": lambda x: torch.logsumexp(x, 1),
    "var_mean": lambda x: torch.var_mean(x, 1),
    "var_mean_all": lambda x: torch.var_mean(x),
    "std_mean_keepdim": lambda x: torch.std_mean(x, (0, 2), correction=0, keepdim=True),
    "softmax": lambda x: torch.softmax(x, -1),
    "softmax_dim0": lambda x: torch.softmax(x, 0),
    "log_softmax": lambda x: torch.log_softmax(x, 1),
    "softmin": lambda x: torch.nn.functional.softmin(x, 2),
    "softmax_f64": lambda x: torch.softmax(x, 1, dtype=torch.float64),
    "size_one_axis": lambda x: x[:, :1].sum(1) + x[:, :1].amax(1),
}

SCANS = {
    "cumsum": lambda x: torch.cumsum(x, 1),
    "cumsum_last": lambda x: torch.cumsum(x, -1),
    "cumprod": lambda x: torch.cumprod(x * 0.3 + 1, 0),
    "reverse_cumsum": lambda x: torch.cumsum(x.flip(1), 1).flip(1),
    "exclusive_cumsum": lambda x: torch.cumsum(x, 1) - x,
    "int_cumsum": lambda x: torch.cumsum((x > 0).to(torch.int32), 1),
    "cummax": lambda x: torch.cummax(x, 1),
    "cummin_dim0": lambda x: torch.cummin(x, 0),
    "cummax_ties": lambda x: torch.cummax(torch.round(x), 1),
    "logcumsumexp": lambda x: torch.logcumsumexp(x * 40, 1),
    "reverse_logcumsumexp": lambda x: torch.logcumsumexp(x.flip(0), 0).flip(0),
}


@pytest.mark.parametrize("name", REDUCTIONS)
def test_reduction(check, name):
    check(REDUCTIONS[name], torch.randn(3, 5, 7))


@pytest.mark.parametrize("name", SCANS)
def test_scan(check, name):
    check(SCANS[name], torch.randn(4, 9))


def test_reverse_cumsum_is_one_reversed_scan(check):
    program = check(SCANS["reverse_cumsum"], torch.randn(4, 9))
    (scan,) = [d for d in program.defs if type(d).__name__ == "Scan"]
    assert scan.reverse and not scan.exclusive
    assert program.outputs == (scan.name,)  # the two flips cancel


def test_cumsum_minus_input_is_an_exclusive_scan(check):
    program = check(SCANS["exclusive_cumsum"], torch.randn(4, 9))
    (scan,) = [d for d in program.defs if type(d).__name__ == "Scan"]
    assert scan.exclusive and program.outputs == (scan.name,)


def test_softmax_subtracts_the_row_max(check):
    program = check(REDUCTIONS["softmax"], torch.randn(3, 5, 7) * 100)
    ops = [str(getattr(d, "op", "")) for d in program.defs]
    assert "max" in ops and ops.index("max") < ops.index("exp")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_sum_and_softmax_accumulate_in_f32(check, dtype):
    program = check(lambda x: (x.sum(1), torch.softmax(x, 1)), torch.randn(4, 300).to(dtype))
    reduces = [d for d in program.defs if type(d).__name__ == "Reduce"]
    assert reduces and all(str(d.type.dtype) == "f32" for d in reduces)


def test_cummax_with_nan_and_ties_keeps_torch_positions(check):
    nan = float("nan")
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, nan, 5.0, nan], [2.0, 2.0, 1.0, 2.0, 0.0, 4.0, 4.0]])
    check(lambda t: (torch.cummax(t, 1), torch.cummin(t, 1)), x)


@pytest.mark.parametrize("expr", [
    "torch.cummax(torch.randint(0, 5, (16, 100)).float(), 1)",
    "torch.cummin(torch.randn(300, 7).half(), 0)",
])
def test_cummax_emitted_cuda_matches_eager(expr):
    from tests.tensor_ir.emitted import assert_emitted_cuda_matches_eager

    assert_emitted_cuda_matches_eager(expr)


# any / all are max / min over bool: the accumulator starts at false for any (true for all)
# and crosses lanes as an int (CUDA's shuffles take no bool). Most rows of `> 2` over 16
# values hold no true value, so a wrong start value shows.
@pytest.mark.parametrize("expr", [
    "torch.any(torch.randn(64, 16) > 2, dim=-1).float()",
    "torch.all(torch.randn(64, 16) > -2, dim=-1).float()",
    "torch.any(torch.randn(8, 16, 4) > 2, dim=1).float()",
    "torch.any(torch.randn(4, 3000) > 3.5, dim=-1).float()",
    "torch.cummax(torch.randn(8, 64) > 0, dim=-1).values.float()",
])
def test_bool_reductions_on_sampled_rows_compile_and_match_eager(expr):
    from tests.tensor_ir.emitted import assert_sampled_rows_match_eager

    assert_sampled_rows_match_eager(expr, per_kernel=3, seed=4)


# argmax / argmin take the first NaN of a row, as torch's max and min propagate NaN: about one
# value in ten is NaN here, so most rows hold one or more, at other positions each check
@pytest.mark.parametrize("expr", [
    "torch.where(torch.rand(64, 40) > 0.9, float('nan'), torch.randn(64, 40)).argmax(-1)",
    "torch.where(torch.rand(64, 40) > 0.9, float('nan'), torch.randn(64, 40)).argmin(-1)",
    "torch.where(torch.rand(4, 3000) > 0.999, float('nan'), torch.randn(4, 3000)).half()"
    ".max(dim=-1).indices",
])
def test_argmax_and_argmin_take_the_first_nan_on_sampled_rows(expr):
    from tests.tensor_ir.emitted import assert_sampled_rows_match_eager

    assert_sampled_rows_match_eager(expr, per_kernel=3, seed=5)


def test_logcumsumexp_keeps_small_values_under_a_large_maximum(check):
    """One scan combining from the larger value: -1000 then 0 gives -1000 then 0 (a shift by
    the row's maximum would give -inf first); -inf is the identity and NaN propagates."""
    x = torch.tensor([[-1000.0, 0.0, float("-inf"), 5.0, float("nan"), 1.0],
                      [float("-inf"), float("-inf"), 88.0, 89.0, -3.0, float("inf")]])
    program = check(lambda t: torch.logcumsumexp(t, 1), x)
    assert [type(d).__name__ for d in program.defs].count("Scan") == 1


@pytest.mark.parametrize("expr", [
    "torch.logcumsumexp(torch.randn(8, 300) * 20, 1)",
    "torch.logcumsumexp(torch.randn(500, 4).half(), 0)",
])
def test_logcumsumexp_on_sampled_rows_compiles_and_matches_eager(expr):
    from tests.tensor_ir.emitted import assert_sampled_rows_match_eager

    assert_sampled_rows_match_eager(expr, per_kernel=3, seed=12)
