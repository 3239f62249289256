"""`emmy.compile(model, *example_inputs)`: a callable that runs the tuned kernels.

Rows come from the schedule database (the best row `emmy-agent optimize` found for each kernel
identity on the target) or the space's default. Where the kernels run is `run`:

- `auto`: on the GPU when there is one, else the model eagerly (and `backend` says so);
- `gpu`: on the GPU (an error where there is none);
- `emulate`: the emitted CUDA on the CPU emulator (every thread a host thread: for checking
  the kernels at small shapes, never for speed);
- `eager`: the model itself (the kernels are still compiled, so `rows` and `source` show them).

Each call returns new output tensors (a later call never overwrites an earlier result).
"""

from __future__ import annotations

from typing import Any

from emmy.dtypes import as_user
from emmy.errors import UserError

RUNS = ("auto", "gpu", "emulate", "eager")


def check_run(run: str) -> None:
    """Refuse a `run` that is not one of RUNS, or `gpu` where there is none."""
    from emmy.runtime.gpu import gpu_available

    if run not in RUNS:
        raise UserError(f"run must be one of {', '.join(RUNS)}, not `{run}`")
    if run == "gpu" and not gpu_available():
        raise UserError("run=gpu: no CUDA GPU is available here (cupy and torch.cuda must "
                        "both see one); run=emulate checks the kernels on the CPU")


class KernelFailed(RuntimeError):
    """An emulated kernel crashed, hung or did not build (a bug in emmy, not in the input)."""


class Compiled:
    """The compiled program of one model at the example inputs' shapes."""

    def __init__(self, model, example_inputs: tuple, *, target: str, db: str | None,
                 run: str = "auto", name: str | None = None):
        from emmy.frontend.workload import Workload
        from emmy.pipeline import Options, compile_to
        from emmy.runtime.gpu import gpu_available

        check_run(run)
        self.model = model           # in its own mode: a model in training mode as it trains
        # the program is of these values of the non-tensor arguments (export bakes them in)
        self._fixed = {i: x for i, x in enumerate(example_inputs) if not _is_tensor(x)}
        workload = Workload(name=name or type(model).__name__.lower(), model=self.model,
                            inputs=tuple(example_inputs), source="", origin="<api>")
        self.workload = workload
        results = compile_to(workload, "cuda", Options(target=target, db=db))
        self.graph = results["torch"]
        self.program = results["cuda"]
        # the buffers the program writes (a KV cache), by module path: their placeholders
        self._written = {p.target: p.name for p in self.graph.placeholders
                         if p.target in self.graph.updates}
        self.rows = {u.kernel: u.row for u in self.program.units}
        self.run = "gpu" if run == "auto" and gpu_available() else \
            "eager" if run == "auto" else run
        self._gpu = None
        # parameters and buffers bound once (a CPU model's copied to the GPU, or cloned where
        # the kernels run on the CPU): an integer buffer may have become index arithmetic
        # (emmy.tensor_ir.tables), so the program takes the model's values as they are now
        if self.run == "gpu":
            from emmy.runtime.gpu import GpuProgram

            self._gpu = GpuProgram(self.program)
            self._values = {n: v.to(self._gpu.device) for n, v in self.graph.values.items()}
        elif self.run == "emulate":
            self._values = {n: v.clone() for n, v in self.graph.values.items()}
        else:                                   # eager: the model runs itself
            self._values = self.graph.values
        self.backend = {"gpu": "cuda (emmy kernels)",
                        "emulate": "cpu emulator (emmy kernels; for checking, not speed)",
                        "eager": "eager torch" + (" (no CUDA GPU here)" if run == "auto"
                                                  else " (asked for)")}[self.run]

    def __repr__(self) -> str:
        rows = "".join(f"\n  {k}: {r}" for k, r in self.rows.items())
        return (f"<emmy.Compiled {self.program.name} for {self.program.target}: "
                f"{len(self.rows)} kernel(s), backend {self.backend}>{rows}")

    @property
    def source(self) -> str:
        return "\n".join(u.source for u in self.program.units)

    def check(self):
        """The kernels against the model on fresh inputs (the tuner's check: several seeds,
        and on a GPU several value distributions, against a float64 reference), where they
        run (the GPU, else the CPU emulator): an `emmy.bench.harness.HarnessCheck`."""
        from emmy.bench.harness import check_program

        return check_program(self.workload, self.graph, self.program,
                             device="gpu" if self.run == "gpu" else "cpu")

    def __call__(self, *inputs) -> Any:
        if self.run == "eager":
            import torch

            with torch.no_grad():
                return self.model(*inputs)
        outs = self.outputs(*inputs)
        return outs[0] if len(outs) == 1 else outs

    def outputs(self, *inputs) -> tuple:
        """The program's outputs, in the order the model returns them (flattened), computed by
        the kernels (on the GPU, or on the CPU emulator with run=emulate)."""
        import torch

        tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
        if len(tensors) != len(self.graph.inputs):
            raise UserError(f"the compiled program takes {len(self.graph.inputs)} tensor "
                            f"inputs, got {len(tensors)}")
        self._check_arguments(inputs, tensors)
        bound = {p.name: t for p, t in zip(self.graph.inputs, tensors)}
        bound.update(self._values)
        # the buffers it writes as the model holds them now (a cache reset since is seen)
        for target, name in self._written.items():
            buffer = self.model.get_buffer(target)
            bound[name] = buffer.to(self._gpu.device) if self.run == "gpu" else buffer.clone()
        if self.run == "gpu":
            outs = self._gpu.call(bound)
        elif self.run == "emulate":
            outs = self._emulated(bound)
        else:
            raise UserError("this program runs eagerly (run=eager): call it, not outputs()")
        self._write_back(outs[len(self.graph.returned):], tensors)
        # complex outputs come as (real, imaginary) pairs: viewed as complex again
        return tuple(as_user(o, self.graph.node(r.name).type.dtype)
                     for o, r in zip(outs, self.graph.returned))

    def _write_back(self, values, tensors: list) -> None:
        """The buffers the model writes (a KV cache) and the inputs it writes in place: their
        new values go into the model's own buffers (which the next call reads) and the caller's
        tensors, as eager leaves them."""
        import torch

        from emmy.torch_ir.ir import updated_input

        for target, value in zip(self.graph.updates, values):
            i = updated_input(target)
            written = self.model.get_buffer(target) if i is None else tensors[i]
            with torch.no_grad():
                written.copy_(value.to(written.device))

    def _check_arguments(self, inputs: tuple, tensors: list) -> None:
        """A call's arguments as the program takes them: each tensor of the shape and type it
        was compiled for, each other argument the value it had (export baked it in)."""
        from emmy.dtypes import from_torch

        for i, x in self._fixed.items():
            if i >= len(inputs) or _is_tensor(inputs[i]) or inputs[i] != x:
                got = inputs[i] if i < len(inputs) else "nothing"
                raise UserError(f"argument {i} was {x!r} when the model was compiled, now "
                                f"{got!r}: the program is of that value (compile again for "
                                "another, or pass it as a tensor: a position read with "
                                "`.item()` is read when the program runs)")
        for p, t in zip(self.graph.inputs, tensors):
            if tuple(t.shape) != tuple(p.type.shape) or from_torch(t.dtype) != p.type.dtype:
                raise UserError(f"input `{p.name}`: {from_torch(t.dtype)}{list(t.shape)}, "
                                f"compiled for {p.type.dtype}{list(p.type.shape)} (emmy "
                                "compiles static shapes: compile again for these)")

    def _emulated(self, bound: dict) -> tuple:
        import torch

        from emmy.dtypes import to_torch
        from emmy.runtime.cpu import run_program

        res = run_program(self.program, bound)
        if not res.ok:
            raise KernelFailed(f"the emulated kernel {res.failed} failed ({res.status}): "
                                f"{res.log[-2000:]}")
        return tuple(torch.from_numpy(o.copy()).to(to_torch(b.type.dtype))   # bf16 comes as f32
                     for o, b in zip(res.outputs, self.program.outputs))


def _is_tensor(x) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


def compile(model, *example_inputs, target: str = "sm_90a", db: str | None = "",
            run: str = "auto") -> Compiled:
    """Compile `model` for the shapes of `example_inputs` (db: a schedule database path, "" the
    default one, None to ignore tuned rows; run: auto, gpu, emulate or eager, as the module
    says)."""
    return Compiled(model, example_inputs, target=target, db=db, run=run)
