"""Ops emmy has no decomposition of its own for, lowered through torch's.

PyTorch describes many ops in terms of others: composite ops (`diff`, `tile`, `outer`,
`tensordot`, ...) are written in other aten ops, and `torch._decomp` holds Python
decompositions of many more (`isnan`, `copysign`, `heaviside`, `xlogy`, `multi_margin_loss`,
...). For a node whose op is not in emmy's tables, `expand` traces the op alone with make_fx on
fake tensors of its arguments' types (shapes are static, so the trace is exact) and returns the
ops it became as Torch IR nodes, for the caller to lower one by one as it does the graph's own.
The Torch IR keeps the op as the user wrote it; the decomposition shows from the Tensor IR on.

An op torch has no decomposition for traces to itself and stays unsupported; so does one whose
decomposition depends on the values (a data-dependent branch or shape).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from emmy.dtypes import DType, to_torch
from emmy.torch_ir.ir import Node, Ref, TensorType

# Literals the capture wrote as strings (emmy.torch_ir.capture._arg): back to torch's objects.
_OBJECTS = ("torch.strided", "torch.contiguous_format", "torch.preserve_format",
            "torch.channels_last")


@dataclass(frozen=True)
class Expansion:
    """The nodes an op decomposes into, in order; `inputs` names the placeholder each tensor
    argument became (in the order of Ref leaves in the node's arguments), `outputs` the value
    (or values) the op returns, as Refs, Nones and tuples of them."""

    inputs: tuple[str, ...]
    nodes: tuple[Node, ...]
    outputs: Any


_NAMESPACES = ("prims", "quantized_decomposed")


def overload(name: str):
    """The OpOverload of a Torch IR op name ("add.Tensor", "rms_norm", "prims.where",
    "quantized_decomposed.quantize_per_tensor.tensor"), or None."""
    import torch

    ns, _, rest = name.partition(".")
    if ns not in _NAMESPACES:
        ns, rest = "aten", name
    base, _, which = rest.partition(".")
    packet = getattr(getattr(torch.ops, ns), base, None)
    return getattr(packet, which or "default", None) if packet is not None else None


def _table(op) -> dict:
    """torch's decomposition of `op`: torch._decomp's (grid_sampler's and affine_grid's
    written here, as ATen's kernels compute them), or
    for the quantize and dequantize ops PT2E's convert_pt2e leaves in a graph
    (`quantized_decomposed`), the Python functions that define them
    (torch.ao.quantization.fx._decomposed), those whose scale and zero point are tensors
    written here with tensor ops (torch's call `.item()`, which a trace cannot)."""
    from torch._decomp import decomposition_table

    if op.namespace == "aten" and op._schema.name == "aten::grid_sampler_3d":
        return {op: _grid_sampler_3d}
    if op.namespace == "aten" and op._schema.name == "aten::grid_sampler_2d":
        return {op: _grid_sampler_2d}
    if op.namespace == "aten" and op._schema.name == "aten::affine_grid_generator":
        return {op: _affine_grid_generator}
    if op in decomposition_table:
        return {op: decomposition_table[op]}
    if op.namespace != "quantized_decomposed":
        return {}
    import torch.ao.quantization.fx._decomposed as decomposed

    base, which = op._schema.name.split("::")[-1], op._overloadname
    fn = _TENSOR_QPARAMS.get((base, which)) or \
        getattr(decomposed, base if which == "default" else f"{base}_{which}", None)
    return {op: fn} if fn is not None else {}


def _affine_grid_generator(theta, size, align_corners: bool):
    """F.affine_grid as ATen's CPU kernel computes it: each axis's positions linspace(-1, 1, n),
    times (n - 1) and then divided by n unless align_corners (torch._decomp's linspace between
    +-(n - 1) / n differs by a unit in the last place, which moves a nearest sample at a
    half-pixel tie to the next pixel), a row of ones, times theta transposed."""
    import torch

    def positions(n: int):
        if n <= 1:
            return torch.zeros(1, dtype=theta.dtype, device=theta.device)
        r = torch.linspace(-1, 1, n, dtype=theta.dtype, device=theta.device)
        return r if align_corners else r * (n - 1) / n

    extents = [int(e) for e in size[2:]]              # (h, w) or (d, h, w)
    axes = [positions(e) for e in reversed(extents)]  # x (the last axis) first
    shape = tuple(extents)
    coords = []
    for i, a in enumerate(axes):
        view = [1] * len(shape)
        view[len(shape) - 1 - i] = shape[len(shape) - 1 - i]
        coords.append(a.view(view).expand(shape))
    coords.append(torch.ones(shape, dtype=theta.dtype, device=theta.device))
    base = torch.stack(coords, -1).view(1, -1, len(coords), 1)        # (1, points, k, 1)
    grid = (base * theta.mT.unsqueeze(1)).sum(-2)                     # (n, points, dims)
    return grid.view(int(size[0]), *shape, len(extents))


def _grid_sampler_3d(volume, grid, interpolation_mode: int = 0, padding_mode: int = 0,
                     align_corners: bool = False):
    """F.grid_sample of a 5-D volume (DVGO's and Plenoxels' voxel grids), which torch has no
    decomposition of (_grid_sampler)."""
    return _grid_sampler(volume, grid, interpolation_mode, padding_mode, align_corners)


def _grid_sampler_2d(image, grid, interpolation_mode: int = 0, padding_mode: int = 0,
                     align_corners: bool = False):
    """F.grid_sample of an image, bilinear or nearest, as torch's CPU kernel computes it
    (_grid_sampler; torch._decomp's scales the grid in another order, which moves a nearest
    sample at a half-pixel tie to the other pixel); bicubic by torch._decomp's."""
    if interpolation_mode == 2:
        from torch._decomp import decomposition_table
        import torch

        return decomposition_table[torch.ops.aten.grid_sampler_2d.default](
            image, grid, interpolation_mode, padding_mode, align_corners)
    return _grid_sampler(image, grid, interpolation_mode, padding_mode, align_corners)


def _grid_sampler(a, grid, interpolation_mode: int, padding_mode: int, align_corners: bool):
    """Each grid point's (x, y[, z]) in [-1, 1] scaled to pixel or voxel coordinates (the
    centres or corners at the ends, as align_corners says), in the order torch's CPU kernels
    scale them (an image's: (g + 1) * s, minus 1/2 for centres; a volume's: ((g + 1) / 2) *
    (size - 1), or ((g + 1) * size - 1) / 2), padded (zeros: a corner outside weighs 0;
    border: clamped; reflection: reflected about the ends, then clamped), then the (bi- or
    tri-)linear sum over the corners around it or the nearest one (rounded half to even);
    16-bit inputs computed in f32."""
    import itertools

    import torch

    if interpolation_mode not in (0, 1):
        raise ValueError("grid_sampler takes bilinear or nearest")
    dtype = a.dtype
    wide = dtype in (torch.float16, torch.bfloat16)
    a, g = (a.float(), grid.float()) if wide else (a, grid)
    n, c, *sizes = a.shape
    image = len(sizes) == 2

    def reflect(t, twice_low: int, twice_high: int):
        if twice_low == twice_high:
            return torch.zeros_like(t)
        low, span = twice_low / 2, (twice_high - twice_low) / 2
        d = (t - low).abs()
        extra = torch.fmod(d, span)
        odd = (d / span).floor().to(torch.int64) % 2 == 1
        return torch.where(odd, span + low - extra, extra + low)

    def source(t, size: int):
        if image:       # torch's vectorized kernel: a factor computed once
            t = (t + 1) * ((size - 1) / 2) if align_corners else (t + 1) * (size / 2) - 0.5
        else:
            t = (t + 1) / 2 * (size - 1) if align_corners else ((t + 1) * size - 1) / 2
        if padding_mode == 1:
            return t.clamp(0, size - 1)
        if padding_mode == 2:
            t = reflect(t, 0, 2 * (size - 1)) if align_corners else reflect(t, -1, 2 * size - 1)
            return t.clamp(0, size - 1)
        return t

    # grid[..., 0] runs along the last axis (x, the width), grid[..., 1] the one before, ...
    coords = [source(g[..., len(sizes) - 1 - d], size) for d, size in enumerate(sizes)]
    lead = [1] * len(sizes)
    batch = torch.arange(n).view(n, 1, *lead)
    channel = torch.arange(c).view(1, c, *lead)

    def corner(at, weight):
        inside = None
        for t, size in zip(at, sizes):
            ok = (t >= 0) & (t < size)
            inside = ok if inside is None else inside & ok
        at = [torch.where(inside, t, 0).to(torch.int64).unsqueeze(1) for t in at]
        return a[(batch, channel, *at)] * torch.where(inside, weight, 0).unsqueeze(1)

    if interpolation_mode == 1:
        out = corner([t.round() for t in coords], torch.ones_like(coords[0]))
    else:
        low = [t.floor() for t in coords]
        out = None
        for step in itertools.product((0, 1), repeat=len(sizes)):
            weight = None
            for t, t0, s in zip(coords, low, step):
                w = t - t0 if s else t0 + 1 - t
                weight = w if weight is None else weight * w
            term = corner([t0 + s for t0, s in zip(low, step)], weight)
            out = term if out is None else out + term
    return out.to(dtype) if wide else out


def _quantize_per_tensor_tensor(input, scale, zero_point, quant_min, quant_max, dtype):
    """As torch's: x times 1 / scale (in double, then a float operand), rounded half to even,
    plus the zero point, clamped, cast."""
    import torch

    if input.dtype in (torch.float16, torch.bfloat16):
        input = input.to(torch.float32)
    inv = (1.0 / scale.reshape(()).to(torch.float64)).to(input.dtype)
    q = torch.round(input * inv) + zero_point.reshape(()).to(input.dtype)
    return torch.clamp(q, quant_min, quant_max).to(dtype)


def _dequantize_per_tensor_tensor(input, scale, zero_point, quant_min, quant_max, dtype, *,
                                  out_dtype=None):
    import torch

    out_dtype = out_dtype or torch.float32
    return (input.to(out_dtype) - zero_point.reshape(()).to(out_dtype)) * \
        scale.reshape(()).to(out_dtype)


def _choose_qparams_tensor(input, qmin, qmax, eps, dtype):
    """Dynamic quantization's affine parameters of a whole tensor, as torch.ao's
    determine_qparams computes them (a scale of the range including 0, at least eps, in the
    input's type then as float64, and the zero point that maps 0 exactly), without its Python
    check of the min and max (a branch on their values, which holds for any non-empty input)."""
    import torch

    low, high = torch.aminmax(input)
    low, high = torch.clamp(low, max=0), torch.clamp(high, min=0)
    scale = torch.maximum((high - low) / float(qmax - qmin),
                          torch.full((1,), eps, dtype=torch.float32))
    zero = qmin - torch.round(low / scale).to(torch.int32)
    return scale.to(torch.float64), torch.clamp(zero, qmin, qmax).to(torch.int64)


_TENSOR_QPARAMS = {("quantize_per_tensor", "tensor"): _quantize_per_tensor_tensor,
                   ("dequantize_per_tensor", "tensor"): _dequantize_per_tensor_tensor,
                   ("choose_qparams", "tensor"): _choose_qparams_tensor}


def expand(node: Node, types: dict[str, TensorType]) -> Expansion | None:
    """torch's decomposition of `node` (its Ref arguments of the given types), or None where
    torch has none that applies here."""
    import torch
    from torch.func import functionalize
    from torch.fx.experimental.proxy_tensor import make_fx

    op = overload(node.op)
    if op is None or not isinstance(op, torch._ops.OpOverload):
        return None
    refs = tensor_refs(node)
    if any(r not in types for r in refs):
        return None
    fakes = fake_tensors([types[r] for r in refs])

    def call(*tensors):
        it = iter(tensors)
        args = tuple(_torch_arg(a, it) for a in node.args)
        kwargs = {k: _torch_arg(v, it) for k, v in node.kwargs}
        return op(*args, **kwargs)

    table = _table(op)
    try:
        # oneDNN off: the decompositions of the recurrent layers (lstm, gru) otherwise pick
        # oneDNN's fused layer for CPU tensors, which is a kernel of its own, not ops (setting
        # the flags warns about Intel GPUs)
        with warnings.catch_warnings(action="ignore"), torch.backends.mkldnn.flags(enabled=False):
            gm = make_fx(call, decomposition_table=table, tracing_mode="fake")(*fakes)
            calls = [n for n in gm.graph.nodes if n.op == "call_function"]
            if any(n.target is op for n in calls):
                return None  # torch computes it with its own kernel: no decomposition
            if not all(map(_out_of_place, calls)):
                # it updates views in place (gru_cell: `gates.chunk(3, 1)[0].add_(...)`):
                # the same trace again through functionalization, which writes each update as
                # a new tensor
                gm = make_fx(functionalize(gm, remove="mutations"), tracing_mode="fake")(*fakes)
                calls = [n for n in gm.graph.nodes if n.op == "call_function"]
                if not all(map(_out_of_place, calls)):
                    return None  # it updates an input
    except Exception:  # a data-dependent decomposition, arguments it refuses: none applies
        return None
    return _mirror(gm, node)


def fake_tensors(types) -> list:
    """Fake tensors (shape and type, no data) of these TensorTypes, as torch.export traces
    with."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        return [torch.empty(t.shape, dtype=to_torch(t.dtype)) for t in types]


def _out_of_place(n) -> bool:
    """Turn an in-place call of a decomposition (nanmean's `isnan(x).logical_not_()`) into
    its out-of-place twin, later readers of the tensor it updated reading its result instead
    (True); False where that would not be the same program (it updates an input, or a
    view)."""
    from emmy.torch_ir.masked import functional_twin

    schema = getattr(n.target, "_schema", None)
    if schema is None or not schema.is_mutable:
        return True
    twin = functional_twin(n.target)
    first = n.args[0] if n.args else None
    if (twin is n.target or getattr(first, "op", None) != "call_function"
            or getattr(first.target, "_schema", None) is None
            or any(r.alias_info is not None for r in first.target._schema.returns)):
        return False
    order = {m: i for i, m in enumerate(n.graph.nodes)}
    n.target = twin
    first.replace_all_uses_with(n, delete_user_cb=lambda u: order[u] > order[n])
    return True


def tensor_refs(node: Node) -> list[str]:
    """The tensors a node reads, in the order of its arguments (positional, then keyword)."""
    refs: list[str] = []
    _collect(node.args, refs)
    _collect(tuple(v for _, v in node.kwargs), refs)
    return refs


def _collect(a, refs: list[str]) -> None:
    if isinstance(a, Ref):
        refs.append(a.name)
    elif isinstance(a, tuple):
        for x in a:
            _collect(x, refs)


def _torch_arg(a, tensors):
    import torch

    if isinstance(a, Ref):
        return next(tensors)
    if isinstance(a, tuple):
        return [_torch_arg(x, tensors) for x in a]
    if isinstance(a, DType):
        return to_torch(a)
    if isinstance(a, str) and a in _OBJECTS:
        return getattr(torch, a.split(".", 1)[1])
    if isinstance(a, str) and a in ("cpu", "meta") or isinstance(a, str) and a.startswith("cuda"):
        return torch.device(a)
    return a


def _mirror(gm, node: Node) -> Expansion:
    """The traced graph as Torch IR nodes named after `node` (so messages point at it)."""
    from emmy.torch_ir.capture import _arg, _value_type, op_name

    names: dict[str, str] = {}
    inputs: list[str] = []
    nodes: list[Node] = []
    outputs: Any = None
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            names[n.name] = f"{node.name}.{n.name}"
            inputs.append(names[n.name])
        elif n.op == "call_function":
            names[n.name] = f"{node.name}.{n.name}"
            nodes.append(Node(name=names[n.name], op=op_name(n.target),
                              args=tuple(_arg(a, names) for a in n.args),
                              kwargs=tuple((k, _arg(v, names)) for k, v in n.kwargs.items()),
                              type=_value_type(n.meta.get("val"), node.name),
                              source=node.source))
        elif n.op == "output":
            outputs = _arg(n.args[0], names)
    return Expansion(tuple(inputs), tuple(nodes), outputs)
