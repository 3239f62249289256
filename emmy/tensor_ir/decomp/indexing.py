"""Reads at data-dependent positions: embedding, gather, index_select, take_along_dim and
tensor indexing (`x[idx]`, `x[:, idx]`, `x[i, j]`), each one Gather; and writes at them
(scatter, scatter_add, scatter_reduce, index_copy, index_add, index_fill, index_put): with few
positions a row, a compare and select per position; with more, reductions over the writes,
each output element reading every write along its dimension.

Each index tensor is broadcast to the result's shape; `Builder.gather` wraps negative
positions and clamps the rest into range (torch raises on an index out of range; a kernel
reads the nearest row instead of faulting).
"""

from __future__ import annotations

import math

from emmy.dtypes import DType
from emmy.symbolic import mod, var
from emmy.tensor_ir.builder import Builder, broadcast_shapes
from emmy.tensor_ir.decomp.layout import axes, expand, norm_dim, reshape, squeeze
from emmy.tensor_ir.decomp.pooling import combine
from emmy.tensor_ir.decomp.table import Decomp, Refused, TorchShaped, registrar
from emmy.tensor_ir.ir import EwOp as E
from emmy.tensor_ir.ir import ReduceOp as R
from emmy.tensor_ir.ir import axis_var, gather_var
from emmy.tensor_ir.semantics import identity

OPS: dict[str, Decomp] = {}
op = registrar(OPS)


def _positions(b: Builder, i: str) -> str:
    if b.dtype(i) not in (DType.I32, DType.I64):
        raise Refused(f"an index tensor of {b.dtype(i)} (a boolean mask selects a number of "
                      "elements only known at run time; integer positions only)")
    return i


@op("embedding")
def lower_embedding(b, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    idx = _positions(b, indices)
    rows, dim = b.shape(weight)
    shape = b.shape(idx) + (dim,)
    placed = b.index_map(idx, shape, axes(b.rank(idx)))
    return b.gather(weight, shape, [var(gather_var(0)), var(axis_var(len(shape) - 1))], [placed])


@op("gather")
def lower_gather(b, x, dim, index, sparse_grad=False):
    idx = _positions(b, index)
    rank = b.rank(x)
    if rank == 0:
        return x
    dim = norm_dim(dim, rank)
    shape = b.shape(idx)
    where = [var(gather_var(0)) if j == dim else var(axis_var(j)) for j in range(rank)]
    return b.gather(x, shape, where, [idx])


@op("take_along_dim")
def lower_take_along_dim(b, x, indices, dim=None):
    idx = _positions(b, indices)
    if dim is None:
        return lower_gather(b, reshape(b, x, (-1,)), 0, reshape(b, idx, (-1,)))
    rank = b.rank(x)
    dim = norm_dim(dim, rank)
    common = list(broadcast_shapes(_without(b.shape(x), dim), _without(b.shape(idx), dim)))
    x = expand(b, x, common[:dim] + [b.shape(x)[dim]] + common[dim + 1:])
    idx = expand(b, idx, common[:dim] + [b.shape(idx)[dim]] + common[dim + 1:])
    return lower_gather(b, x, dim, idx)


def _without(shape, dim: int) -> tuple[int, ...]:
    return tuple(1 if j == dim else n for j, n in enumerate(shape))


@op("index_select")
def lower_index_select(b, x, dim, index):
    idx = _positions(b, index)
    if b.rank(idx) > 1:
        raise Refused("index_select takes a 1-D index")
    rank = b.rank(x)
    if rank == 0:
        return x
    dim = norm_dim(dim, rank)
    shape = list(b.shape(x))
    shape[dim] = b.shape(idx)[0] if b.rank(idx) else 1
    placed = b.index_map(idx, shape, [var(axis_var(dim))] if b.rank(idx) else [])
    where = [var(gather_var(0)) if j == dim else var(axis_var(j)) for j in range(rank)]
    return b.gather(x, shape, where, [placed])


@op("item")
def lower_item(b, x):
    """A one-element tensor's value, as torch.export records `emb[t]` for a 0-d integer tensor
    t (item, then a select at it): the tensor itself, which a select reads as a position. Any
    other use of the number (a size, a slice's bounds) is data-dependent and refused by export
    or by the op reading it."""
    if math.prod(b.shape(x)) != 1:
        raise Refused(f"item of a tensor of shape {b.shape(x)}")
    return b.index_map(x, (), [0] * b.rank(x))


def select_at(b: Builder, x: str, dim: int, index: str) -> str:
    """x[..., index, ...] along `dim` at a position a 0-d integer tensor holds (negative from
    the end): index_select of that one position, its axis dropped."""
    if b.rank(x) == 0:
        return x
    dim = norm_dim(dim, b.rank(x))
    return squeeze(b, lower_index_select(b, x, dim, reshape(b, index, [1])), [dim])


@op("index.Tensor")
def lower_index(b, x, indices):
    """torch's advanced indexing: the index tensors broadcast together to a shape B; B takes
    the place of the indexed axes when they are adjacent, else it comes first."""
    indices = list(indices) + [None] * (b.rank(x) - len(indices))
    if len(indices) > b.rank(x):
        raise Refused(f"{len(indices)} indices for a tensor of rank {b.rank(x)}")
    tensors = [j for j, i in enumerate(indices) if i is not None]
    if not tensors:
        return x
    for j in tensors:
        _positions(b, indices[j])
    common = broadcast_shapes(*(b.shape(indices[j]) for j in tensors))
    kept = [j for j, i in enumerate(indices) if i is None]
    adjacent = tensors == list(range(tensors[0], tensors[-1] + 1))
    lead = [j for j in kept if j < tensors[0]] if adjacent else []
    start = len(lead)   # where B's axes begin in the result
    trail = [j for j in kept if j not in lead]
    sizes = b.shape(x)
    shape = tuple(sizes[j] for j in lead) + common + tuple(sizes[j] for j in trail)
    b_axes = [var(axis_var(start + d)) for d in range(len(common))]
    where, placed = [], []
    for j in range(len(sizes)):
        if indices[j] is None:
            at = lead.index(j) if j in lead else start + len(common) + trail.index(j)
            where.append(var(axis_var(at)))
        else:
            where.append(var(gather_var(len(placed))))
            spread = b.broadcast_to(indices[j], common)
            placed.append(b.index_map(spread, shape, b_axes))
    return b.gather(x, shape, where, placed)


# ---- writes at data-dependent positions -------------------------------------------------------

SCATTER_LIMIT = 32   # positions written per output row, each one compare and select (unrolled)
# past it, the writes are reductions over a last axis of them (_reduced_writes)

# scatter_reduce's reductions (a mean: the sum, divided by the count)
_REDUCTIONS = {"sum": R.SUM, "mean": R.SUM, "prod": R.PROD, "amax": R.MAX, "amin": R.MIN}


def _written(b: Builder, x: str, dim: int, updates, add: bool) -> str:
    """x where, for each k, the elements along `dim` at position pos_k take value_k; `updates`
    is a list of (pos_k, value_k): both broadcast over x's shape (pos_k is 1 along `dim`),
    later ones written after earlier ones (the last write wins, as torch's CPU loop has it),
    or all added when `add`."""
    pos = b.iota(b.shape(x), dim, DType.I64)
    out = x
    for at, value in updates:
        hit = b.ew(E.EQ, pos, at)
        out = b.ew(E.ADD, out, b.ew(E.WHERE, hit, value, 0)) if add else \
            b.ew(E.WHERE, hit, value, out)
    return b.cast(out, b.dtype(x))


def _hits(b: Builder, positions: dict[int, str]) -> str:
    """Where the writes land: `positions` maps each written dimension to the write's position
    along it, over x's shape plus a last axis of the writes (the same along that dimension)."""
    wide = b.shape(next(iter(positions.values())))
    return combine(b, E.AND, [b.ew(E.EQ, b.iota(wide, d, DType.I64), at)
                              for d, at in positions.items()])


def _reduced_writes(b: Builder, x: str, hit: str, values, how: str,
                    include_self: bool = True) -> str:
    """x with m writes, as reductions over them (any m): `hit` (_hits) and `values` (or one
    scalar) are over x's shape plus a last axis of the m writes. `how`: "last" (the last write
    to a position wins, as torch's CPU loop has it), "add" (x plus every write), or one of
    scatter_reduce's reductions, which take x in only with `include_self`."""
    wide = b.shape(hit)
    last = len(wide) - 1
    dtype = b.dtype(x)
    values = b.cast(values, dtype) if isinstance(values, str) else values
    if how == "last":
        k = b.iota(wide, last, DType.I64)
        chosen = b.reduce(R.MAX, b.ew(E.WHERE, hit, k, -1), [last])
        mine = b.ew(E.EQ, k, b.index_map(chosen, wide, axes(last)))
        value = b.reduce(R.MAX, b.ew(E.WHERE, mine, values, identity(R.MAX, dtype)), [last])
        return b.ew(E.WHERE, b.ew(E.GE, chosen, 0), value, x)
    op = R.SUM if how == "add" else _REDUCTIONS[how]
    reduced = b.reduce(op, b.ew(E.WHERE, hit, values, identity(op, dtype)), [last])
    if how == "add":
        return b.cast(b.ew(E.ADD, x, reduced), dtype)
    count = b.reduce(R.SUM, b.cast(hit, DType.I64), [last])
    if how == "mean":
        total = b.ew(E.ADD, x, reduced) if include_self else reduced
        n = b.ew(E.ADD, count, 1) if include_self else b.ew(E.MAX, count, 1)
        out = b.ew(E.DIV, total, n) if dtype.is_float else \
            b.ew(E.FLOOR, b.ew(E.DIV, b.cast(total, DType.F64), b.cast(n, DType.F64)))
    elif include_self:
        out = b.ew({R.SUM: E.ADD, R.PROD: E.MUL, R.MAX: E.MAX, R.MIN: E.MIN}[op], x, reduced)
    else:
        out = reduced
    if not include_self:
        out = b.ew(E.WHERE, b.ew(E.GT, count, 0), out, x)
    return b.cast(out, dtype)


def _scatter(b: Builder, x: str, dim: int, index: str, src, how: str,
             include_self: bool = True) -> str:
    """out = x, then for every position p of `index`: out[p with p[dim] = index[p]] = src[p]
    (`how`: "last", "add" or a scatter_reduce reduction, as _reduced_writes), with index's
    other extents those of x. Up to SCATTER_LIMIT positions along `dim` (and "last" or "add"),
    a compare and select per position; past it, reductions over the positions."""
    idx = _positions(b, index)
    rank = b.rank(x)
    if rank == 0 or b.rank(idx) != rank:
        raise Refused("scatter into a 0-d tensor, or an index of another rank than the tensor")
    dim = norm_dim(dim, rank)
    shape, ishape = b.shape(x), b.shape(idx)
    if any(ishape[j] != shape[j] for j in range(rank) if j != dim):
        raise Refused(f"an index of shape {ishape} into {shape}: emmy writes whole rows (the "
                      f"index's extents besides dim {dim} those of the tensor)")
    m = ishape[dim]
    if m > SCATTER_LIMIT or how not in ("last", "add"):
        wide = shape + (m,)
        at = [var(axis_var(rank)) if j == dim else var(axis_var(j)) for j in range(rank)]
        value = b.index_map(src, wide, at) if isinstance(src, str) else src
        hit = _hits(b, {dim: b.cast(b.index_map(idx, wide, at), DType.I64)})
        return _reduced_writes(b, x, hit, value, how, include_self)
    updates = []
    for k in range(m):
        at = [k if j == dim else var(axis_var(j)) for j in range(rank)]
        one = b.index_map(idx, shape, at)
        value = b.index_map(src, shape, at) if isinstance(src, str) else src
        updates.append((b.cast(one, DType.I64), value))
    return _written(b, x, dim, updates, how == "add")


@op("scatter.src", "scatter.value")
def lower_scatter(b, x, dim, index, src):
    return _scatter(b, x, dim, index, src, "last")


@op("scatter_add")
def lower_scatter_add(b, x, dim, index, src):
    return _scatter(b, x, dim, index, src, "add")


@op("scatter.reduce", "scatter.value_reduce")
def lower_scatter_reduce_arg(b, x, dim, index, src, *, reduce):
    """scatter(..., reduce="add" | "multiply"), the older spelling of scatter_reduce."""
    if reduce not in ("add", "multiply"):
        raise Refused(f"reduce={reduce!r}; scatter takes 'add' or 'multiply'")
    return _scatter(b, x, dim, index, src, "sum" if reduce == "add" else "prod")


@op("index_reduce")
def lower_index_reduce(b, x, dim, index, source, reduce, *, include_self=True):
    """x with source's slices along `dim` reduced into the rows `index` names: scatter_reduce
    with each slice's position spread over the slice."""
    dim = norm_dim(dim, b.rank(source))
    spread = b.index_map(index, b.shape(source), [var(axis_var(dim))])
    return lower_scatter_reduce(b, x, dim, spread, source, reduce, include_self=include_self)


@op("scatter_reduce.two")
def lower_scatter_reduce(b, x, dim, index, src, reduce, *, include_self=True):
    if reduce not in _REDUCTIONS:
        raise Refused(f"reduce={reduce!r}; scatter_reduce takes one of "
                      f"{', '.join(sorted(_REDUCTIONS))}")
    return _scatter(b, x, dim, index, src, reduce, include_self)


def _index_write(b: Builder, x: str, dim: int, index: str, source, add: bool, alpha=1,
                 wrap: bool = False) -> str:
    """index_copy / index_add / index_fill: slice k of `source` along dim (a scalar: the same
    value) goes to position index[k] of x along dim (a 1-D index; past SCATTER_LIMIT
    positions, as reductions over them); `wrap`: a negative position counts from the end (index_fill; the others refuse it in
    eager)."""
    idx = _positions(b, index)
    rank = b.rank(x)
    if b.rank(idx) > 1 or rank == 0:
        raise Refused("a 1-D index into a tensor with at least one dimension")
    dim = norm_dim(dim, rank)
    m = b.shape(idx)[0] if b.rank(idx) else 1
    shape = b.shape(x)
    if m > SCATTER_LIMIT:
        wide = shape + (m,)
        at = [var(axis_var(rank)) if j == dim else var(axis_var(j)) for j in range(rank)]
        one = b.cast(b.index_map(idx, wide, [var(axis_var(rank))]), DType.I64)
        if wrap:
            one = b.ew(E.WHERE, b.ew(E.LT, one, 0), b.ew(E.ADD, one, shape[dim]), one)
        value = source
        if isinstance(source, str):
            value = b.index_map(source, wide, at)
            value = b.ew(E.MUL, value, alpha) if alpha != 1 else value
        return _reduced_writes(b, x, _hits(b, {dim: one}), value, "add" if add else "last")
    updates = []
    for k in range(m):
        one = b.index_map(idx, [1 if j == dim else n for j, n in enumerate(shape)],
                          [k] if b.rank(idx) else [])
        if isinstance(source, str):
            at = [k if j == dim else var(axis_var(j)) for j in range(rank)]
            value = b.index_map(source, shape, at)
            value = b.ew(E.MUL, value, alpha) if alpha != 1 else value
        else:
            value = source
        one = b.cast(one, DType.I64)
        if wrap:
            one = b.ew(E.WHERE, b.ew(E.LT, one, 0), b.ew(E.ADD, one, shape[dim]), one)
        updates.append((one, value))
    return _written(b, x, dim, updates, add)


@op("index_copy")
def lower_index_copy(b, x, dim, index, source):
    return _index_write(b, x, dim, index, source, add=False)


@op("index_add")
def lower_index_add(b, x, dim, index, source, *, alpha=1):
    return _index_write(b, x, dim, index, source, add=True, alpha=alpha)


@op("index_fill.int_Scalar")
def lower_index_fill(b, x, dim, index, value):
    return _index_write(b, x, dim, index, value, add=False, wrap=True)


@op("index_put")
def lower_index_put(b, x, indices, values, accumulate=False):
    """x with `values` written (added, with accumulate) where `indices` point: what torch
    makes of `y[mask] = v`, `y[idx] = v`, `y[:, idx] += v`. A boolean mask (after any leading
    `:`) takes one value for every element it selects; one 1-D integer index tensor (negative
    positions counting from the end) takes the slices of `values` in order, as index_copy
    (index_add) along its dimension; several, or one of another rank, _index_put_many."""
    given = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(given) > 1:
        return _index_put_many(b, x, given, values, accumulate)
    (dim, index), shape = given[0], b.shape(x)
    if b.dtype(index) is DType.BOOL:
        mshape = b.shape(index)
        if tuple(shape[dim:dim + len(mshape)]) != tuple(mshape):
            raise Refused(f"a mask of shape {mshape} at dimension {dim} of a tensor of shape "
                          f"{shape}")
        if isinstance(values, str) and math.prod(b.shape(values)) != 1:
            raise Refused("a mask writing several values (one per element it selects, a "
                          "number only known at run time); write one value, or use "
                          "torch.where(mask, values, y)")
        mask = b.index_map(index, shape, axes(len(shape))[dim:dim + len(mshape)])
        value = b.cast(reshape(b, values, ()), b.dtype(x)) if isinstance(values, str) \
            else values
        if accumulate:
            return b.cast(b.ew(E.ADD, x, b.ew(E.WHERE, mask, value, 0)), b.dtype(x))
        return b.ew(E.WHERE, mask, value, x)
    idx = _positions(b, index)
    if b.rank(idx) != 1:
        return _index_put_many(b, x, given, values, accumulate)
    slices = shape[:dim] + (b.shape(idx)[0],) + shape[dim + 1:]
    source = b.broadcast_to(values, slices) if isinstance(values, str) else values
    return _index_write(b, x, dim, idx, source, add=accumulate, wrap=True)


def _index_put_many(b: Builder, x: str, given, values, accumulate: bool) -> str:
    """`y[i, j] = v`, `y[:, idx2d] = v`, `y[i, :, j] = v` (`+=` with accumulate): integer
    index tensors broadcast together to B; write k of the prod(B) lands where every indexed
    dimension's position is its index's k-th (negative ones counting from the end), as
    reductions over the writes. `values` is over the indexed slice as torch shapes it: B in
    place of adjacent indexed dimensions, else B first and the other dimensions after."""
    dims = [d for d, _ in given]
    shape = b.shape(x)
    index = [_positions(b, i) for _, i in given]
    common = broadcast_shapes(*(b.shape(i) for i in index))
    m = math.prod(common)
    wide = shape + (m,)
    k = var(axis_var(len(shape)))
    positions = {}
    for d, i in zip(dims, index):
        row = reshape(b, b.broadcast_to(i, common), (m,))
        at = b.cast(b.index_map(row, wide, [k]), DType.I64)
        positions[d] = b.ew(E.WHERE, b.ew(E.LT, at, 0), b.ew(E.ADD, at, shape[d]), at)
    if isinstance(values, str):
        if dims == list(range(dims[0], dims[-1] + 1)):          # B where the dimensions were
            first, end = dims[0], dims[-1] + 1
            before, after = list(range(first)), list(range(end, len(shape)))
        else:                                                   # B first
            before, after = [], [a for a in range(len(shape)) if a not in dims]
        outer = tuple(shape[a] for a in before)
        inner = tuple(shape[a] for a in after)
        flattened = reshape(b, b.broadcast_to(values, outer + common + inner),
                            outer + (m,) + inner)
        values = b.index_map(flattened, wide, [*(var(axis_var(a)) for a in before), k,
                                               *(var(axis_var(a)) for a in after)])
    return _reduced_writes(b, x, _hits(b, positions), values, "add" if accumulate else "last")


@op("masked_scatter")
def lower_masked_scatter(b, x, mask, source):
    """x with the elements where `mask` (broadcast to x) holds replaced, in row-major order,
    by source's first elements (a vision-language model's image features merged into its
    token embeddings): the element at p takes source[the count of mask's true elements
    before p], a running count over the flattened mask, then a gather."""
    shape = b.shape(x)
    n = math.prod(shape)
    if n == 0:
        return x
    keep = b.broadcast_to(b.cast(mask, DType.BOOL), shape)
    counted = b.scan(R.SUM, b.cast(reshape(b, keep, [n]), DType.I64), 0)
    before = reshape(b, b.ew(E.SUB, counted, 1), shape)
    flat = reshape(b, source, [math.prod(b.shape(source))])
    taken = b.gather(flat, shape, [var(gather_var(0))], [before])
    return b.ew(E.WHERE, keep, b.cast(taken, b.dtype(x)), x)


EMBEDDING_BAG_MODES = ("sum", "mean", "max")


@op("embedding_bag.padding_idx", "embedding_bag")
def lower_embedding_bag(b, weight, indices, offsets, scale_grad_by_freq=False, mode=0,
                        sparse=False, per_sample_weights=None, include_last_offset=False,
                        padding_idx=None):
    """nn.EmbeddingBag: per bag (the indices from offsets[b] to the next offset), the sum, mean
    or max of the weight rows they name (an empty bag: zeros; entries equal to padding_idx
    left out). Bags of one size (a 2-D input: offsets an arange) reduce over that size; others
    over every index, each masked to its bag. Also torch's other three results (offset2bag,
    bag_size, max_indices) as its CPU kernel gives them, for a program that reads them."""
    idx = _positions(b, indices)
    if b.rank(idx) != 1 or b.rank(offsets) != 1:
        raise Refused("embedding_bag with indices and offsets of rank 1 (a 2-D input is "
                      "reshaped by F.embedding_bag)")
    if mode not in (0, 1, 2):
        raise Refused(f"embedding_bag mode {mode} (0, 1, 2: {', '.join(EMBEDDING_BAG_MODES)})")
    n, d = b.shape(idx)[0], b.shape(weight)[1]
    bags = b.shape(offsets)[0] - (1 if include_last_offset else 0)
    step = b.affine_value(offsets)
    fixed = (step is not None and not include_last_offset and not step.const
             and len(step.terms) == 1 and n == bags * step.terms[0][1])
    if fixed:                                 # bags of `size` indices each
        size = step.terms[0][1]
        k_pos = b.ew(E.ADD, b.ew(E.MUL, b.iota((bags, size), 0), size), b.iota((bags, size), 1))
        inside = b.full((bags, size), True, DType.BOOL)
    else:                                     # every index, masked to the bag
        size = n
        k_pos = b.iota((bags, n), 1)
        start = b.index_map(offsets, (bags, n), [var(axis_var(0))])
        if include_last_offset:
            end = b.index_map(offsets, (bags, n), [var(axis_var(0)) + 1])
        else:
            bounds = {axis_var(0): bags}
            nxt = b.index_map(offsets, (bags, n), [mod(var(axis_var(0)) + 1, bags, bounds)])
            end = b.ew(E.WHERE, b.ew(E.EQ, b.iota((bags, n), 0), bags - 1), n, nxt)
        inside = b.ew(E.AND, b.ew(E.GE, k_pos, start), b.ew(E.LT, k_pos, end))
    rows = b.gather(idx, (bags, size), [var(gather_var(0))], [k_pos])   # the row each names
    valid = inside if padding_idx is None or padding_idx < 0 else \
        b.ew(E.AND, inside, b.ew(E.NE, rows, padding_idx))
    shape3 = (bags, size, d)
    vectors = lower_embedding(b, weight, rows)                          # (bags, size, d)
    if per_sample_weights is not None:
        if mode != 0:
            raise Refused("per_sample_weights with mode sum only (as torch)")
        vectors = b.ew(E.MUL, vectors, b.gather(per_sample_weights, shape3, [var(gather_var(0))],
                                                [b.index_map(k_pos, shape3, axes(2))]))
    keep = b.index_map(valid, shape3, axes(2))
    count = b.reduce(R.SUM, b.cast(valid, DType.I64), (1,))
    some = b.index_map(b.ew(E.GT, count, 0), (bags, d), axes(1))
    if mode == 2:
        low = b.ew(E.WHERE, keep, vectors, float("-inf"))
        top = b.reduce(R.MAX, low, (1,))
        out = b.ew(E.WHERE, some, top, 0.0)
        hit = b.ew(E.AND, keep, b.ew(E.EQ, low, b.index_map(top, shape3, [var(axis_var(0)),
                                                                        var(axis_var(2))])))
        at = b.reduce(R.MIN, b.ew(E.WHERE, hit, b.index_map(k_pos, shape3, axes(2)), n), (1,))
        first_row = b.gather(idx, (bags, d), [var(gather_var(0))],
                             [b.ew(E.WHERE, b.ew(E.LT, at, n), at, 0)])
        max_indices = b.ew(E.WHERE, some, first_row, 0)
    else:
        out = b.reduce(R.SUM, b.ew(E.WHERE, keep, vectors, 0.0), (1,))
        if mode == 1:
            out = b.ew(E.WHERE, some, b.ew(E.DIV, out, b.index_map(count, (bags, d), axes(1))),
                       0.0)
    out = b.cast(out, b.dtype(weight))
    # torch's bookkeeping results: for sum zeros (offset2bag empty without a padding_idx);
    # for mean and max each index's bag and each bag's count (max: each maximum's row), as
    # its CPU kernel gives them
    i_pos = b.iota((n, bags), 0)
    starts = b.index_map(offsets, (n, bags), [var(axis_var(1))])
    offset2bag = b.ew(E.SUB, b.reduce(R.SUM, b.cast(b.ew(E.LE, starts, i_pos), DType.I64), (1,)),
                      1)
    if mode == 0:
        aux = (offset2bag if padding_idx is not None else None, None, None)
    else:
        aux = (offset2bag, count, max_indices if mode == 2 else count)
    # torch's shapes for them come from its meta kernels, which with include_last_offset
    # disagree with its CPU kernel (and with each other: export records _embedding_bag's for
    # a weight that requires grad, _embedding_bag_forward_only's for one that does not);
    # where they are not the graph's, zeros of its shape
    return (out, *(TorchShaped(a, DType.I64) for a in aux))


