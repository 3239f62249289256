"""Constant sparse matrices (a graph's normalized adjacency as LightGCN keeps it: a COO tensor
attribute) times dense ones, as static-shape Torch IR.

The matrix is a constant, so its structure is known when the model is compiled: it is stored as
ELLPACK, each row's column positions and values padded to the longest row's count R (position 0,
value 0), and `torch.sparse.mm(G, x)` becomes a gather of x's rows at those positions, a
multiply by the values and a sum over R: M x R x N multiply-adds, where a dense G would take
M x K x N (R is the most nonzeros a row has).
"""

from __future__ import annotations

from dataclasses import dataclass

from emmy.dtypes import DType, from_torch
from emmy.errors import UserError
from emmy.torch_ir.ir import Node, Ref, TensorType

# the ops that multiply a sparse constant (their first operand) by a dense matrix
PRODUCTS = ("_sparse_mm", "mm", "matmul")


@dataclass(frozen=True)
class SparseConstant:
    columns: str            # placeholder names of the ELLPACK arrays, (M, R) each
    values: str
    shape: tuple[int, int]
    width: int              # R
    dtype: DType


def ellpack(value):
    """(columns, values), each (M, R): a 2-D COO constant's nonzeros row by row, padded."""
    import torch

    if value.dim() != 2 or value.dense_dim() != 0:
        raise UserError(f"a sparse constant of shape {tuple(value.shape)} with dense "
                        "dimensions: emmy takes 2-D COO matrices")
    value = value.coalesce()
    rows, cols = value.indices()
    rows_n = value.shape[0]
    counts = torch.bincount(rows, minlength=rows_n)
    width = max(int(counts.max()) if counts.numel() else 0, 1)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(rows.numel()) - starts[rows]        # coalesced: sorted by row
    columns = torch.zeros(rows_n, width, dtype=torch.int64)
    values = torch.zeros(rows_n, width, dtype=value.dtype)
    columns[rows, slot] = cols
    values[rows, slot] = value.values()
    return columns, values


def product_nodes(name: str, sparse: SparseConstant, x: Ref, x_type: TensorType,
                  source: str | None) -> list[Node]:
    """`name` = sparse @ x as a gather of x's rows, a multiply and a sum over the row's slots."""
    m, k = sparse.shape
    if len(x_type.shape) != 2 or x_type.shape[0] != k:
        raise UserError(f"a sparse ({m}, {k}) matrix times a tensor of shape {x_type.shape}: "
                        "emmy takes a 2-D dense right operand")
    n, r = x_type.shape[1], sparse.width
    rows = TensorType((m, r, n), x_type.dtype)
    return [
        Node(name=f"{name}_rows", op="embedding", args=(x, Ref(sparse.columns)), type=rows,
             source=source),
        Node(name=f"{name}_weights", op="unsqueeze", args=(Ref(sparse.values), -1),
             type=TensorType((m, r, 1), sparse.dtype), source=source),
        Node(name=f"{name}_terms", op="mul.Tensor",
             args=(Ref(f"{name}_rows"), Ref(f"{name}_weights")), type=rows, source=source),
        Node(name=name, op="sum.dim_IntList", args=(Ref(f"{name}_terms"), (1,)),
             type=TensorType((m, n), x_type.dtype), source=source),
    ]


def constant(name: str, value) -> tuple[SparseConstant, dict]:
    """The SparseConstant for a COO value, and its arrays by placeholder name."""
    columns, values = ellpack(value)
    info = SparseConstant(f"{name}_columns", f"{name}_values", tuple(value.shape),
                          columns.shape[1], from_torch(values.dtype))
    return info, {info.columns: columns, info.values: values}
