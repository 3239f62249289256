"""Run a compiled program on a CUDA GPU: each unit's cubin loaded through cupy, launched on
torch's current stream. Buffers are torch CUDA tensors and kernels receive their device
pointers, so torch (or any DLPack producer, e.g. cupy) and the kernels share memory, no copy.

cupy is optional (`pip install -e ".[gpu]"`) and imported only when a program is loaded.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import cache
from typing import Any, Mapping

from emmy.cuda.program import CudaProgram, TensorMapSpec
from emmy.dtypes import DType, as_stored, to_torch
from emmy.runtime.buffers import dtype_of_c

STATIC_SHARED_LIMIT = 48 * 1024          # a block's shared memory without the opt-in attribute
MAX_DYNAMIC_SHARED_ATTR = 8              # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES


class CompileFailed(Exception):
    """NVRTC refused a unit's source: the kernel name and the compiler's log."""

    def __init__(self, kernel: str, log: str):
        super().__init__(f"kernel {kernel}: NVRTC compile failed\n{log}")
        self.kernel = kernel
        self.log = log


class GpuError(RuntimeError):
    """A CUDA error while loading or running a program (bad launch, illegal address, …)."""


@cache
def gpu_available() -> bool:
    """True when cupy imports, sees a CUDA device, and torch.cuda works too; never raises."""
    try:
        import cupy
        import torch

        return cupy.cuda.runtime.getDeviceCount() > 0 and torch.cuda.is_available()
    except Exception:
        return False


def elf_image(cubin: bytes) -> bytes:
    """The cubin padded back to the size its ELF header declares (trailing zeros may have
    been stripped on the way here; cuModuleLoadData reads the header's size, not ours)."""
    if len(cubin) < 64 or cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        return cubin
    phoff, shoff = struct.unpack_from("<QQ", cubin, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", cubin, 0x36)
    size = max(len(cubin), phoff + phentsize * phnum, shoff + shentsize * shnum)
    return cubin + b"\0" * (size - len(cubin))


@dataclass(frozen=True)
class _Launch:
    function: Any          # cupy.cuda.Function
    name: str
    grid: int
    threads: int
    shared_bytes: int
    args: tuple[str, ...]
    tensor_maps: tuple[TensorMapSpec, ...] = ()


@dataclass(frozen=True)
class _Unit:
    kernel: str
    zero_fill: tuple[str, ...]
    launches: tuple[_Launch, ...]


class GpuProgram:
    """A CudaProgram loaded on one GPU, with its intermediates, outputs and temporaries
    allocated once. `run` checks; `launch` only enqueues (for timing)."""

    def __init__(self, prog: CudaProgram, *, device: int | None = None):
        import cupy
        import torch

        from emmy.cuda.nvrtc import compile_cuda
        from emmy.schedule.targets import get_target

        self.prog = prog
        index = torch.cuda.current_device() if device is None else device
        self.device = torch.device("cuda", index)
        target = get_target(prog.target)
        units = []
        with cupy.cuda.Device(index):
            for unit in prog.units:
                compiled = compile_cuda(unit.source, target)
                if not compiled.ok or compiled.cubin is None:
                    raise CompileFailed(unit.kernel, compiled.log)
                try:
                    module = cupy.cuda.Module()
                    module.load(elf_image(compiled.cubin))
                    launches = tuple(self._load(module, compiled, spec) for spec in unit.launches)
                except Exception as e:
                    raise GpuError(f"kernel {unit.kernel}: loading the cubin failed: {e}") from e
                units.append(_Unit(unit.kernel, tuple(unit.zero_fill), launches))
        self._units = tuple(units)
        self.buffers: dict[str, Any] = {}
        for b in (*prog.intermediates, *prog.outputs):
            self.buffers[b.name] = torch.empty(b.type.shape, dtype=to_torch(b.type.dtype),
                                               device=self.device)
        self._temporaries, self._zeroed = {}, {}
        for unit in prog.units:
            for name, ctype, count in unit.temporaries:
                make = torch.zeros if name in unit.zeroed else torch.empty
                t = make((count,), dtype=to_torch(dtype_of_c(ctype)), device=self.device)
                # a zeroed one (split:S:last's tickets) is left zero by every run: never
                # poisoned, and zeroed again by poison() after a run that may have stopped short
                (self._zeroed if name in unit.zeroed else self._temporaries)[name] = t
                self.buffers[name] = t
        self._bound: tuple | None = None
        self._streams: dict[int, Any] = {}

    @staticmethod
    def _load(module, compiled, spec) -> _Launch:
        import cupy

        fn = module.get_function(spec.function)
        static = 0
        if spec.function in compiled.resources:
            static = compiled.resources[spec.function].shared_bytes
        if spec.shared_bytes and static + spec.shared_bytes > STATIC_SHARED_LIMIT:
            cupy.cuda.driver.funcSetAttribute(fn.ptr, MAX_DYNAMIC_SHARED_ATTR, spec.shared_bytes)
        grid = spec.grid
        if spec.persistent:
            grid = resident_grid(spec.grid, spec.cluster, _resident_blocks(fn, spec))
        return _Launch(fn, spec.function, grid, spec.threads, spec.shared_bytes, spec.args,
                       spec.tensor_maps)

    def grids(self) -> dict[str, int]:
        """The grid each function is launched with (a persistent one's as fitted to this GPU)."""
        return {l.name: l.grid for unit in self._units for l in unit.launches}

    def bind(self, inputs: Mapping[str, Any]) -> None:
        """Use these tensors as the program's inputs (moved or cast only when they must be)."""
        import numpy as np
        import torch

        for b in self.prog.inputs:
            if b.name not in inputs:
                raise KeyError(f"no value for program input `{b.name}`")
            self.buffers[b.name] = _as_device_tensor(inputs[b.name], b.type.shape, b.type.dtype,
                                                     self.device)
        for unit in self._units:
            for launch in unit.launches:
                for tm in launch.tensor_maps:
                    image = encode_tensor_map(tm, self.buffers[tm.buffer].data_ptr())
                    self.buffers[tm.name] = torch.frombuffer(bytearray(image), dtype=torch.uint8
                                                             ).to(self.device)
        bound = []
        for unit in self._units:
            calls = tuple((l.function, (max(1, l.grid),), (l.threads,),
                           tuple(np.uint64(self.buffers[a].data_ptr()) for a in l.args),
                           l.shared_bytes) for l in unit.launches)
            bound.append((tuple(self.buffers[n] for n in unit.zero_fill), calls))
        self._bound = tuple(bound)

    def poison(self) -> None:
        """Fill outputs, intermediates and temporaries so that an unwritten element shows (and
        zero the temporaries each run must leave zero, in case a run was cut short)."""
        for b in (*self.prog.intermediates, *self.prog.outputs):
            _poison(self.buffers[b.name])
        for t in self._temporaries.values():
            _poison(t)
        for t in self._zeroed.values():
            t.zero_()

    def launch(self, units: tuple[int, ...] | None = None) -> None:
        """Enqueue the program (or only the units at these positions) once on torch's current
        stream, without synchronizing."""
        import cupy
        import torch

        if self._bound is None:
            raise RuntimeError("bind() the inputs before launching")
        stream = self._stream(torch.cuda.current_stream(self.device).cuda_stream)
        with cupy.cuda.Device(self.device.index):
            for i, (zeros, calls) in enumerate(self._bound):
                if units is not None and i not in units:
                    continue
                for t in zeros:
                    t.zero_()
                for fn, grid, block, args, smem in calls:
                    fn(grid, block, args, shared_mem=smem, stream=stream)

    def _stream(self, handle: int):
        """cupy's view of torch's stream (None: the legacy default stream, cupy's default)."""
        import cupy

        if handle == 0:
            return None
        if handle not in self._streams:
            self._streams[handle] = cupy.cuda.ExternalStream(handle)
        return self._streams[handle]

    def run(self, inputs: Mapping[str, Any]) -> tuple:
        """Bind, poison the outputs, launch, wait; the output tensors (reused by the next run)."""
        return self._go(inputs, check=True)

    def call(self, inputs: Mapping[str, Any]) -> tuple:
        """Run on `inputs` into new output tensors, enqueued on torch's current stream (no
        poisoning, no wait: what `emmy.compile`'s callable does). Intermediates and
        temporaries are this program's own, so calls on one stream follow each other."""
        import torch

        for b in self.prog.outputs:
            self.buffers[b.name] = torch.empty(b.type.shape, dtype=to_torch(b.type.dtype),
                                               device=self.device)
        return self._go(inputs, check=False)

    def _go(self, inputs: Mapping[str, Any], *, check: bool) -> tuple:
        """Bind and launch; with `check`, poison the outputs first and wait for the kernels."""
        import torch

        try:
            self.bind(inputs)
            if check:
                self.poison()
            self.launch()
            if check:
                torch.cuda.synchronize(self.device)
        except (KeyError, ValueError):
            raise
        except Exception as e:  # cupy's CUDADriverError, torch's RuntimeError (async errors)
            raise GpuError(f"{type(e).__name__}: {e}") from e
        return tuple(self.buffers[b.name] for b in self.prog.outputs)


def resident_grid(grid: int, cluster: int, resident: int | None) -> int:
    """The grid of a persistent launch (blocks walk the work in steps of gridDim.x) on a GPU
    that holds `resident` of its blocks at once (None: unknown). The compiled grid assumes the
    target's SM count; on a GPU with fewer SMs the blocks past what it holds would start only
    when others have walked all their tiles, a second wave that doubles the time. A multiple
    of the cluster, at least one cluster, never more than compiled."""
    if resident is None or resident < cluster:
        return grid
    return min(grid, resident // cluster * cluster)


def _resident_blocks(fn, spec) -> int | None:
    """How many blocks of `spec` the current GPU holds at once, from the driver's occupancy
    calculator (clusters counted whole); None when it cannot say."""
    try:
        from cuda.bindings import driver as cu

        func = cu.CUfunction(fn.ptr)
        if spec.cluster > 1:
            config = cu.CUlaunchConfig()
            config.gridDimX, config.gridDimY, config.gridDimZ = spec.grid, 1, 1
            config.blockDimX, config.blockDimY, config.blockDimZ = spec.threads, 1, 1
            config.sharedMemBytes = spec.shared_bytes
            err, clusters = cu.cuOccupancyMaxActiveClusters(func, config)
            count = clusters * spec.cluster
        else:
            err, per_sm = cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                func, spec.threads, spec.shared_bytes)
            count = per_sm * _sm_count()
        return count if err == cu.CUresult.CUDA_SUCCESS and count > 0 else None
    except Exception:
        return None


def _sm_count() -> int:
    import cupy

    return int(cupy.cuda.Device().attributes["MultiProcessorCount"])


def run_program_gpu(prog: CudaProgram, inputs: Mapping[str, Any]) -> tuple:
    """Run `prog` once on the GPU; its outputs as torch CUDA tensors, in program order."""
    return GpuProgram(prog).run(inputs)


def encode_tensor_map(spec: TensorMapSpec, address: int) -> bytes:
    """The 128-byte CUtensorMap of `spec` over its buffer, which starts at device address
    `address` (the tensor starts `spec.offset` elements in; zeros outside it; L2 promotion of
    256 bytes)."""
    import numpy as np
    from cuda.bindings import driver as cu

    types = {"__half": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
             "__nv_bfloat16": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
             "float": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32}
    swizzles = {0: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
                1: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
                2: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B,
                3: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_32B}
    err, tensor_map = cu.cuTensorMapEncodeTiled(
        types[spec.ctype], len(spec.dims), address + spec.offset * spec.elem_bytes,
        [cu.cuuint64_t(d) for d in spec.dims],
        [cu.cuuint64_t(s) for s in spec.strides], [cu.cuuint32_t(b) for b in spec.box],
        [cu.cuuint32_t(1)] * len(spec.dims), cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        swizzles[spec.swizzle], cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise GpuError(f"cuTensorMapEncodeTiled failed for {spec}: {err}")
    return np.array(tensor_map.opaque, np.uint64).tobytes()


def _as_device_tensor(value, shape: tuple[int, ...], dtype: DType, device):
    """A contiguous tensor of this shape and element type on `device`; the same storage when
    `value` already is one (torch tensor, or any DLPack producer such as a cupy array)."""
    import torch

    if isinstance(value, torch.Tensor):
        t = value
    elif hasattr(value, "__dlpack__"):
        t = torch.from_dlpack(value)
    else:
        t = torch.as_tensor(value)
    t = as_stored(t).to(device=device, dtype=to_torch(dtype))
    if t.numel() != _numel(shape):
        raise ValueError(f"expected {_numel(shape)} elements of shape {shape}, "
                         f"got {tuple(t.shape)}")
    t = t.reshape(shape).contiguous()
    # kernels read their inputs in 16-byte vectors, cp.async and TMA copies from buffers that
    # start as cudaMalloc's do; a view into the middle of a tensor (x[1:]) may not
    return t.clone() if t.data_ptr() % 16 else t


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _poison(t) -> None:
    import torch

    if t.dtype.is_floating_point:
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(False)  # no poison value exists for bool
    else:
        t.fill_(torch.iinfo(t.dtype).min + 7)


__all__ = ["gpu_available", "run_program_gpu", "GpuProgram", "GpuError", "CompileFailed",
           "elf_image", "encode_tensor_map"]
