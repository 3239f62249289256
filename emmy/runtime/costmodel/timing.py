"""Timing: a launch's seconds from its work and traffic, wave by wave (bandwidths, bytes in
flight, the dependent chain, compute, same-address atomics), its limiter, and the memset
launch that zeroes an output before atomics."""

from __future__ import annotations

import math
from dataclasses import dataclass

from emmy.cuda.nvrtc import Resources
from emmy.runtime.costmodel.constants import (ATOMIC_SAME_ADDRESS_S, COMPUTE_EFFICIENCY,
                                              DRAM_EFFICIENCY, DRAM_LATENCY_S,
                                              FP64_RATE_FRACTION, ISSUE_PER_SM_PER_CYCLE,
                                              L2_LATENCY_S, L2_OVER_DRAM, L2_USABLE_FRACTION,
                                              METHOD, SFU_LANES_PER_SM, SM_MAX_BYTES_IN_FLIGHT,
                                              SM_PORT_BYTES_PER_CYCLE, WARPS_FOR_FULL_ISSUE)
from emmy.runtime.costmodel.traffic import L2Residency, Traffic, classify
from emmy.runtime.costmodel.work import Work
from emmy.runtime.occupancy import Occupancy, occupancy, waves
from emmy.schedule.targets import Target


@dataclass(frozen=True, slots=True)
class LaunchEstimate:
    """The modeled time of one launch and the figures it came from."""

    kernel: str                      # the Tile IR kernel the launch belongs to
    function: str
    seconds: float
    bytes_dram: int                  # reads and writes that reach DRAM
    bytes_l2: int                    # reads served by L2 (beyond the DRAM bytes, which pass it too)
    flops: int                       # FP32-pipe + FP64 + special-function operations
    occupancy: float                 # active warps / max warps per SM
    blocks_per_sm: int
    waves: int
    limiter: str                     # memory | compute | latency | launch
    resources: Resources | None
    grid: int = 0
    threads: int = 0
    breakdown: tuple[tuple[str, float], ...] = ()   # seconds per term, summed over waves
    method: str = METHOD


_LIMITER = {"dram": "memory", "l2": "memory", "sm port": "memory", "latency": "latency",
            "issue": "compute", "fp32": "compute", "fp64": "compute", "sfu": "compute",
            "atomics": "memory", "last block": "latency"}


def estimate_launch(work: Work, spec, resources: Resources | None, target: Target,
                    l2: L2Residency | None = None, *, kernel: str = "") -> LaunchEstimate:
    """Model one launch (`spec`: a LaunchSpec) of a function whose work is `work`."""
    l2 = l2 if l2 is not None else L2Residency(target.l2_bytes * L2_USABLE_FRACTION)
    occ = occupancy(spec.threads, spec.shared_bytes, resources, target)
    if occ.blocks_per_sm == 0:
        return _unlaunchable(kernel, spec, occ, resources)
    resident = min(work.jobs, occ.blocks_per_sm * target.sm_count * work.jobs_per_block)
    traffic = classify(work, resident, target, l2)
    spill = 0.0
    if resources and (resources.spill_store_bytes or resources.spill_load_bytes):
        spill = ((resources.spill_store_bytes + resources.spill_load_bytes) * spec.grid
                 * spec.threads * max(1.0, work.lane_loop_trips))
    totals: dict[str, float] = {}
    seconds = 0.0
    plan = waves(spec.grid, occ, target)
    for wave in plan:
        terms = _wave_terms(work, traffic, spill, wave, spec, occ, target)
        atomics = terms.pop("atomics")
        # a block waits for its loads, then runs its dependent steps
        terms["latency"] = terms.pop("concurrency") + terms.pop("chain")
        worst = max(terms, key=terms.get)
        t = terms[worst] + atomics
        seconds += wave.count * t
        totals[worst] = totals.get(worst, 0.0) + wave.count * terms[worst]
        if atomics:
            totals["atomics"] = totals.get("atomics", 0.0) + wave.count * atomics
    for name, size in traffic.touched:
        l2.touch(name, size)
    if work.finish_cycles:      # split:K:last: the ticket's round trip, then the partials'
        totals["last block"] = DRAM_LATENCY_S + L2_LATENCY_S + work.finish_cycles / target.clock_hz
        seconds += totals["last block"]
    limiter = _LIMITER[max(totals, key=totals.get)] if totals else "launch"
    if target.launch_overhead_s >= seconds:
        limiter = "launch"
    breakdown = tuple(sorted(totals.items())) + (("launch", target.launch_overhead_s),)
    return LaunchEstimate(
        kernel=kernel, function=spec.function, seconds=seconds + target.launch_overhead_s,
        bytes_dram=round(traffic.dram_read + traffic.write), bytes_l2=round(traffic.l2_read),
        flops=round(work.fp32 + work.fp64 + work.sfu), occupancy=occ.fraction,
        blocks_per_sm=occ.blocks_per_sm, waves=sum(w.count for w in plan), limiter=limiter,
        resources=resources, grid=spec.grid, threads=spec.threads, breakdown=breakdown)


def _wave_terms(work: Work, traffic: Traffic, spill: float, wave, spec, occ: Occupancy,
                target: Target) -> dict[str, float]:
    """Seconds one wave needs by each limit (the wave does its share of the launch's work)."""
    f = wave.blocks / spec.grid
    lanes = wave.blocks * spec.threads
    clock = target.clock_hz
    all_bytes = traffic.dram_read + traffic.l2_read + traffic.write
    cap = wave.sms * SM_MAX_BYTES_IN_FLIGHT
    concurrency = 0.0
    for g in traffic.groups:
        if g.dram or g.l2:
            in_flight = min(lanes * g.in_flight_per_lane, cap)
            concurrency += (f * (g.dram * DRAM_LATENCY_S + g.l2 * L2_LATENCY_S)
                            / max(in_flight, 1e-9))
    warps_per_sm = wave.blocks_per_sm * occ.warps_per_block
    efficiency = COMPUTE_EFFICIENCY * min(1.0, warps_per_sm / WARPS_FOR_FULL_ISSUE)
    fp32_lanes = target.fp32_flops / 2 / target.sm_count / clock
    per_cycle = wave.sms * clock * efficiency
    return {
        "dram": f * (traffic.dram_read + traffic.write)
        / (target.dram_bytes_per_s * DRAM_EFFICIENCY),
        "l2": f * (all_bytes + traffic.overfetch + traffic.atomic + spill)
        / (target.dram_bytes_per_s * L2_OVER_DRAM),
        "sm port": f * (all_bytes + traffic.overfetch + spill)
        / (wave.sms * SM_PORT_BYTES_PER_CYCLE * clock),
        "concurrency": concurrency,
        "issue": f * work.instructions / target.warp_size / (per_cycle * ISSUE_PER_SM_PER_CYCLE),
        "fp32": f * work.fp32 / (per_cycle * fp32_lanes),
        "fp64": f * work.fp64 / (per_cycle * fp32_lanes * FP64_RATE_FRACTION),
        "sfu": f * work.sfu / (per_cycle * SFU_LANES_PER_SM),
        "chain": work.chain_cycles / clock,
        "atomics": f * traffic.atomic_chain * ATOMIC_SAME_ADDRESS_S,
    }


def _unlaunchable(kernel: str, spec, occ: Occupancy, resources) -> LaunchEstimate:
    """A block that fits on no SM (registers or shared memory): never finishes."""
    return LaunchEstimate(kernel=kernel, function=spec.function, seconds=math.inf, bytes_dram=0,
                          bytes_l2=0, flops=0, occupancy=0.0, blocks_per_sm=0, waves=0,
                          limiter=f"unlaunchable ({occ.limiter})", resources=resources,
                          grid=spec.grid, threads=spec.threads)


def memset_estimate(kernel: str, buffer: str, size: int, target: Target) -> LaunchEstimate:
    """Zeroing a buffer before an atomic launch: one more launch writing `size` bytes."""
    t = size / (target.dram_bytes_per_s * DRAM_EFFICIENCY)
    limiter = "launch" if target.launch_overhead_s >= t else "memory"
    return LaunchEstimate(kernel=kernel, function=f"memset {buffer}",
                          seconds=t + target.launch_overhead_s, bytes_dram=size, bytes_l2=0,
                          flops=0, occupancy=0.0, blocks_per_sm=0, waves=1, limiter=limiter,
                          resources=None,
                          breakdown=(("dram", t), ("launch", target.launch_overhead_s)))

