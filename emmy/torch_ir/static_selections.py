"""Selections through masks the data decides, made static: positions a mask of constants
selects (fold_constant_masks, at the end), and those read row by row and added back
(rewrite_selections).

Positions a mask selects, `idx, tok = torch.where(mask)` or `torch.nonzero(mask)`, read row
by row and added back with `index_add_`: Mixtral's (and Qwen-MoE's, OLMoE's) per-expert loop
picks the tokens routed to an expert, runs the expert on them, scales each by its routing
weight and adds it into the output. torch.export records the selection with a length the data
decides (u0), which emmy cannot hold.

Where every tensor of that length is computed row by row from the selected positions (each
row from its own position only: element-wise ops, a linear layer over the last axis, a gather
at the positions, reshapes that keep the rows), and the rows end in an `index_add` along that
axis, the program computes the same sums when it takes every position the mask could select
(a static count: the mask's size), each row it did not select added as zeros. So the graph is
rewritten to that before it is mirrored: the selection becomes the grid of all positions in
the mask's order, and each added row is kept where the mask holds and zeroed elsewhere (a
select, so that an expert's output on a token it was not given, finite or not, adds nothing).
The work is that of the dense computation: every expert on every token (E/k times the sparse
loop's products, for k of E experts a token).

Anything else read from the selection (a sum over it, a sort, a row read at another row's
position, the count itself) leaves the graph as it is, and the selection is refused as before.
"""

from __future__ import annotations

import math
from functools import cache


def rewrite_selections(module) -> None:
    """Rewrite each selection of the graph module's graph whose rows all end in index_add, in
    place, and give every node the value (shape, type) it has then."""
    graph = module.graph
    changed = False
    for sel in [n for n in graph.nodes if _selection(n)]:
        plan = _plan(sel)
        if plan is None:
            continue
        _rewrite(graph, sel, *plan)
        changed = True
    if not changed:
        return
    graph.eliminate_dead_code()
    module.recompile()
    _propagate(module)


def _aten():
    import torch

    return torch.ops.aten


def _selection(node) -> bool:
    aten = _aten()
    return node.op == "call_function" and (
        (node.target is aten.where.default and len(node.args) == 1)
        or node.target is aten.nonzero.default) and _static(_val(node.args[0]).shape)


def _val(node):
    return node.meta.get("val") if hasattr(node, "meta") else None


def _static(shape) -> bool:
    return all(isinstance(s, int) for s in shape)


def _count(sel):
    """The symbol of the selection's length (u0)."""
    val = _val(sel)
    first = val[0] if isinstance(val, (tuple, list)) else val
    return first.shape[0]


def _axis(node, u) -> int | None:
    """The axis of `node`'s value whose extent is the selection's length; None when none is
    (more than one: -1)."""
    val = _val(node)
    if not hasattr(val, "shape"):
        return None
    axes = [i for i, s in enumerate(val.shape) if _is(s, u)]
    return axes[0] if len(axes) == 1 else (-1 if axes else None)


def _is(s, u) -> bool:
    return not isinstance(s, int) and str(getattr(s, "node", s)) == str(getattr(u, "node", u))


def _plan(sel):
    """(the positions' readers, the index_add sinks, the assertion nodes to drop) where every
    use of the selection is a row-wise computation ending in an index_add along the selection's
    axis; else None."""
    import operator

    aten = _aten()
    u = _count(sel)
    rows: set = set()       # nodes whose values have the selection's axis
    sinks: list = []
    scalars: set = set()    # the length read as a number (sym_size) and what only asserts it
    todo = [sel]
    seen = {sel}
    while todo:
        n = todo.pop()
        for user in n.users:
            if user in seen:
                continue
            seen.add(user)
            t = user.target
            if t is aten.sym_size.int or t is aten._assert_scalar.default or (
                    getattr(t, "__module__", None) in ("_operator", "operator")
                    and t is not operator.getitem):
                scalars.add(user)
                todo.append(user)
                continue
            if t is aten._assert_tensor_metadata.default and not {"size", "stride"} & set(
                    user.kwargs):
                continue                   # a check of the type, which the rows keep
            if t in (aten.index_add.default, aten.index_add_.default):
                sinks.append(user)         # checked once every row is known
                continue
            if not _row_wise(user, rows | {sel}, u):
                return None
            rows.add(user)
            todo.append(user)
    for sink in sinks:
        dest, dim, index, src = sink.args[:4]
        if dest in seen or index not in rows or src not in rows or len(sink.args) > 4 or \
                sink.kwargs.get("alpha", 1) != 1 or _axis(src, u) != dim % _val(src).dim():
            return None
    if not sinks or any(_axis(n, u) == -1 for n in rows):
        return None
    return rows, sinks, scalars


_SHAPING = ("view.default", "reshape.default", "_unsafe_view.default", "unsqueeze.default",
            "squeeze.dim", "squeeze.dims", "squeeze.default")
_SAME = ("to.dtype", "_to_copy.default", "clone.default", "contiguous.default", "alias.default",
         "detach.default", "to.dtype_layout")


def _row_wise(node, rows: set, u) -> bool:
    """Whether each row of `node`'s value (along the selection's axis) is computed from the
    same row of what it reads from the selection, and from nothing else of that length."""
    import operator

    import torch

    aten = _aten()
    if node.op != "call_function":
        return False
    t = node.target
    if t is operator.getitem:
        return node.args[0] in rows and _axis(node, u) == 0
    name = f"{getattr(t, '_opname', '')}.{getattr(t, '_overloadname', '')}"
    ours = [a for a in node.all_input_nodes if a in rows]
    axis = _axis(node, u)
    if axis is None or axis == -1:
        return False
    if torch.Tag.pointwise in getattr(t, "tags", ()) or name in _SAME:
        # every operand of the selection's length lines it up with the result's axis
        return all(_aligned(a, node, u) for a in ours)
    if t in (aten.linear.default, aten.matmul.default, aten.mm.default):
        x, w = node.args[:2]
        return x in rows and w not in rows and _axis(x, u) < _val(x).dim() - 1 and \
            (t is not aten.mm.default or _axis(x, u) == 0) and \
            all(b not in rows for b in node.args[2:] if hasattr(b, "op"))
    if t is aten.index.Tensor:
        x, indices = node.args
        if x in rows:
            return False
        picked = [i for i in indices if i is not None]
        return all(i in rows and _val(i).dim() == 1 for i in picked) and \
            all(i is None or i in rows for i in indices)
    if t is aten.select.int and len(ours) == 1 and node.args[0] in rows:
        x, dim = node.args[0], node.args[1] % _val(node.args[0]).dim()
        return dim != _axis(x, u)          # `nz[:, 0]`: a column of each row
    if name in _SHAPING and len(ours) == 1:
        return _leading(ours[0], u) and _leading(node, u) and \
            _trailing(ours[0], u) == _trailing(node, u)
    return False


def _aligned(a, node, u) -> bool:
    """`a`'s selection axis is `node`'s, counted from the right (broadcasting)."""
    va, vn = _val(a), _val(node)
    return vn.dim() - _axis(node, u) == va.dim() - _axis(a, u)


def _leading(node, u) -> bool:
    """Every axis before the selection's is of extent 1."""
    shape = _val(node).shape
    return all(s == 1 for s in shape[:_axis(node, u)])


def _trailing(node, u) -> int:
    shape = _val(node).shape
    return math.prod(int(s) for s in shape[_axis(node, u) + 1:])


def _rewrite(graph, sel, rows, sinks, scalars) -> None:
    """The selection as the grid of every position of the mask (row-major), its rows kept at
    each sink where the mask holds."""
    import torch

    aten = _aten()
    mask = sel.args[0]
    shape = tuple(_val(mask).shape)
    total = math.prod(shape)
    with graph.inserting_before(sel):
        flat = graph.call_function(aten.arange.default, (total,), {"dtype": torch.int64})
        coords = []
        for d, n in enumerate(shape):
            stride = math.prod(shape[d + 1:])
            c = graph.call_function(aten.div.Tensor_mode, (flat, stride),
                                    {"rounding_mode": "floor"}) if stride > 1 else flat
            coords.append(graph.call_function(aten.remainder.Scalar, (c, n)) if d else c)
        held = graph.call_function(aten.ne.Scalar, (graph.call_function(
            aten.reshape.default, (mask, [total])), 0))
        if sel.target is aten.nonzero.default:
            dense = graph.call_function(aten.stack.default, (coords, 1))
    for n in list(sel.users):
        if sel.target is aten.nonzero.default:
            n.replace_input_with(sel, dense)
        else:       # getitem(where, d)
            n.replace_all_uses_with(coords[n.args[1]])
    for sink in sinks:
        src, dim = sink.args[3], sink.args[1]
        rank = _val(src).dim()
        dim %= rank
        with graph.inserting_before(sink):
            keep = graph.call_function(aten.reshape.default, (
                held, [1] * dim + [total] + [1] * (rank - dim - 1)))
            kept = graph.call_function(aten.where.ScalarOther, (keep, src, 0))
            if "stack_trace" in sink.meta:
                kept.meta["stack_trace"] = sink.meta["stack_trace"]
        sink.replace_input_with(src, kept)
    for n in reversed(list(graph.nodes)):
        if n in scalars and not n.users:
            graph.erase_node(n)


# ---- masks that are constants: SimCLR's `sim[~torch.eye(N, dtype=torch.bool)].view(N, -1)` ----

def fold_constant_masks(ep, written: set = frozenset()) -> None:
    """A boolean mask computed from nothing the program takes (torch.eye, arange, ones and what
    is computed from them) selects a number of elements known when compiling: each such
    selection `x[mask]` becomes `x[p0, p1, ...]`, the mask's positions as constants of the
    program (lifted as torch.export lifts a tensor constant), and every value is propagated
    again, so that what follows (`.view(N, -1)`) has a static shape. A mask computed from
    memory an in-place op writes (`written`: `m = torch.ones(...); m[0, 1] = False`) is left
    alone: the program is mirrored functionalized, where the writes are values this folds."""
    from torch.export.graph_signature import InputKind

    graph = ep.graph_module.graph
    folded = False
    # the values known when compiling: the program's tensor constants, and those lifted here
    lifted = {s.arg.name: ep.constants[s.target] for s in ep.graph_signature.input_specs
              if s.kind is InputKind.CONSTANT_TENSOR and s.target in ep.constants}
    known = {n: lifted[n.name] for n in graph.nodes if n.op == "placeholder" and n.name in lifted}
    puts = {_aten().index_put.default, _aten().index_put_.default}
    for node in list(graph.nodes):
        if _same_shape_masked_select(node):     # x.masked_select(m): x[m] where they agree
            with graph.inserting_before(node):
                index = graph.call_function(_aten().index.Tensor, (node.args[0], [node.args[1]]))
            index.meta = dict(node.meta)
            node.replace_all_uses_with(index)
            graph.erase_node(node)
            node, folded = index, True
        mask = _constant_mask(node)
        if mask is None:
            continue
        if any(u.target in puts for u in node.args[1][mask].users):
            continue       # `c[mask] *= lam`: a masked update, rewritten whole (emmy.torch_ir.masked)
        value = _evaluate(node.args[1][mask], known, written)
        if value is None:
            continue
        positions = []
        for d, p in enumerate(value.nonzero(as_tuple=True)):
            positions.append(_lift(ep, f"{node.name}_at{d}", p.contiguous()))
            known[positions[-1]] = p
        indices = list(node.args[1])
        indices[mask:mask + 1] = positions
        node.args = (node.args[0], indices)
        folded = True
    if folded:
        graph.eliminate_dead_code()
        ep.graph_module.recompile()
        _propagate(ep.graph_module)


def _same_shape_masked_select(node) -> bool:
    """x.masked_select(mask) where mask has x's shape (then it selects what x[mask] does)."""
    if node.op != "call_function" or node.target is not _aten().masked_select.default:
        return False
    x, m = (_val(a) for a in node.args[:2])
    return x is not None and m is not None and tuple(x.shape) == tuple(m.shape)


def _constant_mask(node) -> int | None:
    """The position among x[...]'s indices of a boolean mask, where that is the only tensor
    index; else None."""
    import torch

    if node.op != "call_function" or node.target is not _aten().index.Tensor:
        return None
    tensors = [i for i, a in enumerate(node.args[1]) if a is not None]
    if len(tensors) != 1:
        return None
    val = _val(node.args[1][tensors[0]])
    return tensors[0] if getattr(val, "dtype", None) is torch.bool else None


@cache
def _like_ops() -> frozenset:
    """The factories that take only a tensor's shape and type from it (asked of every node
    _evaluate visits: built once)."""
    aten = _aten()
    return frozenset({aten.ones_like.default, aten.zeros_like.default, aten.full_like.default})


def _evaluate(node, memo: dict, written: set = frozenset()):
    """`node`'s value where it is computed from the values `memo` knows (constants) and from
    no input of the program (factory ops and what they feed), and from no memory an in-place
    op writes (`written`), else None."""
    import torch

    if node in memo:
        return memo[node]
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload) or \
            node in written:
        return None

    def value(a):
        if hasattr(a, "op"):
            v = _evaluate(a, memo, written)
            if v is None:
                raise LookupError
            return v
        if isinstance(a, (list, tuple)):
            return type(a)(value(x) for x in a)
        return a
    try:
        if node.target in _like_ops() and hasattr(node.args[0], "op"):
            # ones_like(sim) of a computed sim: only its shape and type matter
            like = _val(node.args[0])
            if like is None:
                return None
            args = (torch.empty(tuple(like.shape), dtype=like.dtype), *value(node.args[1:]))
        else:
            args = value(node.args)
        kwargs = {k: value(v) for k, v in node.kwargs.items()}
        out = node.target(*args, **kwargs)
    except (LookupError, RuntimeError, TypeError, ValueError):   # an input read, or refused
        return None
    memo[node] = out if isinstance(out, torch.Tensor) else None
    return memo[node]


def _lift(ep, name: str, value):
    """A constant of the program holding `value`: a placeholder before the model's inputs and
    its entry among the program's lifted constants."""
    from torch.export.graph_signature import InputKind, InputSpec, TensorArgument

    graph = ep.graph_module.graph
    specs = ep.graph_signature.input_specs
    first = next((i for i, s in enumerate(specs) if s.kind is InputKind.USER_INPUT), len(specs))
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    with graph.inserting_before(placeholders[first] if first < len(placeholders) else
                                next(n for n in graph.nodes if n.op != "placeholder")):
        ph = graph.placeholder(name)
    fake = _fake_mode(graph)
    ph.meta["val"] = fake.from_tensor(value, static_shapes=True) if fake is not None else value
    specs.insert(first, InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(name=ph.name),
                                  target=name))
    ep.constants[name] = value
    return ph


def _fake_mode(graph):
    from torch._guards import detect_fake_mode

    return detect_fake_mode([n.meta["val"] for n in graph.nodes
                             if n.op == "placeholder" and "val" in n.meta])


def _propagate(module) -> None:
    """Every node's value (shape, type) as the graph computes it now."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    inputs = [n.meta["val"] for n in module.graph.nodes if n.op == "placeholder"]
    FakeTensorProp(module, _fake_mode(module.graph)).propagate_dont_convert_inputs(*inputs)
