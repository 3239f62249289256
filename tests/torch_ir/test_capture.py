"""torch.export capture into Torch IR: a 1:1 mirror, parameters as load(...), clear failures."""

import functools
import textwrap

import pytest
import torch
import torch.nn as nn

from emmy.errors import UserError
from emmy.frontend.workload import load_expr, load_file
from emmy.torch_ir.capture import capture
from emmy.torch_ir.ir import InputKind
from emmy.torch_ir.printer import print_graph


def test_rmsnorm_is_one_op_and_its_weight_a_load():
    w = load_expr("nn.RMSNorm(2048)(torch.randn(32, 2048))")
    g = capture(w.model, w.inputs, name=w.name)
    assert [n.op for n in g.nodes] == ["rms_norm"]
    text = print_graph(g)
    assert 'weight = load("weight") : f32[2048]' in text
    assert "rms_norm = rms_norm(x, [2048], weight) : f32[32,2048]" in text
    assert g.values["weight"].shape == (2048,)


def test_printout_is_deterministic():
    w = load_expr("nn.Linear(3, 2)(torch.randn(4, 3))")
    assert print_graph(capture(w.model, w.inputs)) == print_graph(capture(w.model, w.inputs))


def test_buffers_and_multiple_outputs():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("shift", torch.ones(4))

        def forward(self, x):
            y = x + self.shift
            return y.max(dim=1), y

    g = capture(M(), (torch.randn(2, 4),))
    kinds = {p.name: p.kind for p in g.placeholders}
    assert kinds["shift"] is InputKind.BUFFER
    assert len(g.outputs) == 3  # values, indices, y


def test_source_line_points_into_the_workload_file(tmp_path):
    path = tmp_path / "w.py"
    path.write_text(textwrap.dedent("""
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def forward(self, x):
                return torch.exp(-x)

        def get_inputs():
            return [torch.randn(4, 4)]

        def get_init_inputs():
            return []
    """))
    w = load_file(path)
    g = capture(w.model, w.inputs, origin=str(path))
    assert g.nodes[-1].source == "w.py:7: return torch.exp(-x)"


def test_data_dependent_shape_is_a_user_error():
    class M(nn.Module):
        def forward(self, x):
            return x[x > 0]

    with pytest.raises(UserError, match="data-dependent"):
        capture(M(), (torch.randn(8),))


def test_export_failure_is_a_user_error():
    class M(nn.Module):
        def forward(self, x):
            return x.numpy()

    with pytest.raises(UserError, match="torch.export failed"):
        capture(M(), (torch.randn(8),))


def test_non_tensor_output_is_refused():
    class M(nn.Module):
        def forward(self, x):
            return x.shape[0]

    with pytest.raises(UserError):
        capture(M(), (torch.randn(8),))


def test_a_none_among_the_outputs_is_named():
    """Optical-flow nets return `(flow, None)` in eval: the message names the position."""
    class M(nn.Module):
        def forward(self, x):
            return x * 2, None

    with pytest.raises(UserError, match=r"its output 1 is None, not a tensor.*drop a `None`"):
        capture(M(), (torch.randn(8),))


def test_in_place_ops_on_intermediates_become_their_functional_twins():
    """nn.ReLU(inplace=True) after a layer, `y.add_(x)`: nothing reads the overwritten tensor
    again, so the functional op computes the same value."""
    from emmy.tensor_ir.interp import run
    from emmy.tensor_ir.lower import lower

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True))

        def forward(self, x):
            y = self.body(x)
            return y.add_(x).mul_(2.0)

    model, x = M().eval(), torch.randn(4, 8)
    g = capture(model, (x,))
    ops = [n.op for n in g.nodes]
    assert "relu" in ops and "add.Tensor" in ops and "mul.Tensor" in ops
    assert not any(op.split(".")[0].endswith("_") for op in ops)
    (got,) = run(lower(g), {"x": x} | dict(g.values))
    torch.testing.assert_close(torch.from_numpy(got), model(x).detach())


def test_in_place_ops_read_through_their_result_are_functional():
    """torch.export points later reads of an overwritten tensor at the in-place op's result."""
    from emmy.tensor_ir.interp import run
    from emmy.tensor_ir.lower import lower

    class ReadAgain(nn.Module):
        def forward(self, x):
            y = x * 2
            z = y.relu_()
            return z + y      # y is z here

    x = torch.randn(8)
    g = capture(ReadAgain(), (x,))
    (got,) = run(lower(g), {"x": x})
    torch.testing.assert_close(torch.from_numpy(got), ReadAgain()(x))


class _ViewReadAfter(nn.Module):
    def forward(self, x):
        y = x * 2
        v = y[0:2]
        y.relu_()
        return v + 1          # v shares y's memory: it sees the relu


class _BaseReadAfter(nn.Module):
    def forward(self, x):
        y = x * 2
        y[0:2].relu_()
        return y              # y sees the relu of its first two elements


class _SliceAssign(nn.Module):
    def forward(self, x):
        y = torch.zeros_like(x)
        y[1:] = x[:-1]            # copy_ into a view of y, then y read whole
        y[0] += 1
        return y


class _OnInput(nn.Module):
    def forward(self, x):
        return x.relu_()


class _OnBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(8))

    def forward(self, x):
        self.cache[2:4] = x[:2]
        return self.cache + x


class _RegionOnClone(nn.Module):
    """SmoothQuant's fake_quant: a clone quantized in place under `@torch.no_grad()`."""

    @staticmethod
    @torch.no_grad()
    def quantize(t):
        scale = t.abs().amax(-1, keepdim=True).clamp(min=1e-5) / 127
        t.div_(scale).round_().mul_(scale)
        return t

    def forward(self, x):
        return self.quantize(x.clone()) * 2


class _RegionViewReadAfter(nn.Module):
    def forward(self, x):
        t = x * 2
        v = t[:2]                 # taken before the region: it sees the region's write
        with torch.no_grad():
            t.mul_(3.0)
        return t[:2] + v


class _RegionOnInput(nn.Module):
    def forward(self, x):
        with torch.no_grad():
            x.mul_(2.0)
        return x + 1


class _InPlacePowers(nn.Module):
    """PyG's gcn_norm: `deg.pow_(-0.5)` (aten pow_.Scalar: a tensor to a number's power, whose
    out-of-place twin is pow.Tensor_Scalar), `**=`, and a tensor exponent."""

    def forward(self, x, e):
        d = x.abs() + 1
        d.pow_(-0.5)
        y = x * 2
        y **= 2
        z = x.abs() + 1
        z.pow_(e)
        return d, y, z


class _InPlaceBits(nn.Module):
    """HashNeRF's `xor_result ^= coords[..., i] * primes[i]` and the other in-place operators
    (aten's __ixor__, __ior__, ...: their twins are __xor__, __or__, ...)."""

    def forward(self, x):
        r = torch.zeros_like(x)
        r ^= x * 3
        r |= 5
        r <<= 2
        r &= x + 7
        return r


class _NormAfterWrite(nn.Module):
    """PointNet++'s `centroids[:, i] = farthest` next to a BatchNorm: the write makes torch
    functionalize the program, which leaves batch norm as _native_batch_norm_legit_no_training."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(8).eval()
        self.bn.running_mean.uniform_(-1, 1)
        self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        c = torch.zeros(4)
        c[0] = 1.0
        return c, self.bn(x)


def _args(model):
    if isinstance(model, _InPlacePowers):
        return torch.randn(4, 8), torch.rand(4, 8) * 2
    if isinstance(model, _InPlaceBits):
        return (torch.arange(32, dtype=torch.int32).reshape(4, 8) * 2654435,)
    return (torch.randn(4, 8),)


@pytest.mark.parametrize("model", [_RegionOnClone(), _RegionViewReadAfter(), _InPlacePowers(),
                                   _InPlaceBits(), _NormAfterWrite()])
def test_in_place_ops_in_regions_and_with_renamed_twins_compute_as_eager(model):
    from emmy.tensor_ir.interp import run
    from emmy.tensor_ir.lower import lower

    args = _args(model)
    g = capture(model, args)
    got = run(lower(g), {p.name: a for p, a in zip(g.inputs, args)})
    for out, want in zip(got, (lambda r: r if isinstance(r, tuple) else (r,))(model(*args))):
        torch.testing.assert_close(torch.from_numpy(out), want)


def test_an_in_place_write_into_an_input_inside_a_region_updates_the_input():
    g = capture(_RegionOnInput(), (torch.randn(4, 8),))
    assert [n.op for n in g.nodes] == ["mul.Tensor", "add.Tensor"]
    assert g.updates == ("input:0",) and g.outputs[1].name == "mul"


@pytest.mark.parametrize("model", [_ViewReadAfter(), _BaseReadAfter(), _SliceAssign()])
def test_in_place_ops_whose_memory_is_read_elsewhere_are_functionalized(model):
    """Something else reads the memory written (a view, its base): torch functionalizes the
    program (slice_scatter and friends) and the mirror is of that."""
    from emmy.tensor_ir.interp import run
    from emmy.tensor_ir.lower import lower

    x = torch.randn(8)
    g = capture(model, (x,))
    assert not any(n.op.split(".")[0].endswith("_") for n in g.nodes)
    (got,) = run(lower(g), {"x": x})
    torch.testing.assert_close(torch.from_numpy(got), model(x.clone()))


class _OnParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(8))

    def forward(self, x):
        with torch.no_grad():
            self.w.mul_(2)
        return self.w * x


def test_in_place_writes_into_parameters_are_refused():
    with pytest.raises(UserError, match="writes into a parameter"):
        capture(_OnParameter(), (torch.randn(8),))


def test_an_input_written_in_place_and_returned_is_an_output_and_an_update():
    g = capture(_OnInput(), (torch.randn(8),))
    assert g.updates == ("input:0",)
    assert [n.op for n in g.nodes] == ["relu"] and len(g.outputs) == 2


def test_a_buffer_the_model_writes_is_an_output_written_back():
    """`self.cache[2:4] = x[:2]` (a KV cache's update): the buffer's new value is an output
    after those the model returns, named by the buffer's path, and the program computes it."""
    from emmy.tensor_ir.interp import run
    from emmy.tensor_ir.lower import lower

    model, x = _OnBuffer(), torch.randn(8)
    g = capture(model, (x,))
    assert g.updates == ("cache",) and len(g.outputs) == 2 and len(g.returned) == 1
    assert 'store("cache", ' in print_graph(g)
    got = run(lower(g), {"x": x, "cache": torch.zeros(8)})
    want_out = model(x)                             # eager writes its own buffer
    torch.testing.assert_close(torch.from_numpy(got[0]), want_out)
    torch.testing.assert_close(torch.from_numpy(got[1]), model.cache)


def test_parameters_of_a_top_level_sequential_get_c_names():
    """`0.weight` becomes `p0_weight`: the CUDA kernels take parameters by these names."""
    g = capture(nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)), (torch.randn(2, 4),))
    names = [p.name for p in g.placeholders if p.kind is InputKind.PARAM]
    assert names == ["p0_weight", "p0_bias", "p2_weight", "p2_bias"]
    assert all(n.isidentifier() for n in names)


class _NoGradRotary(nn.Module):
    """Hugging Face's rotary embedding: `@torch.no_grad()` on the forward, autocast turned off
    around the float32 part, a `with torch.no_grad():` block nested in it."""

    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8)))

    @torch.no_grad()
    def forward(self, x, position_ids):
        freqs_shape = (position_ids.shape[0], -1, 1)
        inv = self.inv_freq[None, :, None].float().expand(freqs_shape)
        with torch.autocast(device_type="cpu", enabled=False):
            freqs = (inv @ position_ids[:, None, :].float()).transpose(1, 2)
            with torch.set_grad_enabled(False):
                emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos(), emb.sin()
        return cos.to(x.dtype), sin.to(x.dtype)


def test_grad_and_autocast_off_regions_are_inlined():
    from emmy.tensor_ir.interp import run
    from emmy.tensor_ir.lower import lower

    model = _NoGradRotary().eval()
    x, pos = torch.randn(2, 5, 8).half(), torch.arange(5).expand(2, 5)
    g = capture(model, (x, pos))
    ops = [n.op for n in g.nodes]
    assert not any("wrap" in op for op in ops) and "cat" in ops and "cos" in ops
    assert any(n.name.startswith("no_grad_") and ".autocast_off_" in n.name   # nested
               for n in g.nodes)
    got = run(lower(g), {"x": x, "position_ids": pos})
    for out, want in zip(got, model(x, pos)):
        assert torch.equal(torch.from_numpy(out).half(), want)


def test_an_autocast_region_that_is_on_is_refused_with_its_line():
    class Cast(nn.Module):
        def forward(self, x):
            with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                return x @ x

    with pytest.raises(UserError, match="autocast region at .*return x @ x.*cast the model"):
        capture(Cast(), (torch.randn(4, 4),))


def test_a_data_dependent_branch_is_refused_in_one_line(capsys):
    """torch prints the partly traced graph on its way to the error; only the message shows,
    with the line that branches."""
    class Branch(nn.Module):
        def forward(self, x):
            mask = torch.triu(x.new_ones((8, 8), dtype=torch.bool), diagonal=1)
            if torch.sum(mask).item():
                x = x.masked_fill(mask, 0.0)
            return x

    with pytest.raises(UserError, match="data-dependent shape or control flow") as info:
        capture(Branch(), (torch.randn(8, 8),))
    assert "at test_capture.py:" in str(info.value)            # the user's line, named
    assert "::" not in str(info.value)                          # a line's colon, not two
    assert str(info.value).endswith("pick one with `torch.where(cond, a, b)`")
    out, err = capsys.readouterr()
    assert out == "" and err == ""



def test_a_forward_that_keeps_state_on_the_module_leaves_it_as_it_was():
    """RevIN keeps its statistics on the module in forward: export must not leave its fake
    tensors there (a later copy or run of the model could not read them)."""
    import copy

    class RevIN(nn.Module):
        def forward(self, x):
            self.mean = x.mean(1, keepdim=True).detach()
            return x - self.mean

    model = RevIN()
    capture(model, (torch.randn(2, 8),))
    assert not hasattr(model, "mean")

    class Grid(nn.Module):           # YOLOv5's Detect caches its grids in a list
        def __init__(self):
            super().__init__()
            self.grid = [torch.empty(0)]
            self.cache = {"steps": [torch.empty(0)]}

        def forward(self, x):
            if self.grid[0].shape != x.shape:
                self.grid[0] = torch.arange(x.shape[0], dtype=x.dtype)
                self.cache["steps"][0] = self.grid[0] * 2
            return x + self.grid[0] + self.cache["steps"][0]

    grid = Grid()
    capture(grid, (torch.randn(8),))
    assert grid.grid[0].shape == (0,) and grid.cache["steps"][0].shape == (0,)
    assert torch.equal(grid(torch.zeros(8)), torch.arange(8.0) * 3)
    copy.deepcopy(model)
    model(torch.randn(2, 8))
    capture(model, (torch.randn(2, 8),))
    assert type(model.mean) is torch.Tensor and model.mean.shape == (2, 1)


_GRIDS: dict = {}


@functools.lru_cache(maxsize=4)
def _base_grid(n: int):
    return torch.linspace(-1.0, 1.0, n)


class _Backwarp(nn.Module):
    """sniklaus' PWC-Net keeps its sampling grids in a module-level dict, filled in forward;
    warping code memoizes them with lru_cache as often."""

    def forward(self, x):
        key = str(x.shape)
        if key not in _GRIDS:
            _GRIDS[key] = torch.linspace(-1.0, 1.0, x.shape[-1]).view(1, -1)
        return x + _GRIDS[key] + _base_grid(x.shape[-1])


def test_a_forward_that_caches_in_its_source_file_leaves_the_caches_as_they_were():
    _base_grid(5)                          # remembered before: forgotten, as the cache cannot
    model = _Backwarp()                    # take out export's entry alone
    capture(model, (torch.randn(2, 8),))
    assert _GRIDS == {} and _base_grid.cache_info().currsize == 0
    out = model(torch.zeros(2, 8))          # eager fills them with real tensors
    assert torch.equal(out, 2 * torch.linspace(-1.0, 1.0, 8).expand(2, 8))
    capture(model, (torch.randn(2, 8),))    # and export reads those
    assert type(_GRIDS["torch.Size([2, 8])"]) is torch.Tensor
    assert _base_grid.cache_info().currsize == 1


def test_ops_writing_into_out_compute_as_eager():
    """torch.optim's amsgrad writes `torch.maximum(m, v, out=m)`, spectral_norm's power step
    `F.normalize(..., out=self._u)` (a buffer: written back); into a parameter it is refused."""
    from emmy.tensor_ir.interp import run
    from emmy.tensor_ir.lower import lower

    class Amsgrad(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("u", torch.zeros(6))
            self.w = nn.Parameter(torch.randn(6))

        def forward(self, m, v):
            m = m.clone()
            torch.maximum(m, v, out=m)
            torch.nn.functional.normalize(v[0] * 2, dim=0, out=self.u)
            return m.sqrt() + self.u

    m, v = torch.rand(4, 6), torch.rand(4, 6)
    g = capture(Amsgrad(), (m, v))
    assert g.updates == ("u",)
    got = run(lower(g), {p.name: t.numpy() for p, t in zip(g.inputs, (m, v))})
    model = Amsgrad()
    torch.testing.assert_close(torch.from_numpy(got[0]), model(m, v))
    torch.testing.assert_close(torch.from_numpy(got[1]), model.u)

    class IntoParameter(Amsgrad):
        def forward(self, m, v):
            with torch.no_grad():
                torch.maximum(self.w, v[0], out=self.w)
            return m * self.w

    with pytest.raises(UserError, match="writes into its parameter `w`"):
        capture(IntoParameter(), (m, v))


def test_torch_tensor_with_its_data_by_keyword_exports():
    """sniklaus' PWC-Net writes `torch.tensor(data=[...], dtype=..., device=...)`, on which
    export fails with an IndexError of its own; torch.tensor is itself again afterwards."""
    import numpy as np

    from emmy.tensor_ir.interp import run
    from emmy.tensor_ir.lower import lower

    class Normalize(nn.Module):
        def forward(self, x):
            mean = torch.tensor(data=[0.485, 0.456, 0.406], dtype=x.dtype, device=x.device)
            return x - mean.view(1, 3, 1, 1)

    real = torch.tensor
    x = torch.randn(2, 3, 4, 4)
    g = capture(Normalize(), (x,))
    assert torch.tensor is real
    (got,) = run(lower(g), {"x": x.numpy()})
    np.testing.assert_allclose(got, Normalize()(x).numpy(), rtol=1e-6)


def test_distributions_argument_checks_do_not_stop_export():
    """`Normal(loc, scale)` checks its arguments (a data-dependent branch) by default; export
    runs without the checks, and the default is as it was afterwards."""
    from torch.distributions import Categorical, Distribution, Normal, StudentT

    class Likelihoods(nn.Module):
        def forward(self, mu, sigma, logits, y):
            return (Normal(mu, sigma).log_prob(y), StudentT(3.0, mu, sigma).log_prob(y),
                    Categorical(logits=logits).entropy())

    before = Distribution._validate_args
    g = capture(Likelihoods(), (torch.randn(4), torch.rand(4) + 0.5, torch.randn(4, 3),
                                torch.randn(4)))
    assert len(g.outputs) == 3 and Distribution._validate_args == before


@pytest.mark.parametrize("var_shape, full, reduction", [
    ((4, 3), False, "mean"), ((4,), True, "sum"), ((4, 1), False, "none")])
def test_gaussian_nll_loss_exports_without_its_variance_check(var_shape, full, reduction):
    """F.gaussian_nll_loss raises where a variance is negative (a data-dependent branch):
    export runs torch's formula without it (the eager check still raises); heteroscedastic
    and per-row variances, `full`, every reduction; on the emulator against eager."""
    import torch.nn.functional as F

    from emmy.frontend.workload import Workload
    from tests.tensor_ir.emitted import assert_workload_cuda_matches_eager

    loss = nn.GaussianNLLLoss(full=full, reduction=reduction)
    inputs = (torch.randn(4, 3), torch.randn(4, 3), torch.rand(*var_shape) + 0.1)
    assert_workload_cuda_matches_eager(Workload("nll", loss, inputs, "", "<test>"))
    assert F.gaussian_nll_loss.__module__ == "torch.nn.functional"


def test_an_in_place_op_after_a_type_change_is_on_a_copy():
    """`x = x.to(torch.float)` of a bf16 input is a new tensor: `x.div_(t)` writes into it, not
    into the input (vLLM's sampler)."""
    class Sampler(nn.Module):
        def forward(self, logits, t):
            logits = logits.to(torch.float)
            logits.div_(t.unsqueeze(1))
            return logits

    g = capture(Sampler(), (torch.randn(3, 8).bfloat16(), torch.rand(3) + 0.5))
    assert "div.Tensor" in [n.op for n in g.nodes]

    class Same(nn.Module):          # the same type: `to` returns the input itself
        def forward(self, logits, t):
            logits = logits.to(torch.float)
            logits.div_(t.unsqueeze(1))
            return logits

    g = capture(Same(), (torch.randn(3, 8), torch.rand(3) + 0.5))   # written back
    assert g.updates == ("input:0",)


def test_an_input_reshaped_in_place_is_named_with_its_line():
    """torch.export fails with an IndexError of its own on `min_p.unsqueeze_(1)`; the message
    says what the model did, and where."""
    class MinP(nn.Module):
        def forward(self, probs, min_p):
            return probs * min_p.unsqueeze_(dim=1)

    with pytest.raises(UserError, match=r"in-place `unsqueeze_` at test_capture.py:\d+: "
                                        r"return probs \* min_p.unsqueeze_\(dim=1\) reshapes a "
                                        "model input"):
        capture(MinP(), (torch.rand(3, 8), torch.rand(3)), origin=__file__)


def test_vmap_is_named_as_such():
    """flex_attention builds its block mask with torch.vmap: the refusal names vmap, not
    torch's internal batching helpers."""
    from emmy.torch_ir.capture import op_name

    from torch._functorch import predispatch

    assert op_name(predispatch._add_batch_dim) == "torch.vmap"


def test_inputs_named_as_the_kernels_own_locals_are_renamed():
    """An input named `e`, `v0`, `a0`, `lane` or `int` would be hidden inside a kernel by the
    local of that name (the element index, a value, a loop variable, the lane, a C++ type): it
    is named `u_e`, ... and the emitted CUDA compiles and agrees with eager."""
    from emmy.frontend.workload import Workload
    from tests.tensor_ir.emitted import assert_workload_cuda_matches_eager

    class Names(nn.Module):
        def forward(self, e, v0, a0, lane, x):
            return (e * 2 + v0 + a0 + lane).sum(-1) + x.sum()

    inputs = tuple(torch.randn(8, 64) for _ in range(5))
    g = capture(Names(), inputs)
    assert [p.name for p in g.placeholders] == ["u_e", "u_v0", "u_a0", "u_lane", "x"]
    assert_workload_cuda_matches_eager(Workload("names", Names(), inputs, source="",
                                                origin="<test>"))


def test_a_selection_whose_size_a_reshape_asserts_says_so():
    """pytorch3d's `candidates[one_hot(argmax) > 0.5, :]`, reshaped to one row per input: export
    asserts the count at run time; the refusal names the variable size, not a bare (64, 4)."""
    import torch.nn.functional as F

    class Pick(nn.Module):
        def forward(self, c, q):
            return c[F.one_hot(q.argmax(dim=-1), num_classes=4) > 0.5, :].reshape(8, 4)

    with pytest.raises(UserError, match=r"data-dependent shape \(8, 4, asserted only when it "
                                        r"runs\)"):
        capture(Pick(), (torch.randn(8, 4, 4), torch.randn(8, 4)))

    class Select(nn.Module):
        def forward(self, x):
            return x[x > 0]

    with pytest.raises(UserError, match=r"data-dependent shape \(u0\).*torch.where\(mask"):
        capture(Select(), (torch.randn(8),))


def test_a_data_dependent_count_or_split_gets_the_static_way_to_write_it():
    """PyG's degree by `bincount(dst, minlength=n)` and torchrec's split by `.tolist()` sizes:
    the hint is for them, not the boolean mask's."""
    class Degree(nn.Module):
        def forward(self, x, dst):
            return x / torch.bincount(dst, minlength=x.size(0)).clamp(min=1).unsqueeze(-1)

    with pytest.raises(UserError, match=r"`bincount` at .*scatter_add_\(0, idx"):
        capture(Degree(), (torch.randn(6, 3), torch.tensor([0, 2, 2, 5])))

    class Split(nn.Module):
        def forward(self, values, lengths):
            a, b = values.split(lengths.view(2, -1).sum(1).tolist())
            return a.sum() + b.sum()

    with pytest.raises(UserError, match=r"`split_with_sizes` at .*give them as Python numbers"):
        capture(Split(), (torch.randn(10), torch.tensor([2, 3, 1, 4])))


def test_a_write_at_a_zero_dim_tensor_s_position_gets_the_one_element_index():
    """vLLM's `self.output_tokens[:, self.step] = t` (a 0-d step buffer): export cannot make
    the position an integer; the message shows the write that works."""
    class Step(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("tokens", torch.zeros(2, 8, dtype=torch.long))
            self.register_buffer("step", torch.tensor(3))

        def forward(self, t):
            self.tokens[:, self.step] = t
            return self.tokens * 1

    with pytest.raises(UserError, match=r"one-element tensor: `x\[:, t.view\(1\)\] = v`"):
        capture(Step(), (torch.tensor([5, 7]),))


def test_a_python_int_of_the_data_gets_the_way_to_read_it_when_the_program_runs():
    """MoCo's `ptr = int(self.queue_ptr)` and `F.one_hot(target)` without num_classes: export
    needs the data as a Python number; each message shows what to write instead."""
    class Queue(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("queue", torch.zeros(4, 12))
            self.register_buffer("ptr", torch.zeros(1, dtype=torch.long))

        def forward(self, keys):
            ptr = int(self.ptr)
            self.queue[:, ptr:ptr + keys.shape[0]] = keys.T
            return self.queue.sum(0)

    with pytest.raises(UserError, match=r"`int\(t\)` makes .*`t.item\(\)` is read when"):
        capture(Queue(), (torch.randn(3, 4),))
    class OneHot(nn.Module):
        def forward(self, t):
            return torch.nn.functional.one_hot(t).float()

    with pytest.raises(UserError, match="give num_classes"):
        capture(OneHot(), (torch.tensor([0, 2, 1]),))


def test_a_read_of_data_is_named_with_its_line_and_the_way_around_it():
    """Lovasz's `perm = perm.data`: torch.export fails on a fake tensor among its constants,
    without a line; the message names the line and `.detach()`."""
    class Data(nn.Module):
        def forward(self, x):
            v, perm = torch.sort(x, descending=True)
            perm = perm.data
            return x[perm] + v

    with pytest.raises(UserError, match=r"at test_capture.py:\d+: perm = perm.data: .*"
                                        r"`.detach\(\)` reads the same values"):
        capture(Data(), (torch.randn(9),), origin=__file__)


def test_python_s_max_of_a_number_read_off_a_tensor_gets_the_clamp_hint():
    """FCOS's normalizer `max(total_num_pos.item() / num_gpus, 1.0)` branches on the number;
    the message shows the tensor op, and the rewrite it shows compiles."""
    class Normalizer(nn.Module):
        def __init__(self, rewritten: bool):
            super().__init__()
            self.rewritten = rewritten

        def forward(self, loss, labels):
            count = (labels > 0).sum()
            n = torch.clamp(count / 1.0, min=1.0) if self.rewritten else \
                max(count.item() / 1.0, 1.0)
            return loss.sum() / n

    inputs = (torch.randn(6), torch.tensor([0, 2, 0, 1, 0, 3]))
    with pytest.raises(UserError, match=r"Python's max or min .*`torch.clamp\(t, min=...\)`"):
        capture(Normalizer(False), inputs, origin=__file__)
    capture(Normalizer(True), inputs)


def test_values_moved_to_numpy_get_the_hint_to_keep_them_a_tensor():
    """TimesNet's periods `top.detach().cpu().numpy()`: torch's error says only that numpy is
    not supported; the message says to keep the values a tensor."""
    class Periods(nn.Module):
        def forward(self, x):
            top = torch.topk(x.abs(), 2).indices.detach().cpu().numpy()
            return x[:, int(top[0, 0]):]

    with pytest.raises(UserError, match=r"moved to numpy .* keep them a tensor"):
        capture(Periods(), (torch.randn(3, 8),))


class SplineEdges(nn.Module):
    """nflows' rational-quadratic spline: a write into a padded tensor's slice (functionalized
    by torch) beside masked updates (rewritten by emmy before mirroring, in place)."""

    def forward(self, inputs, ud):
        ud = torch.nn.functional.pad(ud, pad=(1, 1))
        ud[..., 0] = 0.5
        inside = (inputs >= -1.0) & (inputs <= 1.0)
        outputs = torch.zeros_like(inputs)
        outputs[~inside] = inputs[~inside]
        outputs[inside] = inputs[inside] * 2.0
        return outputs, ud


def test_a_program_emmy_rewrote_is_functionalized_from_a_fresh_export():
    """Functionalizing the program emmy's own rewrites had edited failed in torch ("could not
    rewrite the program without writes"); a fresh export functionalizes."""
    from emmy.frontend.workload import Workload
    from tests.tensor_ir.emitted import assert_workload_cuda_matches_eager

    inputs = (torch.randn(16, 4) * 2, torch.randn(16, 4, 5))
    capture(SplineEdges(), inputs)
    assert_workload_cuda_matches_eager(Workload("spline", SplineEdges(), inputs, "", "<test>"))
