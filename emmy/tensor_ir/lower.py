"""Lower Torch IR to Tensor IR: each node through its decomposition, in graph order."""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Any

from emmy.dtypes import DType, as_stored
from emmy.errors import InternalError, UnsupportedOp
from emmy.tensor_ir import complex as cx
from emmy.tensor_ir import torch_decomp
from emmy.tensor_ir.builder import Builder
from emmy.tensor_ir.decomp import REGISTRY
from emmy.tensor_ir.decomp.table import Refused, TorchShaped
from emmy.tensor_ir.ir import Input, InputKind, Program
from emmy.tensor_ir.semantics import as_numpy
from emmy.torch_ir.ir import Graph, Node, Ref, TensorType

__all__ = ["lower", "SUPPORTED_OPS"]

# every op some rule lowers: emmy's tables, and the ops of complex values only
SUPPORTED_OPS: list[str] = sorted(set(REGISTRY) | cx.COMPLEX_ONLY)

def lower(graph: Graph) -> Program:
    """Decompose every node of `graph` into Tensor IR definitions."""
    b = Builder(graph.name)
    env: dict[str, Any] = {}
    for p in graph.placeholders:
        table = None
        # an integer constant read as index arithmetic; not a buffer the program writes (its
        # value is the next call's input: a beam search's `cur_len += 1`)
        if p.kind is not InputKind.INPUT and p.name in graph.values and \
                p.type.dtype in (DType.I32, DType.I64) and p.target not in graph.updates:
            table = b.table(as_numpy(graph.values[p.name]), p.type.dtype)
        if p.type.dtype.is_complex:     # stored as (re, im) pairs: emmy.tensor_ir.complex
            env[p.name] = cx.from_stored(b, b.input(p.name, cx.stored_type(p.type), p.kind,
                                                    p.target), p.type)
        else:
            env[p.name] = table or b.input(p.name, p.type, p.kind, p.target)
    for node in graph.nodes:
        env[node.name] = lower_node(b, node, env)
    values = {p.name: as_stored(graph.values[p.name]) for p in graph.placeholders
              if p.kind is not InputKind.INPUT and p.name in graph.values and p.name in b.defs}
    outputs = [_output(b, env[r.name]) for r in graph.outputs]
    return replace(b.finish(outputs, values), tf32=graph.tf32)


def _output(b: Builder, value) -> str:
    """An output's Tensor IR value: a complex one as its stored pairs; an input as it is
    (`x.reshape(-1)` of a vector) copied, so that the caller gets its own tensor, as from
    every other program."""
    if isinstance(value, cx.Pair):
        return cx.to_stored(b, value)
    return b.copy(value) if isinstance(b.defs[value], Input) else value


def lower_node(b: Builder, node: Node, env: dict[str, Any], _expanding: tuple[str, ...] = ()):
    """The Tensor IR value(s) of one node: a name, a tuple of names, or None (a complex value:
    an emmy.tensor_ir.complex.Pair)."""
    if cx.involves_complex(node, env):
        result = cx.lower_complex(b, node, env, lower_node)
        if result is not cx.NO_RULE:
            return result
        return _lower_through_torch(b, node, env, _expanding, refused=cx.UNSUPPORTED)
    if node.op.startswith("_foreach_"):
        return _foreach(b, node, env, _expanding)
    decomp = REGISTRY.get(node.op)
    if decomp is None:
        return _lower_through_torch(b, node, env, _expanding)
    halves: list[DType] = []
    tensor = _widen(b, halves) if decomp.opmath else None
    args = tuple(_resolve(a, env, tensor) for a in node.args)
    kwargs = {k: _resolve(v, env, tensor) for k, v in node.kwargs}
    try:
        inspect.signature(decomp.fn).bind(b, *args, **kwargs)
    except TypeError as e:
        raise UnsupportedOp(node.op, source=node.source,
                            detail=f"arguments not understood: {e}") from None
    try:
        result = decomp.fn(b, *args, **kwargs)
    except Refused as e:
        raise UnsupportedOp(node.op, source=node.source, detail=e.detail) from None
    return _conform(b, node, result, halves[0] if halves else None)


# the op a `_foreach_<op>.<overload>` applies to each tensor of its lists, by overload: the
# names to try, in order
_FOREACH = {"List": ("{}.Tensor", "{}.Tensor_Tensor", "{}"), "Tensor": ("{}.Tensor", "{}"),
            "Scalar": ("{}.Tensor_Scalar", "{}.Scalar", "{}.Tensor", "{}"),
            "ScalarList": ("{}.Tensor_Scalar", "{}.Scalar", "{}.Tensor", "{}"),
            "ScalarAndTensor": ("{}.Scalar", "{}"),
            "default": ("{}", "{}.default")}
_FOREACH_OP = {"norm": "linalg_vector_norm"}


def _foreach(b: Builder, node: Node, env: dict[str, Any], expanding: tuple[str, ...]):
    """torch._foreach_* (torch.optim's multi-tensor path): the op on each tensor of its lists,
    a list argument's (tensors or numbers) i-th entry for the i-th, the rest shared."""
    base, _, overload = node.op[len("_foreach_"):].partition(".")
    base = _FOREACH_OP.get(base, base)
    names = [f.format(base) for f in _FOREACH.get(overload or "default", ("{}",))]
    op = next((n for n in names if n in REGISTRY), names[-1])
    count = next((len(a) for a in node.args if isinstance(a, tuple)), 0)
    types = node.type if isinstance(node.type, tuple) else (node.type,) * count

    def entry(a, i):
        return a[i] if isinstance(a, tuple) and len(a) == count else a
    args, kwargs = node.args, node.kwargs
    if base in ("addcmul", "addcdiv") and len(args) == 4:       # its value, positional here
        args, kwargs = args[:3], (*kwargs, ("value", args[3]))
    out = []
    for i in range(count):
        one = replace(node, name=f"{node.name}_{i}", op=op,
                      args=tuple(entry(a, i) for a in args),
                      kwargs=tuple((k, entry(v, i)) for k, v in kwargs), type=types[i])
        out.append(lower_node(b, one, env, expanding))
    return tuple(out)


def _lower_through_torch(b: Builder, node: Node, env: dict[str, Any], expanding: tuple[str, ...],
                         refused: str | None = None):
    """An op emmy has no decomposition of: the ops torch decomposes it into, each lowered as
    a node of the graph would be (emmy.tensor_ir.torch_decomp). `refused`: what to say where
    that fails (on complex values: what emmy computes on them)."""
    types = {}
    for r in torch_decomp.tensor_refs(node):
        v = env.get(r)
        if isinstance(v, (str, cx.Pair)):
            types[r] = v.type if isinstance(v, cx.Pair) else b.type(v)
    expansion = None if node.op in expanding else torch_decomp.expand(node, types)
    if expansion is None:
        raise UnsupportedOp(node.op, source=node.source, detail=refused)
    local = {inp: env[r] for inp, r in zip(expansion.inputs, torch_decomp.tensor_refs(node))}
    for sub in expansion.nodes:
        try:
            local[sub.name] = lower_node(b, sub, local, expanding + (node.op,))
        except UnsupportedOp as e:
            if e.op == node.op and not refused:
                raise
            raise UnsupportedOp(node.op, source=node.source,
                                detail=refused or f"torch decomposes it into ops that include "
                                                  f"`{e.op}`, which emmy does not lower") from None
    return _conform(b, node, _resolve(expansion.outputs, local), None)


def _resolve(a, env: dict[str, Any], tensor=None):
    """Refs become definition names (passed through `tensor`); literals stay as they are."""
    if isinstance(a, Ref):
        value = env[a.name]
        return tensor(value) if tensor else value
    if isinstance(a, tuple):
        return tuple(_resolve(x, env, tensor) for x in a)
    return a


def _widen(b: Builder, halves: list[DType]):
    """For opmath ops: f16/bf16 (and 8-bit float) tensors are cast to f32, and their type
    remembered."""
    def widen(v):
        if isinstance(v, tuple):
            return tuple(widen(x) for x in v)
        if isinstance(v, str) and b.dtype(v).is_narrow_float:
            halves.append(b.dtype(v))
            return b.cast(v, DType.F32)
        return v

    return widen


def _conform(b: Builder, node: Node, result, half: DType | None):
    """Check shapes against torch's and give each result torch's element type."""
    if result is None:
        return None
    if isinstance(result, tuple):
        types = node.type if isinstance(node.type, tuple) and len(node.type) == len(result) \
            else (None,) * len(result)
        return tuple(_conform_one(b, node, r, t, half) for r, t in zip(result, types))
    return _conform_one(b, node, result, node.type if isinstance(node.type, TensorType) else None,
                        half)


def _conform_one(b: Builder, node: Node, name, want: TensorType | None, half):
    if isinstance(name, cx.Pair):       # a complex value: its parts typed as they were built
        return name
    if isinstance(name, TorchShaped):
        if want is None and name.value is None:
            raise InternalError(f"lowering {node.op} ({node.name}): a result without a shape")
        if want is None or (name.value is not None and b.shape(name.value) == want.shape):
            name = name.value
        else:
            return b.full(want.shape, 0, name.dtype)
    if want is None:
        return b.cast(name, half) if half and b.dtype(name).is_float else name
    if b.shape(name) != want.shape:
        raise InternalError(f"lowering {node.op} ({node.name}) gave shape {b.shape(name)}, "
                            f"torch gives {want.shape}")
    if 0 in want.shape:     # no elements: nothing to compute, whatever the op
        return b.full(want.shape, 0, want.dtype)
    return b.cast(name, want.dtype)
