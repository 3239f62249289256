"""`emmy.compile(model, *example_inputs)`: a callable that runs the tuned kernels.

Rows come from the schedule database (the best row `emmy-agent optimize` found for each kernel
identity on the target) or the space's default. On a machine with a CUDA GPU the callable runs
the compiled kernels; elsewhere it runs the model eagerly and says so in `backend`.
"""

from __future__ import annotations

from typing import Any


class Compiled:
    """The compiled program of one model at the example inputs' shapes."""

    def __init__(self, model, example_inputs: tuple, *, target: str, db: str | None):
        from emmy.frontend.workload import Workload
        from emmy.pipeline import Options, compile_to
        from emmy.runtime.gpu import gpu_available

        self.model = model.eval()
        workload = Workload(name=type(model).__name__.lower(), model=self.model,
                            inputs=tuple(example_inputs), source="", origin="<api>")
        results = compile_to(workload, "cuda", Options(target=target, db=db))
        self.graph = results["torch"]
        self.program = results["cuda"]
        self.rows = {u.kernel: u.row for u in self.program.units}
        self._gpu = None
        if gpu_available():
            from emmy.runtime.gpu import GpuProgram

            self._gpu = GpuProgram(self.program)
        self.backend = "cuda (emmy kernels)" if self._gpu else "eager torch (no CUDA GPU here)"

    def __repr__(self) -> str:
        rows = "".join(f"\n  {k}: {r}" for k, r in self.rows.items())
        return (f"<emmy.Compiled {self.program.name} for {self.program.target}: "
                f"{len(self.rows)} kernel(s), backend {self.backend}>{rows}")

    @property
    def source(self) -> str:
        return "\n".join(u.source for u in self.program.units)

    def __call__(self, *inputs) -> Any:
        if self._gpu is None:
            import torch

            with torch.no_grad():
                return self.model(*inputs)
        bound = {p.name: t for p, t in zip(self.graph.inputs, inputs)}
        bound.update(self.graph.values)
        outs = self._gpu.run(bound)
        return outs[0] if len(outs) == 1 else tuple(outs)


def compile(model, *example_inputs, target: str = "sm_90a", db: str | None = "") -> Compiled:
    """Compile `model` for the shapes of `example_inputs` (db: a schedule database path, "" the
    default one, None to ignore tuned rows)."""
    return Compiled(model, example_inputs, target=target, db=db)
