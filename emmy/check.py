"""Check a compiled program against PyTorch eager on the workload's inputs (CPU reference)."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, replace

import numpy as np

from emmy.dtypes import DType, tolerance
from emmy.errors import UserError, WorkloadFails
from emmy.selections import graph_dtypes
from emmy.tensor_ir.semantics import as_numpy


@dataclass(frozen=True)
class OutputCheck:
    name: str
    dtype: DType
    shape: tuple[int, ...]
    max_abs: float
    max_rel: float             # over elements of the reference at least atol in magnitude
    atol: float
    rtol: float
    ok: bool
    reference: str = "eager"   # or "float64 eager": the model run in float64
    why: str = ""              # what makes a mismatch more than a difference in values


@dataclass(frozen=True)
class CheckReport:
    outputs: tuple[OutputCheck, ...]

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)


def to_numpy(t) -> np.ndarray:
    """A torch tensor as numpy (bf16 and 8-bit floats widened to f32, which numpy lacks; a
    complex tensor as its (real, imaginary) pairs, as the kernels store it)."""
    return as_numpy(t)


def flatten_tensors(value) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in flatten_tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in flatten_tensors(v)]
    return []


SLOW_EMULATION_S = 30.0   # an emulated check this long earns a note on the workload's size


def slow_emulation_note(seconds: float, what: str = "an evaluation") -> str:
    """Why a check on the CPU took long, and what to do about it."""
    return (f"{what} took {seconds:.0f} s: the CPU emulator runs every thread of the kernel at "
            "the workload's full size; --set NAME=VALUE on the file's size constants makes it "
            "smaller (rows are then checked and modeled at that size)")


def program_inputs(graph, inputs: tuple) -> dict[str, np.ndarray]:
    """Bind the workload's tensors and the model's parameters to the program's input names."""
    import torch

    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    if len(tensors) != len(graph.inputs):
        raise UserError(f"the model takes {len(graph.inputs)} tensor inputs, "
                        f"get_inputs() gave {len(tensors)}")
    bound = {p.name: to_numpy(t) for p, t in zip(graph.inputs, tensors)}
    bound.update({name: to_numpy(v) for name, v in graph.values.items()})
    return bound


def per_output(floor: DType | tuple | None, i: int) -> DType | None:
    """Output i's floor type of a floor given for all outputs or one per output."""
    return floor[i] if isinstance(floor, tuple) else floor


def compare(names, dtypes, got: list[np.ndarray], expected: list, *,
            tf32: bool = False, selections: tuple = (), slack: list | None = None,
            floor: DType | tuple | None = None, rival: list | None = None) -> CheckReport:
    """Compare each output with the eager result in float64, with a tolerance by dtype (f32 as
    f16 where the workload allows tf32 products; a float output at least as wide as the
    tolerance of `floor`, the least precise float type the model starts in or the output is
    computed through: one for all outputs, or a tuple of one per output), widened
    elementwise by `slack` (per output,
    where given); an output of positions a selection took (`selections`, per output:
    emmy.selections) that differs from the reference's is compared by the values its positions
    pick. `rival` (per output, where given): another result's distance from the same reference
    elementwise (eager's from float64); where that result itself misses the tolerance, an
    output passes when neither its largest nor its mean distance is larger than the rival's
    (see _compare_outputs)."""
    checks = []
    for i, (name, dtype, g, e) in enumerate(zip(names, dtypes, got, expected)):
        with np.errstate(invalid="ignore"):     # a signaling NaN (bits read as a float)
            ref = to_numpy(e).astype(np.float64)
            val = np.asarray(g).astype(np.float64)
        atol, rtol = tolerance(dtype, tf32=tf32, floor=per_output(floor, i))
        if val.shape != ref.shape:
            if tuple(n for n in val.shape if n != 1) != tuple(n for n in ref.shape if n != 1):
                checks.append(OutputCheck(name, dtype, ref.shape, float("inf"), float("inf"),
                                          atol, rtol, False, why=f"shape {val.shape}, eager's "
                                          f"{ref.shape}"))
                continue
            # axes of one apart (torch's meta function and its eager kernel disagree, as for a
            # vector's unreduced multilabel_margin_loss: (1,) and ()): the values are compared
            val = val.reshape(ref.shape)
        sel = selections[i] if i < len(selections) else None
        if sel is not None and not np.array_equal(val, ref):
            checks.append(_by_picked_values(name, dtype, g, e, sel))
            continue
        with np.errstate(invalid="ignore"):     # inf - inf: settled just below
            diff = np.abs(val - ref)
        both_nan = np.isnan(val) & np.isnan(ref)
        same_inf = np.isinf(val) & np.isinf(ref) & (np.sign(val) == np.sign(ref))
        diff = np.where(both_nan | same_inf, 0.0, diff)
        diff = np.where(np.isnan(diff), np.inf, diff)
        max_abs = float(diff.max()) if diff.size else 0.0
        # relative to elements the absolute tolerance does not cover (a zero of eager's, which
        # the program rounds to 1e-9, is no relative error of 1e21)
        large = np.abs(ref) >= max(atol, 1e-30)
        rel = diff / np.maximum(np.abs(ref), 1e-30)
        max_rel = float(np.where((diff == 0) | ~large, 0.0, rel).max()) if diff.size else 0.0
        bound = atol + rtol * np.abs(np.where(np.isfinite(ref), ref, 0.0))
        if rival is not None and i < len(rival) and rival[i] is not None:
            other = rival[i].reshape(ref.shape)
            ok = bool(np.any(other > bound) and diff.size and diff.max() <= other.max()
                      and diff.mean() <= other.mean())
            checks.append(OutputCheck(name, dtype, ref.shape, max_abs, max_rel, atol, rtol, ok))
            continue
        if slack is not None and i < len(slack) and slack[i] is not None:
            bound = bound + slack[i].reshape(ref.shape)
        ok = bool(np.all(diff <= bound))
        checks.append(OutputCheck(name, dtype, ref.shape, max_abs, max_rel, atol, rtol, ok))
    return CheckReport(tuple(checks))


def _by_picked_values(name, dtype, got, expected, sel) -> OutputCheck:
    """Positions that differ from the reference's, checked by the values they pick."""
    import torch

    from emmy.selections import check_positions

    c = check_positions(torch.as_tensor(np.asarray(got)), expected, sel)
    return OutputCheck(name, dtype, tuple(expected.shape), c.max_abs, c.max_rel, 0.0, c.rtol,
                       c.bad == 0, "eager, by the values the positions pick")


def eager_outputs(workload, selections: list | None = None) -> list:
    import torch

    with torch.no_grad():
        return flatten_tensors(run_eager(workload.model, workload.inputs, selections))


def run_eager(model, args, selections: list | None = None):
    """model(*args) in eager PyTorch; where the model itself fails on its inputs (an index out
    of range, say), that is the input's fault: WorkloadFails (a UserError) naming torch's
    reason. torch.topk breaks ties as emmy does, and each selection of positions (topk,
    argmax, max over a dim) is appended to `selections` (emmy.selections). Tensors the forward
    makes without naming a device (a window for stft, shifts to unpack nibbles) are made on the
    inputs' device, as they are where a person runs the model on it."""
    import torch

    from emmy.selections import recording

    dev = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
    try:
        with recording(selections), \
                torch.device(dev) if dev is not None and dev.type != "cpu" else nullcontext():
            return model(*args)
    except Exception as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise WorkloadFails(f"the model fails on its inputs in eager PyTorch: "
                        f"{type(e).__name__}: {reason}") from None


def check_loop_program(workload, graph, loop_program) -> CheckReport:
    """Run the Loop IR on the CPU (numpy reference) and compare every output with PyTorch eager."""
    from emmy.loop_ir.interp import run

    got = run(loop_program, program_inputs(graph, workload.inputs))
    return _compare_outputs(loop_program.outputs, got, workload, updates=graph.updates,
                            computes=graph_dtypes(graph))


def check_cuda_program(workload, graph, cuda_program):
    """Run the emitted CUDA on the CPU emulator; (report, None) or (None, failed RunResult)."""
    from emmy.runtime.cpu import run_program

    result = run_program(cuda_program, program_inputs(graph, workload.inputs))
    if not result.ok:
        return None, result
    return _compare_outputs(cuda_program.outputs, list(result.outputs), workload,
                            tf32=graph.tf32, updates=graph.updates,
                            computes=graph_dtypes(graph)), result


def with_updates(model, updates: tuple[str, ...]):
    """The model on a copy of its state and of its inputs, returning what it returns and then
    the new values of the buffers and inputs it writes (`Graph.updates`), as its program's
    outputs are: the reference for a program that writes a KV cache or an argument in place.
    Without updates, the model itself."""
    import copy

    import torch

    from emmy.torch_ir.ir import updated_input

    if not updates:
        return model

    class WithUpdates(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = copy.deepcopy(model)

        def forward(self, *args):
            args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            out = flatten_tensors(self.model(*args))
            return (*out, *(self.model.get_buffer(t) if updated_input(t) is None
                            else tensors[updated_input(t)] for t in updates))

    return WithUpdates()        # the copy in the model's own mode, as its program computes


def _compare_outputs(outs, got, workload, *, tf32: bool = False,
                     updates: tuple[str, ...] = (), computes: tuple = ()) -> CheckReport:
    """Each output against eager; one that misses is compared again with the model run in
    float64, the tolerance widened by eager's own distance from it: a program that rounds less
    often than eager f16/bf16 (which rounds after every op) can be nearer the exact result
    than eager is, and further from eager than the tolerance (a LayerNorm over three
    near-equal values magnifies eager's roundings), as can an f32 program that computes in
    float64 where eager does not (a small matrix's inverse by its closed form, against eager's
    float32 LU on an ill-conditioned matrix); where eager is far from the exact result, the
    program may be as far and no less accurate. A float output is checked no tighter than
    the least precise float type the model starts in, or it is computed through (`computes`,
    per output), allows."""
    from emmy.selections import least_precise, model_dtype, of_outputs

    own: list = []
    start = model_dtype(workload.model, workload.inputs)
    floor = tuple(least_precise((start, c)) for c in computes) or start
    if updates:          # the reference runs on copies of the state it writes, once each
        workload = _Fresh(workload, updates)
    expected = eager_outputs(workload, own)
    if len(expected) != len(outs):
        raise UserError(f"the model returns {len(expected)} tensors; the program has {len(outs)}")
    names, dtypes = [b.name for b in outs], [b.type.dtype for b in outs]
    report = compare(names, dtypes, got, expected, tf32=tf32,
                     selections=of_outputs(expected, own, floor=start), floor=floor)
    if report.ok:
        return report
    recorded: list = []
    exact = eager_outputs_f64(workload, recorded)
    if exact is None:
        return report
    exact = list(mended_reference(exact, expected))
    selections = of_outputs(exact, recorded, own, start)
    plain = compare(names, dtypes, got, exact, tf32=tf32, selections=selections, floor=floor)
    eager_error = _eager_error(expected, exact)
    again = compare(names, dtypes, got, exact, tf32=tf32, selections=selections, floor=floor,
                    slack=eager_error)
    # where eager itself misses float64 (16-bit roundings under a softmax of scores in the
    # hundreds, one f16 step apart), the two miss at different elements: no further from it
    # than eager by the largest and the mean distance is as accurate as eager
    overall = compare(names, dtypes, got, exact, tf32=tf32, floor=floor, rival=[
        None if selections and selections[i] is not None else err
        for i, err in enumerate(eager_error)])
    return CheckReport(tuple(
        o if o.ok else
        replace(a, reference="float64 eager" if p.ok else
                "float64 eager, give or take eager's own error") if a.ok else
        replace(v, reference="float64 eager, no further from it than eager (max and mean "
                "error)") if v.ok else o
        for o, p, a, v in zip(report.outputs, plain.outputs, again.outputs, overall.outputs)))


class _Fresh:
    """A workload whose `model` is a fresh copy each time it is read, returning the buffers it
    writes too (with_updates): each reference run starts from the model's own state."""

    def __init__(self, workload, updates: tuple[str, ...]):
        self._workload, self._updates = workload, updates

    def __getattr__(self, name: str):
        if name == "model":
            return with_updates(self._workload.model, self._updates)
        return getattr(self._workload, name)


def mended_reference(exact, native) -> tuple:
    """The float64 reference, NaN only where the model in its own types is NaN too: a model
    that masks with its dtype's finfo.min gets float64's in float64, which a softmax in float32
    (`softmax(x, dtype=torch.float32)`, as Hugging Face's attention writes it) turns into -inf
    and a row masked everywhere into NaN, where the model in its own dtype gives its average.
    There the model's own output is the reference (a program NaN there fails, as it must)."""
    import torch

    out = []
    for x, own in zip(exact, native):
        if isinstance(x, torch.Tensor) and isinstance(own, torch.Tensor) and \
                x.shape == own.shape and x.is_floating_point() and own.is_floating_point():
            x = torch.where(torch.isnan(x) & ~torch.isnan(own), own.to(x.dtype), x)
        out.append(x)
    return tuple(out)


def _eager_error(expected: list, exact: list) -> list:
    """Per output, how far eager's own result is from the float64 one, elementwise (None where
    the shapes or values do not compare): where eager's f16/bf16 roundings move an ill-
    conditioned output (a log_softmax of values in the hundreds, whose inputs' last bit is worth
    several units), a program may differ from both by as much and be no less accurate than
    eager."""
    out = []
    for e, x in zip(expected, exact):
        ref, mine = to_numpy(x).astype(np.float64), to_numpy(e).astype(np.float64)
        if ref.shape != mine.shape:
            out.append(None)
            continue
        with np.errstate(invalid="ignore"):
            err = np.abs(mine - ref)
        out.append(np.where(np.isfinite(err), err, 0.0))
    return out


def eager_outputs_f64(workload, selections: list | None = None) -> list | None:
    """The model's outputs with its parameters and floating inputs in float64 (None where it
    does not run so); its selections appended to `selections` (see run_eager)."""
    import copy

    import torch

    args = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
            for x in workload.inputs]
    try:
        with torch.no_grad():
            return flatten_tensors(run_eager(copy.deepcopy(workload.model).double(), args,
                                             selections))
    except Exception:   # an op without a float64 kernel: eager in its own types only
        return None
