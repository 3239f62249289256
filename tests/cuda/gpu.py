"""Launching a test kernel on the GPU (cuda-bindings' driver API, NVRTC for sm_90a): for the
tests marked `gpu` only; nothing here runs without a device."""

from __future__ import annotations

import numpy as np

from emmy.cuda.emulate.run import TensorMapArg
from emmy.cuda.nvrtc import compile_cuda
from emmy.schedule.targets import get_target


def ok(result):
    """A driver call's result without its status, which must be success."""
    from cuda.bindings import driver as cu

    err, *rest = result
    assert err == cu.CUresult.CUDA_SUCCESS, err
    return rest[0] if len(rest) == 1 else rest


def load(source: str, kernel: str, smem: int = 0):
    """`kernel` of `source` compiled for sm_90a and loaded in the current context, with its
    dynamic shared-memory limit raised to `smem`; returns (function, module, compiled: its
    NVRTC result, with the ptxas report)."""
    from cuda.bindings import driver as cu

    compiled = compile_cuda(source, get_target("sm_90a"))
    assert compiled.ok, compiled.log
    module = ok(cu.cuModuleLoadData(compiled.cubin))
    function = ok(cu.cuModuleGetFunction(module, kernel.encode()))
    if smem:
        ok(cu.cuFuncSetAttribute(
            function, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem))
    return function, module, compiled


def _dims(d) -> tuple[int, int, int]:
    return (d, 1, 1) if isinstance(d, int) else tuple(d)


def run_on_gpu(source: str, kernel: str, grid, block, smem: int, args) -> None:
    """Launch `kernel` of `source` on device 0 (grid and block: an int or three); numpy arrays
    are copied in and back, TensorMapArgs become tensor maps (cuTensorMapEncodeTiled) over
    their arrays, numpy scalars keep their type and Python ints are passed as int32."""
    from cuda.bindings import driver as cu

    from emmy.cuda.program import TensorMapSpec
    from emmy.runtime.gpu import encode_tensor_map

    ok(cu.cuInit(0))
    ok(cu.cuCtxSetCurrent(ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))))
    function, _module, _ = load(source, kernel, smem)
    pointers = {i: ok(cu.cuMemAlloc(max(a.nbytes, 1)))
                for i, a in enumerate(args) if isinstance(a, np.ndarray)}
    storage, device = [], []
    for i, a in enumerate(args):
        if isinstance(a, TensorMapArg):
            image = np.frombuffer(encode_tensor_map(TensorMapSpec(
                "map", "", "__half", a.dims, a.strides, a.box, a.swizzle),
                int(pointers[a.array])), np.uint8)
            ptr = ok(cu.cuMemAlloc(128))
            ok(cu.cuMemcpyHtoD(ptr, image, 128))
            storage.append(np.array([int(ptr)], np.uint64))
        elif isinstance(a, np.ndarray):
            ok(cu.cuMemcpyHtoD(pointers[i], a, a.nbytes))
            device.append((pointers[i], a))
            storage.append(np.array([int(pointers[i])], np.uint64))
        elif isinstance(a, np.generic):
            storage.append(np.array([a]))
        else:
            storage.append(np.array([a], np.int32))
    params = np.array([s.ctypes.data for s in storage], np.uint64)
    ok(cu.cuLaunchKernel(function, *_dims(grid), *_dims(block), smem, 0, params.ctypes.data, 0))
    ok(cu.cuCtxSynchronize())
    for ptr, a in device:
        ok(cu.cuMemcpyDtoH(a, ptr, a.nbytes))
        ok(cu.cuMemFree(ptr))


def torch_launcher(source: str, kernel: str, grid: int, threads: int, smem: int, tensors):
    """A function that launches `kernel` of `source` on the current torch stream with the
    tensors' pointers (and Python ints, as int32) as its arguments (torch's context is made
    current first); its `resources` attribute is the ptxas report."""
    import torch
    from cuda.bindings import driver as cu

    torch.cuda.synchronize()
    function, module, compiled = load(source, kernel, smem)
    storage = [np.array([t], np.int32) if isinstance(t, int) else
               np.array([t.data_ptr()], np.uint64) for t in tensors]
    params = np.array([s.ctypes.data for s in storage], np.uint64)

    def launch():
        stream = torch.cuda.current_stream().cuda_stream
        ok(cu.cuLaunchKernel(function, grid, 1, 1, threads, 1, 1, smem, stream,
                             params.ctypes.data, 0))

    launch.keep = (module, storage, params, tensors)     # alive as long as the launcher
    launch.resources = compiled.resources
    return launch


def seconds(fn, reps: int = 20) -> float:
    """Mean seconds per call of `fn` over `reps` back-to-back calls after 3 warm-ups (CUDA
    events on the current stream; no L2 flush)."""
    import torch

    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / reps
