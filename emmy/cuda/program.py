"""A compiled program: CUDA source per kernel, and the launches and buffers that run it."""

from __future__ import annotations

from dataclasses import dataclass

from emmy.cuda.emit import emit_program
from emmy.cuda.emulate.run import TensorMapArg
from emmy.loop_ir.ir import Buffer
from emmy.memo import ByIdentity

_EMITTED = ByIdentity()   # a Kernel IR program's CUDA (emmy.memo)


@dataclass(frozen=True, slots=True)
class TensorMapSpec:
    """A TMA tensor map that a launch passes by pointer: parameter `name` (in the launch's args,
    typed `const EmmyTensorMap*`, see emmy_sm90.cuh) points to 128 bytes in global memory that
    the runtime fills before the launch, over buffer `buffer` (cuTensorMapEncodeTiled on a GPU,
    emmy_emu::TensorMap in the emulator). Dimension 0 is the contiguous one; `strides` are the
    byte strides of dimensions 1.. (dimension 0's is the element size)."""

    name: str
    buffer: str
    ctype: str                  # "__half" | "__nv_bfloat16" | "float"
    dims: tuple[int, ...]       # elements per dimension
    strides: tuple[int, ...]    # bytes, dimensions 1..
    box: tuple[int, ...]        # elements per dimension that one copy moves
    swizzle: int = 1            # 0 none, 1 128-byte, 2 64-byte, 3 32-byte
    offset: int = 0             # elements from the buffer's start to the tensor's first one

    @property
    def elem_bytes(self) -> int:
        return 4 if self.ctype == "float" else 2

    def emulator_arg(self, array: int) -> TensorMapArg:
        """The emulator's argument for this map, `array` being the buffer's argument index."""
        return TensorMapArg(array, self.elem_bytes, self.dims, self.strides, self.box,
                            self.swizzle, self.offset * self.elem_bytes)


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    function: str
    grid: int
    threads: int
    shared_bytes: int
    args: tuple[str, ...]
    tensor_maps: tuple[TensorMapSpec, ...] = ()   # filled by the runtime before the launch
    cluster: int = 1          # blocks per thread-block cluster (along x; the grid is a multiple)
    persistent: bool = False  # the blocks walk the work: the runtime may launch fewer (see
                              # emmy.runtime.gpu.resident_grid)


@dataclass(frozen=True, slots=True)
class Unit:
    """One Tile IR kernel with its row: source, launches in order, scratch buffers."""

    kernel: str
    row: str
    source: str
    launches: tuple[LaunchSpec, ...]
    temporaries: tuple[tuple[str, str, int], ...]
    zero_fill: tuple[str, ...]
    zeroed: tuple[str, ...] = ()    # temporaries zero when allocated and left zero by each run


@dataclass(frozen=True, slots=True)
class CudaProgram:
    name: str
    inputs: tuple[Buffer, ...]
    intermediates: tuple[Buffer, ...]
    outputs: tuple[Buffer, ...]
    units: tuple[Unit, ...]
    target: str


def build_program(m) -> CudaProgram:
    """Emit the CUDA of every materialized kernel (m: pipeline.Materialized)."""
    tp = m.scheduled.program
    units = []
    for k, kp in zip(tp.kernels, m.kernels):
        fns = {f.name: f for f in kp.functions}
        launches = tuple(LaunchSpec(l.function, fns[l.function].grid, fns[l.function].threads,
                                    fns[l.function].shared_bytes, l.args,
                                    fns[l.function].tensor_maps, fns[l.function].cluster,
                                    fns[l.function].persistent)
                         for l in kp.launches)
        units.append(Unit(k.name, str(m.scheduled.rows[k.name]),
                          _EMITTED(kp, None, lambda kp=kp: emit_program(kp)), launches,
                          kp.temporaries, kp.zero_fill, kp.zeroed))
    return CudaProgram(tp.name, tp.inputs, tp.intermediates, tp.outputs, tuple(units),
                       m.scheduled.target.name)
