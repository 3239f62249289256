"""Tile IR: a kernel's schedule-independent Fold tree, and the row applied to it.

A Loop IR kernel is lifted into:
- `grid`: the outer parallel axes whose iterations are independent workers' jobs ("rows");
- `body`: what one job computes, as items in order: scalar statements (the Loop IR's own
  statements, computed once per job) and `Fold`s over one axis each:
    map     every element independently (an output pass);
    reduce  fold elements into accumulators with `init` + `combine`; the statements after the
            fold that read its accumulators are its observer (rsqrt(mean + eps) in RMSNorm);
    scan    a running reduce whose running value is read inside the fold.
  A fold's own body holds the per-element `lift` (statements) and may nest further folds.

The Fold tree never changes when a row is applied: `Scheduled` pairs a TileKernel with a row.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Union

from emmy.loop_ir.ir import Buffer, Init, Stmt
from emmy.schedule.row import Row
from emmy.symbolic import Lin


class FoldKind(Enum):
    MAP = "map"
    REDUCE = "reduce"
    SCAN = "scan"

    def __str__(self) -> str:
        return self.value


class KernelKind(Enum):
    """The shape of the Fold tree, which decides the schedule's decision points."""

    MAP = "map"          # body has no folds: one element per job (a perfect nest of maps)
    ROW = "row"          # body folds along an axis: reductions, then maybe an output pass
    SCAN = "scan"        # body scans along an axis
    CONTRACT = "contract"  # a sum of products of two loads: a matrix product (tile_ir.contract)
    ATTENTION = "attention"  # scaled dot-product attention, f16/bf16/f32 (tile_ir.attention)
    CHAIN = "chain"        # two chained contractions, fused (tile_ir.chain.FusedChain)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Axis:
    var: str
    extent: int


@dataclass(frozen=True, slots=True)
class Fold:
    kind: FoldKind
    axis: Axis
    accs: tuple[Init, ...]            # reduce / scan: the accumulators it folds into
    body: tuple["Item", ...]          # the lift: statements, and nested folds
    reverse: bool = False
    limit: Lin | None = None          # the fold stops at min(extent, limit), limit over the
                                      # grid's variables: a ragged split's shorter last slice
    shared: bool = False              # a slice of it is folded by each block of a cluster,
                                      # a reduction's partials combined across the cluster


Item = Union[Stmt, Fold]


@dataclass(frozen=True, slots=True, kw_only=True)
class TileKernel:
    name: str
    identity: str                     # the Loop IR kernel identity hash
    kind: KernelKind
    inputs: tuple[Buffer, ...]
    outputs: tuple[Buffer, ...]
    grid: tuple[Axis, ...]            # outer parallel axes, outermost first
    body: tuple[Item, ...]
    atomic: bool = False              # stores add into outputs zeroed beforehand (split reductions)
    cluster: int = 1                  # > 1: the last grid axis is a block's rank in a cluster of
                                      # this many sharing the job (REDUCE=cluster:C); the folds
                                      # hold its slices, reductions combine across the cluster
    contract: object = None           # CONTRACT kernels: their tile_ir.contract.Contraction
    attention: object = None          # ATTENTION kernels: their tile_ir.attention.Attention
    chain: object = None              # CHAIN kernels: their tile_ir.chain.FusedChain
    tf32: bool = False                # its float32 products may round operands to tf32
    # REDUCE=split:K:last: the grid's last axis is the slice of each job a block folds; once it
    # has stored its partials, the block takes a ticket for its job in `tickets` (an int per
    # job, zero before and after each run), and the last of the K runs `finish` (the fold of
    # the K partials and the statements after it) for the job
    finish: tuple = ()
    tickets: str = ""

    @property
    def jobs(self) -> int:
        n = 1
        for a in self.grid:
            n *= a.extent
        return n

    @property
    def folds(self) -> tuple[Fold, ...]:
        """The folds directly in a job's body: the ones a schedule distributes over workers."""
        return tuple(i for i in self.body if isinstance(i, Fold))


@dataclass(frozen=True, slots=True, kw_only=True)
class TileProgram:
    name: str
    inputs: tuple[Buffer, ...]
    intermediates: tuple[Buffer, ...]
    outputs: tuple[Buffer, ...]
    kernels: tuple[TileKernel, ...]


@dataclass(frozen=True, slots=True)
class Scheduled:
    """A kernel with the row applied to it (a new object; the kernel is unchanged)."""

    kernel: TileKernel
    row: Row
