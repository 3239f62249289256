"""Determinants, inverses and solves of small matrices (up to 4 x 4: cameras' intrinsics,
rotations, homogeneous transforms, 3D geometry's per-point systems) by their closed forms:
the determinant as the sum over permutations (Laplace's expansion along the first row), the
inverse as the adjugate over it, a solve as the inverse times the right-hand side. Each
matrix's entries are elementwise values over the batch, so a batch of them is one elementwise
kernel. They compute in float64 whatever the input's type (a 4 x 4 inverse is about two hundred
products; LU's pivoting, which the closed form lacks, is what keeps float32 accurate), and
the result is rounded to the input's type once. A singular matrix gives infinities or NaN where
torch raises; larger matrices are refused (torch's LU and pivoting are not lowered)."""

from __future__ import annotations

from emmy.dtypes import DType
from emmy.tensor_ir.builder import Builder
from emmy.tensor_ir.decomp.layout import axes, lower_stack
from emmy.tensor_ir.decomp.matmul import matmul
from emmy.tensor_ir.decomp.table import Decomp, Refused, registrar
from emmy.tensor_ir.ir import EwOp as E

OPS: dict[str, Decomp] = {}
op = registrar(OPS)

LARGEST = 4


def _entries(b: Builder, a: str, name: str) -> list[list[str]]:
    """a's entries, each a tensor over the batch, in float64."""
    shape = b.shape(a)
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise Refused(f"{name} of a {shape} tensor: a square matrix (or a batch of them)")
    n = shape[-1]
    if n > LARGEST or n == 0:
        raise Refused(f"{name} of {n} x {n} matrices: emmy computes up to {LARGEST} x {LARGEST} "
                      "by their closed forms (torch's LU factorization is not lowered)")
    batch = shape[:-2]
    x = b.cast(a, DType.F64)
    return [[b.index_map(x, batch, [*axes(len(batch)), i, j]) for j in range(n)]
            for i in range(n)]


def _det(b: Builder, m: list[list[str]], rows: list[int], cols: list[int]) -> str:
    """The determinant of m's submatrix on `rows` x `cols`: the sum over permutations."""
    if len(rows) == 1:
        return m[rows[0]][cols[0]]
    if len(rows) == 2:
        (r0, r1), (c0, c1) = rows, cols
        return b.ew(E.SUB, b.ew(E.MUL, m[r0][c0], m[r1][c1]), b.ew(E.MUL, m[r0][c1], m[r1][c0]))
    total = None
    for k, c in enumerate(cols):          # along the first row
        minor = _det(b, m, rows[1:], cols[:k] + cols[k + 1:])
        term = b.ew(E.MUL, m[rows[0]][c], minor)
        total = term if total is None else b.ew(E.SUB if k % 2 else E.ADD, total, term)
    return total


def _inverse(b: Builder, m: list[list[str]]) -> tuple[list[list[str]], str]:
    """(the inverse's entries, the determinant): the adjugate over the determinant."""
    n = len(m)
    every = list(range(n))
    cof = [[_det(b, m, every[:i] + every[i + 1:], every[:j] + every[j + 1:]) if n > 1 else None
            for j in range(n)] for i in range(n)]
    if n == 1:
        return [[b.ew(E.DIV, 1.0, m[0][0])]], m[0][0]
    det = None
    for j in range(n):
        term = b.ew(E.MUL, m[0][j], cof[0][j])
        det = term if det is None else b.ew(E.SUB if j % 2 else E.ADD, det, term)
    inv = [[b.ew(E.DIV, b.ew(E.NEG, cof[j][i]) if (i + j) % 2 else cof[j][i], det)
            for j in range(n)] for i in range(n)]
    return inv, det


def _matrix(b: Builder, rows: list[list[str]], dtype: DType) -> str:
    """Entries back into [..., n, n], rounded to `dtype` once."""
    return b.cast(lower_stack(b, [lower_stack(b, r, -1) for r in rows], -2), dtype)


def _float(b: Builder, a: str) -> DType:
    dtype = b.dtype(a)
    if not dtype.is_float:
        raise Refused(f"a matrix of {dtype}: torch's linear algebra takes floating point")
    return dtype


@op("linalg_det", "det")
def lower_det(b, a):
    dtype = _float(b, a)
    m = _entries(b, a, "det")
    n = len(m)
    return b.cast(_det(b, m, list(range(n)), list(range(n))), dtype)


@op("inverse", "linalg_inv")
def lower_inverse(b, a):
    dtype = _float(b, a)
    inv, _ = _inverse(b, _entries(b, a, "inverse"))
    return _matrix(b, inv, dtype)


@op("linalg_solve")
def lower_solve(b, a, rhs, *, left=True):
    """A X = B: X = inverse(A) B, B a batch of vectors where torch takes it so (B.ndim is 1, or
    A.ndim - 1 with B's shape A's without its last axis)."""
    if not left:
        raise Refused("left=False (X A = B)")
    dtype = _float(b, a)
    inv = _matrix(b, _inverse(b, _entries(b, a, "solve"))[0], DType.F64)
    shape, rshape = b.shape(a), b.shape(rhs)
    vector = len(rshape) == 1 or (len(rshape) == len(shape) - 1 and rshape == shape[:-1])
    rhs = b.cast(rhs, DType.F64)
    if len(rshape) == 1:
        x = matmul(b, inv, rhs)
    elif vector:
        x = _column(b, matmul(b, inv, _as_column(b, rhs)))
    else:
        x = matmul(b, inv, rhs)
    return b.cast(x, dtype)


def _as_column(b: Builder, v: str) -> str:
    shape = b.shape(v)
    return b.index_map(v, (*shape, 1), axes(len(shape)))


def _column(b: Builder, x: str) -> str:
    shape = b.shape(x)
    return b.index_map(x, shape[:-1], [*axes(len(shape) - 1), 0])

