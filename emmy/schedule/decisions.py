"""Typed decisions read from a row's values (the row itself stays canonical text)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from emmy.schedule.row import Row


@dataclass(frozen=True, slots=True)
class Work:
    mode: str        # "thread": a job per thread; "warp": a job per warp; "block": a job per block
    count: int       # threads per block (thread, block) or warps per block (warp)

    @property
    def threads(self) -> int:
        return self.count * 32 if self.mode == "warp" else self.count

    @property
    def lanes(self) -> int:
        """Threads that cooperate on one job."""
        return {"thread": 1, "warp": 32, "block": self.count}[self.mode]

    @property
    def jobs_per_block(self) -> int:
        return self.threads // self.lanes


@dataclass(frozen=True, slots=True)
class Tile:
    vec: int         # elements per vector access (float4 = 4)
    n: int           # vectors per thread per step: independent accumulator chains / unroll


@dataclass(frozen=True, slots=True)
class Reduce:
    method: str      # serial | shuffle | smem | split | cluster
    split: int = 1   # blocks sharing one job's reduction (split: K, cluster: the cluster's size)
    combine: str = ""  # atomic | combine (split only)


def split_chunk(n: int, k: int, vec: int) -> int:
    """Elements of each of `k` slices of an n-element axis (REDUCE=split:k): whole
    `vec`-element vectors, the last slice taking what is left (fewer, never none: the rule
    reduce.split_fits_axis refuses a split that would leave it empty)."""
    return -(-n // (k * vec)) * vec


def cluster_step(size: int, lanes: int, vec: int) -> int:
    """Elements one step of a fold shared by a cluster (REDUCE=cluster:C) takes: `size` blocks
    of `lanes` lanes, `vec` each. A reduction or scan shorter than a step is not shared
    (tile_ir.apply.cluster_shares); the rule reduce.cluster_shares_a_job refuses a row where a
    scan, or the longest fold, is."""
    return size * lanes * vec


@dataclass(frozen=True, slots=True)
class Stage:
    kind: str        # direct | smem
    is_async: bool = False


@dataclass(frozen=True, slots=True)
class Decisions:
    work: Work
    tile: Tile
    reduce: Reduce | None
    stage: Stage | None
    cut: bool


def read_work(value: str) -> Work:
    mode, count = value.split(":")
    return Work(mode, int(count))


def read_tile(value: str) -> Tile:
    m = re.fullmatch(r"v(\d+)x(\d+)", value)
    assert m, value
    return Tile(int(m[1]), int(m[2]))


def read_reduce(value: str) -> Reduce:
    parts = value.split(":")
    if parts[0] == "split":
        return Reduce("split", int(parts[1]), parts[2])
    if parts[0] == "cluster":
        return Reduce("cluster", int(parts[1]))
    return Reduce(parts[0])


def read_stage(value: str) -> Stage:
    return Stage("smem", True) if value == "smem:async" else Stage(value)


def read(row: Row) -> Decisions:
    """Typed view of a row the space has accepted."""
    return Decisions(work=read_work(row["WORK"]), tile=read_tile(row["TILE"]),
                     reduce=read_reduce(row["REDUCE"]) if "REDUCE" in row.keys else None,
                     stage=read_stage(row["STAGE"]) if "STAGE" in row.keys else None,
                     cut=row.get("PLACE") == "cut")
