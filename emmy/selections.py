"""Outputs that hold positions (topk, sort, argmax, max over a dimension) as a reference sees
them.

Positions are discrete: where two candidates hold equal values, or values a rounding apart,
which one a program picks is not the program's error. The reference therefore
- breaks exact ties as emmy's kernels do, lowest position first (torch.topk and an unstable
  sort leave their order unspecified, and topk's CPU kernel returns them in any order):
  `stable_topk`, sorts with stable=True;
- records, while the model runs (`recording`), each selection's source tensor, so that an
  output that is such a selection's positions can be checked by what it points at
  (`positions_agree`): a position is right when it is in range, and the value it picks is the
  value the reference's position picks within `position_rtol` of the least precise floating
  type the values went through (the source's, or the model's own: bf16 logits make float32
  probabilities a bf16 rounding apart), relative to that value plus the rms of its row (a
  product's rounding scales with its terms, not its result); topk takes no position twice.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from emmy.dtypes import DType, from_torch, tolerance


@dataclass(frozen=True)
class Selection:
    """Positions a selection took from `source` along `dim` (None: over the flattened tensor,
    as argmax without a dim); `keepdim`: the output keeps that dimension; `distinct`: no
    position twice (topk)."""

    source: Any
    dim: int | None
    keepdim: bool
    distinct: bool
    output: Any                 # the positions tensor the model returned
    dtype: DType                # whose tolerance decides near ties (of_outputs sets it)


def stable_topk(x, k, dim=-1, largest=True, sorted=True, *, out=None):
    """torch.topk with equal values taken lowest position first; NaN counts as the largest
    value, as in torch.topk (and torch.sort)."""
    import torch

    if out is not None:
        raise TypeError("topk(out=...) is not supported by the reference")
    values, indices = torch.sort(x, dim=dim, descending=largest, stable=True)
    # contiguous, as topk's own results are (CenterNet views them: `.view(batch, -1)`)
    return torch.return_types.topk((values.narrow(dim, 0, k).contiguous(),
                                    indices.narrow(dim, 0, k).contiguous()))


_MODE = None


@contextmanager
def recording(into: list | None = None):
    """Run torch code with topk as stable_topk and every sort stable; each selection's
    positions (topk, sort, argsort, argmax, argmin, max / min, median, nanmedian, mode and
    kthvalue over a dim) are appended to
    `into` (a Selection) when given."""
    global _MODE
    if _MODE is None:
        _MODE = _mode_class()
    with _MODE(into):
        yield


def _mode_class():
    import torch
    from torch.overrides import TorchFunctionMode

    topk = (torch.topk, torch.Tensor.topk)
    sort = (torch.sort, torch.Tensor.sort, torch.argsort, torch.Tensor.argsort)
    arg = (torch.argmax, torch.argmin, torch.Tensor.argmax, torch.Tensor.argmin)
    extreme = (torch.max, torch.min, torch.Tensor.max, torch.Tensor.min)
    ranked = (torch.median, torch.Tensor.median, torch.nanmedian, torch.Tensor.nanmedian,
              torch.mode, torch.Tensor.mode, torch.kthvalue, torch.Tensor.kthvalue)

    class Selections(TorchFunctionMode):
        def __init__(self, into):
            super().__init__()
            self.into = into

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in topk:
                out = stable_topk(*args, **kwargs)
            elif func in sort:
                p = _bound(("input", "dim", "descending"), args, kwargs)
                values, indices = torch.sort(p["input"], dim=p.get("dim", -1),
                                             descending=bool(p.get("descending")), stable=True)
                out = indices if func in sort[2:] else torch.return_types.sort((values, indices))
            else:
                out = func(*args, **kwargs)
            if self.into is not None:
                self._record(func, args, kwargs, out)
            return out

        def _record(self, func, args, kwargs, out):
            if func in topk:
                p = _bound(("input", "k", "dim"), args, kwargs)
                found = (p["input"], p.get("dim", -1), True, True, out[1])
            elif func in sort:
                p = _bound(("input", "dim"), args, kwargs)
                found = (p["input"], p.get("dim", -1), True, True,
                         out if func in sort[2:] else out[1])
            elif func in arg:
                p = _bound(("input", "dim", "keepdim"), args, kwargs)
                found = (p["input"], p.get("dim"), bool(p.get("keepdim")), False, out)
            elif func in extreme and isinstance(out, tuple):     # max / min over a dim
                p = _bound(("input", "dim", "keepdim"), args, kwargs)
                found = (p["input"], p["dim"], bool(p.get("keepdim")), False, out.indices)
            elif func in ranked and isinstance(out, tuple):  # median, mode, kthvalue
                names = ("input", "dim", "keepdim") if func in ranked[:6] else \
                    ("input", "k", "dim", "keepdim")
                p = _bound(names, args, kwargs)
                found = (p["input"], p.get("dim", -1), bool(p.get("keepdim")), False,
                         out.indices)
            else:
                return
            if isinstance(found[0], torch.Tensor):
                self.into.append(Selection(*found, from_torch(found[0].dtype)))

    return Selections


def _bound(names, args, kwargs) -> dict:
    """The call's arguments by name (`names`: the positional parameters, in order; numpy's
    `axis`, which torch takes for `dim`, as `dim`)."""
    out = dict(zip(names, args))
    out.update(kwargs)
    if "axis" in out:
        out["dim"] = out.pop("axis")
    return out


def of_outputs(outputs, recorded: list[Selection], own: list[Selection] | None = None,
               floor: DType | None = None) -> tuple:
    """For each output (flattened, as the model returned it), the Selection whose positions it
    is, else None. `own`: the same model's selections in its own dtypes (recorded in the same
    order) when `recorded` comes from a float64 run; the tolerance is that of the least
    precise of their source's dtype and `floor` (the model's: least_precise)."""
    import dataclasses

    if own is None or len(own) != len(recorded):
        own = recorded
    recorded = [dataclasses.replace(s, dtype=least_precise((o.dtype, floor))
                                    if o.dtype.is_float else o.dtype)
                for s, o in zip(recorded, own)]

    def key(t):
        return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)

    by_key = {key(s.output): s for s in recorded}
    return tuple(by_key.get(key(t)) for t in outputs)


def graph_dtypes(graph) -> tuple[DType | None, ...]:
    """Per output of a Torch IR graph, the least precise floating type it is computed through
    (Muon's Newton-Schulz steps in bfloat16 between float32 tensors: their roundings reach
    its float32 result); not an 8-bit float's."""
    from emmy.torch_ir.ir import Ref

    nodes = {n.name: n for n in (*graph.placeholders, *graph.nodes)}
    memo: dict[str, DType | None] = {}

    def refs(args):
        for a in args:
            if isinstance(a, Ref):
                yield a.name
            elif isinstance(a, tuple):
                yield from refs(a)

    def operands(node) -> list[str]:       # a placeholder has none
        args = (*getattr(node, "args", ()), *(v for _, v in getattr(node, "kwargs", ())))
        return [r for r in refs(args) if r in nodes]

    def through(name: str) -> DType | None:
        todo = [name]
        while todo:          # operands first, without recursion (an unrolled RNN is deep)
            node = nodes[todo[-1]]
            waiting = [r for r in operands(node) if r not in memo]
            if waiting:
                todo.extend(waiting)
                continue
            todo.pop()
            types = node.type if isinstance(node.type, tuple) else (node.type,)
            own = [t.dtype for t in types if t is not None and t.dtype.is_float
                   and t.dtype.itemsize > 1]
            memo[node.name] = least_precise([*own, *(memo[r] for r in operands(node))])
        return memo[name]

    return tuple(through(r.name) for r in graph.outputs)


def least_precise(dtypes) -> DType | None:
    """The floating type of `dtypes` with the widest tolerance (an integer type when there is
    none, None when there is nothing; None entries are skipped)."""
    found = [d for d in dtypes if d is not None]
    floats = [d for d in found if d.is_float]
    return max(floats, key=lambda d: tolerance(d)[1]) if floats else \
        (found[0] if found else None)


def position_rtol(dtype: DType) -> float:
    """How far apart, relatively, two values may be and still rank either way: two units in
    the last place of a 16-bit type (its rounding decides the order of values closer than
    that), the output tolerance of f32 and f64 (where accumulation order, not the final
    rounding, moves a value), 0 for integers."""
    return {DType.BF16: 2.0 ** -6, DType.F16: 2.0 ** -9}.get(dtype, tolerance(dtype)[1])


def model_dtype(model, args) -> DType | None:
    """The least precise floating type of the model's parameters and tensor arguments; not an
    8-bit float's (torch computes nothing in one: every use widens its values exactly)."""
    import torch

    tensors = [*model.parameters(), *(a for a in args if isinstance(a, torch.Tensor))]
    return least_precise(from_torch(t.dtype) for t in tensors
                         if t.is_floating_point() and t.element_size() > 1)


def positions_agree(got, ref, sel: Selection):
    """Per element of `ref` (the reference's positions): (does `got` pick a value equal to the
    one `ref` picks, within position_rtol(sel.dtype) of |wanted| + the rms of the row,
    and, for topk, no position twice; |picked - wanted|, inf out of range). Two tensors shaped
    like `ref`."""
    import torch

    src = sel.source.detach().to(torch.float64)
    ref = ref.detach().to(src.device, torch.int64)
    got = got.detach().to(src.device, torch.int64).reshape(ref.shape)
    if src.dim() == 0:
        src = src.reshape(1)
    if sel.dim is None:                               # over the flattened tensor
        src, dim, g, r = src.reshape(-1), 0, got.reshape(1), ref.reshape(1)
    else:
        dim = sel.dim % src.dim()
        g, r = (got, ref) if sel.keepdim or got.dim() == src.dim() else \
            (got.unsqueeze(dim), ref.unsqueeze(dim))
    n = src.shape[dim]
    inside = (g >= 0) & (g < n)
    picked = src.gather(dim, g.clamp(0, n - 1))
    want = src.gather(dim, r)
    rtol = position_rtol(sel.dtype)
    same = (picked == want) | (torch.isnan(picked) & torch.isnan(want))
    gap = torch.where(same, 0.0, (picked - want).abs())
    gap = torch.where(inside & ~torch.isnan(gap), gap, float("inf"))
    finite = torch.where(torch.isfinite(src), src, 0.0)
    rms = finite.square().mean(dim, keepdim=True).sqrt()
    ok = gap <= rtol * (torch.where(torch.isfinite(want), want.abs(), 0.0) + rms)
    if sel.distinct and g.shape[dim] > 1:
        s = g.sort(dim).values
        k = g.shape[dim]
        twice = (s.narrow(dim, 1, k - 1) == s.narrow(dim, 0, k - 1)).any(dim, keepdim=True)
        ok = ok & ~twice
    return ok.reshape(ref.shape), gap.reshape(ref.shape)


@dataclass(frozen=True)
class PositionCheck:
    """positions_agree's verdict on one output, summed up for a report."""

    ok: Any              # per element (a bool tensor shaped like the reference)
    gap: Any             # per element, |picked - wanted| (inf out of range)
    max_abs: float
    max_rel: float       # max_abs over the source's largest finite |value|
    rtol: float          # position_rtol of the selection

    @property
    def bad(self) -> int:
        return int((~self.ok).sum())


def check_positions(got, ref, sel: Selection) -> PositionCheck:
    """positions_agree, with the figures a report prints."""
    import torch

    ok, gap = positions_agree(got, ref, sel)
    src = sel.source.detach().to(torch.float64).abs()
    finite = src[torch.isfinite(src)]
    scale = float(finite.max()) if finite.numel() else 0.0
    max_abs = float(gap.max()) if gap.numel() else 0.0
    return PositionCheck(ok, gap, max_abs, max_abs / max(scale, 1e-30), position_rtol(sel.dtype))
