"""The cost model: the time of each launch from the work its Tile IR does, the code its row
made (Kernel IR), the ptxas report and the target table. It runs on any machine and every
figure it gives is `modeled`, never `measured`; it exists to rank rows, not to replace timing.

Per launch (one Kernel IR function with its LaunchSpec):

  work        loads, stores and arithmetic counted on the launch's Tile IR kernel (the row's
              part): accesses = jobs × extents of the folds around the access; distinct
              elements = product of the extents of the index's variables (capped by its range).
  traffic     each global load's bytes go to DRAM, L2 or L1 (`classify`), with
              l2_hit(d) = 1 for a reuse distance d <= usable L2, 0 from 2× it, linear between:
                first read of a buffer      distinct bytes; from L2 by l2_hit(bytes touched
                                            since an earlier launch touched it), else DRAM
                a later pass re-reading it  (STAGE=direct) from L2 by l2_hit(window), window =
                                            rows the resident jobs touch (shared rows once)
                repeats within a pass       L1 when the buffer is small, else L2 by l2_hit(size)
              a pass reading a staged row from shared memory (STAGE=smem) moves no global bytes.
              Uncoalesced accesses (neighbouring threads in different 32-byte sectors) move a
              whole sector per access at L2, unless each lane walks its own contiguous run.
  occupancy   blocks per SM from threads, registers, shared memory (occupancy.py), and waves:
              full waves, then a tail wave with fewer blocks (fewer bytes in flight, fewer SMs).
  per wave    the wave does its share f = blocks in the wave / grid of the work, in seconds:
                bandwidth   f × bytes / rate for DRAM (reads + writes at DRAM_EFFICIENCY × peak),
                            L2 (all traffic, L2_OVER_DRAM × DRAM peak), and the busy SMs' ports
                concurrency f × Σ_groups (dram × DRAM_LATENCY + l2 × L2_LATENCY) / in flight,
                            in flight = min(lanes × bytes per lane, busy SMs × per-SM cap)
                            (Little's law: a pass moves at most its bytes in flight per latency)
                chain       one block's dependent steps: fold chains, lane combines, barriers
                compute     f × instructions / (busy SMs × issue rate × efficiency); the same
                            for the FP32 pipe, FP64 and the special-function units
              t_wave = max(bandwidth, compute, concurrency + chain) + same-address atomics
  launch      Σ_waves count × t_wave + target.launch_overhead_s; zero-filled outputs add one
              memset launch each; a program's launches add up, L2 contents carried between them.

The limiter names the term that took the most time: "memory" (a bandwidth), "latency" (too

The package, by role:

  constants   the named rates, latencies and instruction counts the model is calibrated by
  work        what a launch does, counted on its Tile IR part and read off its Kernel IR
  traffic     L2 residency between launches and where each load's bytes come from
  timing      the per-wave terms, a launch's time and limiter, the memset before atomics
  api         programs, kernels and rows: NVRTC's resource reports, ranking, formatting
"""

from emmy.runtime.costmodel.api import (ProgramEstimate, estimate_compiled, estimate_kernel,
                                        estimate_program, estimate_row, format_estimate,
                                        rank_rows, resources_of)
from emmy.runtime.costmodel.constants import (
    ATOMIC_SAME_ADDRESS_S, BARRIER_CYCLES, COMPUTE_EFFICIENCY, CP_ASYNC_IN_FLIGHT,
    DRAM_EFFICIENCY, DRAM_LATENCY_S, FOLD_OP_CYCLES, FP64_RATE_FRACTION,
    HALF_CONVERT_INSTRUCTIONS, ISSUE_PER_SM_PER_CYCLE, L1_REUSE_BYTES, L2_LATENCY_S,
    L2_OVER_DRAM, L2_USABLE_FRACTION, LOOP_ITERATIONS_IN_FLIGHT, LOOP_OVERHEAD_INSTRUCTIONS,
    MAP_INDEX_INSTRUCTIONS, METHOD, SECTOR_BYTES, SFU_LANES_PER_SM, SHUFFLE_STEP_CYCLES,
    SM_MAX_BYTES_IN_FLIGHT, SM_PORT_BYTES_PER_CYCLE, SMEM_STEP_CYCLES, WARPS_FOR_FULL_ISSUE)
from emmy.runtime.costmodel.timing import LaunchEstimate, estimate_launch, memset_estimate
from emmy.runtime.costmodel.traffic import L2Residency, Traffic, classify, l2_hit
from emmy.runtime.costmodel.work import Work, launch_work, types_of

__all__ = [
    # results and entry points
    "LaunchEstimate", "ProgramEstimate", "estimate_compiled", "estimate_kernel",
    "estimate_program", "estimate_row", "format_estimate", "rank_rows", "resources_of",
    # the pieces of one launch's estimate
    "Work", "launch_work", "types_of", "L2Residency", "Traffic", "classify", "l2_hit",
    "estimate_launch", "memset_estimate",
    # constants
    "METHOD", "ATOMIC_SAME_ADDRESS_S", "BARRIER_CYCLES", "COMPUTE_EFFICIENCY",
    "CP_ASYNC_IN_FLIGHT", "DRAM_EFFICIENCY", "DRAM_LATENCY_S", "FOLD_OP_CYCLES",
    "FP64_RATE_FRACTION", "HALF_CONVERT_INSTRUCTIONS", "ISSUE_PER_SM_PER_CYCLE",
    "L1_REUSE_BYTES", "L2_LATENCY_S", "L2_OVER_DRAM", "L2_USABLE_FRACTION",
    "LOOP_ITERATIONS_IN_FLIGHT", "LOOP_OVERHEAD_INSTRUCTIONS", "MAP_INDEX_INSTRUCTIONS",
    "SECTOR_BYTES", "SFU_LANES_PER_SM", "SHUFFLE_STEP_CYCLES", "SM_MAX_BYTES_IN_FLIGHT",
    "SM_PORT_BYTES_PER_CYCLE", "SMEM_STEP_CYCLES", "WARPS_FOR_FULL_ISSUE",
]
