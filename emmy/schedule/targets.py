"""GPU targets: the limits legality checks against and the rates the cost model uses.

Sources, cited per figure below:
  [PG]    CUDA C++ Programming Guide, "Compute Capabilities", table "Technical Specifications per
          Compute Capability" (columns 8.0 and 9.0) and the occupancy calculator's allocation
          granularities.
  [H200]  NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column); GH100 whitepaper for the chip.
  [A100]  NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM column); GA100 whitepaper.
  [SEEN]  read off an H200 lent to this project (cudaDeviceProp via PyTorch; nvidia-smi clocks).
Peak rates are dense (no structured sparsity). Whitepaper TFLOP/s figures are at boost clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from emmy.errors import UserError

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """One GPU: its compile flag, hardware limits, and peak rates."""

    name: str                          # canonical spelling: "sm_90a", "sm_80"
    gpu: str                           # the card the rates describe
    arch_flag: str                     # NVRTC option, e.g. "-arch=sm_90a"
    compute_capability: tuple[int, int]
    # execution limits
    sm_count: int
    warp_size: int
    max_threads_per_block: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    max_warps_per_sm: int
    registers_per_sm: int              # 32-bit registers
    registers_per_block: int
    max_registers_per_thread: int
    register_alloc_unit: int           # registers are allocated per warp in units of this many
    # shared memory (bytes)
    shared_per_sm: int
    shared_per_block_optin: int        # max per block, after cudaFuncSetAttribute opt-in
    shared_per_block_static: int       # static __shared__ limit without opt-in
    shared_reserved_per_block: int     # taken by the system from the SM's pool for each block
    shared_alloc_unit: int
    # memory system
    l2_bytes: int
    dram_bytes_per_s: float
    # peak rates (FLOP/s, dense)
    fp32_flops: float                  # CUDA cores, FMA = 2 FLOPs
    tf32_tensor_flops: float
    fp16_tensor_flops: float           # fp16 inputs, fp32 accumulate
    bf16_tensor_flops: float
    clock_hz: float                    # boost SM clock
    launch_overhead_s: float           # estimate: host launch + GPU front end, back to back
    # features
    has_cp_async: bool
    has_ldmatrix: bool
    has_mma_sync: bool
    has_wgmma: bool
    has_tma: bool

    def __str__(self) -> str:
        return self.name

    @property
    def shared_per_block_max(self) -> int:
        """Largest dynamic + static shared memory one block may use (opt-in)."""
        return self.shared_per_block_optin


# H200 SXM: GH100 with 132 SMs enabled [H200][SEEN].
SM_90A = Target(
    name="sm_90a",
    gpu="NVIDIA H200 SXM",
    arch_flag="-arch=sm_90a",          # 'a': arch-specific features (wgmma, setmaxnreg) [PG]
    compute_capability=(9, 0),
    sm_count=132,                      # [H200][SEEN]
    warp_size=32,                      # [PG]
    max_threads_per_block=1024,        # [PG]
    max_threads_per_sm=2048,           # [PG]
    max_blocks_per_sm=32,              # [PG]
    max_warps_per_sm=64,               # [PG]
    registers_per_sm=64 * 1024,        # [PG]
    registers_per_block=64 * 1024,     # [PG]
    max_registers_per_thread=255,      # [PG]
    register_alloc_unit=256,           # [PG] occupancy calculator, per warp
    shared_per_sm=228 * KIB,           # [PG]
    shared_per_block_optin=227 * KIB,  # [PG]
    shared_per_block_static=48 * KIB,  # [PG]
    shared_reserved_per_block=1 * KIB, # [PG]
    shared_alloc_unit=128,             # [PG] occupancy calculator
    l2_bytes=60 * MIB,                 # [SEEN] cudaDeviceProp.l2CacheSize on the lent H200
    dram_bytes_per_s=4.8e12,           # [H200] HBM3e, 141 GB
    fp32_flops=67e12,                  # [H200]; = 132 SMs x 128 lanes x 2 x 1.98 GHz
    tf32_tensor_flops=494.5e12,        # [H200] 989 TFLOP/s with sparsity, halved
    fp16_tensor_flops=989.5e12,        # [H200] 1979 with sparsity; reached through wgmma only,
    bf16_tensor_flops=989.5e12,        # [H200] mma.sync reaches well under it; [SEEN] 790 bf16
    clock_hz=1.98e9,                   # [H200] boost; [SEEN] 1980 MHz under load
    launch_overhead_s=3e-6,            # estimate: back-to-back launches of small kernels
    has_cp_async=True,                 # [PG] sm_80+
    has_ldmatrix=True,                 # [PG] sm_75+
    has_mma_sync=True,                 # [PG] sm_80+ for m16n8k16 bf16
    has_wgmma=True,                    # [PG] sm_90a only
    has_tma=True,                      # [PG] sm_90+
)

# A100 80GB SXM: GA100 with 108 SMs enabled [A100].
SM_80 = Target(
    name="sm_80",
    gpu="NVIDIA A100 80GB SXM",
    arch_flag="-arch=sm_80",
    compute_capability=(8, 0),
    sm_count=108,                      # [A100]
    warp_size=32,                      # [PG]
    max_threads_per_block=1024,        # [PG]
    max_threads_per_sm=2048,           # [PG]
    max_blocks_per_sm=32,              # [PG]
    max_warps_per_sm=64,               # [PG]
    registers_per_sm=64 * 1024,        # [PG]
    registers_per_block=64 * 1024,     # [PG]
    max_registers_per_thread=255,      # [PG]
    register_alloc_unit=256,           # [PG] occupancy calculator, per warp
    shared_per_sm=164 * KIB,           # [PG]
    shared_per_block_optin=163 * KIB,  # [PG]
    shared_per_block_static=48 * KIB,  # [PG]
    shared_reserved_per_block=1 * KIB, # [PG]
    shared_alloc_unit=128,             # [PG] occupancy calculator
    l2_bytes=40 * MIB,                 # [A100]
    dram_bytes_per_s=2.039e12,         # [A100] 80GB SXM, HBM2e
    fp32_flops=19.5e12,                # [A100]; = 108 SMs x 64 lanes x 2 x 1.41 GHz
    tf32_tensor_flops=156e12,          # [A100]
    fp16_tensor_flops=312e12,          # [A100]
    bf16_tensor_flops=312e12,          # [A100]
    clock_hz=1.41e9,                   # [A100] boost
    launch_overhead_s=3e-6,            # estimate, as above
    has_cp_async=True,                 # [PG] sm_80+
    has_ldmatrix=True,                 # [PG]
    has_mma_sync=True,                 # [PG]
    has_wgmma=False,                   # [PG] sm_90a only
    has_tma=False,                     # [PG] sm_90+
)

TARGETS: dict[str, Target] = {t.name: t for t in (SM_90A, SM_80)}
DEFAULT_TARGET = SM_90A.name


def get_target(name: str) -> Target:
    """The target named `name`, or a UserError listing the known ones."""
    try:
        return TARGETS[name]
    except KeyError:
        known = ", ".join(TARGETS)
        raise UserError(f"unknown target `{name}`; known targets: {known}",
                        hint=f"the default is {DEFAULT_TARGET} (H100/H200)") from None
