"""Reads at data-dependent positions (embedding, gather, index_select, take_along_dim, tensor
indexing): one Gather each, against eager PyTorch through every stage: the Tensor IR and Loop
IR interpreters, and the emitted CUDA on the CPU emulator (default and sampled legal rows)."""

import numpy as np
import pytest
import torch
import torch.nn as nn

from emmy.errors import UserError
from emmy.frontend.workload import load_expr
from emmy.loop_ir import interp as loop_interp
from emmy.loop_ir.lower import lower as lower_loops
from emmy.kernel_ir.printer import print_program as print_kernel
from emmy.loop_ir.printer import print_program
from tests.rows import without_clusters
from emmy.pipeline import compile_to
from emmy.tensor_ir.ir import Gather, IndexMap, Input
from emmy.tensor_ir.lower import lower
from emmy.torch_ir.capture import capture
from emmy.verify import verify_rows
from tests.tensor_ir.conftest import Fn, assert_matches
from tests.tensor_ir.emitted import assert_emitted_cuda_matches_eager


def _ints(lo, hi, *shape, dtype=torch.int64):
    return torch.randint(lo, hi, shape, dtype=dtype)


CASES = {
    # name: (function, inputs)
    "embedding": (nn.Embedding(20, 8), lambda: (_ints(0, 20, 3, 5),)),
    "embedding_int32_padding_idx": (nn.Embedding(20, 8, padding_idx=0),
                                    lambda: (_ints(0, 20, 4, dtype=torch.int32),)),
    "gather_last": (lambda x, i: torch.gather(x, 1, i),
                    lambda: (torch.randn(6, 9), _ints(0, 9, 6, 4))),
    "gather_first_smaller": (lambda x, i: x.gather(0, i),
                             lambda: (torch.randn(6, 9), _ints(0, 6, 2, 5))),
    "gather_3d_middle": (lambda x, i: torch.gather(x, -2, i),
                         lambda: (torch.randn(2, 7, 5), _ints(0, 7, 2, 3, 5))),
    "index_select": (lambda x, i: torch.index_select(x, 1, i),
                     lambda: (torch.randn(4, 9, 3), _ints(0, 9, 6))),
    "index_select_scalar": (lambda x, i: x.index_select(0, i),
                            lambda: (torch.randn(5, 3), torch.tensor(3))),
    "index_rows_negative": (lambda x, i: x[i], lambda: (torch.randn(7, 4), _ints(-7, 7, 2, 3))),
    "index_middle_axis": (lambda x, i: x[:, i], lambda: (torch.randn(3, 8, 2), _ints(0, 8, 5))),
    "index_two_adjacent": (lambda x, i, j: x[:, i, j],
                           lambda: (torch.randn(2, 6, 5, 3), _ints(0, 6, 4, 1), _ints(0, 5, 3))),
    "index_two_apart": (lambda x, i, j: x[i, :, j],
                        lambda: (torch.randn(6, 4, 5), _ints(0, 6, 3), _ints(0, 5, 3))),
    "take_along_dim": (lambda x, i: torch.take_along_dim(x, i, 1),
                       lambda: (torch.randn(5, 8), _ints(0, 8, 1, 3))),
    "take_along_flat": (lambda x, i: torch.take_along_dim(x, i),
                        lambda: (torch.randn(5, 8), _ints(0, 40, 7))),
    "gather_of_transposed": (lambda x, i: x.t()[i], lambda: (torch.randn(9, 6), _ints(0, 6, 4))),
    "gather_of_computed": (lambda x, i: torch.exp(x).cumsum(1).gather(1, i),
                           lambda: (torch.randn(4, 10), _ints(0, 10, 4, 3))),
    "gather_at_argmax": (lambda x: x.gather(1, x.argmax(1, keepdim=True)),
                         lambda: (torch.randn(5, 11),)),
    "embedding_half": (nn.Embedding(16, 8).half(), lambda: (_ints(0, 16, 2, 3),)),
}


def _model(fn):
    return fn if isinstance(fn, nn.Module) else Fn(fn)


@pytest.mark.parametrize("name", sorted(CASES))
def test_tensor_and_loop_ir_match_eager(name):
    torch.manual_seed(0)
    fn, make = CASES[name]
    model, inputs = _model(fn).eval(), make()
    graph = capture(model, inputs, name=name)
    program = lower(graph)
    assert any(isinstance(d, Gather) for d in program.defs) or name == "index_select_scalar"
    bound = {p.name: v for p, v in zip(graph.inputs, inputs)}
    bound |= {k: v for k, v in graph.values.items()}
    with torch.no_grad():
        want = model(*inputs)
    from emmy.tensor_ir.interp import run
    assert_matches(run(program, bound)[0], want, "Tensor IR")
    got = loop_interp.run(lower_loops(program), bound)[0]
    assert_matches(got.astype(np.float32) if want.dtype == torch.bfloat16 else got, want, "Loop IR")


def test_one_gather_reads_the_source_where_a_view_of_an_input_is_indexed():
    """x.t()[i] gathers from x itself (the transpose composes into the gather's index)."""
    graph = capture(Fn(lambda x, i: x.t()[i]), (torch.randn(9, 6), _ints(0, 6, 4)))
    program = lower(graph)
    (g,) = [d for d in program.defs if isinstance(d, Gather)]
    assert isinstance(program.get(g.arg), Input)
    assert not any(isinstance(d, IndexMap) and d.name == g.arg for d in program.defs)


def test_positions_are_wrapped_and_clamped_into_range():
    """torch raises on an index out of range; the program reads the nearest row (no fault)."""
    graph = capture(Fn(lambda x, i: x[i]), (torch.randn(5, 3), _ints(0, 5, 4)))
    program = lower(graph)
    from emmy.tensor_ir.interp import run
    x = torch.randn(5, 3)
    positions = torch.tensor([-1, 7, -9, 2])
    got = run(program, {graph.inputs[0].name: x, graph.inputs[1].name: positions})[0]
    np.testing.assert_array_equal(got, x[[4, 4, 0, 2]].numpy())


def test_the_position_is_computed_once_outside_the_row_it_reads():
    stages = compile_to(load_expr("nn.Embedding(100, 64)(torch.randint(0, 100, (4, 16)))"),
                        "kernel")
    text = print_program(stages["loop"])
    assert "(@0 = " in text
    inner = text.split("for a2")[1]
    assert "load input" not in inner      # the index is read once per row, not per element
    kernel = "\n".join(print_kernel(k) for k in stages["kernel"].kernels)
    assert "load.global.v4 weight[" in kernel   # the row itself is read as vectors


def test_a_computed_source_is_stored_and_a_product_reads_a_stored_gather():
    w = load_expr("nn.Linear(64, 32)(torch.tanh(torch.randn(100, 64))"
                  "[torch.randint(0, 100, (4, 16))])")
    stages = compile_to(w, "tile")
    kinds = [k.kind.value for k in stages["tile"].program.kernels]
    assert kinds[-1] == "contract", kinds           # the linear layer: a matrix-product template
    notes = " ".join(stages["loop"].notes)
    assert "reads it at positions known only at run time" in notes     # tanh(...) is stored
    assert "a product reads this gather" in notes


def test_a_boolean_mask_is_refused_with_a_reason():
    """A mask selects a number of elements known only at run time: not a static shape."""
    with pytest.raises(UserError, match="data-dependent shape"):
        compile_to(load_expr("(lambda x, m: x[m])(torch.randn(5, 3), "
                             "torch.randint(0, 2, (5,)).bool())"), "tensor")


EXPRS = [
    "nn.Embedding(100, 64)(torch.randint(0, 100, (4, 16)))",
    "torch.gather(torch.randn(8, 32), 1, torch.randint(0, 32, (8, 5)))",
    "torch.randn(16, 24, 8)[torch.randint(0, 16, (5, 1)), :, torch.randint(0, 8, (4,))]",
    "nn.LayerNorm(64)(nn.Embedding(100, 64)(torch.randint(0, 100, (4, 16))))",
    "nn.Embedding(100, 64).half()(torch.randint(0, 100, (4, 16))) * 2",
    "torch.randn(30, 8).to(torch.bfloat16)[torch.randint(-30, 30, (5, 2))]",
    "(lambda x: torch.gather(x, 1, x.argmax(1, keepdim=True)))(torch.randn(16, 40))",
]


@pytest.mark.parametrize("expr", EXPRS)
def test_emitted_cuda_matches_eager(expr):
    assert_emitted_cuda_matches_eager(expr)


@pytest.mark.parametrize("expr", [
    "nn.LayerNorm(64)(nn.Embedding(100, 64)(torch.randint(0, 100, (4, 16))))",
    "nn.Linear(64, 32)(nn.Embedding(100, 64)(torch.randint(0, 100, (4, 16))))",
])
def test_sampled_legal_rows_are_correct(expr):
    results = verify_rows(load_expr(expr), per_kernel=3, seed=3, targets=("sm_90a",),
                          where=without_clusters)
    assert results
    bad = [r for r in results if r.verdict != "ok"]
    assert not bad, bad


@pytest.mark.parametrize("fn", [lambda x: x[torch.arange(3) * 2 + 1],
                                lambda x: torch.index_select(x, 1, torch.arange(5, -1, -2)),
                                lambda x: nn.functional.embedding(torch.arange(4), x)])
def test_positions_an_iota_gives_are_an_index_map(check, fn):
    """x[arange(...)] reads known positions: an index map, no gather (positions out of range
    or wrapping stay a gather, as torch wraps them)."""
    program = check(fn, torch.randn(10, 6))
    assert not any(isinstance(d, Gather) for d in program.defs)
    assert any(isinstance(d, IndexMap) for d in program.defs)


def test_negative_iota_positions_stay_a_wrapped_gather(check):
    program = check(lambda x: x[torch.arange(4) - 2], torch.randn(10, 6))
    assert any(isinstance(d, Gather) for d in program.defs)


def test_a_gather_after_a_reduction_survives_place_cut():
    """PLACE=cut stores the argmax and recomputes what follows it in a second kernel: the
    gather's position is among what that kernel reads (found by bench/fuzz.py: it was not)."""
    from emmy.check import check_cuda_program
    from emmy.pipeline import Options

    w = load_expr("(lambda t: t.gather(1, t.argmax(1, keepdim=True)) * t)(torch.randn(16, 40))")
    row = "WORK=warp:1 TILE=v1x1 REDUCE=shuffle STAGE=direct PLACE=cut"
    stages = compile_to(w, "cuda", Options(rows={"": row}))
    report, failed = check_cuda_program(w, stages["torch"], stages["cuda"])
    assert report is not None and report.ok, failed and failed.log[-800:]


def test_an_index_the_model_itself_rejects_is_bad_input(capsys):
    """torch raises on an embedding index out of range: that is the input's fault (exit 2,
    torch's reason), not a traceback from the check's eager run."""
    from emmy.cli import main

    rc = main(["run", "--check", "-c", "nn.Embedding(10, 4)(torch.randint(0, 20, (3,)))"])
    err = capsys.readouterr().err
    assert rc == 2 and "fails on its inputs in eager PyTorch: IndexError" in err


def test_a_zero_dim_integer_tensor_indexes_as_a_gather(check):
    """`emb[t]` with t a 0-d integer tensor (RWKV's RNN mode reads its embedding so): export
    records item, then a select at it; both compile, a negative position counting from the
    end, along any dimension; on the emulator too."""
    def look(tokens, emb, x):
        return emb[tokens[1]], emb[tokens[2]] * 2, x[:, tokens[0]]

    args = (torch.tensor([3, -1, 5]), torch.randn(7, 4), torch.randn(2, 6, 3))
    check(look, *args)
    assert_emitted_cuda_matches_eager(
        "(lambda t, emb: emb[t[1]] + emb[t[0]])(torch.tensor([3, -1]), torch.randn(7, 4))")


def test_a_slice_at_a_tensor_s_value_gets_the_gather_that_keeps_its_shape():
    with pytest.raises(UserError, match=r"data-dependent shape.*x\[t \+ torch.arange\(n\)\]"):
        capture(Fn(lambda t, x: x[t[0]:t[0] + 2]), (torch.tensor([3, 1]), torch.randn(7, 4)))


def _window(pos, x):
    """ExecuTorch's llama reads its cache at `input_pos[0].item()`, with torch._check on it."""
    p = pos[0].item()
    torch._check(p >= 1)
    torch._check(p < 5)
    return x.narrow(1, p, 3), x[p + 1:p + 3] * 2, x[:, p - 1], x[max(p, 2):max(p, 2) + 2]


def test_a_slice_at_a_number_read_off_a_tensor_reads_its_window(check):
    """export records item, arithmetic on it (sym_add, sym_max), torch._check's assertions and
    a slice whose length simplifies to a constant: a gather of the window's positions, which
    the program reads when it runs (one program, every position torch._check allows)."""
    x = torch.randn(7, 8)
    program = check(_window, torch.tensor([2, 0]), x)
    graph = capture(Fn(_window), (torch.tensor([2, 0]), x))
    from emmy.tensor_ir.interp import run

    for p in range(1, 5):
        got = run(program, {g.name: v for g, v in zip(graph.inputs, (torch.tensor([p, 0]), x))})
        for g, w in zip(got, _window(torch.tensor([p, 0]), x)):
            assert_matches(g, w, f"position {p}")
    assert_emitted_cuda_matches_eager(
        "(lambda t, x: x.narrow(0, t[0].item(), 3) + x[t[1].item()])"
        "(torch.tensor([4, -2]), torch.randn(9, 5))")


def test_a_window_past_the_end_is_clamped_into_the_tensor():
    """Where torch would raise (the window reaches past the axis), the window starts earlier:
    every read stays inside the tensor."""
    from emmy.tensor_ir.interp import run

    x = torch.randn(6, 2)
    fn = Fn(lambda t, x: x.narrow(0, t[0].item(), 3))
    graph = capture(fn, (torch.tensor([1]), x))
    (got,) = run(lower(graph), dict(zip((p.name for p in graph.inputs), (torch.tensor([5]), x))))
    assert_matches(got, x[3:6], "clamped window")


def test_a_tensor_made_of_numbers_read_off_tensors(check):
    """FNO's grid `torch.tensor(torch.linspace(0, 1, 5).tolist())`, flow_viz's
    `torch.tensor(rad.max().item())` and `torch.full((3,), x.item())`: the numbers are 0-d
    tensors here, broadcast and cast (an internal error before)."""
    check(lambda x: (x + torch.tensor(torch.linspace(0, 1, 5).tolist()),
                     x / torch.tensor(x.abs().max().item()),
                     torch.full((3,), x[0, 1].item()) * 2),
          torch.randn(3, 5))


def test_python_arithmetic_on_numbers_read_off_tensors(check):
    """An optimizer's step read with `.item()`: a learning rate decayed by division, Adam's
    bias corrections (`1 - 0.9 ** step`, a square root by `** 0.5`: torch.export itself
    guards math.sqrt's argument), on a float and an integer step."""

    def step(x, t, n):
        s, k = t.item(), n.item()
        return (x * (0.1 / (1 + (s - 1) * 0.01)),
                x * (1 - 0.999 ** s) ** 0.5 / (1 - 0.9 ** s),
                x * (2.0 ** k) + k / 4)

    check(step, torch.randn(4, 8), torch.tensor(3.0), torch.tensor(5))
