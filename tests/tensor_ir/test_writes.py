"""Writes into tensors, as model code makes them: slice and element assignment (`y[:, 0] = 1`,
`out[..., 1:] = x[..., :-1]`), masked assignment (`y[mask] = 0`) and writes at positions
(`y[idx] = v`, `index_put_(..., accumulate=True)`). torch functionalizes them (slice_scatter,
select_scatter, copy, fill, index_put); each case runs through the emitted CUDA on the
emulator against eager, and what cannot be written without run-time shapes is refused."""

import pytest
import torch
import torch.nn as nn

from emmy.errors import UnsupportedOp, UserError
from emmy.frontend.workload import Workload
from emmy.pipeline import compile_to
from tests.tensor_ir.emitted import assert_workload_cuda_matches_eager

IDX = torch.tensor([4, -1, 0])


class Writes(nn.Module):
    """y = x.clone(), then `body` (statements over x, y and idx), then y."""

    def __init__(self, body: str):
        super().__init__()
        self.body = body

    def forward(self, x, idx):
        y = x.clone()
        exec(compile(self.body, "<write>", "exec"), {"torch": torch}, {"x": x, "y": y, "idx": idx})
        return y


CASES = {
    "element": "y[-1, 3] = 0.5",
    "row": "y[2] = x[0] * 2",
    "column_add": "y[:, 0] += 1",
    "every_other": "y[:, ::2] = 0",
    "strided_from": "y[..., 1::3] = x[..., :4] * 2",
    "block": "y[2:5, 3:9:2] = x[:3, :3]",
    "view_of_view": "y[1:3][:, 0] = 5",
    "shift": "y[:, 1:] = x[:, :-1]\ny[:, 0] = 0",
    "mask": "y[(x > 1) | x.isnan()] = 0",
    "mask_tensor_value": "y[x < 0] = x.amax()",
    "mask_rows": "y[x[:, 0] > 0] = -1.0",
    # updates through a mask, rewritten as where(mask, f(x), x) (emmy/torch_ir/masked.py)
    "mask_update": "y[x > 0] = x[x > 0] * 2",
    "mask_augmented": "y[(x < 0) & (x > -1)] -= 1",
    "mask_rows_update": "y[x[:, 0] > 0] *= x[1] + 1",
    "positions": "y[idx] = x[:3] + 1",
    "positions_dim1": "y[:, idx] = x[:, :3]",
    "positions_accumulate": "y.index_put_((idx,), torch.ones(12), accumulate=True)",
    # several index tensors, or one of rank 2: reductions over the writes (IDX repeats none;
    # 4 and -1 along dim 1 of 12, -1 counting from the end)
    "positions_pairs": "y[idx, idx] = x[0, :3]",
    "positions_pairs_accumulate": "y.index_put_((idx.abs(), idx), torch.ones(3), "
                                  "accumulate=True)",
    "positions_grid": "y[idx.reshape(3, 1), idx] = 7.0",
    "positions_rank_2": "y[:, idx.reshape(3, 1)] += 1",
    "fill_diagonal": "y.fill_diagonal_(0)",
    "diagonal_zero": "y.diagonal().zero_()",
    "diagonal_offset": "y.diagonal(2).copy_(x[0, :6] * 3)",
}
# (body, shape of x) for writes that need another shape
SHAPED = {
    "fill_diagonal_wrap": ("y.fill_diagonal_(2.0, wrap=True)", (20, 4)),
    "fill_diagonal_cube": ("y.fill_diagonal_(1.5)", (4, 4, 4)),
    "diagonal_of_a_batch": ("y.diagonal(-1, 1, 2).fill_(3)", (3, 5, 5)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", CASES)
def test_write_matches_eager(name, dtype):
    if dtype is torch.bfloat16 and name not in ("shift", "mask", "positions_dim1", "block"):
        pytest.skip("bf16 on a sample of the cases")
    x = torch.randn(6, 12).to(dtype)
    x[0, 1] = float("nan")
    w = Workload(name, Writes(CASES[name]).eval(), (x, IDX), source=CASES[name],
                 origin="<test>")
    assert_workload_cuda_matches_eager(w)


@pytest.mark.parametrize("name", SHAPED)
def test_shaped_write_matches_eager(name):
    body, shape = SHAPED[name]
    w = Workload(name, Writes(body).eval(), (torch.randn(shape), IDX), source=body,
                 origin="<test>")
    assert_workload_cuda_matches_eager(w)


@pytest.mark.parametrize("body, message", [
    ("y[x > 0] = x[x > 0].cumsum(0)", "data-dependent shape .*torch.where"),
    ("y[x > 0] = x[x < 0][:1]", "data-dependent"),
])
def test_writes_needing_run_time_shapes_are_refused(body, message):
    w = Workload("w", Writes(body).eval(), (torch.randn(6, 12), IDX), source=body,
                 origin="<test>")
    with pytest.raises((UnsupportedOp, UserError), match=message):
        compile_to(w, "tensor")


@pytest.mark.parametrize("body", ["y[idx, :, idx] = x[0, :, :3].T * 2",
                                  "y[idx, 1:, idx] += 1.5",
                                  "y[idx.reshape(3, 1), :, idx] = x[1, :, :3]"])
def test_index_tensors_on_dimensions_apart_take_their_values_first(body):
    """Index tensors on dimensions apart: the values' shape is the indices' broadcast shape
    first, then the other dimensions (torch's rule)."""
    w = Workload("w", Writes(body).eval(), (torch.randn(6, 3, 12), IDX), source=body,
                 origin="<test>")
    assert_workload_cuda_matches_eager(w)
