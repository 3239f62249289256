"""What the split:S:last tests share: the tickets a last-block launch leaves (its last argument,
an int per tile, query block or job, zero before and after every run)."""

from __future__ import annotations


def record_tickets(monkeypatch) -> list:
    """The tickets after each emulated launch from now on (a copy each), as a list that fills
    as the launches run."""
    import numpy as np

    import emmy.runtime.cpu as cpu

    after = []
    run = cpu.build_and_run

    def spy(source, function, grid, block, smem, args, **kw):
        out = run(source, function, grid, block, smem, args, **kw)
        after.append(np.array(args[-1]))
        return out

    monkeypatch.setattr(cpu, "build_and_run", spy)
    return after


def assert_gpu_runs_repeat_their_bits(w, row: str) -> None:
    """On the GPU: `w` under `row` run three times on the same inputs and once enqueued
    without waiting gives the same output bits every time (the last block adds the partials in
    split order, whichever block finishes last) and leaves every ticket zero after each."""
    import torch

    from emmy.check import program_inputs
    from emmy.pipeline import Options, compile_to
    from emmy.runtime.gpu import GpuProgram

    stages = compile_to(w, "cuda", Options(rows={"": row}))
    loaded = GpuProgram(stages["cuda"])
    inputs = program_inputs(stages["torch"], w.inputs)
    (tickets,) = stages["cuda"].units[0].zeroed
    outs = []
    for _ in range(3):
        (out,) = loaded.run(inputs)
        outs.append(out.clone())
        assert not loaded.buffers[tickets].any()
    (out,) = loaded.call(inputs)
    torch.cuda.synchronize()
    for o in (*outs[1:], out):
        assert torch.equal(o, outs[0])
    assert not loaded.buffers[tickets].any()
