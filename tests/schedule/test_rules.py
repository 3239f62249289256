"""Legality rules: for every rule in RULES, a real kernel and a row that only that rule refuses,
with the reason naming the facts (numbers, names) that make the row illegal.

Rows are checked with `Space(kernel, target).check(row)`, the same path `emmy` uses for a row a
user gives; a refused row must also be absent from the space's enumeration.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

import pytest

from emmy.frontend.workload import load_expr
from emmy.pipeline import compile_to
from emmy.schedule import decisions as dec
from emmy.schedule.row import parse
from emmy.schedule.rules import RULES
from emmy.schedule.space import GRAMMAR, Space
from emmy.schedule.targets import TARGETS, get_target
from emmy.tile_ir.ir import TileKernel

SM90 = get_target("sm_90a")
SM80 = get_target("sm_80")
# Rules that no real target can trigger within the grammar are shown on made-up targets:
# the grammar caps a block at 1024 threads, and every real target has cp.async.
SMALL_BLOCKS = dataclasses.replace(SM90, name="small512", max_threads_per_block=512)
NO_CP_ASYNC = dataclasses.replace(SM90, name="sm_75", compute_capability=(7, 5),
                                  has_cp_async=False)

# Workloads (torch expressions as `emmy -c` takes them), each lifting to one kernel.
RMS = "nn.RMSNorm(2048)(torch.randn(32, 2048))"              # row: reduce -> map, x reused
RMS_HALF = "nn.RMSNorm(2048)(torch.randn(32, 2048).half())"  # the same, x is f16
RMS_3072 = "nn.RMSNorm(3072)(torch.randn(16, 3072))"          # 12 KiB rows
RMS_WIDE = "nn.RMSNorm(55296)(torch.randn(2, 55296))"         # 216 KiB rows
SOFTMAX = "nn.Softmax(-1)(torch.randn(8, 100))"               # row of 100, 400 B rows
CHANNEL_SOFTMAX = "nn.Softmax(1)(torch.randn(2, 16, 8, 8))"       # rows 64 elements apart
CUMSUM = "(lambda x: torch.cumsum(x, 1))(torch.randn(8, 64))"
REV_CUMSUM = "(lambda x: torch.flip(torch.cumsum(torch.flip(x, [1]), 1), [1]))(torch.randn(8, 64))"
EW = "(lambda x: torch.exp(x) * 2 + 1)(torch.randn(4, 4))"
MAP_102 = "(lambda x: x * 2)(torch.randn(102))"
# a chain the back-to-back template does not take (A is f16, B f32): the generic space
CHAIN = ("(lambda a, b, c: (a.float() @ b) @ c)"
         "(torch.randn(8, 16).half(), torch.randn(16, 8), torch.randn(8, 4))")
SLICE = "(lambda x: x[:, 1:] * 2)(torch.randn(4, 65))"        # loads start at odd offsets
SUM_102 = "(lambda x: x.sum())(torch.randn(102))"
SUM_2049 = "(lambda x: x.sum())(torch.randn(2049))"   # 64 slices of 33: the last is empty
SCALAR = "(lambda x: x * 2)(torch.randn(()))"                  # a map of one element
SUM_2D = "(lambda x: x.sum())(torch.randn(64, 128))"          # 8192 elements, one job
ARGMAX = "(lambda x: torch.argmax(x, 1))(torch.randn(8, 64))"
AMAX = "(lambda x: torch.amax(x, 1))(torch.randn(8, 64))"


@lru_cache(maxsize=None)
def kernel(expr: str) -> TileKernel:
    """The expression's one kernel as lifted, before a row (a default PLACE=cut) applies."""
    from emmy.tile_ir.lift import lift_program

    tp = lift_program(compile_to(load_expr(expr), "loop")["loop"])
    assert len(tp.kernels) == 1, [k.name for k in tp.kernels]
    return tp.kernels[0]


@lru_cache(maxsize=None)
def space(expr: str, target_name: str) -> Space:
    target = {t.name: t for t in (*TARGETS.values(), SMALL_BLOCKS, NO_CP_ASYNC)}[target_name]
    return Space(kernel(expr), target)


# rule name -> cases: (workload, target, row, fragments the reason must contain)
CASES: dict[str, list[tuple[str, str, str, tuple[str, ...]]]] = {
    "work.threads_per_block": [
        (RMS, "small512", "WORK=block:1024 TILE=v1x1 REDUCE=shuffle STAGE=direct PLACE=fuse",
         ("1024 threads > 512 per block on small512",)),
        (RMS, "small512", "WORK=warp:32 TILE=v4x1 REDUCE=shuffle STAGE=direct PLACE=fuse",
         ("1024 threads > 512 per block",)),
    ],
    "work.map_is_per_thread": [
        (EW, "sm_90a", "WORK=warp:4 TILE=v1x1", ("`k0_expr`", "is a map", "thread:T")),
        (MAP_102, "sm_90a", "WORK=block:32 TILE=v1x1", ("`k0_expr`", "is a map", "thread:T")),
    ],
    "work.lanes_fit_the_axis": [
        (SOFTMAX, "sm_90a", "WORK=block:128 TILE=v1x1 REDUCE=shuffle STAGE=direct PLACE=fuse",
         ("128 threads share one job", "longest axis has 100 elements")),
    ],
    "tile.vector_bytes": [
        (RMS, "sm_90a", "WORK=block:256 TILE=v8x1 REDUCE=shuffle STAGE=direct PLACE=fuse",
         ("v8 of 4-byte elements is 32 bytes", "at most 16 bytes")),
    ],
    "tile.vector_divides_axis": [
        (MAP_102, "sm_90a", "WORK=thread:32 TILE=v4x1",
         ("axis a0 has 102 elements", "not a multiple of the vector width 4")),
        (SUM_102, "sm_90a", "WORK=block:32 TILE=v4x1 REDUCE=shuffle",
         ("axis a0 has 102 elements", "vector width 4")),
        (SCALAR, "sm_90a", "WORK=thread:32 TILE=v2x1",
         ("single element", "nothing to vectorize")),
    ],
    "tile.vector_aligned": [
        (SLICE, "sm_90a", "WORK=thread:32 TILE=v2x1",
         ("`x`", "multiples of 1 element(s), not of 2", "v2")),
    ],
    "tile.scan_vector": [
        (CUMSUM, "sm_90a", "WORK=warp:4 TILE=v2x1 REDUCE=shuffle", ("one element per lane (v1)",)),
    ],
    "tile.scan_serial_steps": [
        (CUMSUM, "sm_90a", "WORK=thread:32 TILE=v1x4 REDUCE=serial",
         ("a thread scanning its row alone folds one element a step", "n=4")),
    ],
    "reduce.method_fits_work": [
        (RMS, "sm_90a", "WORK=warp:4 TILE=v4x1 REDUCE=smem STAGE=direct PLACE=fuse",
         ("smem does not fit WORK=warp:4", "32 lane(s) per job", "use shuffle")),
        (RMS, "sm_90a", "WORK=thread:128 TILE=v4x1 REDUCE=shuffle STAGE=direct PLACE=fuse",
         ("shuffle does not fit WORK=thread:128", "1 lane(s) per job", "use serial")),
        (SUM_2D, "sm_90a", "WORK=warp:4 TILE=v1x1 REDUCE=split:2:atomic",
         ("split does not fit WORK=warp:4", "use shuffle")),
        (RMS, "sm_90a", "WORK=block:256 TILE=v4x1 REDUCE=serial STAGE=direct PLACE=fuse",
         ("serial does not fit WORK=block:256", "256 lane(s) per job",
          "use shuffle or smem or split:K:atomic|combine")),
    ],
    "reduce.block_scan_shuffles": [
        (CUMSUM, "sm_90a", "WORK=block:64 TILE=v1x1 REDUCE=smem",
         ("a block scans each chunk by shuffles", "use shuffle")),
    ],
    "reduce.split_needs_pure_reduction": [
        (RMS, "sm_90a", "WORK=block:256 TILE=v1x1 REDUCE=split:2:combine STAGE=direct PLACE=fuse",
         ("`k0_rmsnorm`", "output pass", "cannot be shared across blocks")),
        (RMS, "sm_90a", "WORK=block:256 TILE=v1x1 REDUCE=split:2:atomic STAGE=direct PLACE=cut",
         ("`k0_rmsnorm`", "cannot be shared across blocks")),
    ],
    "reduce.split_ops": [
        (ARGMAX, "sm_90a", "WORK=block:32 TILE=v1x1 REDUCE=split:2:combine",
         ("argmax tracks positions", "not split across blocks")),
        (AMAX, "sm_90a", "WORK=block:32 TILE=v1x1 REDUCE=split:2:atomic",
         ("atomic splits add f32 partial sums", "use split:K:combine")),
    ],
    "reduce.split_fits_axis": [
        (SUM_2049, "sm_90a", "WORK=block:32 TILE=v1x1 REDUCE=split:64:combine",
         ("2049 elements in 64 slices of whole v1 vectors (33 a slice) leave the last slice "
          "empty", "use fewer slices")),
        (SUM_2D, "sm_90a", "WORK=block:1024 TILE=v4x1 REDUCE=split:4:atomic",
         ("4 slices × 1024 lanes × v4 = 16384 elements per step > the 8192 elements",)),
    ],
    "reduce.cluster_shares_a_job": [
        (RMS, "sm_80", "WORK=block:256 TILE=v4x1 REDUCE=cluster:2 STAGE=direct PLACE=fuse",
         ("thread-block clusters need sm_90 or later; sm_80 has none",)),
        (REV_CUMSUM, "sm_90a", "WORK=block:32 TILE=v1x1 REDUCE=cluster:2",
         ("a reverse scan runs from the row's end",)),
        (SUM_102, "sm_90a", "WORK=block:32 TILE=v1x1 REDUCE=cluster:4",
         ("4 blocks × 32 lanes × v1 = 128 elements per step > the 102 elements of the longest "
          "fold: no fold gives every block a step",)),
        (CUMSUM, "sm_90a", "WORK=block:32 TILE=v1x1 REDUCE=cluster:4",
         ("4 blocks × 32 lanes × v1 = 128 elements per step > the 64 elements of the scan",)),
    ],
    "stage.needs_lanes": [
        (SOFTMAX, "sm_90a", "WORK=thread:32 TILE=v1x1 REDUCE=serial STAGE=smem PLACE=fuse",
         ("WORK=thread gives each job one thread", "use direct")),
    ],
    "stage.cluster": [
        (RMS, "sm_90a", "WORK=block:256 TILE=v4x1 REDUCE=cluster:2 STAGE=smem PLACE=fuse",
         ("each block of a cluster reads its own slice", "use direct")),
    ],
    "stage.shared_budget": [
        (RMS, "sm_90a", "WORK=warp:32 TILE=v4x1 REDUCE=shuffle STAGE=smem PLACE=fuse",
         ("32 row(s) × 8 KiB", "KiB shared memory > 227 KiB per block on sm_90a",
          "1 KiB reserved by the system")),
        # fits the 227 KiB of sm_90a (see test_shared_budget_is_per_target), not sm_80's 163
        (RMS_3072, "sm_80", "WORK=warp:16 TILE=v4x1 REDUCE=shuffle STAGE=smem PLACE=fuse",
         ("16 row(s) × 12 KiB", "192.016 KiB shared memory > 163 KiB per block on sm_80")),
        # one 216 KiB row fits; 1024 lanes add 16 KiB of scratch for combining them
        (RMS_WIDE, "sm_90a", "WORK=block:1024 TILE=v4x1 REDUCE=shuffle STAGE=smem PLACE=fuse",
         ("1 row(s) × 216 KiB + 16 KiB for combining lanes", "> 227 KiB per block on sm_90a")),
    ],
    "stage.async": [
        (RMS_HALF, "sm_90a", "WORK=block:256 TILE=v1x1 REDUCE=shuffle STAGE=smem:async PLACE=fuse",
         ("cp.async copies 4, 8 or 16 bytes", "TILE=v1x1 copies 2 bytes")),
        (RMS, "sm_75", "WORK=block:256 TILE=v4x1 REDUCE=shuffle STAGE=smem:async PLACE=fuse",
         ("cp.async needs sm_80 or later; sm_75 has none",)),
        (CHANNEL_SOFTMAX, "sm_90a",
         "WORK=warp:4 TILE=v4x1 REDUCE=shuffle STAGE=smem:async PLACE=fuse",
         ("cp.async copies 4 neighbouring elements", "lies 64 elements apart")),
    ],
    "place.cut_cluster": [
        (RMS, "sm_90a", "WORK=block:256 TILE=v4x1 REDUCE=cluster:2 STAGE=direct PLACE=cut",
         ("a cluster already spreads the output pass over its blocks", "use fuse")),
    ],
    "place.cut_chain_is_two_kernels": [
        (CHAIN, "sm_90a", "WORK=warp:4 TILE=v1x1 REDUCE=shuffle PLACE=cut",
         ("two matrix products", "_cut0", "WORK=thread:32 TILE=v1x1 REDUCE=serial")),
    ],
    "place.cut_leaves_nothing_to_stage": [
        (RMS, "sm_90a", "WORK=block:256 TILE=v4x1 REDUCE=shuffle STAGE=smem PLACE=cut",
         ("output pass moves to a second kernel", "use STAGE=direct")),
        (SOFTMAX, "sm_90a", "WORK=warp:4 TILE=v4x1 REDUCE=shuffle STAGE=smem:async PLACE=cut",
         ("STAGE=smem", "use STAGE=direct")),
    ],
}

# Rules that cannot refuse a row alone, with the rules that always refuse it too.
ALSO_REFUSED: dict[str, set[str]] = {}

PARAMS = [pytest.param(rule, *case, id=f"{rule}-{i}")
          for rule, cases in CASES.items() for i, case in enumerate(cases)]


def test_every_rule_has_a_case():
    names = [r.name for r in RULES]
    assert len(names) == len(set(names)), "rule names must be unique"
    missing = [n for n in names if not CASES.get(n)]
    assert not missing, f"rules without a test case in test_rules.py: {missing}"
    assert set(CASES) <= set(names), f"cases for unknown rules: {set(CASES) - set(names)}"


@pytest.mark.parametrize("rule, expr, target, text, fragments", PARAMS)
def test_rule_refuses_its_row(rule, expr, target, text, fragments):
    sp = space(expr, target)
    row = parse(text)
    refusals = sp.check(row)
    assert {r.rule for r in refusals} == {rule} | ALSO_REFUSED.get(rule, set()), \
        "\n".join(map(str, refusals))
    mine = [r for r in refusals if r.rule == rule]
    assert len(mine) == 1
    r = mine[0]
    key = next(x.key for x in RULES if x.name == rule)
    assert r.key == key and r.value == row[key]
    for fragment in fragments:
        assert fragment in r.reason, f"{fragment!r} not in {r.reason!r}"
    assert str(r) == f"{key}={row[key]}: {r.reason}  [{rule}]"
    assert row not in set(sp.all_rows), "a refused row must never be listed"


@pytest.mark.parametrize("rule, expr, target, text, fragments",
                         [p for p in PARAMS if p.values[0] not in ALSO_REFUSED])
def test_changing_the_refused_decision_makes_the_row_legal(rule, expr, target, text, fragments):
    """Each case is one bad decision away from a listed row: the rule is what refuses it."""
    sp = space(expr, target)
    row = parse(text)
    key = next(x.key for x in RULES if x.name == rule)
    fixes = [row.replace(key, v) for v in GRAMMAR[key]]
    assert any(not sp.check(f) for f in fixes)


def test_shared_budget_is_per_target():
    text = "WORK=warp:16 TILE=v4x1 REDUCE=shuffle STAGE=smem PLACE=fuse"
    assert space(RMS_3072, "sm_90a").check(parse(text)) == []
    assert [r.rule for r in space(RMS_3072, "sm_80").check(parse(text))] == ["stage.shared_budget"]
    # and without staging the row is legal on both
    direct = parse(text).replace("STAGE", "direct")
    assert space(RMS_3072, "sm_80").check(direct) == []


def test_wide_row_fits_without_the_combining_scratch():
    ok = "WORK=block:32 TILE=v4x1 REDUCE=shuffle STAGE=smem PLACE=fuse"
    assert space(RMS_WIDE, "sm_90a").check(parse(ok)) == []


def test_no_grammar_work_value_exceeds_a_real_targets_block():
    """Why work.threads_per_block is shown on a made-up target."""
    for t in TARGETS.values():
        assert all(dec.read_work(v).threads <= t.max_threads_per_block for v in GRAMMAR["WORK"])


# --- refusals that are not rules: the row's shape ------------------------------------------

def test_unknown_value_lists_the_allowed_values():
    refusals = space(RMS, "sm_90a").check(
        parse("WORK=block:100 TILE=v4x1 REDUCE=tree STAGE=direct PLACE=fuse"))
    assert [(r.rule, r.key, r.value) for r in refusals] == [
        ("row.grammar", "WORK", "block:100"), ("row.grammar", "REDUCE", "tree")]
    work, red = refusals
    assert "not a WORK value" in work.reason
    assert "thread:T | warp:W | block:T" in work.reason and "32..1024" in work.reason
    assert "serial | shuffle | smem | split:K:atomic | split:K:combine" in red.reason


@pytest.mark.parametrize("text", ["WORK=thread:32 TILE=v3x1", "WORK=thread:32 TILE=v4x8",
                                  "WORK=warp:64 TILE=v1x1", "WORK=thread:2048 TILE=v1x1"])
def test_values_outside_the_grammar(text):
    refusals = space(EW, "sm_90a").check(parse(text))
    assert [r.rule for r in refusals] == ["row.grammar"]
    assert "allowed:" in refusals[0].reason


def test_missing_keys_are_named():
    refusals = space(RMS, "sm_90a").check(parse("WORK=block:256 TILE=v4x1"))
    assert [(r.rule, r.key) for r in refusals] == [
        ("row.keys", "REDUCE"), ("row.keys", "STAGE"), ("row.keys", "PLACE")]
    for r in refusals:
        assert "missing" in r.reason and "`k0_rmsnorm`" in r.reason
        assert "WORK TILE REDUCE STAGE PLACE" in r.reason


def test_extra_keys_are_named():
    refusals = space(EW, "sm_90a").check(parse("WORK=thread:32 TILE=v1x1 REDUCE=serial PLACE=fuse"))
    assert [(r.rule, r.key, r.value) for r in refusals] == [
        ("row.keys", "REDUCE", "serial"), ("row.keys", "PLACE", "fuse")]
    assert "REDUCE does not apply to kernel `k0_expr`" in refusals[0].reason
    assert "its decision points are WORK TILE" in refusals[0].reason


def test_keys_the_codec_knows_but_no_kernel_decides():
    refusals = space(RMS, "sm_90a").check(
        parse("WORK=block:256 TILE=v4x1 REDUCE=shuffle STAGE=direct RASTER=row PLACE=fuse"))
    assert [(r.rule, r.key) for r in refusals] == [("row.keys", "RASTER")]


def test_a_reduction_without_reuse_has_no_stage_or_place():
    sp = space(SUM_2D, "sm_90a")
    assert sp.keys == ("WORK", "TILE", "REDUCE")
    refusals = sp.check(parse("WORK=block:256 TILE=v4x1 REDUCE=shuffle STAGE=smem"))
    assert [(r.rule, r.key) for r in refusals] == [("row.keys", "STAGE")]


def test_shape_errors_come_before_rules():
    """A row with a bad key is not judged by the rules (they'd see a half-made row)."""
    refusals = space(RMS, "sm_90a").check(parse("WORK=block:2048 TILE=v8x1"))
    assert {r.rule for r in refusals} == {"row.grammar", "row.keys"}
