"""Layout ops: views, transposes, broadcasts, slices, flips, concatenation, tuple access.

Everything here is an IndexMap (no arithmetic), except `cat`, which selects between
index-mapped pieces with `where` over an Iota.
"""

from __future__ import annotations

import math
from typing import Sequence

from emmy.errors import InternalError
from emmy.symbolic import Lin, floordiv, mod, var
from emmy.tensor_ir.builder import Builder, broadcast_shapes
from emmy.tensor_ir.decomp.table import Decomp, Refused, registrar
from emmy.tensor_ir.ir import EwOp, axis_var

OPS: dict[str, Decomp] = {}
op = registrar(OPS)


def axes(n: int) -> list[Lin]:
    """The identity index a0, a1, …, a(n-1)."""
    return [var(axis_var(i)) for i in range(n)]


def norm_dim(d: int, rank: int) -> int:
    """A possibly negative dimension as 0 <= d < rank (rank 0 accepts 0 and -1)."""
    return d % rank if rank else 0


def norm_dims(dims, rank: int) -> tuple[int, ...]:
    """None or () means all dimensions; an int is one dimension."""
    if dims is None or dims == ():
        return tuple(range(rank))
    if isinstance(dims, int):
        dims = (dims,)
    return tuple(sorted({norm_dim(d, rank) for d in dims}))


# ---- helpers shared with the other families ----------------------------------------------------

def reshape(b: Builder, x: str, shape: Sequence[int]) -> str:
    """Row-major reshape: input index i is (flat // stride_i) % extent_i of the flat position.

    Each output axis is first written in pieces at the input's axis boundaries
    (a = (a // 4) * 4 + a % 4), so merged and split axes simplify to plain divisions.
    """
    src = b.shape(x)
    shape = infer_shape(shape, math.prod(src))
    bounds = {axis_var(i): n for i, n in enumerate(shape)}
    cuts = set(_strides(src)) | {math.prod(src)}
    flat = Lin()
    for j, (n, stride) in enumerate(zip(shape, _strides(shape))):
        flat = flat + _pieces(var(axis_var(j)), n, stride, cuts, bounds) * stride
    index = [mod(floordiv(flat, stride, bounds), n, bounds) for n, stride in zip(src, _strides(src))]
    return b.index_map(x, shape, index)


def _pieces(a: Lin, n: int, stride: int, cuts, bounds) -> Lin:
    """`a` as a sum of digits split where an input axis boundary falls inside it."""
    steps = [1]
    for cut in sorted(c // stride for c in cuts if stride < c < stride * n and c % stride == 0):
        if cut % steps[-1] == 0:
            steps.append(cut)
    out = floordiv(a, steps[-1], bounds) * steps[-1]
    for low, high in zip(steps, steps[1:]):
        out = out + mod(floordiv(a, low, bounds), high // low, bounds) * low
    return out


def infer_shape(shape: Sequence[int], numel: int) -> tuple[int, ...]:
    shape = list(shape)
    if -1 in shape:
        known = math.prod(n for n in shape if n != -1)
        shape[shape.index(-1)] = numel // known if known else 0
    if math.prod(shape) != numel:
        raise InternalError(f"cannot view {numel} elements as {tuple(shape)}")
    return tuple(shape)


def _strides(shape: Sequence[int]) -> list[int]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return out[::-1]


def permute(b: Builder, x: str, dims: Sequence[int]) -> str:
    """out axis i is input axis dims[i]."""
    rank = b.rank(x)
    dims = [norm_dim(d, rank) for d in dims]
    index = [None] * rank
    for i, d in enumerate(dims):
        index[d] = var(axis_var(i))
    return b.index_map(x, [b.shape(x)[d] for d in dims], index)


def transpose(b: Builder, x: str, d0: int, d1: int) -> str:
    dims = list(range(b.rank(x)))
    if dims:
        d0, d1 = norm_dim(d0, len(dims)), norm_dim(d1, len(dims))
        dims[d0], dims[d1] = dims[d1], dims[d0]
    return permute(b, x, dims)


def along(b: Builder, v: str, shape: Sequence[int], axis: int) -> str:
    """Spread a vector along one axis of `shape` (a per-channel weight along axis 1)."""
    return b.index_map(v, shape, [var(axis_var(axis))])


def unsqueeze(b: Builder, x: str, dim: int) -> str:
    rank = b.rank(x)
    dim = dim % (rank + 1)
    shape = list(b.shape(x))
    shape.insert(dim, 1)
    return b.index_map(x, shape, [var(axis_var(i if i < dim else i + 1)) for i in range(rank)])


def squeeze(b: Builder, x: str, dims=None) -> str:
    """Drop the extent-1 axes among `dims` (all of them when None)."""
    shape = b.shape(x)
    dims = norm_dims(dims, len(shape))
    gone = [i for i in dims if shape[i] == 1]
    index, j = [], 0
    for i in range(len(shape)):
        if i in gone:
            index.append(0)
        else:
            index.append(var(axis_var(j)))
            j += 1
    return b.index_map(x, [n for i, n in enumerate(shape) if i not in gone], index)


def expand(b: Builder, x: str, sizes: Sequence[int]) -> str:
    """Broadcast to `sizes`; -1 keeps an existing extent."""
    lead = len(sizes) - b.rank(x)
    shape = [b.shape(x)[i - lead] if n == -1 else n for i, n in enumerate(sizes)]
    return b.broadcast_to(x, shape)


def slice_axis(b: Builder, x: str, dim: int, start, end, step: int = 1) -> str:
    """x[start:end:step] along `dim`, with Python's clamping of start and end."""
    shape = list(b.shape(x))
    dim = norm_dim(dim, len(shape))
    start, end, _ = slice(start, end).indices(shape[dim])
    shape[dim] = max(0, -(-(end - start) // step))
    index = axes(len(shape))
    index[dim] = index[dim] * step + start
    return b.index_map(x, shape, index)


def select(b: Builder, x: str, dim: int, i: int) -> str:
    shape = list(b.shape(x))
    dim = norm_dim(dim, len(shape))
    i %= shape[dim]
    index = [var(axis_var(j if j < dim else j - 1)) for j in range(len(shape))]
    index[dim] = i
    del shape[dim]
    return b.index_map(x, shape, index)


def flip(b: Builder, x: str, dims: Sequence[int]) -> str:
    shape = b.shape(x)
    index = axes(len(shape))
    for d in norm_dims(tuple(dims), len(shape)):
        index[d] = index[d] * -1 + (shape[d] - 1)
    return b.index_map(x, shape, index)


def cat(b: Builder, xs: Sequence[str], dim: int = 0) -> str:
    """Concatenate along `dim`: pick each piece where the position falls in its range."""
    rank = b.rank(xs[0])
    dim = norm_dim(dim, rank)
    xs = [x for x in xs if b.shape(x)[dim] > 0] or list(xs[:1])
    shape = list(b.shape(xs[0]))
    shape[dim] = sum(b.shape(x)[dim] for x in xs)
    bounds = {axis_var(i): n for i, n in enumerate(shape)}
    pieces, start = [], 0
    for x in xs:
        n = b.shape(x)[dim]
        index = axes(rank)
        # (a_dim - start) mod n, kept non-negative: in bounds everywhere, right where it is picked
        index[dim] = mod(index[dim] + (-start) % n, n, bounds)
        pieces.append((b.index_map(x, shape, index), start + n))
        start += n
    pos = b.iota(shape, dim)
    out = pieces[-1][0]
    for piece, end in reversed(pieces[:-1]):
        out = b.ew(EwOp.WHERE, b.ew(EwOp.LT, pos, end), piece, out)
    return out


# ---- the table ---------------------------------------------------------------------------------

@op("as_strided")
def lower_as_strided(b, x, size, stride, storage_offset=None):
    """x.as_strided(size, stride, offset) of a contiguous x (the capture sees to that): output
    element (i0, i1, ...) is x's element at row-major position offset + i0 s0 + i1 s1 + ...
    (HF Longformer's overlapping chunks, icefall's relative shift)."""
    src = b.shape(x)
    size, stride, offset = [int(n) for n in size], [int(s) for s in stride], \
        int(storage_offset or 0)
    if any(s < 0 for s in stride) or offset < 0:
        raise Refused("as_strided with a negative stride or offset")
    last = offset + sum((n - 1) * s for n, s in zip(size, stride))
    if math.prod(size) and last >= math.prod(src):
        raise Refused(f"as_strided reads element {last} of a tensor of {math.prod(src)}")
    bounds = {axis_var(i): n for i, n in enumerate(size)}
    flat = Lin() + offset
    for j, s in enumerate(stride):
        flat = flat + var(axis_var(j)) * s
    index = [mod(floordiv(flat, st, bounds), n, bounds) for n, st in zip(src, _strides(src))]
    return b.index_map(x, tuple(size), index)


@op("view", "reshape", "_unsafe_view", "view_copy")
def lower_view(b, x, shape):
    return reshape(b, x, shape)


@op("view_as", "reshape_as")
def lower_view_as(b, x, other):
    return reshape(b, x, b.shape(other))


@op("flatten.using_ints")
def lower_flatten(b, x, start_dim=0, end_dim=-1):
    shape = b.shape(x)
    if not shape:
        return reshape(b, x, (1,))
    s, e = norm_dim(start_dim, len(shape)), norm_dim(end_dim, len(shape))
    return reshape(b, x, shape[:s] + (math.prod(shape[s:e + 1]),) + shape[e + 1:])


@op("unflatten.int")
def lower_unflatten(b, x, dim, sizes):
    shape = b.shape(x)
    dim = norm_dim(dim, len(shape))
    sizes = infer_shape(sizes, shape[dim])
    return reshape(b, x, shape[:dim] + sizes + shape[dim + 1:])


@op("permute")
def lower_permute(b, x, dims):
    return permute(b, x, dims)


@op("transpose.int", "swapaxes")
def lower_transpose(b, x, dim0, dim1):
    return transpose(b, x, dim0, dim1)


@op("t")
def lower_t(b, x):
    return transpose(b, x, 0, 1) if b.rank(x) == 2 else x


@op("numpy_T")
def lower_numpy_t(b, x):
    return permute(b, x, list(reversed(range(b.rank(x)))))


@op("mT")
def lower_mt(b, x):
    return transpose(b, x, -2, -1)


@op("movedim.int")
def lower_movedim(b, x, source, destination):
    rank = b.rank(x)
    dims = [d for d in range(rank) if d != norm_dim(source, rank)]
    dims.insert(norm_dim(destination, rank), norm_dim(source, rank))
    return permute(b, x, dims)


@op("expand")
def lower_expand(b, x, size, implicit=False):
    return expand(b, x, size)


@op("expand_as", "broadcast_to")
def lower_expand_as(b, x, other):
    return b.broadcast_to(x, other if isinstance(other, tuple) else b.shape(other))


@op("broadcast_tensors")
def lower_broadcast_tensors(b, tensors):
    shape = broadcast_shapes(*(b.shape(t) for t in tensors))
    return tuple(b.broadcast_to(t, shape) for t in tensors)


@op("unsqueeze")
def lower_unsqueeze(b, x, dim):
    return unsqueeze(b, x, dim)


@op("squeeze", "squeeze.dim", "squeeze.dims")
def lower_squeeze(b, x, dim=None):
    return squeeze(b, x, dim)


@op("slice.Tensor")
def lower_slice(b, x, dim=0, start=None, end=None, step=1):
    return slice_axis(b, x, dim, start, end, step)


def window_start(b: Builder, start: str, n: int, length: int) -> str:
    """A window's first position that a 0-d integer tensor holds (a number read off a tensor,
    `x.narrow(1, t.item(), 4)`): negative from the end, then clamped so the whole window lies
    in the axis (torch would raise where it does not)."""
    wrapped = b.ew(EwOp.WHERE, b.ew(EwOp.LT, start, 0), b.ew(EwOp.ADD, start, n), start)
    return b.ew(EwOp.MIN, b.ew(EwOp.MAX, wrapped, 0), max(n - length, 0))


@op("narrow")
def lower_narrow(b, x, dim, start, length):
    if isinstance(start, str):          # a position the data holds: its window's positions
        from emmy.tensor_ir.decomp.indexing import lower_index_select

        dim = norm_dim(dim, b.rank(x))
        first = window_start(b, start, b.shape(x)[dim], length)
        return lower_index_select(b, x, dim, b.ew(EwOp.ADD, b.iota((length,), 0), first))
    if start < 0:
        start += b.shape(x)[norm_dim(dim, b.rank(x))]
    return slice_axis(b, x, dim, start, start + length)


@op("select.int")
def lower_select(b, x, dim, index):
    if isinstance(index, str):          # a position the data holds (emb[t], t a 0-d tensor)
        from emmy.tensor_ir.decomp.indexing import select_at

        return select_at(b, x, dim, index)
    return select(b, x, dim, index)


@op("unbind.int")
def lower_unbind(b, x, dim=0):
    return tuple(select(b, x, dim, i) for i in range(b.shape(x)[norm_dim(dim, b.rank(x))]))


def split(b: Builder, x: str, sizes: Sequence[int], dim: int) -> tuple[str, ...]:
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return tuple(slice_axis(b, x, dim, s, s + n) for s, n in zip(starts, sizes))


@op("split.Tensor")
def lower_split(b, x, split_size, dim=0):
    n = b.shape(x)[norm_dim(dim, b.rank(x))]
    return split(b, x, [min(split_size, n - s) for s in range(0, n, split_size)], dim)


@op("split_with_sizes")
def lower_split_with_sizes(b, x, split_sizes, dim=0):
    return split(b, x, list(split_sizes), dim)


@op("chunk")
def lower_chunk(b, x, chunks, dim=0):
    n = b.shape(x)[norm_dim(dim, b.rank(x))]
    return lower_split(b, x, -(-n // chunks), dim)


@op("flip")
def lower_flip(b, x, dims):
    return flip(b, x, dims)


@op("roll")
def lower_roll(b, x, shifts, dims=()):
    """out[..., i, ...] = x[..., (i - shift) mod n, ...]; without dims, over the flattened
    tensor."""
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims)
    if not dims:
        shape = b.shape(x)
        return reshape(b, lower_roll(b, reshape(b, x, (math.prod(shape),)), shifts, [0]), shape)
    if len(shifts) != len(dims):
        raise Refused(f"roll: {len(shifts)} shifts for {len(dims)} dims")
    shape = b.shape(x)
    bounds = {axis_var(i): n for i, n in enumerate(shape)}
    index = axes(len(shape))
    for shift, d in zip(shifts, dims):
        d = norm_dim(d, len(shape))
        if shape[d]:
            index[d] = mod(index[d] - shift, shape[d], bounds)
    return b.index_map(x, shape, index)


@op("diagonal")
def lower_diagonal(b, x, offset=0, dim1=0, dim2=1):
    """The diagonal of dims (dim1, dim2) as a new last axis (x[..., i, i + offset])."""
    shape = b.shape(x)
    d1, d2 = norm_dim(dim1, len(shape)), norm_dim(dim2, len(shape))
    n = max(0, min(shape[d1] - max(0, -offset), shape[d2] - max(0, offset)))
    rest = [i for i in range(len(shape)) if i not in (d1, d2)]
    out = [shape[i] for i in rest] + [n]
    i = var(axis_var(len(rest)))
    index: list = [None] * len(shape)
    for j, src in enumerate(rest):
        index[src] = var(axis_var(j))
    index[d1], index[d2] = i + max(0, -offset), i + max(0, offset)
    return b.index_map(x, out, index)


@op("diag")
def lower_diag(b, x, diagonal=0):
    """A vector onto the `diagonal`-th diagonal of a square matrix, or a matrix's diagonal."""
    if b.rank(x) == 2:
        return lower_diagonal(b, x, diagonal)
    if b.rank(x) != 1:
        raise Refused(f"diag takes a vector or a matrix, got rank {b.rank(x)}")
    n = b.shape(x)[0] + abs(diagonal)
    shape = (n, n)
    bounds = {axis_var(i): m for i, m in enumerate(shape)}
    row, col = var(axis_var(0)), var(axis_var(1))
    along = row if diagonal >= 0 else col           # the position along x
    values = b.index_map(x, shape, [mod(along, b.shape(x)[0], bounds)])
    on = b.ew(EwOp.EQ, b.ew(EwOp.SUB, b.iota(shape, 1), b.iota(shape, 0)), diagonal)
    return b.ew(EwOp.WHERE, on, values, 0)


@op("unfold")
def lower_unfold(b, x, dimension, size, step):
    """Windows of `size` elements every `step` along `dimension` (Tensor.unfold): that
    dimension counts the windows, a new last one the elements of each,
    out[..., w, ..., e] = x[..., w * step + e, ...]."""
    shape = list(b.shape(x))
    d = norm_dim(dimension, len(shape))
    n = shape[d] if shape else 1
    if size > n or size < 0 or step < 1:
        raise Refused(f"windows of {size} every {step} along a dimension of {n}")
    if not shape:                                   # a 0-d tensor: one window of itself
        return b.index_map(x, [size], [])
    shape[d] = (n - size) // step + 1
    index = axes(len(shape))
    index[d] = index[d] * step + var(axis_var(len(shape)))
    return b.index_map(x, shape + [size], index)


@op("repeat")
def lower_repeat(b, x, repeats):
    src = (1,) * (len(repeats) - b.rank(x)) + b.shape(x)
    y = reshape(b, x, src)
    shape = [r * n for r, n in zip(repeats, src)]
    bounds = {axis_var(i): n for i, n in enumerate(shape)}
    return b.index_map(y, shape, [mod(var(axis_var(i)), n, bounds) for i, n in enumerate(src)])


@op("repeat_interleave.self_int")
def lower_repeat_interleave(b, x, repeats, dim=None, *, output_size=None):
    """Each element `repeats` times in a row along `dim` (the flattened tensor when None):
    out[.., i, ..] = x[.., i // repeats, ..]. A tensor of repeats is another op (refused)."""
    if not isinstance(repeats, int) or repeats < 1:
        raise Refused(f"repeats={repeats!r}: a positive int is an index map")
    if dim is None:
        x, dim = reshape(b, x, (math.prod(b.shape(x)),)), 0
    dim = norm_dim(dim, b.rank(x))
    shape = list(b.shape(x))
    shape[dim] *= repeats
    bounds = {axis_var(i): n for i, n in enumerate(shape)}
    index = axes(len(shape))
    index[dim] = floordiv(index[dim], repeats, bounds)
    return b.index_map(x, shape, index)


@op("cat")
def lower_cat(b, tensors, dim=0):
    return cat(b, tensors, dim)


@op("stack")
def lower_stack(b, tensors, dim=0):
    rank = b.rank(tensors[0]) + 1
    return cat(b, [unsqueeze(b, t, dim % rank) for t in tensors], dim % rank)


@op("contiguous", "clone", "alias", "detach", "detach_", "lift_fresh_copy",
    # of a real tensor (a complex one's are emmy.tensor_ir.complex's)
    "conj_physical", "resolve_conj", "resolve_neg", "positive", "real")
def lower_copy(b, x, *args, **kwargs):
    return x


# ---- whole tensors with a part replaced: what torch makes of writes into views ----------------
# (`y[:, 0] = 1` is select_scatter(y, fill(...), 1, 0); `y[..., 1:] = x` slice_scatter(y, x, ...))

def _as_type_of(b: Builder, x: str, value, shape: Sequence[int]):
    """`value` (a tensor or a number) in x's element type, broadcast to `shape`."""
    if not isinstance(value, str):
        return b.full(shape, value, b.dtype(x))
    return b.broadcast_to(b.cast(value, b.dtype(x)), shape)


@op("fill.Scalar", "fill.Tensor", "copy")
def lower_fill(b, x, value, non_blocking=False):
    """x's shape and type, every element `value` (fill) or `value` broadcast (copy)."""
    return _as_type_of(b, x, value, b.shape(x))


def _scatter_window(b: Builder, x: str, src: str, dim: int, start, step: int) -> str:
    """slice_scatter at a position the data holds (`cache.narrow(1, t.item(), 4).copy_(v)`):
    src's extent along `dim` is the window's; its start clamped as a read's (window_start)."""
    if step != 1 or start is None or not isinstance(src, str):
        raise Refused("a write into a slice at a position the data holds, other than of a "
                      "tensor with step 1")
    shape = list(b.shape(x))
    m = b.shape(src)[dim]
    first = window_start(b, start, shape[dim], m) if isinstance(start, str) else start
    offset = b.ew(EwOp.SUB, b.iota(shape, dim), first)      # the position within the window
    on = b.ew(EwOp.AND, b.ew(EwOp.GE, offset, 0), b.ew(EwOp.LT, offset, m))
    from emmy.tensor_ir.decomp.indexing import lower_index_select

    along = b.ew(EwOp.SUB, b.iota((shape[dim],), 0), first)    # wrapped where not selected
    values = lower_index_select(b, b.cast(src, b.dtype(x)), dim, along)
    return b.ew(EwOp.WHERE, on, values, x)


@op("select_scatter")
def lower_select_scatter(b, x, src, dim, index):
    """x with its `index`-th slice along `dim` replaced by src."""
    shape = b.shape(x)
    dim = norm_dim(dim, len(shape))
    if isinstance(index, str):          # a position the data holds (`x[:, t.item()] = v`)
        index = window_start(b, index, shape[dim], 1)
    else:
        index %= shape[dim]
    placed = _as_type_of(b, x, unsqueeze(b, src, dim) if isinstance(src, str) else src, shape)
    return b.ew(EwOp.WHERE, b.ew(EwOp.EQ, b.iota(shape, dim), index), placed, x)


@op("diagonal_scatter")
def lower_diagonal_scatter(b, x, src, offset=0, dim1=0, dim2=1):
    """x with its diagonal (as `diagonal(x, offset, dim1, dim2)` reads it) replaced by src,
    whose last dimension runs along the diagonal."""
    shape = list(b.shape(x))
    d1, d2 = norm_dim(dim1, len(shape)), norm_dim(dim2, len(shape))
    n = b.shape(src)[-1] if isinstance(src, str) and b.rank(src) else 0
    if n == 0:
        return x
    bounds = {axis_var(i): m for i, m in enumerate(shape)}
    rest = [var(axis_var(i)) for i in range(len(shape)) if i not in (d1, d2)]
    skip = max(0, -offset)                 # rows above the diagonal's first element
    along = mod(var(axis_var(d1)) - skip, n, bounds)   # (wrapped where not on the diagonal)
    values = b.index_map(b.cast(src, b.dtype(x)), shape, rest + [along])
    on = b.ew(EwOp.EQ, b.ew(EwOp.SUB, b.iota(shape, d2), b.iota(shape, d1)), offset)
    return b.ew(EwOp.WHERE, on, values, x)


@op("fill_diagonal")
def lower_fill_diagonal(b, x, fill_value, wrap=False):
    """fill_diagonal_ out of place: every element whose indices are all equal; a tall matrix
    with wrap=True starts the diagonal again every columns + 1 rows."""
    shape = b.shape(x)
    if len(shape) < 2 or (len(shape) > 2 and len(set(shape)) != 1):
        raise Refused(f"fill_diagonal_ of a tensor of shape {tuple(shape)}: a matrix, or all "
                      "dimensions equal")
    if wrap and len(shape) == 2 and shape[0] > shape[1] + 1:
        rows, cols = shape
        bounds = {axis_var(0): rows, axis_var(1): cols}
        first = b.ew(EwOp.EQ, b.iota([cols + 1], 0), 0)
        flat = var(axis_var(0)) * cols + var(axis_var(1))
        on = b.index_map(first, shape, [mod(flat, cols + 1, bounds)])
    else:
        on = b.ew(EwOp.EQ, b.iota(shape, 0), b.iota(shape, 1))
        for d in range(2, len(shape)):
            on = b.ew(EwOp.AND, on, b.ew(EwOp.EQ, b.iota(shape, 0), b.iota(shape, d)))
    return b.ew(EwOp.WHERE, on, _as_type_of(b, x, fill_value, shape), x)


@op("slice_scatter")
def lower_slice_scatter(b, x, src, dim=0, start=None, end=None, step=1):
    """x with x[start:end:step] along `dim` replaced by src: where a position is one of the
    slice's, src at (position - start) / step (an index map, wrapped into range elsewhere and
    not selected there)."""
    shape = list(b.shape(x))
    dim = norm_dim(dim, len(shape))
    if isinstance(start, str) or isinstance(end, str):
        return _scatter_window(b, x, src, dim, start, step)
    start, end, _ = slice(start, end).indices(shape[dim])
    m = len(range(start, end, step))
    if m == 0:
        return x
    bounds = {axis_var(i): n for i, n in enumerate(shape)}
    p = var(axis_var(dim))
    lead = -(-start // step)                       # p + c is a multiple of step on the slice
    c = lead * step - start
    index = axes(len(shape))
    index[dim] = mod(floordiv(p + c, step, bounds) - lead, m, bounds)
    src_shape = shape[:dim] + [m] + shape[dim + 1:]
    values = b.index_map(_as_type_of(b, x, src, src_shape), shape, index)
    pos = b.iota(shape, dim)
    on = b.ew(EwOp.AND, b.ew(EwOp.GE, pos, start), b.ew(EwOp.LE, pos, start + (m - 1) * step))
    if step > 1:
        first = b.ew(EwOp.EQ, b.iota([step], 0), 0)       # position 0 of each step
        on = b.ew(EwOp.AND, on, b.index_map(first, shape, [mod(p + c, step, bounds)]))
    return b.ew(EwOp.WHERE, on, values, x)


@op("dropout")
def lower_dropout(b, x, p=0.5, train=False):
    if train and p > 0:
        raise Refused("dropout in training mode draws a random mask at each call, which a "
                      "compiled program does not reproduce (model.eval() for nn.Dropout; "
                      "F.dropout(..., training=self.training) rather than training=True)")
    return x


@op("_assert_tensor_metadata")
def lower_assert_metadata(b, x, *args, **kwargs):
    return None


@op("getitem")
def lower_getitem(b, seq, i):
    return seq[i]
