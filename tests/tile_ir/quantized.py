"""Helpers of the quantized linear layers' tests (GPTQ's and AWQ's checkpoint formats): the
product's Tile IR kernel, a row checked against eager on the CPU emulator, the K loop's SASS."""

from emmy.check import check_cuda_program
from emmy.frontend.workload import load_file
from emmy.pipeline import Options, compile_to
from emmy.schedule.targets import get_target
from emmy.tile_ir.lift import lift_program

RAGGED = (("batch", 37), ("in_features", 512), ("out_features", 200))
# (sets, row less its PLACE, target): ragged on both sides, f16 and bf16, a raw ring, one tile
# held with a K split summed by its last block, and a wgmma row
ROWS = [
    (RAGGED, "WORK=warps:2x2 TILE=mma:32x64x32 REDUCE=serial STAGE=async:3 RASTER=row", "sm_90a"),
    (RAGGED + (("dtype", "bfloat16"),),
     "WORK=warps:2x2 TILE=mma:64x64x32 REDUCE=split:2:last STAGE=async:2 RASTER=row", "sm_80"),
    ((("batch", 130), ("in_features", 512), ("out_features", 192), ("dtype", "bfloat16")),
     "WORK=warps:2x4 TILE=wgmma:128x64x64 REDUCE=serial STAGE=async:3 RASTER=group:8", "sm_90a"),
]
ROW_IDS = ["f16_ring", "bf16_held_split", "bf16_wgmma"]


def lifted(path, sets=()):
    (k,) = lift_program(compile_to(load_file(path, sets), "loop")["loop"]).kernels
    return k


def checked(path, sets, row, target="sm_90a"):
    w = load_file(path, sets)
    results = compile_to(w, "cuda", Options(rows={"": row}, target=target))
    report, failed = check_cuda_program(w, results["torch"], results["cuda"])
    assert report is not None and report.ok, failed or report.outputs
    (unit,) = results["cuda"].units
    return unit


def assert_the_k_loop_has_no_conversions(path):
    """SASS (sm_90a, NVRTC on the CPU) of an mma.sync row at 256 x 512 -> 256: 16 HMMA and no
    I2F in the K loop (the longest loop)."""
    import pytest

    from emmy.cuda.nvrtc import compile_cuda
    from emmy.cuda.sass import cuobjdump, disassemble, longest_loop

    if cuobjdump() is None:
        pytest.skip("cuobjdump (and nvdisasm) not installed")
    row = "WORK=warps:2x2 TILE=mma:64x64x32 REDUCE=serial STAGE=async:3 RASTER=row PLACE=fuse"
    sets = (("batch", 256), ("in_features", 512), ("out_features", 256))
    (unit,) = compile_to(load_file(path, sets), "cuda", Options(rows={"": row}))["cuda"].units
    loop = longest_loop(disassemble(compile_cuda(unit.source, get_target("sm_90a")).cubin))
    assert loop.count("HMMA.16816.F32") == 16
    assert not any(o.startswith("I2F") for o in loop)


def default_place(path, sets) -> str:
    """The PLACE of the product's default row on sm_90a."""
    from emmy.schedule.space import space_of

    return space_of(lifted(path, sets), get_target("sm_90a")).default()["PLACE"]
