"""Legality: named rules, each a small predicate that returns a plain-English reason or None.

The same rules build the space (an option is offered only if every rule of its key passes
given the decisions before it) and check a proposed row, so a listed row is never refused and
a refused row is never listed. Each rule sees the decisions made so far (`ctx.work`, …).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from emmy.schedule.decisions import Reduce, Stage, Tile, Work, cluster_step, split_chunk
from emmy.schedule.facts import Facts
from emmy.schedule.targets import Target
from emmy.tensor_ir.ir import ReduceOp
from emmy.tile_ir.ir import FoldKind, KernelKind

KIB = 1024


@dataclass(frozen=True)
class Ctx:
    kernel: str
    facts: Facts
    target: Target
    work: Work | None = None
    tile: Tile | None = None
    reduce: Reduce | None = None
    stage: Stage | None = None
    cut: bool | None = None


@dataclass(frozen=True)
class Rule:
    name: str
    key: str
    check: Callable[[Ctx], str | None]


def _kib(n: int) -> str:
    return f"{n / KIB:g} KiB" if n >= KIB else f"{n} B"


# --- WORK -----------------------------------------------------------------------------------

def threads_per_block(c: Ctx) -> str | None:
    if c.work.threads > c.target.max_threads_per_block:
        return (f"{c.work.threads} threads > {c.target.max_threads_per_block} per block "
                f"on {c.target.name}")
    return None


def map_is_per_thread(c: Ctx) -> str | None:
    if c.facts.kind is KernelKind.MAP and c.work.mode != "thread":
        return (f"kernel `{c.kernel}` is a map (no fold along an axis): each thread computes "
                "its own elements; use thread:T")
    return None


def lanes_fit_the_axis(c: Ctx) -> str | None:
    longest = max((e for _, e in c.facts.axes), default=1)
    if c.work.mode == "block" and c.work.lanes > longest:
        return (f"{c.work.lanes} threads share one job but its longest axis has {longest} "
                "elements; choose at most that many")
    return None


# --- TILE -----------------------------------------------------------------------------------

def vector_bytes(c: Ctx) -> str | None:
    width = c.tile.vec * c.facts.widest
    if width > 16:
        return (f"v{c.tile.vec} of {c.facts.widest}-byte elements is {width} bytes; a vector "
                "access moves at most 16 bytes")
    return None


def vector_divides_axis(c: Ctx) -> str | None:
    if not c.facts.axes and c.tile.vec > 1:
        return "the kernel computes a single element; there is nothing to vectorize (v1)"
    for var, extent in c.facts.axes:
        if extent % c.tile.vec:
            return f"axis {var} has {extent} elements, not a multiple of the vector width {c.tile.vec}"
    return None


def vector_aligned(c: Ctx) -> str | None:
    for a in c.facts.accesses:
        if a.stride == 1 and a.aligned % c.tile.vec:
            return (f"`{a.buffer}` is accessed from offsets that are multiples of {a.aligned} "
                    f"element(s), not of {c.tile.vec}: v{c.tile.vec} accesses need aligned starts")
    return None


def scan_vector(c: Ctx) -> str | None:
    if c.facts.kind is KernelKind.SCAN and c.tile.vec != 1:
        return "a scan steps one element per lane (v1)"
    return None


def scan_serial_steps(c: Ctx) -> str | None:
    if c.facts.kind is KernelKind.SCAN and c.work.mode == "thread" and c.tile.n != 1:
        return (f"a thread scanning its row alone folds one element a step (v1x1); n={c.tile.n} "
                "consecutive elements a lane take a warp or a block")
    return None


# --- REDUCE ---------------------------------------------------------------------------------

_METHODS = {"thread": ("serial",), "warp": ("shuffle",),
            "block": ("shuffle", "smem", "split", "cluster")}
_SPELLED = {"split": "split:K:atomic|combine|last", "cluster": "cluster:C"}


def method_fits_work(c: Ctx) -> str | None:
    allowed = _METHODS[c.work.mode]
    if c.reduce.method not in allowed:
        spelled = " or ".join(_SPELLED.get(m, m) for m in allowed)
        return (f"{c.reduce.method} does not fit WORK={c.work.mode}:{c.work.count} "
                f"({c.work.lanes} lane(s) per job); use {spelled}")
    return None


def block_scan_shuffles(c: Ctx) -> str | None:
    if c.facts.kind is KernelKind.SCAN and c.work.mode == "block" and c.reduce.method == "smem":
        return ("a block scans each chunk by shuffles within its warps, the warps' totals in "
                "shared memory; use shuffle")
    return None


def split_needs_pure_reduction(c: Ctx) -> str | None:
    if c.reduce.method == "split" and c.facts.split_ops is None:
        return (f"kernel `{c.kernel}` reads its reduction again inside the same job (an output "
                "pass or a scan), so the reduction cannot be shared across blocks")
    return None


def split_ops(c: Ctx) -> str | None:
    if c.reduce.method != "split" or c.facts.split_ops is None:
        return None
    bad = [op for op in c.facts.split_ops if op in (ReduceOp.ARGMAX, ReduceOp.ARGMIN)]
    if bad:
        return f"{bad[0]} tracks positions; it is not split across blocks"
    if c.reduce.combine == "atomic" and not c.facts.atomic_ok:
        return ("atomic splits add f32 partial sums straight into the output, so the kernel must "
                "store one f32 sum (or its multiple by a constant); use split:K:combine or "
                "split:K:last")
    return None


def split_fits_axis(c: Ctx) -> str | None:
    if c.reduce.method != "split":
        return None
    longest = max(e for _, e in c.facts.axes)
    k, v = c.reduce.split, c.tile.vec
    chunk = split_chunk(longest, k, v)
    if (k - 1) * chunk >= longest:
        return (f"{longest} elements in {k} slices of whole v{v} vectors ({chunk} a slice) "
                "leave the last slice empty; use fewer slices")
    step = k * c.work.lanes * v
    if step > longest:
        return (f"{c.reduce.split} slices × {c.work.lanes} lanes × v{c.tile.vec} = {step} "
                f"elements per step > the {longest} elements of the axis")
    return None


def cluster_shares_a_job(c: Ctx) -> str | None:
    if c.reduce.method != "cluster":
        return None
    if c.target.compute_capability < (9, 0):
        return f"thread-block clusters need sm_90 or later; {c.target.name} has none"
    if c.facts.reverse:
        return ("a reverse scan runs from the row's end; a cluster's blocks scan their slices "
                "from the front (use shuffle)")
    # A reduction shorter than a step of every block's lanes is folded whole by each block (an
    # output pass is always shared); a scan's slices must each take a step (as C ≤ 8 and
    # lanes ≥ 32, none is then empty), and so must the longest fold.
    size, v = c.reduce.split, c.tile.vec
    step = cluster_step(size, c.work.lanes, v)
    folds = list(zip(c.facts.fold_kinds, (n for _, n in c.facts.axes)))
    short_scan = next((n for kind, n in folds if kind is FoldKind.SCAN and step > n), None)
    if short_scan is not None:
        return (f"{size} blocks × {c.work.lanes} lanes × v{v} = {step} elements per step > the "
                f"{short_scan} elements of the scan")
    longest = max(n for _, n in folds)
    if step > longest:
        return (f"{size} blocks × {c.work.lanes} lanes × v{v} = {step} elements per step > the "
                f"{longest} elements of the longest fold: no fold gives every block a step")
    return None


# --- STAGE ----------------------------------------------------------------------------------

def stage_needs_lanes(c: Ctx) -> str | None:
    if c.stage.kind == "smem" and c.work.mode == "thread":
        return ("staging keeps a job's row in shared memory for the lanes that share it; "
                "WORK=thread gives each job one thread; use direct")
    return None


def stage_shared_budget(c: Ctx) -> str | None:
    if c.stage.kind != "smem":
        return None
    rows = c.work.jobs_per_block
    scratch = 16 * c.work.lanes if c.work.lanes > 32 else 0
    need = rows * c.facts.reuse_row_bytes + 16 * len(c.facts.reused) + scratch
    limit = c.target.shared_per_block_optin
    if need > limit:
        extra = f" + {_kib(scratch)} for combining lanes" if scratch else ""
        return (f"{rows} row(s) × {_kib(c.facts.reuse_row_bytes)}{extra} = {_kib(need)} shared "
                f"memory > {_kib(limit)} per block on {c.target.name} "
                f"({_kib(c.target.shared_reserved_per_block)} reserved by the system)")
    return None


def stage_cluster(c: Ctx) -> str | None:
    if c.stage.kind == "smem" and c.reduce is not None and c.reduce.method == "cluster":
        return ("each block of a cluster reads its own slice of the row, again in each pass "
                "(from L2); staging the slices in shared memory is not built: use direct")
    return None


def stage_async(c: Ctx) -> str | None:
    if not c.stage.is_async:
        return None
    if not c.target.has_cp_async:
        return f"cp.async needs sm_80 or later; {c.target.name} has none"
    sizes = {a.itemsize * c.tile.vec for a in c.facts.accesses if a.buffer in c.facts.reused}
    bad = sorted(s for s in sizes if s not in (4, 8, 16))
    if bad:
        return (f"cp.async copies 4, 8 or 16 bytes; TILE=v{c.tile.vec}x{c.tile.n} copies "
                f"{bad[0]} bytes per access")
    if c.tile.vec > 1:
        apart = next((a for a in c.facts.accesses if a.buffer in c.facts.reused
                      and a.stride != 1), None)
        if apart is not None:
            step = "not evenly" if apart.stride is None else f"{apart.stride} elements apart"
            return (f"cp.async copies {c.tile.vec} neighbouring elements; the row of "
                    f"`{apart.buffer}` lies {step} along the axis (use STAGE=smem or v1)")
    return None


# --- PLACE ----------------------------------------------------------------------------------

def cut_leaves_nothing_to_stage(c: Ctx) -> str | None:
    if c.cut and c.stage is not None and c.stage.kind == "smem":
        return ("the output pass moves to a second kernel, so there is no second pass for "
                "STAGE=smem to feed; use STAGE=direct")
    return None


CHAIN_CUT_ROW = {"WORK": "thread:32", "TILE": "v1x1", "REDUCE": "serial"}


def cut_cluster(c: Ctx) -> str | None:
    if c.cut and c.reduce is not None and c.reduce.method == "cluster" and not c.facts.chain:
        return ("a cluster already spreads the output pass over its blocks; a cut after a "
                "cluster's statistics is not built: use fuse")
    return None


def cut_chain_is_two_kernels(c: Ctx) -> str | None:
    if not (c.cut and c.facts.chain):
        return None
    given = {"WORK": f"{c.work.mode}:{c.work.count}", "TILE": f"v{c.tile.vec}x{c.tile.n}",
             "REDUCE": c.reduce.method if c.reduce else "serial"}
    if given != CHAIN_CUT_ROW:
        return (f"PLACE=cut makes `{c.kernel}` two matrix products ({c.kernel}_cut0 and "
                f"{c.kernel}_cut1), each scheduled by its own row; this row's other keys are "
                f"unused and read " + " ".join(f"{k}={v}" for k, v in CHAIN_CUT_ROW.items()))
    return None


RULES: tuple[Rule, ...] = (
    Rule("work.threads_per_block", "WORK", threads_per_block),
    Rule("work.map_is_per_thread", "WORK", map_is_per_thread),
    Rule("work.lanes_fit_the_axis", "WORK", lanes_fit_the_axis),
    Rule("tile.vector_bytes", "TILE", vector_bytes),
    Rule("tile.vector_divides_axis", "TILE", vector_divides_axis),
    Rule("tile.vector_aligned", "TILE", vector_aligned),
    Rule("tile.scan_vector", "TILE", scan_vector),
    Rule("tile.scan_serial_steps", "TILE", scan_serial_steps),
    Rule("reduce.method_fits_work", "REDUCE", method_fits_work),
    Rule("reduce.block_scan_shuffles", "REDUCE", block_scan_shuffles),
    Rule("reduce.split_needs_pure_reduction", "REDUCE", split_needs_pure_reduction),
    Rule("reduce.split_ops", "REDUCE", split_ops),
    Rule("reduce.split_fits_axis", "REDUCE", split_fits_axis),
    Rule("reduce.cluster_shares_a_job", "REDUCE", cluster_shares_a_job),
    Rule("stage.needs_lanes", "STAGE", stage_needs_lanes),
    Rule("stage.shared_budget", "STAGE", stage_shared_budget),
    Rule("stage.cluster", "STAGE", stage_cluster),
    Rule("stage.async", "STAGE", stage_async),
    Rule("place.cut_leaves_nothing_to_stage", "PLACE", cut_leaves_nothing_to_stage),
    Rule("place.cut_cluster", "PLACE", cut_cluster),
    Rule("place.cut_chain_is_two_kernels", "PLACE", cut_chain_is_two_kernels),
)
