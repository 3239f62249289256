"""One test per user mistake: each gets a clear message and exit code 2, never a traceback."""

import subprocess
import sys
import textwrap

import pytest

from emmy.cli import main

RMS_FILE = "examples/rmsnorm.py"


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out, err


def test_unsupported_op_names_the_op_and_the_line(tmp_path, capsys):
    path = tmp_path / "histogram.py"
    path.write_text(textwrap.dedent("""
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def forward(self, x):
                return torch.histogram(x, bins=4)[0]

        def get_inputs():
            return [torch.randn(4, 8)]

        def get_init_inputs():
            return []
    """))
    rc, _, err = run(capsys, "compile", str(path), "--ir", "tensor")
    assert rc == 2
    assert "unsupported op `histogram" in err and "histogram.py:7" in err and "emmy ops" in err


@pytest.mark.parametrize("expr, message", [
    ("torch.topk(torch.randn(2, 5000).double(), 4097)", "unsupported op `topk` at <expr>:2: "
     "return torch.topk(x, 4097): topk with k=4097 of 5000 elements of 64-bit f64 along a "
     "dimension: emmy sorts rows past 4096 elements by merging keys of at most 32 bits"),
    ("torch.mode(torch.randint(0, 9, (2, 5000)))", "unsupported op `mode` at <expr>:2: return "
     "torch.mode(x): the mode of 5000 elements of 64-bit i64 along a dimension: emmy sorts "
     "rows past 4096 elements by merging keys of at most 32 bits"),
    ("torch.topk(torch.randn(4, 8), 9)", "RuntimeError: k not in range for dimension"),
])
def test_topk_past_its_limit_or_the_row_says_so(capsys, expr, message):
    rc, _, err = run(capsys, "compile", "-c", expr, "--ir", "tensor")
    assert rc == 2 and message in err


@pytest.mark.parametrize("expr, message", [
    # a cast inside the forward: an op's argument, not an input (it was an internal error)
    ("(torch.randn(4, 8) * 2).to(torch.uint16)", "`to.dtype` at <expr>:2: return (x * 2)"
     ".to(torch.uint16): unsupported element type torch.uint16; supported: bfloat16, bool"),
    ("torch.abs(torch.randn(4, 8).to(torch.float8_e4m3fnuz))", "unsupported element type "
     "torch.float8_e4m3fnuz"),                    # an input
])
def test_an_element_type_emmy_has_not_is_named(capsys, expr, message):
    rc, _, err = run(capsys, "compile", "-c", expr, "--ir", "tensor")
    assert rc == 2 and message in err and "Traceback" not in err


def test_dropout_asked_to_train_says_how_to_keep_it_off(capsys):
    """MC dropout's `F.dropout(h, p, training=True)`: model.eval() alone does not help."""
    rc, _, err = run(capsys, "compile", "-c", "F.dropout(torch.randn(4, 8), 0.1, training=True)",
                     "--ir", "tensor")
    assert rc == 2 and "dropout in training mode draws a random mask at each call" in err
    assert "training=self.training" in err


def test_a_branch_on_a_buffer_s_value_names_its_line_and_code(tmp_path, capsys):
    """Glow's ActNorm initializes from the first batch: `if self.initialized.item() == 0:`.
    torch's own message shortens the file's path; the line's code comes from the graph it
    printed on the way."""
    path = tmp_path / "actnorm.py"
    path.write_text(textwrap.dedent("""
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("initialized", torch.tensor(0, dtype=torch.uint8))

            def forward(self, x):
                if self.initialized.item() == 0:
                    self.initialized.fill_(1)
                return x * 2

        def get_inputs():
            return [torch.randn(4, 8)]

        def get_init_inputs():
            return []
    """))
    rc, _, err = run(capsys, "compile", str(path), "--ir", "torch")
    assert rc == 2
    assert "actnorm.py:11: if self.initialized.item() == 0:" in err
    assert "torch.where(cond, a, b)" in err


def test_a_cumulative_batch_norm_in_training_says_why_it_is_refused():
    """BatchNorm2d(momentum=None) averages by 1 / float(num_batches_tracked) in training."""
    import torch
    import torch.nn as nn

    import emmy

    with pytest.raises(emmy.errors.UserError, match="momentum=None in training averages"):
        emmy.compile(nn.BatchNorm2d(4, momentum=None).train(), torch.randn(2, 4, 3, 3))


def test_a_write_into_an_input_passed_twice_says_so():
    """attn(x, x, x) on a module that scales its query in place: torch cannot functionalize a
    write into inputs that share memory."""
    import torch

    import emmy
    from tests.tensor_ir.conftest import Fn

    def scaled(q, k):
        q *= 0.5
        return q @ k.transpose(-1, -2)

    x = torch.randn(4, 8)
    with pytest.raises(emmy.errors.UserError, match="inputs 0 and 1 are one tensor"):
        emmy.compile(Fn(scaled), x, x)


def test_ops_lists_the_supported_ops(capsys):
    rc, out, err = run(capsys, "ops")
    assert rc == 0 and "rms_norm" in out.split() and "scaled_dot_product_attention" in out.split()
    assert "topk" in out.split() and "median.dim" in out.split()
    assert "torch decomposes" in err and "#" not in out    # stdout stays one op a line


def test_unknown_row_value_names_the_key_and_its_values(capsys):
    rc, _, err = run(capsys, "run", RMS_FILE, "--row", "WORK=nonsense")
    assert rc == 2
    assert "WORK=nonsense: not a WORK value; allowed: thread:T | warp:W | block:T" in err


def test_illegal_row_gives_every_reason(capsys):
    rc, _, err = run(capsys, "run", RMS_FILE, "--row",
                     "WORK=thread:256 TILE=v8x1 REDUCE=shuffle STAGE=direct PLACE=fuse")
    assert rc == 2
    assert "[tile.vector_bytes]" in err and "[reduce.method_fits_work]" in err


def test_non_canonical_row_spells_the_canonical_one(capsys):
    rc, _, err = run(capsys, "compile", RMS_FILE, "--ir", "tile", "--row",
                     "TILE=v4x1 WORK=block:256 REDUCE=shuffle STAGE=direct PLACE=fuse")
    assert rc == 2
    assert "canonical spelling is `WORK=block:256 TILE=v4x1 REDUCE=shuffle STAGE=direct PLACE=fuse`" in err


def test_row_is_checked_even_for_a_stage_before_it_applies(capsys):
    # `--ir loop` (the default) shows the program before any row; an illegal row is still refused
    rc, out, err = run(capsys, "compile", RMS_FILE, "--row", "WORK=nonsense")
    assert rc == 2 and out == ""
    assert "WORK=nonsense: not a WORK value" in err
    rc, out, err = run(capsys, "compile", RMS_FILE, "--row",
                       "WORK=warp:4 TILE=v4x1 REDUCE=shuffle STAGE=direct PLACE=fuse")
    assert rc == 0 and out.startswith("program rmsnorm(")
    assert "a row applies from the tile stage on; the loop IR is the same without it" in err


def test_unknown_kernel(capsys):
    rc, _, err = run(capsys, "run", RMS_FILE, "--kernel", "k9", "--row", "WORK=block:256")
    assert rc == 2 and "no kernel `k9`; the kernels are k0_rmsnorm" in err


def test_kernel_without_row(capsys):
    rc, _, err = run(capsys, "run", RMS_FILE, "--kernel", "k0_rmsnorm")
    assert rc == 2 and "give --row too" in err


def test_unknown_target(capsys):
    rc, _, err = run(capsys, "space", RMS_FILE, "--target", "sm_75")
    assert rc == 2 and "sm_90a" in err


def test_row_with_the_loop_engine(capsys):
    rc, _, err = run(capsys, "run", RMS_FILE, "--engine", "loop", "--row", "WORK=block:256")
    assert rc == 2 and "loop engine has no schedule" in err


def test_space_json(capsys):
    import json

    rc, out, _ = run(capsys, "space", RMS_FILE, "--json", "--sample", "3")
    assert rc == 0
    (k,) = json.loads(out)["kernels"]
    assert k["name"] == "k0_rmsnorm" and k["count"] > 100 and len(k["rows"]) == 3


def test_space_lists_a_chain_its_default_row_cuts_before_its_halves(capsys):
    import json

    rc, out, _ = run(capsys, "space", "examples/mlp.py", "--json", "--sample", "0")
    assert rc == 0
    kernels = json.loads(out)["kernels"]
    assert [k["name"] for k in kernels] == ["k0_mlp", "k0_mlp_cut0", "k0_mlp_cut1"]
    assert kernels[0]["kind"] == "chain" and kernels[0]["decision_points"]["PLACE"] == ["fuse",
                                                                                        "cut"]


def test_failing_check_exits_1(tmp_path, capsys, monkeypatch):
    # A program whose reference disagrees: swap the eager output for a wrong one.
    import emmy.check as check

    monkeypatch.setattr(check, "eager_outputs", lambda w, _=None: [t * 2 for t in
                                                           check.flatten_tensors(w.model(*w.inputs))])
    monkeypatch.setattr(check, "eager_outputs_f64", lambda w, _=None: None)
    rc, out, _ = run(capsys, "run", RMS_FILE, "--set", "batch_size=2", "--check", "--engine", "loop")
    assert rc == 1 and "MISMATCH" in out and "FAIL" in out


@pytest.mark.parametrize("argv", [["compile", "--ir", "loop", "examples/nope.py"],
                                  ["run", "-c", "nn.RMSNorm(8)", "--check"],
                                  # export fails in an op's meta kernel (torch logs it whole)
                                  ["compile", "--ir", "torch", "examples/lstm.py",
                                   "--set", "sequence_length=0"]])
def test_bad_workloads_from_the_shell(argv):
    proc = subprocess.run([sys.executable, "-m", "emmy", *argv], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "emmy: error:" in proc.stderr and "Traceback" not in proc.stderr


def test_bench_without_a_gpu_or_with_a_bad_filter_exits_2(capsys, monkeypatch):
    import emmy.runtime.gpu as gpu

    monkeypatch.setattr(gpu, "gpu_available", lambda: False)
    rc, _, err = run(capsys, "bench", "--suite", "core")
    assert rc == 2 and "needs a CUDA GPU" in err
    rc, _, err = run(capsys, "bench", "--suite", "core", "--only", "nosuch")
    assert rc == 2 and "matches no workload" in err and "rmsnorm" in err
    rc, _, err = run(capsys, "bench", "--suite", "core", "--budget", "-3")
    assert rc == 2 and "--budget" in err


def test_rows_for_several_kernels_name_their_kernel(capsys):
    cut = "k0_mlp: WORK=warps:1x1 TILE=simt:32x32x8x16 PLACE=cut"
    rc, _, err = run(capsys, "compile", "examples/mlp.py", "--row", cut, "--row", cut)
    assert rc == 2 and "two rows for kernel `k0_mlp`" in err
    rc, _, err = run(capsys, "compile", "examples/mlp.py", "--row", cut, "--kernel", "k0_mlp")
    assert rc == 2 and "names its kernel" in err
    # chained_matmul's chain stays fused by default: its cut kernels do not exist
    rc, _, err = run(capsys, "compile", "examples/chained_matmul.py", "--ir", "tile", "--row",
                     "k0_chained_matmul_cut0: WORK=warps:1x1 TILE=simt:32x32x8 REDUCE=serial "
                     "STAGE=smem RASTER=row")
    assert rc == 2 and "exist when k0_chained_matmul's row has PLACE=cut" in err


def test_sass_without_the_disassembler_exits_2(capsys, monkeypatch):
    import emmy.cuda.sass as sass

    monkeypatch.setattr(sass, "tool", lambda name: None)
    rc, _, err = run(capsys, "compile", "examples/rmsnorm.py", "--ir", "sass")
    assert rc == 2 and "needs cuobjdump and nvdisasm" in err and "pip install" in err


@pytest.mark.parametrize("argv, message", [
    (["--stage", "clustr", "--reduce", "split", "examples/matmul_half.py"],
     "no legal row has a TILE starting with '', a STAGE containing 'clustr' and a REDUCE "
     "starting with 'split'"),
    (["--set", "M=64", "examples/linear_half.py"], "has no module-level constant `M`"),
    (["examples/no_such_file.py"], "no_such_file.py"),
], ids=["filter_matches_nothing", "wrong_set", "missing_file"])
def test_legal_correct_script_refuses_bad_input(argv, message):
    proc = subprocess.run([sys.executable, "bench/legal_correct.py", "--rows", "2", *argv],
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert "legal_correct: error:" in proc.stderr and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_program_without_kernels_says_so(capsys):
    expr = "F.softmax(torch.randn(0, 5), dim=1)"
    rc, out, _ = run(capsys, "space", "-c", expr)
    assert rc == 0 and "no kernels (none of its outputs has an element)" in out
    rc, _, err = run(capsys, "run", "-c", expr, "--check", "--row", "k0: WORK=thread:256")
    assert rc == 2 and "no kernel `k0`; the program has no kernels" in err
