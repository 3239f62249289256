"""The cost model's named constants: the rates, latencies and instruction counts it is
calibrated by (see the package docstring for where each enters)."""

METHOD = "modeled"

# --- memory system ------------------------------------------------------------------------
DRAM_LATENCY_S = 700e-9          # loaded HBM round trip (600-800 ns on H100/H200); Little's law
L2_LATENCY_S = 300e-9            # loaded L2 hit round trip (~260 cycles unloaded, more under load)
DRAM_EFFICIENCY = 0.90           # best fraction of peak DRAM bandwidth a stream reaches
L2_OVER_DRAM = 2.0               # L2 bandwidth as a multiple of DRAM bandwidth (H100: ~2-2.5x)
SM_PORT_BYTES_PER_CYCLE = 64     # one SM's L1<->L2 bandwidth; binds when few SMs are busy
SM_MAX_BYTES_IN_FLIGHT = 64 * 1024  # outstanding global-load bytes one SM can track
L2_USABLE_FRACTION = 0.75        # share of L2 that holds reusable lines (set conflicts, writes)
L1_REUSE_BYTES = 64 * 1024       # a buffer this small, re-read within a pass, stays in L1
SECTOR_BYTES = 32                # the unit L1 and L2 move: a warp's request costs whole sectors
LOOP_ITERATIONS_IN_FLIGHT = 2    # a lane loop's loads overlap the next iteration's (unrolling)
CP_ASYNC_IN_FLIGHT = 4           # cp.async copies a lane keeps in flight while filling a row
ATOMIC_SAME_ADDRESS_S = 1e-9     # one atomic to an address at L2; same-address atomics serialize
# --- arithmetic ---------------------------------------------------------------------------
ISSUE_PER_SM_PER_CYCLE = 4       # warp instructions per SM per cycle (4 schedulers)
SFU_LANES_PER_SM = 16            # special-function results per SM per cycle (sm_80, sm_90)
FP64_RATE_FRACTION = 0.5         # FP64 at half the FP32 rate on both targets (datasheets)
COMPUTE_EFFICIENCY = 0.8         # best fraction of peak issue a real instruction mix reaches
WARPS_FOR_FULL_ISSUE = 8         # warps per SM needed to hide ALU latency between instructions
LOOP_OVERHEAD_INSTRUCTIONS = 3   # per lane-loop iteration: increment, compare, branch
MAP_INDEX_INSTRUCTIONS = 8       # per map-thread vector: flat index, decode (mul.hi/shift), guard
HALF_CONVERT_INSTRUCTIONS = 1    # per f16/bf16 element loaded or stored (convert to/from f32)
# --- latency of one block's dependent chain (cycles) --------------------------------------
FOLD_OP_CYCLES = 4               # dependent FP32 add/max: one fold step on one chain
SHUFFLE_STEP_CYCLES = 30         # shfl.sync + combine, dependent
SMEM_STEP_CYCLES = 30            # st.shared / ld.shared round trip
BARRIER_CYCLES = 40              # __syncthreads once every warp has arrived
CLUSTER_BARRIER_CYCLES = 400     # barrier.cluster arrive + wait across a cluster's SMs (estimate)
DSMEM_LOAD_CYCLES = 200          # ld.shared::cluster from another SM of the cluster (estimate)
