"""Updates through a boolean mask, `x[mask] -= 1` or `out[mask] = y[mask] * 3 + 1`, as
`where(mask, f(x), x)`, and reductions of masked values, `loss[labels != -100].mean()`, as
reductions of `where(mask, f(x), 0)` (the mean divided by the mask's count; a max of the
lowest value; var and std from the masked squared deviations from that mean; a median from
every element sorted with the masked-off ones last): torch.export records the masked values as
a gather (a tensor whose length depends on the data), elementwise ops on it, and a write back
through the same mask or a reduction. The result has a static shape, and the same values as computing the elementwise ops
on every element and keeping the masked ones, so the exported graph is rewritten to that before
it is mirrored (the gathered tensor, which emmy cannot hold, disappears).

The rewrite applies where every tensor the values depend on with the data-dependent length is
such a gather through the same mask node, and everything else they read broadcasts against the
elements' trailing axes (constants, scalars, a row of weights)."""

from __future__ import annotations

import math
from typing import Any, Callable


def rewrite_masked(module, checked: Callable[[Any], None]) -> None:
    """Rewrite each masked update and masked reduction of the graph module's graph in place;
    `checked(put)` is called on each write before it is rewritten (it raises where the write
    may not be rewritten as a functional op: it writes into a parameter, a buffer or a model
    input, or into memory a view reads afterwards)."""
    graph = module.graph
    candidates: set = set()
    for node in list(graph.nodes):
        if _masked_update(node):
            checked(node)
            rewrite, mask = _update, node.args[1][0]
        else:
            mask = _masked_reduction(node)
            if mask is None:
                continue
            rewrite = _reduction
        made: dict = {}
        with graph.inserting_before(node):
            new = rewrite(graph, node, mask, made)
        node.replace_all_uses_with(new)
        _counted(graph, made, mask)
        candidates |= {node, *made} | _bookkeeping(made)
    for node in reversed(list(graph.nodes)):
        if node in candidates and not node.users:
            graph.erase_node(node)
    module.recompile()


def _update(graph, put, mask, made: dict):
    """where(mask, f(x), x) for index_put(x, [mask], f(x[mask]))."""
    x, value = put.args[0], put.args[2]
    values = _full(value, mask, made, graph)
    shape, dtype = tuple(x.meta["val"].shape), x.meta["val"].dtype
    if values.meta["val"].dtype != dtype:
        values = _node(graph, _aten().to.dtype, (values, dtype), {},
                       values.meta["val"].shape, dtype, put)
    return _node(graph, _aten().where.self, (_broadcast_mask(graph, mask, len(shape), put),
                                             values, x), {}, shape, dtype, put)


# reductions of a masked gather: the value the masked-off elements take
_REDUCTIONS = {"sum": 0, "mean": 0, "amax": "lowest", "max": "lowest", "amin": "highest",
               "min": "highest", "var": 0, "std": 0}


def _masked_reduction(node):
    """The mask where `node` reduces, over the gathered axis and without keeping it, values of a
    data-dependent length that can be computed on every element; else None."""
    aten = _aten()
    targets = (aten.sum.default, aten.sum.dim_IntList, aten.mean.default, aten.mean.dim,
               aten.amax.default, aten.amin.default, aten.max.default, aten.min.default,
               aten.median.default, *_spreads())
    if node.op != "call_function" or node.target not in targets or not node.args:
        return None
    g = node.args[0]
    mask = _mask_of(g)
    reduced = _reduce_args(node) if mask is not None and _derived(g, mask) else None
    if reduced is None:
        return None
    if node.target in _spreads() and reduced[0] != list(range(len(reduced[0]))):
        return None     # its mean broadcasts back over the values: the leading axes only
    return mask


def _spreads() -> tuple:
    """var and std: their overloads of a dim list or none, and a Bessel correction (`unbiased`
    or `correction`)."""
    aten = _aten()
    return (aten.var.default, aten.var.dim, aten.var.correction, aten.std.default,
            aten.std.dim, aten.std.correction)


def _reduce_args(node):
    """(the gathered value's axes it reduces, its dtype argument), or None where it keeps them
    or leaves the gathered axis."""
    g = node.args[0]
    rank = _val(g).dim()
    args = list(node.args[1:])
    dims = args[0] if args and isinstance(args[0], (list, tuple)) else node.kwargs.get("dim")
    at = 2 if node.target in _spreads() and node.target._overloadname == "dim" else 1
    keepdim = args[at] if len(args) > at else node.kwargs.get("keepdim", False)
    if keepdim:
        return None
    dims = list(range(rank)) if not dims else sorted({d % rank for d in dims})
    if 0 not in dims:
        return None
    return dims, node.kwargs.get("dtype")


def _reduction(graph, node, mask, made: dict):
    aten = _aten()
    if node.target is aten.median.default:
        return _median(graph, node, mask, made)
    g = node.args[0]
    dims, dtype = _reduce_args(node)
    values = _full(g, mask, made, graph)
    k = _val(mask).dim()
    full_dims = list(range(k)) + [d + k - 1 for d in dims if d > 0]
    vv, out = values.meta["val"], node.meta["val"]
    name = node.target._schema.name.split("::")[-1]
    fill = _REDUCTIONS[name]
    if fill != 0:
        fill = _extreme(vv.dtype, lowest=fill == "lowest")
    bmask = _broadcast_mask(graph, mask, vv.dim(), node)
    kept = _node(graph, aten.where.ScalarOther, (bmask, values, fill), {}, vv.shape, vv.dtype,
                 node)
    if name in ("amax", "max"):
        return _node(graph, aten.amax.default, (kept, full_dims), {}, out.shape, out.dtype, node)
    if name in ("amin", "min"):
        return _node(graph, aten.amin.default, (kept, full_dims), {}, out.shape, out.dtype, node)
    kwargs = {"dtype": dtype} if dtype is not None else {}
    total = _node(graph, aten.sum.dim_IntList, (kept, full_dims), kwargs, out.shape,
                  out.dtype, node)
    if name == "sum":
        return total
    count = _count(graph, mask, math.prod(int(vv.shape[d + k - 1]) for d in dims if d > 0),
                   node)
    mean = _node(graph, aten.div.Tensor, (total, count), {}, out.shape, out.dtype, node)
    if name == "mean":
        return mean
    # var and std: the squared deviations from the mean of the masked values, summed, over
    # max(count - correction, 0) (torch's Bessel correction, 1 unless asked otherwise)
    deviation = _node(graph, aten.sub.Tensor, (values, mean), {}, vv.shape, vv.dtype, node)
    squares = _node(graph, aten.mul.Tensor, (deviation, deviation), {}, vv.shape, vv.dtype,
                    node)
    kept = _node(graph, aten.where.ScalarOther, (bmask, squares, 0), {}, vv.shape, vv.dtype,
                 node)
    spread = _node(graph, aten.sum.dim_IntList, (kept, full_dims), {}, out.shape, out.dtype,
                   node)
    dof = _node(graph, aten.clamp_min.default, (
        _node(graph, aten.sub.Tensor, (count, _correction(node)), {}, (), _torch().int64, node),
        0), {}, (), _torch().int64, node)
    var = _node(graph, aten.div.Tensor, (spread, dof), {}, out.shape, out.dtype, node)
    return var if name == "var" else _node(graph, aten.sqrt.default, (var,), {}, out.shape,
                                           out.dtype, node)


def _count(graph, mask, per: int, like):
    """How many values the mask selects: its count, times `per` values a selected row."""
    int64 = _torch().int64
    count = _node(graph, _aten().sum.default, (mask,), {}, (), int64, like)
    return count if per == 1 else _node(graph, _aten().mul.Tensor, (count, per), {}, (), int64,
                                        like)


def _median(graph, node, mask, made: dict):
    """torch.median of the masked values (the median flow error over valid pixels): every
    element sorted with the masked-off ones last (the type's highest value), the one at
    (count - 1) // 2 (torch's lower median), NaN where a masked value is NaN or none is
    selected (as torch's median of an empty float tensor)."""
    import operator

    aten, torch = _aten(), _torch()
    values = _full(node.args[0], mask, made, graph)
    vv = values.meta["val"]
    n = vv.numel()
    bmask = _broadcast_mask(graph, mask, vv.dim(), node)
    kept = _node(graph, aten.where.ScalarOther, (bmask, values, _extreme(vv.dtype, lowest=False)),
                 {}, vv.shape, vv.dtype, node)
    flat = _node(graph, aten.view.default, (kept, [n]), {}, (n,), vv.dtype, node)
    ordered = _node(graph, aten.sort.default, (flat,), {}, (n,), vv.dtype, node)
    ordered.meta["val"] = (ordered.meta["val"], torch.empty(n, dtype=torch.int64, device="meta"))
    ordered_values = _node(graph, operator.getitem, (ordered, 0), {}, (n,), vv.dtype, node)
    count = _count(graph, mask, n // max(1, _val(mask).numel()), node)
    int64 = torch.int64
    before = _node(graph, aten.sub.Tensor, (count, 1), {}, (), int64, node)
    before = _node(graph, aten.clamp_min.default, (before, 0), {}, (), int64, node)
    middle = _node(graph, aten.floor_divide.default, (before, 2), {}, (), int64, node)
    at = _node(graph, aten.view.default, (middle, [1]), {}, (1,), int64, node)
    picked = _node(graph, aten.gather.default, (ordered_values, 0, at), {}, (1,), vv.dtype,
                   node)
    median = _node(graph, aten.view.default, (picked, []), {}, (), vv.dtype, node)
    if not vv.dtype.is_floating_point:
        return median
    nan = _node(graph, aten.isnan.default, (values,), {}, vv.shape, torch.bool, node)
    nan = _node(graph, aten.logical_and.default, (nan, bmask), {}, vv.shape, torch.bool, node)
    nan = _node(graph, aten.any.default, (nan,), {}, (), torch.bool, node)
    empty = _node(graph, aten.eq.Scalar, (count, 0), {}, (), torch.bool, node)
    nan = _node(graph, aten.logical_or.default, (nan, empty), {}, (), torch.bool, node)
    return _node(graph, aten.where.ScalarSelf, (nan, math.nan, median), {}, (), vv.dtype,
                 node)


def _correction(node) -> float:
    """The Bessel correction of a var or std: `unbiased` of the .default overload, else
    `correction` (1 when not given)."""
    overload = node.target._overloadname
    if overload in ("default", "dim"):            # (self, unbiased) and (self, dim, unbiased)
        at = 1 if overload == "default" else 2
        unbiased = node.args[at] if len(node.args) > at else node.kwargs.get("unbiased", True)
        return 1 if unbiased else 0
    correction = node.kwargs.get("correction")
    return 1 if correction is None else correction


def _extreme(dtype, *, lowest: bool):
    torch = _torch()
    if dtype.is_floating_point:
        return -math.inf if lowest else math.inf
    if dtype == torch.bool:
        return not lowest
    info = torch.iinfo(dtype)
    return info.min if lowest else info.max


def _broadcast_mask(graph, mask, rank: int, like):
    """The mask with an axis of one for each of the values' trailing axes."""
    mv = mask.meta["val"]
    trailing = rank - mv.dim()
    if not trailing:
        return mask
    shape = tuple(mv.shape) + (1,) * trailing
    return _node(graph, _aten().view.default, (mask, list(shape)), {}, shape, mv.dtype, like)


def _mask_of(node):
    """The mask of the first gather `node`'s data-dependent values come from, or None."""
    seen: set = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n in seen or not _dynamic(n):
            continue
        seen.add(n)
        if n.op == "call_function" and n.target is _aten().index.Tensor and \
                isinstance(n.args[1], (list, tuple)) and len(n.args[1]) == 1 and \
                _val(n.args[1][0]) is not None and _val(n.args[1][0]).dtype == _torch().bool:
            return n.args[1][0]
        if n.op == "call_function":
            stack.extend(_tensor_args(n))
    return None


def _masked_update(put) -> bool:
    """Whether `put` is `index_put(x, [mask], values)` (in place or not, not accumulating) with
    a boolean mask over x's leading axes and values of a data-dependent length that can be
    computed on all of x's elements."""
    aten = _aten()
    if put.op != "call_function" or put.target not in (aten.index_put_.default,
                                                      aten.index_put.default):
        return False
    args = list(put.args) + [put.kwargs.get("accumulate", False)]
    if len(args) < 4 or args[3] or not isinstance(args[1], (list, tuple)) or len(args[1]) != 1:
        return False
    x, (mask,), value = args[:3]
    xv, mv = _val(x), _val(mask)
    if xv is None or mv is None or mv.dtype != _torch().bool or \
            not _static(xv.shape) or not _static(mv.shape) or \
            tuple(mv.shape) != tuple(xv.shape[:mv.dim()]) or not _derived(value, mask):
        return False
    return _val(value).dim() == 1 + xv.dim() - mv.dim()


def _derived(node, mask) -> bool:
    """Whether `node`, a tensor of a data-dependent length, can be computed on every element:
    a gather through `mask`, or elementwise ops of such gathers and of values that broadcast
    against their trailing axes."""
    val = _val(node)
    if val is None or not val.shape or _static(val.shape[:1]) or not _static(val.shape[1:]):
        return False
    if _is_gather(node, mask):
        return True
    if not _elementwise(node):
        return False
    for a in _tensor_args(node):
        av = _val(a)
        if av is None:
            return False
        if _static(av.shape):
            if av.dim() > val.dim() - 1 and not (av.dim() == val.dim() and av.shape[0] == 1):
                return False
        elif not _derived(a, mask):
            return False
    return True


def _full(node, mask, made: dict, graph):
    """The node computing `node` on every element (memoized in `made`: original -> new)."""
    if _is_gather(node, mask):
        made.setdefault(node, None)
        return node.args[0]
    if node in made:
        return made[node]
    aten_args = tuple(_full(a, mask, made, graph) if _dynamic(a) else a for a in node.args)
    kwargs = {k: _full(v, mask, made, graph) if _dynamic(v) else v
              for k, v in node.kwargs.items()}
    val = _val(node)
    shape = tuple(mask.meta["val"].shape) + tuple(val.shape[1:])
    new = _node(graph, functional_twin(node.target), aten_args, kwargs, shape, val.dtype, node)
    made[node] = new
    return new


def _counted(graph, made: dict, mask) -> None:
    """A gathered tensor's length read as a number (`(e < 1).sum() / e.numel()` of e =
    epe[valid], KITTI's outlier rate) reads the mask's count instead: a 0-d tensor, which the
    arithmetic on numbers read off tensors takes (`sym_truediv`, ...)."""
    aten = _aten()
    for g in [n for n, new in made.items() if new is None]:        # the gathers themselves
        for u in list(g.users):
            if u.target is aten.sym_size.int and u.args[1] == 0 and \
                    any(v.op != "call_function" or "_assert" not in str(v.target)
                        for v in u.users):
                with graph.inserting_after(u):
                    count = _count(graph, mask, 1, u)
                u.replace_all_uses_with(count)


def _bookkeeping(made: dict) -> set:
    """What export hangs on the gathered values, to go with them: their lengths' symbolic-size
    nodes (sym_size, comparisons, runtime asserts) and metadata asserts (never the graph's
    output, which reads what the program returns)."""
    out: set = set()
    stack = [u for n in made for u in n.users if u.op == "call_function" and
             ("sym_size" in str(u.target) or "_assert" in str(u.target))]
    while stack:
        n = stack.pop()
        if n not in out and n.op == "call_function":
            out.add(n)
            stack.extend(n.users)
    return out


def _node(graph, target, args, kwargs, shape, dtype, like):
    import torch

    new = graph.call_function(target, tuple(args), dict(kwargs))
    new.meta["val"] = torch.empty(tuple(int(s) for s in shape), dtype=dtype, device="meta")
    if "stack_trace" in like.meta:
        new.meta["stack_trace"] = like.meta["stack_trace"]
    return new


def _is_gather(node, mask) -> bool:
    aten = _aten()
    return getattr(node, "op", None) == "call_function" and node.target is aten.index.Tensor \
        and isinstance(node.args[1], (list, tuple)) and len(node.args[1]) == 1 and \
        _same(node.args[1][0], mask)


def _same(a, b) -> bool:
    """Whether two arguments compute the same value: the same node, or the same op on the same
    arguments (`y[x > 0] = x[x > 0] * 2` computes its mask twice)."""
    if a is b:
        return True
    if hasattr(a, "op") and hasattr(b, "op"):
        seeded = _torch().Tag.nondeterministic_seeded in getattr(a.target, "tags", ())
        return a.op == b.op == "call_function" and a.target is b.target and not seeded and \
            len(a.args) == len(b.args) and all(_same(p, q) for p, q in zip(a.args, b.args)) \
            and a.kwargs.keys() == b.kwargs.keys() and \
            all(_same(a.kwargs[k], b.kwargs[k]) for k in a.kwargs)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(p, q) for p, q in zip(a, b))
    if hasattr(a, "op") or hasattr(b, "op"):
        return False
    return type(a) is type(b) and a == b


def _elementwise(node) -> bool:
    torch = _torch()
    target = node.target
    if node.op != "call_function" or not hasattr(target, "_schema"):
        return False
    return torch.Tag.pointwise in target.tags or target in (
        _aten().to.dtype, _aten()._to_copy.default, _aten().type_as.default)


def functional_twin(target):
    """An in-place op's out-of-place overload, the one that takes the same arguments:
    `sub_.Tensor` -> `sub.Tensor`, `pow_.Scalar` (a tensor to a number's power) ->
    `pow.Tensor_Scalar` (`pow.Scalar` is a number to a tensor's power), `__ixor__.Tensor`
    (`r ^= x`) -> `__xor__.Tensor`."""
    name = target._schema.name.split("::")[-1]
    if name.startswith("__i") and name.endswith("__"):        # `r ^= x`: __ixor__ -> __xor__
        base = f"__{name[3:]}"
    elif name.endswith("_"):
        base = name[:-1]
    else:
        return target
    packet = getattr(_aten(), base, None)
    if packet is None:
        return target
    same = getattr(packet, target._overloadname, None)
    kinds = [str(a.type) for a in target._schema.arguments]
    for overload in ([same] if same is not None else []) + \
            [getattr(packet, o) for o in packet.overloads()]:
        if [str(a.type) for a in overload._schema.arguments] == kinds:
            return overload
    return target


def _tensor_args(node) -> list:
    return [a for a in (*node.args, *node.kwargs.values()) if hasattr(a, "meta")]


def _dynamic(a) -> bool:
    v = _val(a) if hasattr(a, "meta") else None
    return v is not None and not _static(v.shape)


def _val(node):
    v = getattr(node, "meta", {}).get("val")
    return v if hasattr(v, "shape") and hasattr(v, "dtype") else None


def _static(shape) -> bool:
    return all(isinstance(s, int) for s in shape)


def _aten():
    import torch

    return torch.ops.aten


def _torch():
    import torch

    return torch
