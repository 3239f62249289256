"""Apply a row to a Tile IR kernel: the kernels it launches, each with its decisions.

Most rows give one kernel. Two decisions give more, as new Tile IR kernels (the original is
never changed):
- PLACE=cut splits a job at its reduce -> map edge: the first kernel computes the statistics
  and stores the values the output pass reads into a `stats` buffer; the second is a map kernel
  over the output pass.
- REDUCE=split:K splits each job's reduction over K blocks: a `partial` kernel whose grid has
  an extra slice axis, then (combine) a `combine` kernel folding the K partials and running the
  observer, or (atomic) the partial kernel adds straight into the zeroed output, or (last) one
  kernel whose last block of each job folds the partials and runs the observer (its `finish`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from emmy.dtypes import DType
from emmy.loop_ir.ir import Accum, Buffer, Load, Store
from emmy.schedule import decisions as dec
from emmy.schedule.row import Row, make_row
from emmy.schedule.targets import Target
from emmy.symbolic import lin, var
from emmy.tile_ir.cut import splits
from emmy.tile_ir.ir import Axis, Fold, FoldKind, KernelKind, TileKernel
from emmy.tile_ir.values import free, reads, substitute_item, used, value_types
from emmy.torch_ir.ir import TensorType


@dataclass(frozen=True)
class Part:
    kernel: TileKernel
    row: Row
    decisions: dec.Decisions


@dataclass(frozen=True)
class Applied:
    parts: tuple[Part, ...]
    temporaries: tuple[Buffer, ...]     # buffers the parts pass between them
    zero_fill: tuple[str, ...]          # outputs to zero before the first part runs
    target: Target | None = None        # contractions: the template's target
    zeroed: tuple[str, ...] = ()        # temporaries zero when allocated and after every run


def built_by_template(k: TileKernel) -> bool:
    """Kernels a template builds (a tiled product, flash attention): one part, the row as is."""
    return k.kind in (KernelKind.CONTRACT, KernelKind.ATTENTION, KernelKind.CHAIN)


def apply_row(k: TileKernel, row: Row, target: Target) -> Applied:
    """The kernels `row` makes of `k` (the row must be legal for `k`)."""
    if built_by_template(k) and row.get("PLACE") != "cut":   # a template builds the launches
        return Applied((Part(k, row, None),), (), (), target)
    if row.get("PLACE") == "cut" and splits(k):
        raise ValueError(f"`{k.name}` with PLACE=cut is two kernels (emmy.tile_ir.cut): the "
                         "tile stage cuts it (emmy.schedule.choose), each with its own row")
    d = dec.read(row)
    if d.cut:
        first, second, stats = cut(k)
        first_row = make_row({key: v for key, v in row.items if key not in ("STAGE", "PLACE")})
        second_row = _map_row(second, d, target)
        a = apply_row(first, first_row, target)
        return Applied(a.parts + (Part(second, second_row, dec.read(second_row)),),
                       a.temporaries + stats, a.zero_fill, zeroed=a.zeroed)
    if d.reduce is not None and d.reduce.method == "split":
        return split(k, row, d)
    if d.reduce is not None and d.reduce.method == "cluster":
        return Applied((Part(cluster(k, d), row, d),), (), ())
    return Applied((Part(k, row, d),), (), ())


def _map_row(k: TileKernel, d: dec.Decisions, target: Target) -> Row:
    """The map kernel after a cut keeps the row's threads and the widest vector legal for it."""
    from emmy.schedule.space import space_of

    space = space_of(k, target)
    threads = min(d.work.threads, target.max_threads_per_block)
    for vec in (d.tile.vec, 4, 2, 1):
        candidate = make_row({"WORK": f"thread:{threads}", "TILE": f"v{vec}x1"})
        if vec <= d.tile.vec and not space.check(candidate):
            return candidate
    raise AssertionError("v1x1 is always legal for a map kernel")


def cut(k: TileKernel) -> tuple[TileKernel, TileKernel, tuple[Buffer, ...]]:
    """Split at the last fold (a map after a reduce): statistics kernel, output-pass kernel.

    Values the output pass reads that come from the folds are stored, one buffer each; the
    job's other statements (loads, index values, arithmetic on them) are recomputed."""
    last = max(i for i, item in enumerate(k.body) if isinstance(item, Fold))
    out_pass: Fold = k.body[last]
    before, after = k.body[:last], k.body[last + 1:]
    types = value_types(before)
    folded = _fold_results(before)
    recomputed = tuple(i for i in before if not isinstance(i, Fold) and not _reads_any(i, folded))
    stored = [n for n in free((out_pass, *after)) if n in folded]
    jobs_shape = tuple(a.extent for a in k.grid)
    grid_index = tuple(var(a.var) for a in k.grid)
    stats = tuple(Buffer(f"{k.name}_{n}", TensorType(jobs_shape, types[n])) for n in stored)
    saves = tuple(Store(b.name, grid_index, n) for b, n in zip(stats, stored))
    first = replace(k, name=f"{k.name}_stat", kind=KernelKind.ROW, outputs=stats,
                    body=before + saves, atomic=False)
    restores = tuple(Load(n, b.name, grid_index, types[n]) for b, n in zip(stats, stored))
    rest = (*recomputed, *out_pass.body, *after)
    second = replace(k, name=f"{k.name}_apply", kind=KernelKind.MAP,
                     inputs=tuple(b for b in k.inputs if reads(rest, b.name)) + stats,
                     grid=k.grid + (out_pass.axis,), body=restores + rest, atomic=False)
    return first, second, stats


def _fold_results(items) -> set[str]:
    """Accumulators of the folds in `items` and every value computed from them."""
    tainted: set[str] = set()
    for i in items:
        if isinstance(i, Fold):
            tainted |= {a.acc for a in i.accs}
        elif _reads_any(i, tainted) and hasattr(i, "dst"):
            tainted.add(i.dst)
    return tainted


def _reads_any(item, names: set[str]) -> bool:
    return bool(used((item,)) & names)


def _slice(fold: Fold, s: str, K: int, vec: int, bounds: dict[str, int]) -> Fold:
    """Slice `s` (of K) of `fold`: its chunk = split_chunk(n, K, vec) elements from s*chunk,
    the last slice stopping at the axis' end where K chunks overrun it."""
    n = fold.axis.extent
    chunk = dec.split_chunk(n, K, vec)
    j = f"{fold.axis.var}_in"
    env = {fold.axis.var: var(s) * chunk + var(j)}
    bounds = bounds | _nested_extents(fold.body) | {s: K, j: chunk}
    return replace(fold, axis=Axis(j, chunk),
                   body=tuple(substitute_item(i, env, bounds) for i in fold.body),
                   limit=None if chunk * K == n else lin(n) - var(s) * chunk)


def _nested_extents(items) -> dict[str, int]:
    """The extents of the axes of the folds nested in `items` (any depth)."""
    out: dict[str, int] = {}
    for i in items:
        if isinstance(i, Fold):
            out[i.axis.var] = i.axis.extent
            out |= _nested_extents(i.body)
    return out


CLUSTER_RANK = "crank"


def cluster(k: TileKernel, d: dec.Decisions) -> TileKernel:
    """Each job shared by a cluster of C blocks (REDUCE=cluster:C): block `crank` folds slice
    `crank` of the job's folds (reductions, scans, then the output pass); a reduction's
    partial results are combined across the cluster's blocks (distributed shared memory), so
    every block goes on with the whole row's value. A reduction too short to give each block's
    lanes a step (cluster_shares) is folded whole by every block."""
    C = d.reduce.split
    bounds = {a.var: a.extent for a in k.grid}
    body = tuple(replace(_slice(i, CLUSTER_RANK, C, d.tile.vec, bounds), shared=True)
                 if isinstance(i, Fold) and cluster_shares(i.kind, i.axis.extent, C,
                                                           d.work.lanes, d.tile.vec) else i
                 for i in k.body)
    return replace(k, grid=k.grid + (Axis(CLUSTER_RANK, C),), body=body, cluster=C)


def cluster_shares(kind: FoldKind, n: int, size: int, lanes: int, vec: int) -> bool:
    """Whether a cluster of `size` blocks shares a fold of n elements: an output pass always
    (a block past the end has nothing to store), a reduction or scan where each block's lanes
    take at least one step of its slice."""
    return kind is FoldKind.MAP or dec.cluster_step(size, lanes, vec) <= n


def split(k: TileKernel, row: Row, d: dec.Decisions) -> Applied:
    """Share each job's reduction among K blocks (the row is legal, so the job is one reduce fold).

    Slice s folds elements [s*chunk, (s+1)*chunk) of the axis, chunk = dec.split_chunk(n, K, V);
    where K slices of whole vectors do not cover n exactly, the last is shorter (its fold
    stops at n - s*chunk: a ragged split, e.g. a 50,257-element row)."""
    K = d.reduce.split
    fold_i = next(i for i, item in enumerate(k.body) if isinstance(item, Fold))
    fold: Fold = k.body[fold_i]
    s = f"{fold.axis.var}_slice"
    sliced = _slice(fold, s, K, d.tile.vec, {a.var: a.extent for a in k.grid})
    part_row = make_row({"WORK": row["WORK"], "TILE": row["TILE"], "REDUCE": "shuffle"})
    grid = k.grid + (Axis(s, K),)
    if d.reduce.combine == "atomic":
        partial = replace(k, name=f"{k.name}_partial", grid=grid,
                          body=k.body[:fold_i] + (sliced,) + k.body[fold_i + 1:], atomic=True)
        return Applied((Part(partial, part_row, dec.read(part_row)),), (),
                       tuple(b.name for b in k.outputs))
    grid_index = tuple(var(a.var) for a in k.grid)
    temps, saves, loads, accs = [], [], [], []
    for init in fold.accs:
        name = f"{k.name}_{init.acc}_partials"
        t = Buffer(name, TensorType(tuple(a.extent for a in k.grid) + (K,), init.dtype))
        temps.append(t)
        saves.append(Store(name, (*grid_index, var(s)), init.acc))
        loaded = f"{init.acc}_p"
        loads.append(Load(loaded, name, (*grid_index, var("k")), init.dtype))
        accs.append(Accum(init.acc, init.op, loaded))
    partial = replace(k, name=f"{k.name}_partial", grid=grid, kind=KernelKind.ROW,
                      outputs=tuple(temps), body=k.body[:fold_i] + (sliced, *saves))
    combine_fold = Fold(FoldKind.REDUCE, Axis("k", K), fold.accs, tuple(loads) + tuple(accs))
    if d.reduce.combine == "last":
        tickets = Buffer(f"{k.name}_tickets", TensorType(tuple(a.extent for a in k.grid),
                                                         DType.I32))
        whole = replace(k, grid=grid, kind=KernelKind.ROW, outputs=k.outputs + tuple(temps)
                        + (tickets,), body=k.body[:fold_i] + (sliced, *saves),
                        finish=(combine_fold,) + k.body[fold_i + 1:], tickets=tickets.name)
        # one kernel: it shows the row as given; its decisions fold the slice as part_row's
        return Applied((Part(whole, row, dec.read(part_row)),), tuple(temps) + (tickets,),
                       (), zeroed=(tickets.name,))
    combine_body = k.body[:fold_i] + (combine_fold,) + k.body[fold_i + 1:]
    combine = replace(k, name=f"{k.name}_combine", kind=KernelKind.ROW,
                      inputs=tuple(b for b in k.inputs if reads(combine_body, b.name)) + tuple(temps),
                      body=combine_body)
    combine_row = make_row({"WORK": "thread:128", "TILE": "v1x1", "REDUCE": "serial"})
    return Applied((Part(partial, part_row, dec.read(part_row)),
                    Part(combine, combine_row, dec.read(combine_row))), tuple(temps), ())


