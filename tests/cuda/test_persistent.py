"""Persistent grids: a wgmma + TMA product's blocks walk the tiles in steps of gridDim.x, so the
runtime may launch fewer blocks than compiled (as many as the GPU holds at once) and still
compute every tile. Checked on the emulator with smaller grids, through the launch plumbing
with a stand-in driver, and on a GPU against the driver's own occupancy figures."""

from __future__ import annotations

import numpy as np
import pytest

from emmy.cuda.emulate.run import build_and_run
from emmy.cuda.program import LaunchSpec
from emmy.frontend.workload import load_file
from emmy.pipeline import Options, compile_to
from emmy.runtime import gpu
from emmy.runtime.gpu import resident_grid
from tests.cuda.test_sm90 import build_gemm

EXAMPLES = "examples/matmul_half.py"
TMA_ROW = "WORK=warps:2x4 TILE=wgmma:128x128x64 REDUCE=serial STAGE=tma:3 RASTER=group:8"
CLUSTER_ROW = ("WORK=warps:2x4 TILE=wgmma:128x128x64 REDUCE=serial STAGE=tma:3:cluster:2x1 "
               "RASTER=group:8")
MMA_ROW = "WORK=warps:2x2 TILE=mma:64x64x32 REDUCE=serial STAGE=async:2 RASTER=row"


@pytest.mark.parametrize("grid, cluster, resident, expected", [
    (132, 1, 132, 132),      # the target's GPU: as compiled
    (132, 1, 114, 114),      # fewer SMs (an H100 PCIe): one wave, not 114 + 18
    (132, 2, 114, 114),
    (132, 2, 120, 120),      # fewer co-resident clusters than SM pairs
    (132, 2, 125, 124),      # whole clusters only
    (40, 1, 132, 40),        # never more than compiled (fewer tiles than SMs)
    (132, 1, None, 132),     # the driver could not say: as compiled
    (132, 2, 1, 132),        # not even one cluster fits: as compiled (the launch reports it)
])
def test_resident_grid(grid, cluster, resident, expected):
    assert resident_grid(grid, cluster, resident) == expected


class _Function:
    ptr = 0x1234


def _spec(cluster):
    return LaunchSpec("k", 132, 384, 197_696, ("a",), cluster=cluster, persistent=True)


def test_resident_blocks_come_from_the_driver(monkeypatch):
    """Clusters are counted whole (max active clusters x cluster size), plain blocks per SM
    times the SMs; the launch configuration asked about is the kernel's own."""
    from cuda.bindings import driver as cu

    asked = {}

    def clusters(func, config):
        asked.update(func=int(func), grid=config.gridDimX, block=config.blockDimX,
                     smem=config.sharedMemBytes)
        return cu.CUresult.CUDA_SUCCESS, 57

    def per_sm(func, threads, smem):
        asked.update(threads=threads, smem_blocks=smem)
        return cu.CUresult.CUDA_SUCCESS, 1

    monkeypatch.setattr(cu, "cuOccupancyMaxActiveClusters", clusters)
    monkeypatch.setattr(cu, "cuOccupancyMaxActiveBlocksPerMultiprocessor", per_sm)
    monkeypatch.setattr(gpu, "_sm_count", lambda: 114)
    assert gpu._resident_blocks(_Function(), _spec(2)) == 114
    assert asked == {"func": 0x1234, "grid": 132, "block": 384, "smem": 197_696}
    assert gpu._resident_blocks(_Function(), _spec(1)) == 114
    assert asked["threads"] == 384 and asked["smem_blocks"] == 197_696


def test_an_occupancy_the_driver_cannot_give_keeps_the_compiled_grid(monkeypatch):
    from cuda.bindings import driver as cu

    monkeypatch.setattr(cu, "cuOccupancyMaxActiveClusters",
                        lambda f, c: (cu.CUresult.CUDA_ERROR_INVALID_CLUSTER_SIZE, 0))
    assert gpu._resident_blocks(_Function(), _spec(2)) is None

    def broken(*_):
        raise RuntimeError("no driver")

    monkeypatch.setattr(cu, "cuOccupancyMaxActiveBlocksPerMultiprocessor", broken)
    assert gpu._resident_blocks(_Function(), _spec(1)) is None


@pytest.mark.parametrize("case, grid", [("ragged_k_grouped", 1), ("batched_mn_major", 1),
                                        ("broadcast_b", 1)])
def test_fewer_blocks_than_compiled_still_compute_every_tile(case, grid):
    problem, body, source, args, expected = build_gemm(case, tma=True)
    assert grid < body.grid
    r = build_and_run(source, "gemm", grid, body.threads, body.smem_bytes, args, timeout=300)
    assert r.ok, f"{r.status}: {r.log}"
    np.testing.assert_allclose(args[0], expected, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("case", ["c2x1_mn64_odd_ragged", "c1x2_k_major"])
def test_one_cluster_walks_every_unit(case):
    """Compiled for two clusters, launched as one: its two blocks take every unit of tiles."""
    problem, body, source, args, expected = build_gemm(case)
    assert body.grid == 4 and body.cluster == 2
    r = build_and_run(source, "gemm", 2, body.threads, body.smem_bytes, args, timeout=300,
                      cluster=2)
    assert r.ok, f"{r.status}: {r.log}"
    np.testing.assert_allclose(args[0], expected, rtol=1e-4, atol=1e-3)


def _stages(row, m, k, n):
    w = load_file(EXAMPLES, (("M", m), ("K", k), ("N", n)))
    return w, compile_to(w, "cuda", Options(rows={"": row}))


def _launches(row, m=512, k=256, n=512):
    return _stages(row, m, k, n)[1]["cuda"].units[0]


def test_only_tma_launches_are_persistent():
    unit = _launches(TMA_ROW)
    (launch,) = unit.launches
    assert launch.persistent and launch.grid == 16
    assert "grid 16 (persistent: at most this many" in unit.source
    (launch,) = _launches(CLUSTER_ROW).launches
    assert launch.persistent and launch.cluster == 2
    (launch,) = _launches(MMA_ROW).launches
    assert not launch.persistent


@pytest.mark.gpu
@pytest.mark.parametrize("row", [TMA_ROW, CLUSTER_ROW], ids=["tma", "cluster"])
def test_gpu_persistent_grid_is_what_the_gpu_holds(row):
    """On the GPU: the launched grid is the compiled one capped by the driver's occupancy
    (one 128x128 block per SM here), whole clusters, and the product is right."""
    import torch

    from emmy.check import program_inputs
    from emmy.runtime.gpu import GpuProgram

    w, stages = _stages(row, 4096, 1024, 4096)
    prog = stages["cuda"]
    (spec,) = prog.units[0].launches
    loaded = GpuProgram(prog)
    grid = loaded.grids()[spec.function]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"\n{row}: compiled grid {spec.grid}, launched {grid} on {sms} SMs")
    assert grid % spec.cluster == 0 and 0 < grid <= min(spec.grid, sms)
    if spec.cluster == 1:
        assert grid == min(spec.grid, sms)
    (out,) = loaded.run(program_inputs(stages["torch"], w.inputs))
    a, b = (x.cuda().float() for x in w.inputs)
    torch.testing.assert_close(out.float(), a @ b, rtol=2e-2, atol=2e-1)
