"""Capture an nn.Module with torch.export into Torch IR (a 1:1 mirror of the exported ops)."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import re
import warnings
from typing import Any

from emmy.dtypes import from_torch
from emmy.errors import UserError
from emmy.torch_ir.ir import (Arg, Graph, InputKind, Node, Placeholder, Ref, TensorType,
                              input_update)
from emmy.torch_ir import sparse
from emmy.torch_ir.masked import functional_twin, rewrite_masked
from emmy.torch_ir.static_selections import fold_constant_masks, rewrite_selections

_KINDS = {"PARAMETER": InputKind.PARAM, "BUFFER": InputKind.BUFFER,
          "CONSTANT_TENSOR": InputKind.CONSTANT, "USER_INPUT": InputKind.INPUT}


class _SharedWrite(UserError):
    """An in-place op writes memory that something else reads afterwards (a slice assignment
    `y[:, 0] = 1`, `out[..., 1:] = x`): the graph needs functionalizing first."""


def capture(model: Any, inputs: tuple, *, name: str = "model", origin: str | None = None,
            tf32: bool = False) -> Graph:
    """Export `model(*inputs)` and mirror the exported graph, one node per op. A program that
    writes into a view or a tensor read again (`y[:, 0] = 1`, `y[mask] = 0`) is mirrored
    functionalized: torch rewrites each such write as a whole new tensor (slice_scatter,
    select_scatter, index_put, ...) and later reads read it."""
    ep = _export(model, inputs, origin)
    try:
        return _mirror(ep, name, origin, tf32)
    except _SharedWrite as e:
        # mirroring rewrote `ep` in place (constant masks, selections, masked updates), which
        # torch's functionalization cannot always take: it rewrites a fresh export
        functional = _functionalized(_export(model, inputs, origin))
        if functional is None:
            shared = _shared_inputs(inputs)
            raise UserError(f"{e}, and torch could not rewrite the program without writes "
                            "(functionalize it)" + (
                                f"; inputs {shared[0]} and {shared[1]} are one tensor (pass "
                                "copies: eager's write into one changes the other too)"
                                if shared else "")) from None
        return _mirror(functional, name, origin, tf32)


def _shared_inputs(inputs: tuple) -> tuple[int, int] | None:
    """The positions of two tensor inputs that share memory (attn(x, x, x)), if any."""
    import torch

    tensors = [(i, t) for i, t in enumerate(inputs) if isinstance(t, torch.Tensor)]
    for j, (i, a) in enumerate(tensors):
        for k, b in tensors[j + 1:]:
            if a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr():
                return i, k
    return None


def _functionalized(ep):
    """The exported program with every in-place op out of place, or None where torch cannot
    functionalize it. A buffer or model input it writes (a KV cache, `heat.sigmoid_()` on an
    argument) gets its new value as an output of the program (torch's mutation outputs)."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            functional = ep.run_decompositions(
                {torch.ops.aten.instance_norm.default: _instance_norm})
        except Exception:     # torch's own error types vary by version
            return None
    return functional


def _instance_norm(x, weight, bias, running_mean, running_var, use_input_stats: bool,
                   momentum: float, eps: float, cudnn_enabled: bool):
    """aten's instance_norm, whose running statistics functionalization does not see written
    otherwise: a batch norm of every (sample, channel) as its own channel, the running
    statistics it updates averaged over the samples and written back."""
    import torch

    b, c = x.shape[0], x.shape[1]

    def repeated(t):
        return None if t is None else t.repeat(b)

    mean, var = repeated(running_mean), repeated(running_var)
    out = torch.batch_norm(x.contiguous().view(1, b * c, *x.shape[2:]), repeated(weight),
                           repeated(bias), mean, var, use_input_stats, momentum, eps,
                           cudnn_enabled)
    if running_mean is not None:
        running_mean.copy_(mean.view(b, c).mean(0))
    if running_var is not None:
        running_var.copy_(var.view(b, c).mean(0))
    return out.view(x.shape)


def _mirror(ep, name: str, origin: str | None, tf32: bool) -> Graph:
    fold_constant_masks(ep, _overwritten(ep.graph_module.graph))
    rewrite_selections(ep.graph_module)
    token = _WINDOWS.set(_windows(ep))
    try:
        return _mirror_calls(ep, name, origin, tf32)
    finally:
        _WINDOWS.reset(token)


def _mirror_calls(ep, name: str, origin: str | None, tf32: bool) -> Graph:
    import torch

    sig = {spec.arg.name: spec for spec in ep.graph_signature.input_specs
           if hasattr(spec.arg, "name")}
    names = _readable_names(ep, sig)
    placeholders: list[Placeholder] = []
    nodes: list[Node] = []
    values: dict[str, Any] = {}
    sparse_constants: dict[str, sparse.SparseConstant] = {}
    for fx_node in ep.graph.nodes:
        if fx_node.op == "placeholder":
            spec = sig.get(fx_node.name)
            if spec is None or (not fx_node.users and isinstance(fx_node.meta.get("val"),
                                                                  (bool, int, float))):
                continue  # a non-tensor input specialized away by export (its value is baked in)
            kind = _KINDS.get(spec.kind.name)
            if kind is None:
                raise UserError(f"unsupported export input kind {spec.kind.name} for {fx_node.name}")
            ph = Placeholder(names.get(fx_node.name, fx_node.name), kind, _tensor_type(fx_node.meta["val"], fx_node.name),
                             spec.target)
            value = _state_value(ep, spec.target).detach() if kind is not InputKind.INPUT \
                else None
            if value is not None and value.layout is not torch.strided:
                if value.layout is not torch.sparse_coo:
                    raise UserError(f"`{spec.target}`: a {value.layout} tensor; emmy takes "
                                    "dense tensors and COO sparse constants")
                info, arrays = sparse.constant(ph.name, value)
                sparse_constants[fx_node.name] = info
                for n, v in arrays.items():     # its structure: never drawn afresh
                    placeholders.append(Placeholder(
                        n, InputKind.CONSTANT, TensorType(tuple(v.shape), from_torch(v.dtype)),
                        spec.target))
                    values[n] = v
                continue
            placeholders.append(ph)
            if value is not None:
                values[ph.name] = value
    writable = frozenset(n for n, spec in sig.items()
                         if spec.kind.name in ("BUFFER", "USER_INPUT"))
    order = _Order(ep.graph_module, writable)
    for module in ep.graph_module.modules():
        if hasattr(module, "graph"):
            rewrite_masked(module, lambda put: _functional(put, order, origin))
    order = _Order(ep.graph_module, writable)  # the rewritten graphs' nodes
    _calls(ep.graph_module, names, nodes, origin, order, sparse_constants)
    # a functionalized program returns the new values of the buffers and inputs it writes
    # first
    written = _written(ep, [p.name for p in placeholders if p.kind is InputKind.INPUT], names)
    flat = _flat(next(n for n in ep.graph.nodes if n.op == "output").args[0])
    new_values, returned = flat[:len(written)], flat[len(written):]
    outputs = tuple(Ref(names.get(r.name, r.name)) for r in _flatten_outputs(returned))
    if not outputs or len(outputs) != len(returned):
        other = next((i for i, r in enumerate(returned) if not hasattr(r, "op")), None)
        what = (f"its output {other} is {returned[other]!r}, not a tensor" if other is not None
                else f"it returns {returned!r}")
        raise UserError(f"the model must return tensors (a tensor, or a tuple, list or dict of "
                        f"them); {what} (return only the tensors: drop a `None` or a number "
                        "from what forward returns)")
    outputs += tuple(Ref(names.get(r.name, r.name)) for r in new_values)
    return Graph(name=name, placeholders=tuple(placeholders), nodes=tuple(nodes), outputs=outputs,
                 tf32=tf32, updates=tuple(written), values=values)


def _written(ep, inputs: list[str], names: dict[str, str]) -> list[str]:
    """What each of the exported program's mutation outputs writes, in their order: a buffer
    by module path, a model input as `input_update` of its position among the tensor inputs."""
    out = []
    for spec in ep.graph_signature.output_specs:
        if spec.kind.name == "BUFFER_MUTATION":
            out.append(spec.target)
        elif spec.kind.name == "USER_INPUT_MUTATION":
            out.append(input_update(inputs.index(names.get(spec.target, spec.target))))
        elif spec.kind.name == "PARAMETER_MUTATION":
            raise UserError(f"the model writes into its parameter `{spec.target}`; emmy "
                            "compiles functional programs, which change nothing but their "
                            "outputs and the buffers and inputs they write (use the "
                            "out-of-place op, or write into a copy made first)")
        elif spec.kind.name != "USER_OUTPUT":
            raise UserError(f"the exported program writes {spec.target} ({spec.kind.name}); "
                            "emmy writes back buffers and model inputs")
    return out


def _calls(module, names: dict[str, str], nodes: list[Node], origin: str | None,
           order: "_Order", sparse_constants: dict | None = None) -> None:
    """Mirror the calls of one graph module's graph into `nodes`; a region torch.export wraps
    in a higher-order op (`with torch.no_grad():`, `@torch.no_grad()`, autocast turned off) has
    its calls mirrored in its place, and reads of the region's results read them directly."""
    import operator

    graph_nodes = list(module.graph.nodes)
    regions: dict[str, list[str]] = {}    # a region's node -> the names of its results
    checked = _assertions(graph_nodes)
    for fx_node in graph_nodes:
        if fx_node.op != "call_function" or fx_node in checked:
            continue
        source = _source_line(fx_node.meta.get("stack_trace"), origin)
        region = _region(module, fx_node, source, origin)
        if region is not None:
            regions[fx_node.name] = _inline(module, fx_node, *region, names, nodes, origin,
                                            order, sparse_constants or {})
            continue
        if fx_node.target is operator.getitem and getattr(fx_node.args[0], "name", None) \
                in regions:
            names[fx_node.name] = regions[fx_node.args[0].name][fx_node.args[1]]
            continue
        read = [a.name for a in fx_node.args if getattr(a, "name", None) in
                (sparse_constants or {})]
        if read:
            op = op_name(fx_node.target)
            if op not in sparse.PRODUCTS or fx_node.args[0].name != read[0] or len(read) > 1:
                at = f" at {source}" if source else ""
                raise UserError(f"`{op}`{at} reads a sparse constant; emmy multiplies one by a "
                                "dense matrix (torch.sparse.mm(G, x), G @ x) and nothing else")
            x = fx_node.args[1]
            nodes.extend(sparse.product_nodes(
                names.get(fx_node.name, fx_node.name), sparse_constants[read[0]],
                Ref(names.get(x.name, x.name)),
                _tensor_type(x.meta["val"], x.name, source), source))
            continue
        try:
            args = tuple(_arg(a, names) for a in fx_node.args)
            kwargs = tuple((k, _arg(v, names)) for k, v in fx_node.kwargs.items())
        except ValueError as e:   # an element type emmy has not (a cast to uint16, ...)
            at = f" at {source}" if source else ""
            raise UserError(f"`{op_name(fx_node.target)}`{at}: {e}") from None
        op = _functional(fx_node, order, origin)
        if op == "as_strided":
            _row_major(fx_node, source)
        if op == "slice.Tensor" and any(isinstance(a, Ref) for a in args[2:4]):
            op, args, kwargs = "narrow", _window(fx_node, args, kwargs, source), ()
        nodes.append(Node(name=names.get(fx_node.name, fx_node.name),
                          op=op, args=args, kwargs=kwargs,
                          type=_value_type(fx_node.meta.get("val"), fx_node.name, source),
                          source=source))


def _assertions(graph_nodes: list) -> set:
    """The calls that assert what torch._check (or an op at a position the data holds) says
    of a number read off a tensor, with what only they read: not mirrored. The program does
    not check them when it runs; a position out of range is clamped into its tensor by the op
    that reads it, as every gather's are."""
    import torch

    asserts = {torch.ops.aten._assert_scalar.default, torch.ops.aten._assert_async.msg,
               torch.ops.aten.sym_constrain_range_for_size.default,
               torch.ops.aten.sym_constrain_range.default}
    found: set = set()
    for n in reversed(graph_nodes):
        if n.op == "call_function" and (n.target in asserts or n.users and all(
                u in found for u in n.users)):
            found.add(n)
    return found


def _window(fx_node, args: tuple, kwargs: tuple, source: str | None) -> tuple:
    """A slice whose bounds are numbers read off a tensor (`x[p:p + 4]`, `x.narrow(1, p, 4)`
    with p = t.item()) as `narrow(x, dim, start, length)`, its length torch's (a static one,
    `end - start` simplified by export; else the slice's type refuses it)."""
    x, dim, start, end, step = args + (0, None, None, 1)[len(args) - 1:]
    dim, start, end, step = (dict(kwargs).get(k, v) for k, v in
                             (("dim", dim), ("start", start), ("end", end), ("step", step)))
    val = fx_node.meta.get("val")
    length = _value_type(val, fx_node.name, source).shape[dim]  # a length that is data: refused
    if step != 1:
        at = f" at {source}" if source else ""
        raise UserError(f"a slice{at} with step {step} at a position the data holds; emmy "
                        "slices at such a position with step 1")
    return (x, dim, 0 if start is None else start, length)


_REGION_LABELS = {"wrap_with_set_grad_enabled": "no_grad", "wrap_with_autocast": "autocast_off"}


def _region(module, fx_node, source: str | None, origin: str | None):
    """(the region's submodule, its operands) where `fx_node` wraps a region of the forward in
    a higher-order op that changes nothing an inference program computes: grad mode, autocast
    turned off. An autocast region that is on is refused (its casts are not in the graph)."""
    kind = getattr(fx_node.target, "__name__", None)
    if kind == "wrap_with_autocast" and fx_node.args[2]:
        source = source or _first_line(getattr(module, fx_node.args[4].target), origin)
        at = f" at {source}" if source else ""
        raise UserError(f"an autocast region{at} (`torch.autocast(...)` on): emmy compiles "
                        "the element types the model computes in; cast the model and its "
                        "inputs instead (model.half(), x.half())")
    return _region_parts(fx_node)


def _region_parts(fx_node):
    """(the submodule, its operands) of a call of a region's higher-order op, else None."""
    kind = getattr(fx_node.target, "__name__", None)
    if kind == "wrap_with_set_grad_enabled":
        return fx_node.args[1], fx_node.args[2:]
    if kind == "wrap_with_autocast":
        return fx_node.args[4], fx_node.args[5:]
    return None


def _first_line(module, origin: str | None) -> str | None:
    """The user's line of the first call in a region that has one."""
    for n in module.graph.nodes:
        line = _source_line(n.meta.get("stack_trace"), origin)
        if line:
            return line
    return None


def _inline(module, fx_node, submodule, operands, names: dict[str, str], nodes: list[Node],
            origin: str | None, order: "_Order", sparse_constants: dict) -> list[str]:
    """Mirror a region's calls (its graph an attribute of `module`, its inputs the operands),
    each call named after the region (`no_grad.to` for `to` in the region
    `wrap_with_set_grad_enabled`, `no_grad_cos.to` in such a region named after its result
    `cos`); the names of its results."""
    region = getattr(module, submodule.target)
    graph = region.graph
    inner: dict[str, str] = {}
    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    for ph, operand in zip(inputs, operands):
        inner[ph.name] = names.get(operand.name, operand.name)
    kind = fx_node.target.__name__
    label = _REGION_LABELS[kind]
    outer, dot, name = names.get(fx_node.name, fx_node.name).rpartition(".")
    prefix = outer + dot + (name.replace(kind, label) if name.startswith(kind)
                            else f"{label}_{name}")
    for n in graph.nodes:
        if n.op == "call_function":
            inner[n.name] = f"{prefix}.{n.name}"
    _calls(region, inner, nodes, origin, order,
           {ph.name: sparse_constants[o.name] for ph, o in zip(inputs, operands)
            if getattr(o, "name", None) in sparse_constants})
    out = next(n for n in graph.nodes if n.op == "output")
    return [inner.get(r.name, r.name) for r in _flat(out.args[0])]


def op_name(target: Any) -> str:
    """`aten.add.Tensor` -> "add.Tensor", `aten.rms_norm.default` -> "rms_norm", other namespaces
    named: `prims.where.default` -> "prims.where"."""
    if getattr(target, "__name__", None) == "getitem" and not hasattr(target, "_schema"):
        return "getitem"
    if getattr(target, "__module__", None) in ("_operator", "operator") or \
            getattr(target, "__name__", "").startswith("sym_") and \
            getattr(target, "__module__", None) == "torch":
        # arithmetic on a number read off a tensor (`t.item() + 3`): `sym_add`, `sym_max`
        return "sym_" + target.__name__.removeprefix("sym_").strip("_")
    if getattr(target, "__module__", None) == "torch._functorch.predispatch":
        return "torch.vmap"        # its batching calls (flex_attention builds its masks so)
    name = getattr(target, "_name", None) or str(target)  # "aten::add.Tensor"
    ns, _, name = name.rpartition("::")
    overload = getattr(target, "_overloadname", "default")
    base = name.split(".")[0]
    if ns and ns != "aten":                 # "prims::where" -> "prims.where"
        base = f"{ns}.{base}"
    return base if overload in ("default", "") else f"{base}.{overload}"


def _functional(fx_node, order, origin: str | None) -> str:
    """The op's name; an in-place op (`relu_`, `add_.Tensor`, as nn.ReLU(inplace=True) records)
    as its functional twin. torch.export points later uses of the overwritten tensor at the
    in-place op's result, so the twin computes the same values, unless something else shares
    the tensor's memory (a view taken before, the tensor it is a view of) and is read
    afterwards, or the memory is a buffer or model input, or the op writes into `out=`, or a
    norm updates running statistics: each raises _SharedWrite, and the program is mirrored
    functionalized. A write into a parameter is refused."""
    name = op_name(fx_node.target)
    schema = getattr(fx_node.target, "_schema", None)
    if _updates_running_stats(fx_node):
        where = _source_line(fx_node.meta.get("stack_trace"), origin)
        raise _SharedWrite(f"`{name}`{' at ' + where if where else ''} updates its running "
                           "statistics in place")
    if schema is None or not schema.is_mutable or not fx_node.args:
        return name
    first = schema.arguments[0]
    base, dot, overload = name.partition(".")
    where = _source_line(fx_node.meta.get("stack_trace"), origin)
    at = f" at {where}" if where else ""
    outs = [fx_node.kwargs[a.name] for a in schema.arguments
            if a.kwarg_only and a.alias_info and a.alias_info.is_write and a.name in fx_node.kwargs]
    if outs:          # `torch.maximum(a, b, out=a)` (torch.optim's amsgrad), F.normalize's out
        _refuse_input_write(set().union(*(_aliases(t) for t in _flat(outs) if hasattr(t, "op"))),
                            order, name, at)
        raise _SharedWrite(f"`{name}`{at} writes its result into `out`")
    if not (first.alias_info and first.alias_info.is_write) or not base.endswith("_") or \
            any(a.alias_info and a.alias_info.is_write for a in schema.arguments[1:]):
        return name          # not a plain in-place update of `self`: the op table decides
    written = fx_node.args[0] if isinstance(fx_node.args[0], (list, tuple)) else \
        (fx_node.args[0],)
    shared = set().union(*(_aliases(t) for t in written))
    if len(written) > 1 or written[0] is not fx_node.args[0]:
        _refuse_input_write(shared, order, name, at)
        # an update of a list of tensors (`_foreach_mul_`) returns nothing: later reads read
        # the tensors themselves, which only a functionalized graph writes anew
        raise _SharedWrite(f"in-place `{name}`{at} writes into a list of tensors")
    writer = fx_node
    while True:
        _refuse_input_write(shared, order, name, at)
        later = [(n, u) for n in shared for u in n.users
                 if u is not writer and order[u] > order[writer]]
        if later:
            n, u = min(later, key=lambda p: order[p[1]])
            raise _SharedWrite(f"in-place `{name}`{at} overwrites the memory of `{n.name}`, "
                               f"which `{u.name}` reads afterwards; emmy compiles functional "
                               "programs (use the out-of-place op)")
        # a region's input (`with torch.no_grad():`) is its caller's operand: the write must
        # not reach memory the caller reads after the region either (the caller reads the
        # region's result instead)
        inputs = [n for n in shared if n in order.regions]
        if not inputs:
            twin = functional_twin(fx_node.target)        # none in aten: emmy's tables name it
            return op_name(twin) if twin is not fx_node.target else base[:-1] + dot + overload
        operand, writer = order.regions[inputs[0]]
        shared = _aliases(operand)


def _row_major(fx_node, source: str | None) -> None:
    """as_strided's sizes and strides count a tensor's storage: emmy reads them as counting
    its elements in row-major order, which they are where the tensor is contiguous and starts
    its storage (HF Longformer's `_chunk` of a view of its input)."""
    val = getattr(fx_node.args[0], "meta", {}).get("val")
    if val is None or not val.is_contiguous() or val.storage_offset() != 0:
        at = f" at {source}" if source else ""
        raise UserError(f"`as_strided`{at} of a tensor that is not contiguous from the start "
                        "of its storage; emmy takes as_strided of a contiguous tensor (call "
                        "`.contiguous()` first)")


def _updates_running_stats(fx_node) -> bool:
    """Whether the node is a batch or instance norm that computes batch statistics and folds
    them into running ones (F.batch_norm(x, running_mean, running_var, training=True), an
    InstanceNorm tracking its statistics): aten's composite op writes them in place without its
    schema saying so, and export records no write unless the graph is functionalized."""
    import torch

    aten = torch.ops.aten
    at = {aten.batch_norm.default: 5, aten.instance_norm.default: 5}.get(fx_node.target)
    if at is None or len(fx_node.args) <= at:
        return False
    return bool(fx_node.args[at]) and fx_node.args[3] is not None


def _refuse_input_write(shared, order, name: str, at: str) -> None:
    """A write into a parameter is refused; one into a buffer (a KV cache) or a model input
    (`heat.sigmoid_()` on an argument) is left to torch's functionalization, which makes the
    new value an output that the caller writes back."""
    written = [n for n in shared if getattr(n, "op", None) == "placeholder"
               and n not in order.regions]
    if any(n.name not in order.writable for n in written):
        raise UserError(f"in-place `{name}`{at} writes into a parameter; emmy compiles "
                        "functional programs, which change nothing but their outputs and the "
                        "buffers and inputs they write (use the out-of-place op, or write into "
                        "a copy made first: `w = w.clone()`)")
    if written:
        raise _SharedWrite(f"in-place `{name}`{at} writes into a buffer or model input")


class _Order(dict):
    """Each node of the exported program's graphs -> its position in its own graph; `regions`:
    each region's input (a placeholder of its submodule) -> (the caller's operand, the call);
    `writable`: the names of the placeholders that are the model's buffers and inputs."""

    def __init__(self, root, writable: frozenset[str] = frozenset()):
        super().__init__()
        self.writable = writable       # the placeholders a program may write back, by name
        self.regions: dict = {}
        for module in root.modules():
            if not hasattr(module, "graph"):
                continue
            for i, n in enumerate(module.graph.nodes):
                self[n] = i
                parts = _region_parts(n) if n.op == "call_function" else None
                if parts is not None:
                    body = getattr(module, parts[0].target)
                    inputs = [p for p in body.graph.nodes if p.op == "placeholder"]
                    self.regions.update({p: (o, n) for p, o in zip(inputs, parts[1])})


def _is_view(fx_node) -> bool:
    """An op whose result shares its first argument's memory (slice, view, transpose, ...)."""
    schema = getattr(getattr(fx_node, "target", None), "_schema", None)
    if schema is None or not schema.returns or not fx_node.args:
        return False
    alias = schema.returns[0].alias_info
    if alias is None or alias.is_write or not hasattr(fx_node.args[0], "op"):
        return False
    if schema.name in ("aten::to", "aten::type_as"):     # a copy where the type or device changes
        new, old = fx_node.meta.get("val"), fx_node.args[0].meta.get("val")
        return getattr(new, "dtype", None) == getattr(old, "dtype", None) and \
            getattr(new, "device", None) == getattr(old, "device", None)
    return True


def _overwritten(graph) -> set:
    """The nodes whose memory an in-place op writes (`m[0, 1] = False` on a mask made by
    torch.ones: a copy_ into a select of it), with every view that shares it."""
    out: set = set()
    for n in graph.nodes:
        schema = getattr(n.target, "_schema", None)
        if n.op != "call_function" or schema is None or not schema.is_mutable:
            continue
        args = {**{a.name: v for a, v in zip(schema.arguments, n.args)}, **n.kwargs}
        for a in schema.arguments:
            if a.alias_info and a.alias_info.is_write and a.name in args:
                out |= set().union(*(_aliases(t) for t in _flat([args[a.name]])
                                     if hasattr(t, "op")))
    return out


def _aliases(node) -> set:
    """Every node that may share `node`'s memory: up through the views it was taken from, then
    down through every view of that base."""
    while _is_view(node):
        node = node.args[0]
    out, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n not in out:
            out.add(n)
            stack.extend(u for u in n.users if _is_view(u) and u.args[0] is n)
    return out


# torch's loggers that print a whole traceback for an error export then raises (an op whose
# meta kernel refuses its inputs): the raised error is the message, once
_EXPORT_LOGGERS = ("torch._subclasses.fake_tensor", "torch.fx.experimental.symbolic_shapes")


def _export(model, inputs, origin: str | None = None):
    import io
    import logging

    import torch

    loggers = [logging.getLogger(n) for n in _EXPORT_LOGGERS]
    levels = [lg.level for lg in loggers]
    # what torch prints on its way to an error (the partly traced graph of a data-dependent
    # branch) stays out of the terminal: the raised error is the message
    printed = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(printed), \
            contextlib.redirect_stderr(printed), _state_kept(model), _arguments_unvalidated():
        warnings.simplefilter("ignore")
        try:
            for lg in loggers:
                lg.setLevel(logging.CRITICAL)
            return torch.export.export(model, tuple(inputs))
        except Exception as e:  # torch's own error types vary by version
            message = _export_message(e, origin, printed.getvalue())
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)
    reshaped, data_at = _eager_watch(model, inputs, origin)
    if data_at and "`.data`" in message and message.startswith("torch.export failed: "):
        message = message.replace("torch.export failed: ", f"torch.export failed{data_at}: ", 1)
    raise UserError(reshaped or message)


@contextlib.contextmanager
def _state_kept(model):
    """The model's attributes as they were before, and the contents of the lists and dicts they
    hold, and of those its modules' source files hold: a forward that keeps a statistic on the
    module (RevIN's `self.mean = x.mean(...)`) or caches a tensor in a list (YOLOv5's
    `self.grid[i] = self._make_grid(...)`), a module-level dict or an lru_cache leaves
    torch.export's fake tensors there otherwise, which no later copy or run of the model can
    read."""
    import torch

    modules = list(model.modules()) if isinstance(model, torch.nn.Module) else []
    saved = [(vars(m), _contents(vars(m))) for m in modules]
    # the caches of the modules' own source files (sniklaus' PWC-Net keeps its sampling grids
    # in a module-level dict, `backwarp_tenGrid[str(shape)] = ...`, filled in forward)
    spaces = {id(g): g for m in modules
              for g in [getattr(getattr(type(m), "forward", None), "__globals__", None)]
              if isinstance(g, dict)}
    caches = [(c, _contents(c)) for g in spaces.values() for c in list(g.values())
              if type(c) in (dict, list) and c is not g]
    # and their memoized functions (`@functools.lru_cache def base_grid(h, w)`): one that
    # remembered something new forgets all it remembers (entries cannot be taken out one by one)
    memos = [(f, f.cache_info().currsize) for g in spaces.values() for f in list(g.values())
             if isinstance(f, functools._lru_cache_wrapper)]
    try:
        yield
    finally:
        for attrs, contents in saved + caches:
            _restore(attrs, contents)
        for f, size in memos:
            if f.cache_info().currsize != size:
                f.cache_clear()


def _contents(container, depth: int = 3):
    """A snapshot of a list's or dict's entries (and of the lists and dicts among them)."""
    items = list(container.items()) if isinstance(container, dict) else list(container)
    values = [v for _, v in items] if isinstance(container, dict) else items
    inner = [_contents(v, depth - 1) if isinstance(v, (list, dict)) and depth else None
             for v in values]
    return items, inner


def _restore(container, snapshot) -> None:
    """Put `container`'s entries back as `snapshot` has them, in place."""
    items, inner = snapshot
    if isinstance(container, dict):
        container.clear()
        container.update(items)
        values = [v for _, v in items]
    else:
        container[:] = items
        values = items
    for v, sub in zip(values, inner):
        if sub is not None:
            _restore(v, sub)


@contextlib.contextmanager
def _arguments_unvalidated():
    """torch.distributions' argument checks off while exporting, and F.gaussian_nll_loss's: they
    only raise (in eager, where the check runs the model, they still do), and each is a
    data-dependent branch to export (`Normal(loc, scale)` checks that every scale is
    positive). And `torch.tensor(data=...)` taken as torch.tensor(...)."""
    import torch
    import torch.nn.functional as F
    from torch.distributions import Distribution

    before = Distribution._validate_args
    checked, tensor = F.gaussian_nll_loss, torch.tensor
    Distribution.set_default_validate_args(False)
    F.gaussian_nll_loss = _gaussian_nll_loss

    def positional(*args, **kwargs):
        """torch.tensor(data=[...]) (sniklaus' PWC-Net): export fails on the keyword with an
        IndexError of its own; the same call with the data first, made while torch.tensor is
        itself (export's tracer recognizes it by identity: a number read off a tensor)."""
        if not args and "data" in kwargs:
            args = (kwargs.pop("data"),)
        torch.tensor = tensor
        try:
            return tensor(*args, **kwargs)
        finally:
            torch.tensor = positional

    torch.tensor = positional
    try:
        yield
    finally:
        Distribution.set_default_validate_args(before)
        F.gaussian_nll_loss, torch.tensor = checked, tensor


def _gaussian_nll_loss(input, target, var, full=False, eps=1e-6, reduction="mean"):
    """F.gaussian_nll_loss as torch computes it, without its check that no variance is
    negative (a data-dependent branch that only raises; the check's eager run still does)."""
    import math

    import torch

    if isinstance(var, (int, float)):
        var = torch.full_like(input, float(var))
    if var.size() != input.size() and input.size()[:-1] == var.size():
        var = torch.unsqueeze(var, -1)      # one variance for a row's entries
    var = var.clamp(min=eps)
    loss = 0.5 * (torch.log(var) + (input - target) ** 2 / var)
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return loss.mean() if reduction == "mean" else loss.sum() if reduction == "sum" else loss


# in-place ops that change a tensor's shape or strides, not its values
_RESHAPING = frozenset({"unsqueeze_", "squeeze_", "transpose_", "t_", "swapdims_", "swapaxes_",
                        "resize_", "resize_as_", "as_strided_", "set_"})


def _eager_watch(model, inputs, origin: str | None) -> tuple[str | None, str | None]:
    """Why export failed where torch's error does not say (an IndexError from its guards): a model
    that reshapes one of its inputs in place (`min_p.unsqueeze_(1)`), found by running it
    eagerly on copies of the inputs; and where it first reads a tensor's `.data` (` at
    file.py:12: ...`), which torch's error on it does not name."""
    import traceback

    import torch
    from torch.overrides import TorchFunctionMode

    copies = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    ids = {id(x) for x in copies if isinstance(x, torch.Tensor)}

    class Watch(TorchFunctionMode):
        found: str | None = None
        data_at: str | None = None      # the first read of a tensor's `.data`

        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", "")
            reshaped = name in _RESHAPING and args and id(args[0]) in ids and not Watch.found
            data = name == "__get__" and getattr(getattr(func, "__self__", None), "__name__",
                                                 None) == "data" and not Watch.data_at
            if reshaped or data:
                frames = [f for f in traceback.extract_stack()
                          if origin is None or f.filename == origin]
                at = f" at {_frame_line(frames[-1])}" if frames else ""
                if reshaped:
                    Watch.found = (f"in-place `{name}`{at} reshapes a model input; emmy "
                                   "compiles functional programs (use the out-of-place op)")
                elif frames:
                    Watch.data_at = at
            return func(*args, **(kwargs or {}))

    try:
        with torch.no_grad(), _state_kept(model), Watch():
            model(*copies)
    except Exception:       # the model's own failure is the check's to report
        pass
    return Watch.found, Watch.data_at


def _export_message(e: Exception, origin: str | None = None, printed: str = "") -> str:
    import traceback

    text = str(e).strip()
    first = text.splitlines()[0] if text else type(e).__name__
    # torch names the user's call that raised it ("The following call raised this error:")
    line = _source_line(text.partition("raised this error:")[2], None)
    caused = re.search(r"Caused by: \(([^():]+):(\d+) in \w+\)", text)
    if line is None and caused and "torch/" not in caused[1] and "_export/" not in caused[1]:
        import linecache

        code = linecache.getline(caused[1], int(caused[2])).strip()
        # torch shortens the path ("mp/r9/model.py" of /tmp/r9/model.py); the graph it
        # printed on the way has "# File: <path>:<line> in forward, code: <code>" lines
        traced = re.search(rf"File: \S*{re.escape(caused[1])}:{caused[2]} in \w+, code: (.*)",
                           printed)
        code = code or (traced[1].strip() if traced else "")
        line = f"{caused[1].rsplit('/', 1)[-1]}:{caused[2]}" + (f": {code}" if code else "")
    mine = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == origin]
    if line is None and mine:       # raised while tracing the user's own code
        line = _frame_line(mine[-1])
    at = f" at {line}" if line else ""
    at += "" if at.endswith(":") else ":"       # a line `if ...:` ends in its own colon
    data_dependent = ("data-dependent" in text or "GuardOnDataDependent" in type(e).__name__
                      or "DataDependent" in text)
    if data_dependent:
        hint = _specialized_hint(line or "", printed) if "extract specialized integer" in \
            text else _branch_hint((line or "").partition(": ")[2])
        return (f"torch.export failed{at} the model has a data-dependent shape or control "
                f"flow (emmy compiles static shapes only): {first}{hint}")
    hint = ("; a write at a number read off a tensor (`p = t.item()`) is written through a "
            "view: `x.select(1, p).copy_(v)`, `x.narrow(1, p, n).copy_(v)`"
            if "(got SymInt)" in first else
            "; export cannot trace a tensor's `.data` (Lovasz's `perm.data`, "
            "`weight.data.clone()`: `.detach()` reads the same values) nor torch.autograd.grad "
            "inside forward" if "fake tensor in the exported program constant" in first else
            "; a tensor's values moved to numpy are data export cannot know: keep them a "
            "tensor (an index, a gather, `torch.where`)" if ".numpy() is not supported" in first
            else "")
    if "fake tensor in the exported program constant" in first:
        first = first.partition(" This typically")[0]   # not torch's "file an issue"
    return f"torch.export failed{at} {type(e).__name__}: {first}{hint}"


def _specialized_hint(line: str, printed: str = "") -> str:
    """What to write instead, where export needed a number the data holds as a Python int
    (`printed`: the graph torch printed on its way to the error, with its lines' code)."""
    if "float(self.num_batches_tracked)" in printed:
        return ("; a BatchNorm with momentum=None in training averages its running statistics "
                "by 1 / num_batches_tracked, a number its buffer holds: give it a momentum "
                "(torch's default is 0.1), or compile it in eval mode")
    if "one_hot(" in line:
        return "; F.one_hot takes its class count from the data's maximum: give num_classes"
    if re.search(r"\bint\(", line):
        return ("; `int(t)` makes the data a Python number export must know: `t.item()` is "
                "read when the program runs (a slice or select at it: `x[:, p:p + n] = v`, "
                "`x.narrow(1, p, n)`)")
    return "; a position a 0-d tensor holds indexes as a one-element tensor: `x[:, t.view(1)] = v`"


def _branch_hint(code: str) -> str:
    """What to write instead of a branch on a tensor's value in the line's code."""
    if re.search(r"\bif\b", code):
        return ("; a branch on a tensor's value: compute both sides and pick one with "
                "`torch.where(cond, a, b)`")
    if re.search(r"(?<![.\w])(max|min)\(", code):
        return ("; Python's max or min of a number read off a tensor branches on it: "
                "`torch.clamp(t, min=...)` or `torch.maximum(a, b)` keeps it a tensor")
    return ""


def _frame_line(frame) -> str:
    """A traceback frame as `file.py:12: the line`, as source lines are named."""
    return f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}: {(frame.line or '').strip()}"


def _state_value(ep, target: str):
    if target in ep.state_dict:
        return ep.state_dict[target]
    return ep.constants[target]


# the FX nodes whose extents torch knows only symbolically and that are constants all the same:
# a view at a position the data holds (`x.narrow(0, t.item(), 3)`, its length `min(3, 9 - u0)`
# given the assertion on u0 its op makes) and what is computed from it
_WINDOWS: contextvars.ContextVar[frozenset] = contextvars.ContextVar("windows",
                                                                    default=frozenset())
_VIEWS = ("narrow", "slice.Tensor", "select.int", "slice_scatter", "select_scatter")


def _windows(ep) -> frozenset:
    """The names of the views of `ep` at a position read off a tensor (an argument that is an
    FX node and not a tensor), and of every call that reads one, transitively."""
    found: set[str] = set()
    for m in ep.graph_module.modules():
        for n in getattr(m, "graph", None).nodes if hasattr(m, "graph") else ():
            if n.op != "call_function":
                continue
            at = op_name(n.target) in _VIEWS and any(
                hasattr(a, "meta") and not hasattr(a.meta.get("val"), "shape") for a in n.args)
            if at or any(a.name in found for a in n.all_input_nodes):
                found.add(n.name)
    return frozenset(found)


def _constant(n) -> int | None:
    """An extent as a number: an int, or a symbolic one whose expression is a constant."""
    if isinstance(n, int):
        return n
    expr = getattr(getattr(n, "node", None), "expr", None)
    return int(expr) if getattr(expr, "is_Integer", False) else n


def _tensor_type(val: Any, what: str, source: str | None = None) -> TensorType:
    import torch

    if not isinstance(val, torch.Tensor):
        raise UserError(f"`{what}` is not a tensor ({type(val).__name__}); emmy compiles tensor "
                        "programs")
    shape = []
    for s in val.shape:
        s = _constant(s) if what in _WINDOWS.get() else s
        if not isinstance(s, int):
            at = f" at {source}" if source else ""
            dims = ", ".join(str(getattr(getattr(d, "node", None), "expr", d)) for d in val.shape)
            if all(d.isdigit() for d in dims.split(", ")):     # a later reshape asserted it
                dims += ", asserted only when it runs"
            raise UserError(f"`{what}`{at} has a data-dependent shape ({dims}); emmy "
                            f"compiles static shapes only ({_static_instead(what)})")
        shape.append(s)
    try:
        dtype = from_torch(val.dtype)
    except ValueError as e:
        raise UserError(f"`{what}`: {e}") from None
    return TensorType(tuple(shape), dtype)


def _static_instead(what: str) -> str:
    """What keeps the shape static, for the op (an FX node's name) whose shape is data."""
    op = re.sub(r"_\d+$", "", what)
    if op == "bincount":
        return ("`bincount` is as long as the largest value: with the length known, "
                "`torch.zeros(n).scatter_add_(0, idx, torch.ones(len(idx)))` counts the same")
    if op.startswith(("slice", "narrow")):
        return ("a slice whose bounds are a tensor's values has a size export cannot know: "
                "give its length as a number, `x.narrow(0, t.item(), n)`, or gather its "
                "positions, `x[t + torch.arange(n)]`")
    if op.startswith("split") or op in ("tensor_split", "repeat_interleave"):
        return ("sizes read off a tensor's values (`.tolist()`, `.item()`) are data: give "
                "them as Python numbers")
    return ("a boolean mask's selection `x[mask]`, `nonzero` or one-argument `where` has as "
            "many elements as the data selects: `torch.where(mask, x, other)` or `x * mask` "
            "keeps the shape")


def _value_type(val: Any, what: str,
                source: str | None = None) -> TensorType | tuple[TensorType, ...] | None:
    if val is None:
        return None
    if isinstance(val, (tuple, list)):
        return tuple(_tensor_type(v, what, source) for v in val if v is not None)
    return _tensor_type(val, what, source) if hasattr(val, "shape") else None


def _readable_names(ep, sig) -> dict[str, str]:
    """Name params, buffers and constants after their module attribute (`weight`, not
    `p_weight`); a name the emitted CUDA declares itself (`e`, `v3`, `lane`, a C++ keyword) gets
    a `u_` before it, as a kernel's parameter would be hidden by the local of that name."""
    taken = {n.name for n in ep.graph.nodes}
    names: dict[str, str] = {}
    for fx_name, spec in sig.items():
        if spec.kind.name == "USER_INPUT" or not spec.target:
            wanted = fx_name
        else:
            wanted = re.sub(r"\W", "_", spec.target)
            if not wanted[:1].isalpha():        # `0.weight` of an nn.Sequential: not a C name
                wanted = f"p{wanted}"
        while _RESERVED.match(wanted) or wanted in _C_WORDS:
            wanted = f"u_{wanted}"
        if wanted != fx_name and wanted not in taken and wanted not in names.values():
            names[fx_name] = wanted
    return names


# names the emitted kernels declare (loop variables a0, loads in0, values v0, accumulators acc0,
# the thread's tid, lane, element e, ...; the templates' prefixed names), and C++'s and CUDA's
_RESERVED = re.compile(r"^(?:(?:a|in|v|acc|it|chunk|ch)\d+(?:_\w*)?|(?:fa|fw|gm|ch|em|g|e|wg|fc|gp|"
                       r"FA|FW|GM|WG|EM)_\w*|__\w*|[eijmnprs]|j4|kb|kk|kt|mt|dn|dp|bz|bid|tid|vid|"
                       r"lane|lanes|slot|job|crank|warp)$")
_C_WORDS = frozenset("""auto bool break case catch char class const constexpr continue default
    delete do double else enum explicit extern false float for friend goto if inline int long
    mutable namespace new operator private protected public register return short signed sizeof
    static struct switch template this throw true try typedef typename union unsigned using
    virtual void volatile while half min max threadIdx blockIdx blockDim gridDim warpSize
    NULL nullptr""".split())


def _arg(a: Any, names: dict[str, str]) -> Arg:
    import torch

    if hasattr(a, "op") and hasattr(a, "name") and hasattr(a, "meta"):  # an fx.Node
        return Ref(names.get(a.name, a.name))
    if isinstance(a, (list, tuple)):
        return tuple(_arg(x, names) for x in a)
    if isinstance(a, torch.dtype):
        return from_torch(a)
    if isinstance(a, (torch.device, torch.layout, torch.memory_format)):
        return str(a)
    if isinstance(a, (int, float, bool, complex, str)) or a is None:
        return a
    return str(a)


def _flat(out: Any) -> list:
    if isinstance(out, (list, tuple)):
        return [x for o in out for x in _flat(o)]
    return [out]


def _flatten_outputs(out: Any):
    if isinstance(out, (list, tuple)):
        for o in out:
            yield from _flatten_outputs(o)
    elif out is not None and hasattr(out, "name"):
        yield Ref(out.name)


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in \S+\n\s*(?P<code>.*)')


def _source_line(stack: str | None, origin: str | None) -> str | None:
    """The user's line that produced a node: the last frame outside torch's own files."""
    if not stack:
        return None
    frames = [m for m in _FRAME.finditer(stack)
              if "site-packages/torch" not in m["file"] and "/torch/" not in m["file"]]
    if origin:
        mine = [m for m in frames if m["file"] == origin]
        frames = mine or frames
    if not frames:
        return None
    m = frames[-1]
    file = m["file"].rsplit("/", 1)[-1]
    return f"{file}:{m['line']}: {m['code'].strip()}"
