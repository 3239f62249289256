"""Run a compiled program on the CPU: each launch's CUDA built with g++ against the emulation
header and run at small shapes. For correctness, never speed."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from emmy.cuda.emulate.run import build_and_run, build_together
from emmy.cuda.program import CudaProgram
from emmy.runtime.buffers import dtype_of_c, from_storage, poisoned, to_storage, storage_of


@dataclass(frozen=True)
class RunResult:
    status: str                         # ok | compile_error | crash | timeout | error
    outputs: tuple[np.ndarray, ...]     # numeric values of the program outputs (when ok)
    log: str = ""
    failed: str = ""                    # the function that failed
    changed_inputs: tuple[str, ...] = ()  # inputs whose bytes differ after the run

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def run_program(prog: CudaProgram, inputs: Mapping[str, object], *, timeout: float = 120.0) -> RunResult:
    """Run every launch in order on `inputs` (tensors or arrays by program input name). The
    kernels not yet in the cache are built first, together (build_together)."""
    build_together([(u.source, u.launches[0].function) for u in prog.units if u.launches])
    buffers: dict[str, np.ndarray] = {}
    for b in prog.inputs:
        buffers[b.name] = to_storage(inputs[b.name], b.type.dtype).reshape(b.type.shape)
    before = {b.name: _digest(buffers[b.name]) for b in prog.inputs}
    for b in (*prog.intermediates, *prog.outputs):
        buffers[b.name] = poisoned(b.type.shape, b.type.dtype)
    for unit in prog.units:
        for name, ctype, count in unit.temporaries:
            buffers[name] = poisoned((count,), dtype_of_c(ctype))
            if name in unit.zeroed:
                buffers[name][...] = 0
        for name in unit.zero_fill:
            buffers[name][...] = 0
        for launch in unit.launches:
            maps = {tm.name: tm.emulator_arg(launch.args.index(tm.buffer))
                    for tm in launch.tensor_maps}
            args = [maps[a] if a in maps else buffers[a] for a in launch.args]
            res = build_and_run(unit.source, launch.function, launch.grid, launch.threads,
                                launch.shared_bytes, args, timeout=timeout,
                                cluster=launch.cluster)
            if not res.ok:
                return RunResult(res.status, (), res.log, launch.function)
    outs = tuple(from_storage(buffers[b.name], b.type.dtype) for b in prog.outputs)
    changed = tuple(n for n, d in before.items() if _digest(buffers[n]) != d)
    return RunResult("ok", outs, changed_inputs=changed)


def _digest(array: np.ndarray) -> str:
    return hashlib.sha256(array.tobytes()).hexdigest()


__all__ = ["run_program", "RunResult", "storage_of"]
