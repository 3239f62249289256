"""Suites: definitions, planning and the report on the CPU; `run_suite` itself on a GPU only."""

from __future__ import annotations

import pytest
import torch

from emmy.bench.baselines import Baseline
from emmy.bench.suites import (SUITES, BenchOptions, DeviceInfo, Prepared, RowResult,
                               SuiteReport, WorkloadResult, WorkloadSpec, append_benchmarks,
                               bench_item, plan_rows, render_notes, run_specs, run_suite,
                               suite_specs)
from emmy.bench.timing import Timing
from emmy.errors import UserError
from emmy.pipeline import compile_to
from emmy.runtime.gpu import gpu_available


def test_suites_cover_the_issue():
    core = suite_specs("core")
    assert {s.name for s in core} == {"rmsnorm", "layernorm", "softmax", "log_softmax",
                                      "elementwise_chain"}
    assert {s.dtype for s in core} == {"f32", "bf16"}
    assert all(dict(s.sets).get("batch_size") == 8192 for s in core)
    assert len(suite_specs("all")) == sum(len(v) for v in SUITES.values())
    with pytest.raises(UserError, match="unknown suite"):
        suite_specs("nope")


def test_the_command_line_offers_every_suite():
    from emmy.bench.suites import SUITE_NAMES
    from emmy.cli import build_parser

    bench = build_parser()._subparsers._group_actions[0].choices["bench"]
    (suite,) = [a for a in bench._actions if a.dest == "suite"]
    assert tuple(suite.choices) == SUITE_NAMES == (*SUITES, "all")


@pytest.mark.parametrize("example,sets", [
    ("rmsnorm", (("batch_size", 4), ("dim", 64))),
    ("layernorm", (("batch_size", 4), ("seq_len", 1), ("hidden", 64))),
    ("softmax", (("batch_size", 4), ("dim", 64))),
    ("log_softmax", (("batch_size", 4), ("dim", 64))),
    ("elementwise_chain", (("batch_size", 4), ("dim", 64))),
    ("matmul", (("M", 8), ("K", 16), ("N", 8))),
    ("linear", (("batch_size", 4), ("in_features", 16), ("out_features", 8))),
    ("bmm", (("batch_size", 2), ("M", 8), ("K", 16), ("N", 8))),
    ("attention", (("batch_size", 1), ("heads", 2), ("seq_len", 8), ("head_dim", 4),
                   ("is_causal", False))),
    ("decode_attention", (("batch_size", 1), ("n_heads", 4), ("n_kv_heads", 2),
                          ("cache_len", 40), ("head_dim", 16))),
    ("conv2d", (("batch_size", 1), ("in_channels", 4), ("out_channels", 8), ("height", 6),
                ("width", 6), ("kernel_size", 3), ("stride", 1), ("padding", 1))),
    ("embedding", (("batch_size", 2), ("seq_len", 8), ("vocab", 50), ("hidden", 16))),
    ("llama_block", (("batch_size", 1), ("seq_len", 8), ("dim", 64), ("n_heads", 4),
                     ("n_kv_heads", 2), ("hidden", 96), ("dtype", "bfloat16"))),
    ("moe_router", (("tokens", 8), ("hidden", 32), ("experts", 16), ("top_k", 4))),
    ("sampling", (("batch_size", 2), ("vocab", 1100))),
    ("int8_linear", (("batch", 4), ("in_features", 16), ("out_features", 8))),
])
def test_every_suite_workload_loads_and_casts(example, sets):
    """The suite's files and size constants exist; the bf16 cast reaches model and inputs."""
    assert any(s.example == example and {k for k, _ in s.sets} == {k for k, _ in sets}
               for s in suite_specs("all"))
    w = WorkloadSpec(example, example, sets, "bf16").load()
    assert all(x.dtype == torch.bfloat16 for x in w.make_inputs() if x.is_floating_point())
    assert all(p.dtype == torch.bfloat16 for p in w.model.parameters())
    compile_to(w, "cuda")


def test_the_fp8_workload_loads_as_its_file_makes_it():
    """"fp8" is not a cast: the file's e4m3 weight stays e4m3 and its activation bf16."""
    (spec, *_) = [s for s in suite_specs("matmul") if s.example == "fp8_linear"]
    w = WorkloadSpec(spec.name, spec.example, (("batch", 4), ("in_features", 32),
                                               ("out_features", 16)), spec.dtype).load()
    assert w.model.weight.dtype == torch.float8_e4m3fn and w.inputs[0].dtype == torch.bfloat16
    assert spec.label == "fp8 linear fp8 16x4096 -> 4096"
    compile_to(w, "cuda")


def test_plan_starts_with_the_default_then_modeled_rows():
    w = WorkloadSpec("softmax", "softmax", (("batch_size", 4), ("dim", 256))).load()
    stages = compile_to(w, "tile")
    plan, notes = plan_rows(stages["loop"], stages["tile"].program, "sm_90a", top_k=2, sample=5)
    assert plan[0].source == "default"
    assert len({p.rows for p in plan}) == len(plan) == 6
    sources = [p.source for p in plan]
    if any(p.modeled_us is not None for p in plan):        # the cost model answered
        assert sources[1:3] == ["modeled", "modeled"]
        assert plan[1].modeled_us <= plan[2].modeled_us
    else:
        assert set(sources[1:]) == {"sweep"} and notes


def test_given_rows_come_after_the_default_and_refused_ones_say_why():
    w = WorkloadSpec("softmax", "softmax", (("batch_size", 4), ("dim", 256))).load()
    stages = compile_to(w, "tile")
    (kernel,) = [k.name for k in stages["tile"].program.kernels]
    legal = "WORK=warp:1 TILE=v1x1 REDUCE=shuffle STAGE=direct PLACE=fuse"
    given = ((None, legal), (kernel, legal),                  # the same row twice: timed once
             (None, "WORK=block:4096 TILE=v1x1 REDUCE=smem STAGE=direct PLACE=fuse"),
             ("k9_nothing", legal))
    plan, notes = plan_rows(stages["loop"], stages["tile"].program, "sm_90a", top_k=1,
                            sample=3, given=given)
    assert [p.source for p in plan[:2]] == ["default", "given"]
    assert plan[1].rows == ((kernel, legal),)
    assert [p.source for p in plan].count("given") == 1
    assert len({p.rows for p in plan}) == len(plan)
    assert any("WORK=block:4096" in n and "refused" in n and f"`{kernel}`" in n for n in notes)
    assert any("k9_nothing" in n and "no such kernel" in n for n in notes)


def test_a_dry_run_times_a_given_row(tmp_path):
    spec = WorkloadSpec("softmax", "softmax", (("batch_size", 4), ("dim", 128)), "f32", "4x128")
    row = "WORK=warp:2 TILE=v1x1 REDUCE=shuffle STAGE=direct PLACE=fuse"
    report = run_specs("tiny", (spec,), None, device="cpu", top_k=0, sample=1, seeds=(0,),
                       distributions=("normal",), rows=((None, row),))
    (w,) = report.workloads
    given = [r for r in w.rows if r.source == "given"]
    assert len(given) == 1 and given[0].verdict == "ok" and given[0].rows[0][1] == row


def test_bench_refuses_a_malformed_row_before_looking_for_a_gpu(capsys):
    from emmy.cli import main

    assert main(["bench", "--suite", "matmul", "--row", "WORK=warps:2x4 tile=mma"]) == 2
    err = capsys.readouterr().err
    assert "--row 'WORK=warps:2x4 tile=mma'" in err and "capitals" in err


def _report(tmp_copy=4000.0) -> SuiteReport:
    spec = WorkloadSpec("rmsnorm", "rmsnorm", (("batch_size", 8192), ("dim", 8192)), "f32",
                        "8192x8192")
    t = lambda us: Timing("measured", us, us * 0.95, us * 1.1, 50)  # noqa: E731
    rows = (RowResult(0, (("k0", "WORK=block:256 TILE=v4x1"),), "default", "ok", timing=t(200.0)),
            RowResult(1, (("k0", "WORK=warp:4 TILE=v4x1"),), "modeled", "ok", timing=t(150.0)),
            RowResult(2, (("k0", "WORK=thread:32 TILE=v1x1"),), "sweep", "incorrect",
                      ("seed 0, normal inputs: out0: 3 elements never written",)),
            RowResult(3, (("k0", "WORK=thread:64 TILE=v1x1"),), "sweep", "skipped"))
    prepared = Prepared(spec.label, (), 8192 * 8192 * 4 * 2 + 8192 * 4, "f64")
    base = (Baseline("eager", t(300.0)), Baseline("torch.compile", t(160.0), "warm-up excluded"))
    w = WorkloadResult(spec, prepared, rows, base)
    dev = DeviceInfo("NVIDIA H200", "580.1", "13.0", "2.11", "14.2", "0.1.0", 132, 60 << 20,
                     141 << 30)
    return SuiteReport("core", "2026-01-01 00:00:00 UTC", "emmy bench --suite core", dev,
                       t(500.0), tmp_copy, (w,), 123.0)


def test_report_table_and_benchmarks_md(tmp_path):
    report = _report()
    table = report.table()
    assert "`WORK=warp:4 TILE=v4x1`" in table          # the fastest passing row
    assert "2.00×" in table and "1.07×" in table       # vs eager, vs torch.compile
    assert "| 2 / 3 |" in table                         # skipped rows are not counted
    gbps = (8192 * 8192 * 8 + 8192 * 4) / 150e-6 / 1e9
    assert f"{gbps:,.0f}" in table
    notes = "\n".join(render_notes(report))
    assert "never written" in notes and "copy ceiling" in notes
    md = tmp_path / "BENCHMARKS.md"
    md.write_text("# Benchmarks\n")
    append_benchmarks(report, md)
    text = md.read_text()
    assert text.startswith("# Benchmarks\n") and "`emmy bench --suite core`" in text
    assert "NVIDIA H200" in text and "torch 2.11" in text and table in text
    assert report.to_dict()["workloads"][0]["rows"][1]["timing"]["median_us"] == 150.0


def test_a_dry_run_on_the_cpu_goes_through_workers_to_the_report(tmp_path):
    """The whole orchestration without a GPU: plan, check on the emulator, assemble, write."""
    spec = WorkloadSpec("softmax", "softmax", (("batch_size", 4), ("dim", 128)), "f32", "4x128")
    md, out = tmp_path / "BENCHMARKS.md", tmp_path / "out.json"
    report = run_specs("tiny", (spec,), out, device="cpu", benchmarks_md=md, top_k=1, sample=2,
                       seeds=(0,), distributions=("normal",))
    (w,) = report.workloads
    assert w.prepared is not None and w.prepared.plan[0].source == "default"
    assert [r.index for r in w.rows] == list(range(len(w.prepared.plan)))
    assert all(r.verdict == "ok" and r.timing is None for r in w.rows), w.rows
    assert w.baselines == () and report.device is None and w.best is None
    assert "dry run" in "\n".join(render_notes(report))
    assert "| 3 / 3 |" in report.table() and report.table() in md.read_text()
    assert "`emmy bench --suite tiny --json" in md.read_text()
    assert '"suite": "tiny"' in out.read_text()


@pytest.mark.skipif(gpu_available(), reason="checks the message given where there is no GPU")
def test_run_suite_without_a_gpu_says_so(tmp_path):
    with pytest.raises(UserError, match="emmy bench needs a CUDA GPU"):
        run_suite("core", benchmarks_md=tmp_path / "B.md")
    assert not (tmp_path / "B.md").exists()


@pytest.mark.gpu
def test_bench_items_on_a_small_workload():
    import time

    spec = WorkloadSpec("softmax", "softmax", (("batch_size", 64), ("dim", 1024)))
    opt = BenchOptions(deadline=time.time() + 300, sample=3, top_k=1, row_timing_s=0.1,
                       baseline_timing_s=0.1)
    prepared = bench_item(("prepare", spec, opt))
    assert prepared.plan[0].source == "default" and prepared.reference_dtype == "f64"
    row = bench_item(("row", spec, 0, opt))
    assert row.verdict == "ok" and row.timing.method == "measured", row.reasons
    eager = bench_item(("baseline", spec, "eager", opt))
    assert eager.timing is not None
    assert bench_item(("row", spec, 999, opt)) is None
    timing, gbps = bench_item(("copy", 1 << 26))
    assert gbps > 100 and timing.method == "measured"


def test_bytes_moved_counts_the_rows_a_gather_reads():
    """An embedding table counts the rows the program reads (once, however many passes of
    LayerNorm read each), not the whole table."""
    from emmy.bench.suites import bytes_moved

    spec = WorkloadSpec("e", "embedding", (("batch_size", 2), ("seq_len", 8), ("vocab", 500),
                                           ("hidden", 16)))
    stages = compile_to(spec.load(), "cuda")
    whole = bytes_moved(stages["cuda"])
    rows = 2 * 8 * 16 * 4
    assert whole - bytes_moved(stages["cuda"], stages["loop"]) == 500 * 16 * 4 - rows
