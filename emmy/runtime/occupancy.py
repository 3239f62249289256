"""Occupancy and waves: how many blocks of a launch an SM holds at once, and how many rounds
of blocks the grid needs. The arithmetic of NVIDIA's occupancy calculator, on the target table
and the ptxas report.

    warps/block   = ceil(threads / warp_size)
    regs/warp     = ceil(registers × warp_size / register_alloc_unit) × register_alloc_unit
    by threads    = floor(max_threads_per_sm / (warps/block × warp_size))
    by registers  = floor(floor(registers_per_sm / regs/warp) / warps/block)
    by shared     = floor(shared_per_sm / (roundup(dynamic + static, shared_alloc_unit)
                                           + shared_reserved_per_block))
    blocks/SM     = min(by threads, by registers, by shared, max_blocks_per_sm)
    waves         = ceil(grid / (blocks/SM × sm_count))
"""

from __future__ import annotations

from dataclasses import dataclass

from emmy.cuda.nvrtc import Resources
from emmy.schedule.targets import Target


@dataclass(frozen=True, slots=True)
class Occupancy:
    """Blocks of one launch resident on an SM at once, and what stops there being more."""

    blocks_per_sm: int          # 0: the block does not fit on an SM at all
    warps_per_block: int
    limiter: str                # threads | registers | shared | blocks
    max_warps_per_sm: int

    @property
    def warps_per_sm(self) -> int:
        return self.blocks_per_sm * self.warps_per_block

    @property
    def fraction(self) -> float:
        """Theoretical occupancy: active warps over the SM's maximum."""
        return self.warps_per_sm / self.max_warps_per_sm


@dataclass(frozen=True, slots=True)
class Wave:
    """One round of blocks: `count` such rounds, each with `blocks` blocks on `sms` SMs."""

    count: int
    blocks: int
    sms: int

    @property
    def blocks_per_sm(self) -> float:
        return self.blocks / self.sms


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(a: int, unit: int) -> int:
    return _ceil_div(a, unit) * unit


def occupancy(threads: int, dynamic_shared: int, resources: Resources | None,
              target: Target) -> Occupancy:
    """Blocks per SM for blocks of `threads` threads using `dynamic_shared` bytes."""
    warps = _ceil_div(threads, target.warp_size)
    limits = {"threads": min(target.max_threads_per_sm // (warps * target.warp_size),
                             target.max_warps_per_sm // warps),
              "blocks": target.max_blocks_per_sm}
    registers = resources.registers if resources else 0
    if registers:
        per_warp = _round_up(registers * target.warp_size, target.register_alloc_unit)
        fits_block = per_warp * warps <= target.registers_per_block
        limits["registers"] = (target.registers_per_sm // per_warp) // warps if fits_block else 0
    static = resources.shared_bytes if resources else 0
    per_block = (_round_up(dynamic_shared + static, target.shared_alloc_unit)
                 + target.shared_reserved_per_block)
    fits_shared = dynamic_shared + static <= target.shared_per_block_optin
    limits["shared"] = target.shared_per_sm // per_block if fits_shared else 0
    limiter = min(limits, key=lambda k: (limits[k], k != "threads"))
    return Occupancy(limits[limiter], warps, limiter, target.max_warps_per_sm)


def waves(grid: int, occ: Occupancy, target: Target) -> tuple[Wave, ...]:
    """The grid's rounds: full waves, then a partial last wave (the tail) when there is one."""
    if occ.blocks_per_sm == 0 or grid == 0:
        return ()
    per_wave = occ.blocks_per_sm * target.sm_count
    full, tail = divmod(grid, per_wave)
    out = []
    if full:
        out.append(Wave(full, per_wave, target.sm_count))
    if tail:
        out.append(Wave(1, tail, min(tail, target.sm_count)))
    return tuple(out)


def wave_count(grid: int, occ: Occupancy, target: Target) -> int:
    """ceil(grid / (blocks per SM × SMs)): rounds of blocks the grid needs."""
    return sum(w.count for w in waves(grid, occ, target))
