"""NVRTC: cubins for both targets, ptxas resources, compile errors as results, the cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from emmy.cuda.nvrtc import (Resources, compile_cuda, include_options, parse_ptxas_log,
                              performance_warnings)
from emmy.errors import UserError
from emmy.schedule.targets import get_target

KERNELS = Path(__file__).parent / "kernels"

SMALL = """
#include "emmy_intrinsics.cuh"
extern "C" __global__ void scale(float* __restrict__ y, const float* __restrict__ x, int n) {
    __shared__ float tile[256];
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    tile[threadIdx.x] = i < n ? x[i] : 0.f;
    __syncthreads();
    if (i < n) y[i] = 2.f * tile[threadIdx.x ^ 1];
}
"""


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
def test_small_kernel_compiles_with_resources(target):
    r = compile_cuda(SMALL, get_target(target))
    assert r.ok, r.log
    assert r.cubin is not None and r.cubin[:4] == b"\x7fELF"
    res = r.resources_of("scale")
    assert r.resources_of() == res
    assert 0 < res.registers <= 255 and res.shared_bytes == 1024
    assert res.spill_store_bytes == res.spill_load_bytes == 0
    assert r.ptx is None


def test_ptx_on_request_names_the_target():
    r = compile_cuda(SMALL, get_target("sm_90a"), ptx=True)
    assert r.ok and ".target sm_90a" in r.ptx and ".entry scale" in r.ptx


def test_compile_error_is_a_result_with_the_line():
    bad = SMALL.replace("2.f * tile", "2.f * tyle")
    r = compile_cuda(bad, get_target("sm_90a"))
    assert not r.ok and r.cubin is None and r.resources == {}
    assert any("emmy_kernel.cu(8): error" in line and "tyle" in line for line in r.errors), r.log


def test_second_compile_hits_the_cache():
    source = SMALL + "// cache probe\n"
    first = compile_cuda(source, get_target("sm_80"))
    second = compile_cuda(source, get_target("sm_80"))
    assert not first.cached and second.cached
    assert second.cubin == first.cubin and second.resources == first.resources
    assert not compile_cuda(source, get_target("sm_90a")).cached   # the target is in the key


@pytest.mark.parametrize("name", ["basics.cu", "mma.cu"])
def test_emulator_kernels_compile_for_the_gpu(name):
    """The sources the emulator tests run are valid CUDA for both targets."""
    source = (KERNELS / name).read_text()
    for target in ("sm_90a", "sm_80"):
        r = compile_cuda(source, get_target(target))
        assert r.ok, r.log
        assert all(res.spill_store_bytes == 0 for res in r.resources.values())


def test_parse_ptxas_log():
    log = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k1' for 'sm_90a'
ptxas info    : Function properties for k1
ptxas         .     24 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 2048 bytes smem, 380 bytes cmem[0]
ptxas info    : Function properties for _Z6helperv
ptxas         .     16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '_Z2k2Pf' for 'sm_90a'
ptxas info    : Function properties for _Z2k2Pf
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, 360 bytes cmem[0]
"""
    assert parse_ptxas_log(log) == {
        "k1": Resources(registers=40, shared_bytes=2048, spill_store_bytes=8,
                        spill_load_bytes=4, stack_bytes=24),
        "_Z2k2Pf": Resources(registers=8, shared_bytes=0, spill_store_bytes=0,
                             spill_load_bytes=0, stack_bytes=0),
    }


def test_performance_warnings_per_kernel():
    log = ("ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are "
           "serialized due to insufficient register resources for the function 'k1'\n"
           "ptxas info    : Compiling entry function 'k1' for 'sm_90a'\n"
           "ptxas info    : Compiling entry function 'k2' for 'sm_90a'\n"
           "ptxas info    : (C7508) Potential Performance Loss: 'setmaxnreg' ignored; unable to "
           "determine register count at entry.\n")
    assert performance_warnings(log) == {
        "k1": ("C7512: wgmma.mma_async instructions are serialized due to insufficient register "
               "resources", "C7508: 'setmaxnreg' ignored; unable to determine register count at "
                            "entry"),
        "k2": ("C7508: 'setmaxnreg' ignored; unable to determine register count at entry",)}


def test_a_serialized_wgmma_is_reported_for_its_kernel():
    """A register-A wgmma whose A registers are computed inside its pipeline stage (after the
    wgmma.fence): ptxas serializes the kernel's wgmmas (C7513), and the result says so."""
    source = """#include "emmy_sm90.cuh"
extern "C" __global__ void __launch_bounds__(128) k(const float* x, float* y, int n) {
  extern __shared__ __align__(16) unsigned char smem[];
  const uint64_t d = wgmma_desc(sm90_smem_addr(smem), 16u, 1024u, WGMMA_SWIZZLE_128B);
  float acc[64] = {}, a[4];
  for (int i = 0; i < 4; ++i) a[i] = x[threadIdx.x * 4 + i];
  for (int it = 0; it < n; ++it) {
    wgmma_fence();
    unsigned p[4] = {__float_as_uint(a[0]), __float_as_uint(a[1]), __float_as_uint(a[2]),
                     __float_as_uint(a[3])};
    wgmma_fence_a(p);
    wgmma_m64k16_rs<128, false, 1>(acc, p, d + it, 1);
    wgmma_commit();
    for (int i = 0; i < 4; ++i) a[i] = a[i] * a[(i + 1) % 4] + 1.f;
    wgmma_wait<0>();
    wgmma_fence_acc(acc);
  }
  float s = 0.f;
  for (int i = 0; i < 64; ++i) s += acc[i];
  y[threadIdx.x] = s + a[0];
}
"""
    result = compile_cuda(source, get_target("sm_90a"))
    assert result.ok, result.log
    assert any(w.startswith("C751") and "serialized" in w for w in result.warnings_of("k")), \
        result.log


def test_missing_cuda_headers_are_a_user_error(monkeypatch):
    from cuda import pathfinder

    monkeypatch.setattr(pathfinder, "find_nvidia_header_directory", lambda lib: None)
    with pytest.raises(UserError, match="CUDA headers for `cudart` not found") as e:
        include_options.__wrapped__()
    assert "nvidia-cuda-runtime" in str(e.value)


@pytest.mark.parametrize("target, sets, row, wanted, absent", [
    # mma.sync with ldmatrix on sm_80 (N = 255: one 2-byte store per element)
    ("sm_80", (), "WORK=warps:2x2 TILE=mma:64x64x32 REDUCE=serial STAGE=smem RASTER=row",
     ("HMMA.16816.F32", "LDSM"), ()),
    # ... with N even, neighbouring columns stored as one 4-byte pair
    ("sm_80", (("N", 256),), "WORK=warps:2x2 TILE=mma:64x64x32 REDUCE=serial STAGE=smem "
     "RASTER=row", ("HMMA.16816.F32", "STG.E"), ("STG.E.U16",)),
    # wgmma fed by TMA on sm_90a (K = 64, N = 256: 16-byte aligned rows), two consumer
    # warpgroups taking the producer's registers
    ("sm_90a", (("K", 64), ("N", 256)), "WORK=warps:2x4 TILE=wgmma:128x128x64 REDUCE=serial "
     "STAGE=tma:3 RASTER=row", ("HGMMA.64x128x16.F32", "UTMALDG", "USETMAXREG"),
     ("STG.E.U16",)),
])
def test_tensor_core_rows_become_tensor_core_sass(target, sets, row, wanted, absent):
    """A half-precision matmul row compiles to the tensor-core instructions it names."""
    from emmy.cuda.sass import cuobjdump, disassemble, instructions
    from emmy.frontend.workload import load_file
    from emmy.pipeline import Options, compile_to

    if cuobjdump() is None:
        pytest.skip("cuobjdump is not installed (pip install nvidia-cuda-cuobjdump)")
    prog = compile_to(load_file("examples/matmul_half.py", sets), "cuda",
                      Options(target=target, rows={"": row}))["cuda"]
    result = compile_cuda(prog.units[0].source, get_target(target))
    ops = instructions(disassemble(result.cubin))
    for op in wanted:
        assert any(o.startswith(op) for o in ops), (op, sorted(set(ops)))
    for op in absent:
        assert op not in ops, (op, sorted(set(ops)))
