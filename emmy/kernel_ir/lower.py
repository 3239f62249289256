"""Lower scheduled Tile IR kernels to Kernel IR.

A job (one iteration of the grid) goes to a worker of `lanes` threads (WORK). The folds directly
in the job's body are spread over the lanes: lane l takes the V-element vectors at l*V,
l*V + lanes*V, …, N of them per step (TILE), with N independent accumulator chains; a reduce
fold then combines chains and lanes (REDUCE); loads of a staged buffer go through shared memory
(STAGE). Folds nested deeper run serially inside one lane. Statements outside folds are computed
by every lane alike; stores outside folds are made by lane 0.
"""

from __future__ import annotations

from importlib import import_module

from emmy.kernel_ir import ir as K
from emmy.kernel_ir.context import Fn, decode
from emmy.kernel_ir.elements import group
from emmy.kernel_ir.fastmath import approximate, sixteen_bit
from emmy.kernel_ir.jobs import lower_jobs
from emmy.symbolic import Lin, floordiv, lin, var
from emmy.tile_ir.apply import Applied, Part
from emmy.tile_ir.ir import KernelKind
from emmy.tile_ir.values import value_types


# kernel kinds a template builds: the module and function that lower them
SM90_HEADER = "emmy_sm90.cuh"     # thread-block clusters (REDUCE=cluster:C)
_TEMPLATES = {KernelKind.CONTRACT: ("emmy.kernel_ir.gemm", "lower_contract"),
              KernelKind.CHAIN: ("emmy.kernel_ir.b2b", "lower_chain"),
              KernelKind.ATTENTION: ("emmy.kernel_ir.flash", "lower_attention")}


def lower_applied(name: str, applied: Applied) -> K.KProgram:
    """All the launches a row makes of one kernel."""
    first = applied.parts[0]
    if first.kernel.kind in _TEMPLATES:     # one part, built by a template's lowering
        module, function = _TEMPLATES[first.kernel.kind]
        lower = getattr(import_module(module), function)
        return lower(first.kernel, first.row, applied.target)
    functions = tuple(lower_part(p) for p in applied.parts)
    launches = tuple(K.Launch(f.name, tuple(p.name for p in f.params)) for f in functions)
    temps = tuple((b.name, b.type.dtype.c_name, b.type.numel) for b in applied.temporaries)
    clusters = any(p.kernel.cluster > 1 for p in applied.parts)
    return K.KProgram(name=name, functions=functions, launches=launches, temporaries=temps,
                      zero_fill=applied.zero_fill, zeroed=applied.zeroed,
                      headers=(SM90_HEADER,) if clusters else ())


def lower_part(part: Part) -> K.KFunction:
    k, d = part.kernel, part.decisions
    buffers = (*k.inputs, *k.outputs)
    fn = Fn(k, d, value_types(k.body), {b.name: b.type.shape for b in buffers},
             {a.var: a.extent for a in k.grid})
    params = tuple(K.Param(b.name, b.type.dtype.c_name, False) for b in k.inputs) + \
        tuple(K.Param(b.name, b.type.dtype.c_name, True) for b in k.outputs)
    if k.kind is KernelKind.MAP:
        body, grid = _lower_map(fn)
    else:
        body, grid = lower_jobs(fn)
    if sixteen_bit(k):
        body = approximate(body)
    prologue = tuple(fn.shared)
    return K.KFunction(name=k.name, params=params, grid=grid, threads=d.work.threads,
                       shared_bytes=fn.shared_top, body=prologue + body, row=str(part.row),
                       cluster=k.cluster)


# --- map kernels ----------------------------------------------------------------------------

def _vector_base(fn: Fn, body: list[K.KStmt], V: int) -> Lin:
    """The first element of a thread's vector along the grid's last axis, written as V times
    the vector's number along it where the axis holds whole vectors: the elements' positions
    are then `V*q + v`, whose remainders and quotients by a divisor of V simplify (a complex
    pair's `(V*q + 1) % 2` is 1, `(V*q + 1) / 2` is `(V/2)*q`), so that an interleaved
    layout's per-element selects and repeated loads fold away in the emitted code."""
    k = fn.k
    if not k.grid:
        return lin(0)
    last = k.grid[-1]
    if V == 1 or last.extent % V:
        return var(last.var)
    q = f"{last.var}_v"
    body.append(K.Index(q, floordiv(var(last.var), V, fn.bounds)))
    fn.bounds[q] = last.extent // V
    return var(q) * V


def _lower_map(fn: Fn) -> tuple[tuple[K.KStmt, ...], int]:
    """One thread per V-element vector of the flattened grid, N vectors per thread."""
    k, T, V, N = fn.k, fn.d.work.threads, fn.d.tile.vec, fn.d.tile.n
    total = k.jobs // V
    grid = max(1, -(-total // (T * N)))
    fn.bounds |= {"tid": T, "bid": grid, "s": N, "vid": total, "e": k.jobs}
    out: list[K.KStmt] = []
    for s in range(N):
        vid = f"vid{s}" if N > 1 else "vid"
        fn.bounds[vid] = total
        body: list[K.KStmt] = [K.Index("e", var(vid) * V, wide=True)]
        body += decode(fn, "e", k.grid, k.jobs)
        last = k.grid[-1].var if k.grid else None
        body += group(fn, k.body, last, _vector_base(fn, body, V), V)
        stmt = [K.Index(vid, (var("bid") * N + s) * T + var("tid"), wide=True)]
        if total % (T * N) or s:
            stmt.append(K.If(f"{vid} < {total}", tuple(body)))
        else:
            stmt += body
        out += stmt
    return tuple(out), grid


