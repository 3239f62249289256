"""Models that write their buffers (gpt-fast's KVCache.update, a step counter) or their inputs
(`x.sigmoid_()` on an argument): the new values are outputs of the program; `emmy run --check`
and the harness compare them with eager's (each reference run on a fresh copy of the model's
state and inputs), and a compiled model writes them back, so a decode loop carries its cache
from call to call as eager does."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import emmy
from emmy.bench.harness import check_program
from emmy.check import check_cuda_program
from emmy.frontend.workload import Workload
from emmy.pipeline import compile_to
from emmy.torch_ir.printer import print_graph

HEADS, MAX_LEN, HEAD_DIM = 2, 16, 8


class DecodeStep(nn.Module):
    """One decode step of attention over a static KV cache (gpt-fast's KVCache.update)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("k_cache", torch.zeros(1, HEADS, MAX_LEN, HEAD_DIM))
        self.register_buffer("v_cache", torch.zeros(1, HEADS, MAX_LEN, HEAD_DIM))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, q, k, v, input_pos):
        self.k_cache[:, :, input_pos] = k
        self.v_cache[:, :, input_pos] = v
        self.steps += 1
        mask = (torch.arange(MAX_LEN) <= input_pos.max())[None, :]
        return F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask)


def _step(pos: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    qkv = [torch.randn(1, HEADS, 2, HEAD_DIM, generator=g) for _ in range(3)]
    return (*qkv, torch.tensor([pos, pos + 1]))


def test_the_check_compares_the_written_buffers_too():
    model = DecodeStep().eval()
    w = Workload("decode", model, _step(3, 0), "", "<test>")
    stages = compile_to(w, "cuda")
    assert stages["torch"].updates == ("k_cache", "v_cache", "steps")
    report, failed = check_cuda_program(w, stages["torch"], stages["cuda"])
    assert report is not None, failed.log[-2000:]
    assert report.ok and len(report.outputs) == 4, report.outputs
    assert int(model.steps) == 0 and not model.k_cache.any()     # the model left as it was
    check = check_program(w, stages["torch"], stages["cuda"], device="cpu", seeds=(0, 1))
    assert check.verdict == "ok", check.reasons


def test_a_compiled_decode_loop_carries_its_cache_as_eager_does():
    model = DecodeStep().eval()
    eager = copy.deepcopy(model)
    compiled = emmy.compile(model, *_step(0, 0), run="emulate")
    for i in range(3):
        args = _step(2 * i, i + 1)
        torch.testing.assert_close(compiled(*args), eager(*args), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model.k_cache, eager.k_cache)
    assert int(model.steps) == int(eager.steps) == 3


@pytest.mark.parametrize("init, forward, shape, label", [
    ("self.register_buffer('total', torch.zeros(4))", "self.total += x\n        return "
     "self.total * 2", "4", "(buffer total): f32[4]"),
    ("pass", "return x.sigmoid_().sum()", "4, 4", "(input x): f32[4,4]"),
])
def test_emmy_run_check_names_the_buffers_and_inputs_it_compares(capsys, tmp_path, init,
                                                                  forward, shape, label):
    from emmy.cli import main

    path = tmp_path / "steps.py"
    path.write_text("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
                    f"    def __init__(self):\n        super().__init__()\n        {init}\n\n"
                    f"    def forward(self, x):\n        {forward}\n\n\n"
                    f"def get_inputs():\n    return [torch.randn({shape})]\n\n\n"
                    "def get_init_inputs():\n    return []\n")
    assert main(["run", str(path), "--check"]) == 0
    out = capsys.readouterr().out
    assert label in out and "PASS" in out


class Counter(nn.Module):
    """HF beam search's `cur_len`: an integer buffer of shape (1,) read as a position and
    incremented; one of shape (1,) is a range, which emmy otherwise reads as index arithmetic
    (a constant), so a written one must stay a buffer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.arange(10.0) * 10)
        self.register_buffer("cur_len", torch.tensor([2]))

    def forward(self, x, offset: int = 0):
        y = x + torch.gather(self.table, 0, self.cur_len) + offset
        self.cur_len += 1
        return y


def test_a_written_integer_buffer_is_read_anew_at_each_call():
    model = Counter()
    eager = copy.deepcopy(model)
    compiled = emmy.compile(model, torch.zeros(1), run="emulate")
    for _ in range(3):
        assert compiled(torch.zeros(1)).item() == eager(torch.zeros(1)).item()
    assert int(model.cur_len) == int(eager.cur_len) == 5
    model.cur_len.fill_(7)                          # a reset after compiling is seen
    assert compiled(torch.zeros(1)).item() == 70.0


def test_a_call_unlike_the_compiled_one_is_refused_by_name():
    import pytest

    from emmy.errors import UserError

    compiled = emmy.compile(Counter(), torch.zeros(1), 2, run="emulate")
    with pytest.raises(UserError, match="argument 1 was 2 when the model was compiled, now 3"):
        compiled(torch.zeros(1), 3)
    with pytest.raises(UserError, match=r"input `x`: f32\[2\], compiled for f32\[1\]"):
        compiled(torch.zeros(2), 2)


class NarrowCache(nn.Module):
    """ExecuTorch's llama KV cache: the step's keys copied into a narrow of the cache at
    `input_pos[0].item()` (with torch._check on it), a value written at that position, and
    attention over the positions written so far."""

    def __init__(self):
        super().__init__()
        self.register_buffer("k_cache", torch.zeros(1, MAX_LEN, HEAD_DIM))
        self.register_buffer("v_cache", torch.zeros(1, MAX_LEN, HEAD_DIM))

    def forward(self, q, k, v, input_pos):
        start = input_pos[0].item()
        torch._check(start >= 0)
        torch._check(start + k.shape[1] <= MAX_LEN)
        self.k_cache.narrow(1, start, k.shape[1]).copy_(k)
        self.v_cache[:, start:start + 2] = v
        mask = torch.arange(MAX_LEN) < start + k.shape[1]
        scores = (q @ self.k_cache.transpose(1, 2)).masked_fill(~mask, float("-inf"))
        return scores.softmax(-1) @ self.v_cache


def _narrow_step(pos: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return (*(torch.randn(1, 2, HEAD_DIM, generator=g) for _ in range(3)), torch.tensor([pos]))


def test_a_cache_written_at_a_number_read_off_a_tensor_is_written_where_it_says():
    model = NarrowCache().eval()
    w = Workload("narrow_cache", model, _narrow_step(5, 0), "", "<test>")
    stages = compile_to(w, "cuda")
    report, failed = check_cuda_program(w, stages["torch"], stages["cuda"])
    assert report is not None, failed.log[-2000:]
    assert report.ok and len(report.outputs) == 3, report.outputs
    eager = copy.deepcopy(model)
    compiled = emmy.compile(model, *_narrow_step(0, 0), run="emulate")
    for pos in (0, 2, 7, 4):            # one program for every position
        args = _narrow_step(pos, pos + 1)
        torch.testing.assert_close(compiled(*args), eager(*args), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model.k_cache, eager.k_cache)
    torch.testing.assert_close(model.v_cache, eager.v_cache)


class SelectCache(nn.Module):
    """A cache row written at `t.item()` through a view (`select(...).copy_`); `cache[:, p] = v`
    itself fails in torch.export, and the message shows the view that works."""

    def __init__(self, through_view: bool = True):
        super().__init__()
        self.through_view = through_view
        self.register_buffer("cache", torch.zeros(2, 9, 4))

    def forward(self, v, t):
        p = t.item()
        torch._check(p >= 0)
        torch._check(p < 9)
        if self.through_view:
            self.cache.select(1, p).copy_(v)
        else:
            self.cache[:, p] = v
        return self.cache.sum(1)


def test_a_row_written_at_a_number_read_off_a_tensor():
    import pytest

    from emmy.errors import UserError

    model = SelectCache()
    eager = copy.deepcopy(model)
    compiled = emmy.compile(model, torch.randn(2, 4), torch.tensor(0), run="emulate")
    for p in (3, 8, 0):
        args = (torch.randn(2, 4), torch.tensor(p))
        torch.testing.assert_close(compiled(*args), eager(*args))
    torch.testing.assert_close(model.cache, eager.cache)
    with pytest.raises(UserError, match=r"got SymInt\); .*`x.select\(1, p\).copy_\(v\)`"):
        emmy.compile(SelectCache(through_view=False), torch.randn(2, 4), torch.tensor(0),
                     run="emulate")


class MocoQueue(nn.Module):
    """MoCo's queue of keys: written at the pointer a buffer holds, read with `.item()`, and
    the pointer advanced modulo the queue's length."""

    def __init__(self):
        super().__init__()
        self.register_buffer("queue", torch.zeros(4, 12))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    def forward(self, keys):
        ptr = self.queue_ptr.item()
        self.queue[:, ptr:ptr + keys.shape[0]] = keys.T
        self.queue_ptr[0] = (ptr + keys.shape[0]) % 12
        return self.queue.sum(0)


def test_a_queue_written_at_a_pointer_its_buffer_holds():
    model = MocoQueue()
    eager = copy.deepcopy(model)
    compiled = emmy.compile(model, torch.randn(3, 4), run="emulate")
    for i in range(5):                   # around the queue and back to its start
        keys = torch.randn(3, 4, generator=torch.Generator().manual_seed(i))
        torch.testing.assert_close(compiled(keys), eager(keys))
    torch.testing.assert_close(model.queue, eager.queue)
    assert int(model.queue_ptr) == int(eager.queue_ptr) == 3


# ---------------------------------------------------------------------------------------------
# Model inputs written in place: written back into the caller's tensors


class FocalHeat(nn.Module):
    """CenterNet's `_sigmoid`: the heatmap logits clamped through `sigmoid_` on the argument."""

    def forward(self, heat, target):
        heat = torch.clamp(heat.sigmoid_(), min=1e-4, max=1 - 1e-4)
        return ((heat - target) ** 2).sum()


class ClampBoxes(nn.Module):
    """ultralytics' `clip_boxes`: each coordinate clamped in place; returns nothing of its own
    but the boxes themselves."""

    def forward(self, boxes, scale):
        boxes[..., 0].clamp_(0, 8)
        boxes[..., 1].clamp_(0, 6)
        boxes.mul_(scale)
        return boxes


class MaskedDecrement(nn.Module):
    """Rainbow's C51 projection on its argument: `x[x > 0] -= 1`, then read again."""

    def forward(self, x, y):
        x[x > 0] -= 1
        torch._foreach_mul_([x, y], 0.5)
        return x * 2 + y.sum()


def _inputs_written(model, *inputs):
    w = Workload(type(model).__name__.lower(), model, inputs, "", "<test>")
    stages = compile_to(w, "cuda")
    return w, stages


def test_an_input_written_in_place_is_an_update_of_that_input():
    _, stages = _inputs_written(FocalHeat(), torch.randn(2, 3, 4, 4), torch.rand(2, 3, 4, 4))
    graph = stages["torch"]
    assert graph.updates == ("input:0",) and graph.update_label("input:0") == "input heat"
    assert 'store("input:0", sigmoid)     # input heat' in print_graph(graph)


def test_the_check_compares_inputs_written_in_place_and_leaves_the_inputs_alone():
    for model, inputs in [(FocalHeat(), (torch.randn(2, 3, 4, 4), torch.rand(2, 3, 4, 4))),
                          (ClampBoxes(), (torch.randn(5, 4) * 8, torch.tensor(0.5))),
                          (MaskedDecrement(), (torch.randn(6, 4), torch.randn(3)))]:
        before = [x.clone() for x in inputs]
        w, stages = _inputs_written(model, *inputs)
        report, failed = check_cuda_program(w, stages["torch"], stages["cuda"])
        assert report is not None, failed.log[-2000:]
        assert report.ok, report.outputs
        assert len(report.outputs) == len(stages["torch"].outputs)
        for x, y in zip(inputs, before):        # each reference ran on copies
            assert torch.equal(x, y)
        check = check_program(w, stages["torch"], stages["cuda"], device="cpu", seeds=(0, 1))
        assert check.verdict == "ok", check.reasons


def test_a_compiled_model_writes_the_caller_s_tensors_as_eager_does():
    model = MaskedDecrement()
    compiled = emmy.compile(model, torch.randn(6, 4), torch.randn(3), run="emulate")
    assert compiled.graph.updates == ("input:0", "input:1")
    for seed in range(2):
        g = torch.Generator().manual_seed(seed)
        x, y = torch.randn(6, 4, generator=g), torch.randn(3, generator=g)
        xe, ye = x.clone(), y.clone()
        out = compiled(x, y)
        torch.testing.assert_close(out, model(xe, ye))
        torch.testing.assert_close(x, xe)
        torch.testing.assert_close(y, ye)


def test_a_model_returning_its_argument_written_in_place_returns_the_new_values():
    compiled = emmy.compile(ClampBoxes(), torch.randn(5, 4) * 8, torch.tensor(0.5),
                            run="emulate")
    boxes = torch.randn(5, 4) * 8
    expected = ClampBoxes()(boxes.clone(), torch.tensor(0.5))
    out = compiled(boxes, torch.tensor(0.5))
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(boxes, expected)


# ---------------------------------------------------------------------------------------------
# Running statistics a norm updates without its op saying so


class FunctionalBatchNorm(nn.Module):
    """F.batch_norm(..., training=True) on buffers (FixMatch's functional BN, functional_call
    style): aten's batch_norm writes the running statistics in place, which its schema does
    not say; the model reads the running mean afterwards."""

    def __init__(self):
        super().__init__()
        self.register_buffer("running_mean", torch.zeros(8))
        self.register_buffer("running_var", torch.ones(8))

    def forward(self, x):
        y = F.batch_norm(x, self.running_mean, self.running_var, None, None, True, 0.1, 1e-5)
        return y, self.running_mean * 2


class StatsAsInputs(nn.Module):
    def forward(self, x, mean, var):
        return F.batch_norm(x, mean, var, None, None, True, 0.1, 1e-5)


class TrackedInstanceNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.InstanceNorm1d(8, affine=True, track_running_stats=True)

    def forward(self, x):
        return self.norm(x)


def test_running_statistics_a_norm_updates_are_written_back():
    cases = [(FunctionalBatchNorm(), (torch.randn(4, 8, 5, 5) + 1,), ("running_mean",
                                                                    "running_var")),
             (StatsAsInputs(), (torch.randn(4, 8, 5), torch.zeros(8), torch.ones(8)),
              ("input:1", "input:2")),
             (TrackedInstanceNorm().train(), (torch.randn(4, 8, 20) * 2 + 1,),
              ("norm.running_mean", "norm.running_var"))]
    for model, inputs, updates in cases:
        w, stages = _inputs_written(model, *inputs)
        assert stages["torch"].updates == updates
        report, failed = check_cuda_program(w, stages["torch"], stages["cuda"])
        assert report is not None, failed.log[-2000:]
        assert report.ok and len(report.outputs) == len(stages["torch"].outputs), report.outputs
    model = TrackedInstanceNorm().train()
    eager = copy.deepcopy(model)
    compiled = emmy.compile(model, torch.randn(4, 8, 20), run="emulate")
    for seed in range(2):
        x = torch.randn(4, 8, 20, generator=torch.Generator().manual_seed(seed)) + seed
        torch.testing.assert_close(compiled(x), eager(x).detach())
    torch.testing.assert_close(model.norm.running_mean, eager.norm.running_mean)
    torch.testing.assert_close(model.norm.running_var, eager.norm.running_var)
