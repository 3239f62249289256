"""The space of real kernels: listed rows are legal, counting and sampling agree with listing,
and a row drawn from the grammar is listed exactly when `check` accepts it."""

from __future__ import annotations

import time
from functools import lru_cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emmy.frontend.workload import load_expr, load_file, parse_sets
from emmy.pipeline import compile_to
from emmy.schedule.row import make_row, parse
from emmy.schedule.space import Space
from emmy.schedule.targets import get_target
from emmy.tile_ir.ir import KernelKind, TileKernel

SM90 = get_target("sm_90a")
SM80 = get_target("sm_80")

WORKLOADS = {
    "rmsnorm": lambda: load_expr("nn.RMSNorm(2048)(torch.randn(32, 2048))"),
    "softmax": lambda: load_expr("nn.Softmax(-1)(torch.randn(8, 100))"),
    "layernorm": lambda: load_expr("nn.LayerNorm(256)(torch.randn(16, 256))"),
    "sum": lambda: load_expr("(lambda x: x.sum())(torch.randn(64, 128))"),
    "cumsum": lambda: load_expr("(lambda x: torch.cumsum(x, 1))(torch.randn(8, 64))"),
    "elementwise": lambda: load_expr("(lambda x: torch.exp(x) * 2 + 1)(torch.randn(4, 4))"),
    "transpose": lambda: load_file("examples/transpose.py", parse_sets(["batch_size=2"])),
    "attention": lambda: load_file("examples/attention.py", parse_sets(
        ["batch_size=1", "heads=1", "seq_len=16", "head_dim=6"])),
    "matmul": lambda: load_file("examples/matmul.py", parse_sets(["M=16", "K=32", "N=16"])),
    # f16 rows: cp.async needs v2 or wider
    "rmsnorm_f16": lambda: load_expr("nn.RMSNorm(2048)(torch.randn(32, 2048).half())"),
    # 102 = 2 × 51: only v1 and v2 divide the axis, and only 2, 3, 6, 17 … slices
    "sum_102": lambda: load_expr("(lambda x: x.sum())(torch.randn(102))"),
    "argmax": lambda: load_expr("(lambda x: torch.argmax(x, 1))(torch.randn(8, 64))"),
    "amax": lambda: load_expr("(lambda x: torch.amax(x, 1))(torch.randn(8, 64))"),
    # loads start one element past a row start: only v1 is aligned
    "slice": lambda: load_expr("(lambda x: x[:, 1:] * 2)(torch.randn(4, 65))"),
    # reduce -> map edge, but the output pass reads another buffer: PLACE without STAGE
    "scale": lambda: load_expr("(lambda x, y: y * x.sum(-1, keepdim=True))"
                               "(torch.randn(4, 64), torch.randn(4, 64))"),
    # a reduce, then a scan reading it: a scan kernel with two folds
    "cumsum_norm": lambda: load_expr("(lambda x: torch.cumsum(x, 1) / x.sum(1, keepdim=True))"
                                     "(torch.randn(4, 64))"),
}
NAMES = tuple(WORKLOADS)
MAP, ROW, SCAN = KernelKind.MAP, KernelKind.ROW, KernelKind.SCAN
FULL = ("WORK", "TILE", "REDUCE", "STAGE", "PLACE")
PURE = ("WORK", "TILE", "REDUCE")   # a pure reduction or a scan: nothing reused, no edge
KINDS = {"rmsnorm": (ROW, FULL), "softmax": (ROW, FULL), "layernorm": (ROW, FULL),
         "sum": (ROW, PURE), "rmsnorm_f16": (ROW, FULL), "sum_102": (ROW, PURE),
         "argmax": (ROW, PURE), "amax": (ROW, PURE), "cumsum": (SCAN, PURE), "elementwise": (MAP, ("WORK", "TILE")),
         "transpose": (MAP, ("WORK", "TILE")), "slice": (MAP, ("WORK", "TILE")), "attention": (ROW, FULL),
         "matmul": (KernelKind.CONTRACT, ("WORK", "TILE", "REDUCE", "STAGE", "RASTER")),
         "scale": (ROW, ("WORK", "TILE", "REDUCE", "PLACE")), "cumsum_norm": (SCAN, PURE)}


# f32 attention over a head dimension no flash template takes (6: the f32 one reads float4
# rows) stores its scores (a product kernel), then one ROW kernel reads them: softmax and the
# product with v, folds nested three deep
LAST = {"attention": 2}


@lru_cache(maxsize=None)
def kernel(name: str) -> TileKernel:
    tp = compile_to(WORKLOADS[name](), "tile")["tile"].program
    assert len(tp.kernels) == LAST.get(name, 1), [k.name for k in tp.kernels]
    return tp.kernels[-1]


@lru_cache(maxsize=None)
def space(name: str, target: str = "sm_90a") -> Space:
    return Space(kernel(name), get_target(target))


@lru_cache(maxsize=None)
def listed(name: str, target: str = "sm_90a") -> frozenset:
    return frozenset(space(name, target).all_rows)


@pytest.mark.parametrize("name", NAMES)
def test_kind_and_keys(name):
    sp = space(name)
    assert (sp.kernel.kind, sp.keys) == KINDS[name]


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("name", NAMES)
def test_every_listed_row_is_legal(name, target):
    sp = space(name, target)
    rows = sp.all_rows
    assert rows, "a kernel's space is never empty"
    for row in rows:
        assert row.keys == sp.keys
        assert sp.check(row) == [], f"{row}: {[str(r) for r in sp.check(row)]}"
        assert parse(str(row)) == row


@pytest.mark.parametrize("name", NAMES)
def test_count_matches_listing(name):
    sp = space(name)
    rows = list(sp.rows())
    assert sp.count() == len(rows) == len(set(rows))
    assert tuple(rows) == sp.all_rows


@pytest.mark.parametrize("name", NAMES)
def test_sample(name):
    sp = space(name)
    n = min(20, sp.count() // 2)
    a = sp.sample(n, seed=1)
    assert len(a) == n == len(set(a))
    assert all(r in listed(name) for r in a)
    assert sp.sample(n, seed=1) == a, "sampling is deterministic per seed"
    assert Space(sp.kernel, sp.target).sample(n, seed=1) == a, "and per seed, not per object"
    assert sp.sample(n, seed=2) != a
    everything = sp.sample(sp.count() + 5, seed=3)
    assert len(everything) == sp.count() and set(everything) == listed(name)


@pytest.mark.parametrize("name", NAMES)
def test_default_is_legal(name):
    for target in ("sm_90a", "sm_80"):
        sp = space(name, target)
        row = sp.default()
        assert sp.check(row) == [] and row in listed(name, target)


@pytest.mark.parametrize("name", NAMES)
def test_decision_points(name):
    sp = space(name)
    points = sp.decision_points()
    assert [k for k, _ in points] == list(sp.keys)
    for key, values in points:
        assert values and set(values) <= set(sp.grammar[key])
        assert set(values) == {r[key] for r in sp.all_rows}


@pytest.mark.parametrize("name", ["rmsnorm", "softmax", "layernorm", "attention"])
def test_sm80_space_is_inside_sm90a_space(name):
    """sm_80's limits are no looser than sm_90a's, so every row legal there is legal here."""
    assert listed(name, "sm_80") <= listed(name, "sm_90a")


def test_rmsnorm_sm80_loses_rows_to_shared_memory_and_clusters():
    sp = space("rmsnorm", "sm_80")
    lost = listed("rmsnorm", "sm_90a") - listed("rmsnorm", "sm_80")
    assert any(row["REDUCE"].startswith("cluster:") for row in lost)
    for row in lost:
        rule = "reduce.cluster_shares_a_job" if row["REDUCE"].startswith("cluster:") else \
            "stage.shared_budget"
        assert {r.rule for r in sp.check(row)} == {rule}


def test_made_up_targets_narrow_the_space():
    """Limits no real target hits within the grammar still shape the space."""
    import dataclasses

    from emmy.schedule import decisions as dec

    small = dataclasses.replace(SM90, name="small512", max_threads_per_block=512)
    no_async = dataclasses.replace(SM90, name="sm_75", has_cp_async=False)
    k = kernel("rmsnorm")
    full = listed("rmsnorm")
    assert set(Space(k, small).all_rows) == {
        r for r in full if dec.read_work(r["WORK"]).threads <= 512}
    assert set(Space(k, no_async).all_rows) == {r for r in full if r["STAGE"] != "smem:async"}


def test_split_rows_are_listed_for_pure_reductions_only():
    """Splits for pure reductions and for the matrix product (whose K range splits over blocks
    by BK steps); their partials added atomically, by a combine kernel or by the last block
    of a job (a tile) to finish; amax cannot add partial maxima atomically."""
    for name in NAMES:
        splits = {r["REDUCE"].split(":")[2] for r in space(name).all_rows
                  if "REDUCE" in r.keys and r["REDUCE"].startswith("split")}
        want = {"sum": {"atomic", "combine", "last"}, "sum_102": {"atomic", "combine", "last"},
                "amax": {"combine", "last"}, "matmul": {"atomic", "combine", "last"}}.get(name,
                                                                                   set())
        assert splits == want, name


def test_enumerating_rmsnorm_is_fast():
    k = kernel("rmsnorm")
    start = time.perf_counter()
    n = sum(1 for _ in Space(k, SM90).rows())
    elapsed = time.perf_counter() - start
    assert n > 100
    assert elapsed < 1.0, f"enumerating {n} rows took {elapsed:.2f} s"


# --- listed never refused, refused never listed ---------------------------------------------

@st.composite
def grammar_rows(draw):
    """A kernel, and a row with one grammar value for each of its keys."""
    name = draw(st.sampled_from(NAMES))
    target = draw(st.sampled_from(["sm_90a", "sm_80"]))
    sp = space(name, target)
    return name, target, make_row({k: draw(st.sampled_from(sp.grammar[k])) for k in sp.keys})


@st.composite
def near_legal_rows(draw):
    """A listed row with one decision replaced by any grammar value: rows at the boundary."""
    name = draw(st.sampled_from(NAMES))
    target = draw(st.sampled_from(["sm_90a", "sm_80"]))
    sp = space(name, target)
    row = draw(st.sampled_from(sp.all_rows))
    key = draw(st.sampled_from(sp.keys))
    return name, target, row.replace(key, draw(st.sampled_from(sp.grammar[key])))


def _agrees(name, target, row):
    refusals = space(name, target).check(row)
    assert (refusals == []) == (row in listed(name, target)), \
        f"{name} on {target}: {row}: {[str(r) for r in refusals]}"
    for r in refusals:
        assert r.reason and r.rule and r.key in row.keys


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grammar_rows())
def test_grammar_rows_are_legal_iff_listed(case):
    _agrees(*case)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(near_legal_rows())
def test_near_legal_rows_are_legal_iff_listed(case):
    _agrees(*case)


@pytest.mark.parametrize("name", ["rmsnorm", "cumsum", "elementwise", "sum"])
def test_whole_grammar_is_legal_iff_listed(name):
    """Exhaustively for a few kernels: every grammar row, checked against the listing."""
    import itertools

    sp = space(name)
    legal = 0
    for values in itertools.product(*(sp.grammar[k] for k in sp.keys)):
        row = make_row(dict(zip(sp.keys, values)))
        ok = sp.check(row) == []
        assert ok == (row in listed(name)), str(row)
        legal += ok
    assert legal == sp.count()


def test_a_template_default_splits_its_reduction_where_the_model_says_so():
    """Two tokens through a 4,096 x 4,096 projection (a batched decoding step): 64 tiles of
    32 x 64 on 132 SMs, each walking K = 4,096; the default splits K, each tile's last block
    summing the partials (no combine kernel; never atomics: a default's sums do not vary run
    to run), for more than a tenth less modeled time. The same projection over 4,096 tokens
    fills the GPU and stays serial."""
    from emmy.runtime.costmodel.api import estimate_kernel

    def default(m: int):
        w = load_expr(f"nn.Linear(4096, 4096, bias=False).half()(torch.randn({m}, 4096).half())")
        (k,) = compile_to(w, "tile")["tile"].program.kernels
        return k, Space(k, SM90).default()

    k, row = default(2)
    assert row["REDUCE"].startswith("split:") and row["REDUCE"].endswith(":last"), row
    serial = make_row({**dict(row.items), "REDUCE": "serial"})
    assert (estimate_kernel(k, row, SM90, nvrtc=False).seconds
            < 0.9 * estimate_kernel(k, serial, SM90, nvrtc=False).seconds)
    assert default(4096)[1]["REDUCE"] == "serial"


def test_attention_defaults_to_flashattention_3s_row_where_wgmma_is():
    """Measured on an H200 (emmy.schedule.flash): 16-bit attention over more than 64 queries
    a head defaults to wgmma + TMA with the softmax overlapping P V on sm_90a; sm_80, f32 and a
    decoding step keep their own orders."""
    def default(expr: str, target=SM90):
        (k,) = compile_to(load_expr(expr), "tile")["tile"].program.kernels
        return str(Space(k, target).default())

    half = ("F.scaled_dot_product_attention(torch.randn(1, 2, 200, 64).half(), "
            "torch.randn(1, 2, 200, 64).half(), torch.randn(1, 2, 200, 64).half(), "
            "is_causal=True)")
    assert default(half) == "WORK=warps:8 TILE=wgmma:128x128 REDUCE=serial STAGE=tma:2:overlap"
    assert default(half, SM80).startswith("WORK=warps:4 TILE=flash:128x32 ")
    assert "TILE=simt:" in default(half.replace(".half()", ""))
    step = ("F.scaled_dot_product_attention(torch.randn(1, 2, 1, 64).half(), "
            "torch.randn(1, 2, 200, 64).half(), torch.randn(1, 2, 200, 64).half())")
    assert "TILE=flash:64x" in default(step), default(step)
    masked = half.replace("is_causal=True", "attn_mask=torch.randn(200, 200).half()")
    assert "TILE=flash:" in default(masked), default(masked)      # not yet run on a GPU


def test_a_split_product_default_takes_the_k_step_the_model_prefers():
    """An int4 decoding layer (16 x 4,096 -> 4,096 on sm_90a) splits K 16 ways; each block's
    256-long slice of K then goes in four steps of 64, not the preferred sixteen of 16, for
    more than a tenth less modeled time; the tile's m and n, the split, staging and raster stay."""
    from emmy.runtime.costmodel.api import estimate_kernel

    (k,) = compile_to(load_file("examples/int4_linear.py", (("batch", 16), ("in_features", 4096),
                                                             ("out_features", 4096))),
                      "tile")["tile"].program.kernels
    sp = Space(k, SM90)
    split = sp._cheapest_reduce(sp._preferred_row())
    row = sp.default()
    assert split["REDUCE"].startswith("split") and split["TILE"] == "mma:32x64x16"
    assert row["TILE"] == "mma:32x64x64"
    assert {**dict(row.items), "TILE": ""} == {**dict(split.items), "TILE": ""}
    assert (estimate_kernel(k, row, SM90, nvrtc=False).seconds
            < 0.9 * estimate_kernel(k, split, SM90, nvrtc=False).seconds)


def test_a_k_step_nvrtc_confirms_is_taken_where_the_model_alone_gains_less():
    """An int8 decoding layer (16 x 4,096 -> 4,096 on sm_90a): steps of 64 are 8% faster by
    the model alone, which assumes the SM full; NVRTC's register count (40 a thread for steps
    of 16: 6 blocks an SM, two waves) makes them a tenth faster and more, so the default
    takes them."""
    from emmy.runtime.costmodel.api import estimate_kernel

    (k,) = compile_to(load_file("examples/int8_linear.py", (("batch", 16), ("in_features", 4096),
                                                             ("out_features", 4096))),
                      "tile")["tile"].program.kernels
    sp = Space(k, SM90)
    split = sp._cheapest_reduce(sp._preferred_row())
    try:
        compiled = [estimate_kernel(k, split.replace("TILE", t), SM90, nvrtc=True).seconds
                    for t in ("mma:32x64x16", "mma:32x64x64")]
    except Exception:
        pytest.skip("no NVRTC here")
    assert compiled[1] < 0.9 * compiled[0]
    assert sp.default()["TILE"] == "mma:32x64x64"


def test_a_skinny_product_default_takes_tiles_that_fill_the_gpu():
    """A router's gate: 4,096 tokens x 7,168 -> 256 experts, bf16. wgmma's preferred 128 x 256
    tile makes 32 blocks on 132 SMs, and wgmma does not split K: the default takes a smaller
    wgmma tile of the same k step and staging, at least 64 blocks, for more than a tenth less
    modeled time. A square 4,096^3 product fills the GPU and keeps the preferred tile; so does
    a product too small for its time to matter."""
    from emmy.runtime.costmodel.api import estimate_kernel

    def default(expr: str):
        (k,) = compile_to(load_expr(expr), "tile")["tile"].program.kernels
        return k, Space(k, SM90).default()

    k, row = default("torch.randn(4096, 7168).bfloat16() @ torch.randn(7168, 256).bfloat16()")
    tile = row["TILE"]
    assert tile.startswith("wgmma:") and tile.endswith("x64") and tile != "wgmma:128x256x64"
    m, n = (int(d) for d in tile.split(":")[1].split("x")[:2])
    assert (4096 // m) * (256 // n) >= 64 and row["STAGE"] == "tma:4:store", row
    preferred = Space(k, SM90)._preferred_row()
    assert preferred["TILE"] == "wgmma:128x256x64"
    assert (estimate_kernel(k, row, SM90, nvrtc=False).seconds
            < 0.9 * estimate_kernel(k, preferred, SM90, nvrtc=False).seconds)
    for other in ("torch.randn(4096, 4096).half() @ torch.randn(4096, 4096).half()",
                  "torch.randn(64, 512).half() @ torch.randn(512, 256).half()"):
        k, row = default(other)
        sp = Space(k, SM90)
        expected = sp._cheapest_reduce(sp._preferred_row())
        if expected["REDUCE"].startswith("split"):     # and its k step (not the tile's m, n)
            expected = sp._cheapest_k_step(expected)
        assert row == expected, other
    assert default("torch.randn(4096, 4096).half() @ torch.randn(4096, 4096).half()")[1][
        "TILE"] == "wgmma:128x256x64"


def test_a_row_kernel_chaining_many_reductions_takes_the_work_the_model_prefers():
    """Top 8 of 256 per row is sixteen reductions a row, one after another: a block per row
    (the preferred WORK for a 256-wide row) waits on barriers between them; the default takes
    the WORK the cost model gives at least a tenth less time. Softmax's two reductions keep the
    preferred WORK."""
    from emmy.runtime.costmodel.api import estimate_kernel

    w = load_expr("torch.topk(torch.randn(4096, 256), 8).values")
    (k,) = compile_to(w, "tile")["tile"].program.kernels
    sp = Space(k, SM90)
    row, preferred = sp.default(), sp._preferred_row()
    assert preferred["WORK"] == "block:256" and row["WORK"] != "block:256"
    assert (estimate_kernel(k, row, SM90, nvrtc=False).seconds
            < 0.9 * estimate_kernel(k, preferred, SM90, nvrtc=False).seconds)
    (soft,) = compile_to(load_expr("torch.softmax(torch.randn(4096, 256), -1)"),
                         "tile")["tile"].program.kernels
    assert Space(soft, SM90).default() == Space(soft, SM90)._preferred_row()


def test_the_work_a_chain_of_reductions_takes_is_confirmed_by_nvrtc():
    """Without NVRTC's register report the model takes a thread a row in blocks of 1,024 for
    20 rounds of top-k over 64 short rows (9 us); 1,024 threads cap a thread at 64 registers
    and the rounds spill (259 us with the report). The default is a WORK the report confirms
    a tenth faster than the preferred one."""
    from emmy.runtime.costmodel.api import estimate_kernel

    (k,) = compile_to(load_expr("torch.topk(torch.randn(64, 28), 20)"),
                      "tile")["tile"].program.kernels
    sp = Space(k, SM90)
    spills = sp._preferred_row({"WORK": "thread:1024"})
    assert (estimate_kernel(k, spills, SM90, nvrtc=False).seconds
            < 0.9 * estimate_kernel(k, sp._preferred_row(), SM90, nvrtc=False).seconds)
    row = sp.default()
    assert row["WORK"] != "thread:1024"
    compiled = estimate_kernel(k, row, SM90, nvrtc=True).seconds
    assert compiled < 0.9 * estimate_kernel(k, sp._preferred_row(), SM90, nvrtc=True).seconds
    assert compiled < 0.1 * estimate_kernel(k, spills, SM90, nvrtc=True).seconds


def test_per_kernel_answers_are_kept_by_identity_not_by_hashing_the_kernel(monkeypatch):
    """Facts of a kernel and the values its statements round are asked for once per statement
    and per row: hashing the whole kernel tree each time made 32 fused LayerNorms (an unrolled
    LayerNorm-LSTM, RWKV's RNN mode) take minutes to schedule. Compiling them hashes no
    kernel."""
    import torch
    import torch.nn as nn

    from emmy.frontend.workload import Workload
    from emmy.pipeline import compile_to
    from emmy.tile_ir.ir import TileKernel

    hashed = []
    monkeypatch.setattr(TileKernel, "__hash__", lambda self: hashed.append(self) or id(self))
    stack = nn.Sequential(*[nn.LayerNorm(48) for _ in range(32)]).eval()
    compile_to(Workload("norms", stack, (torch.randn(16, 48),), "", "<test>"), "kernel")
    assert len(hashed) < 100, len(hashed)
    from emmy.schedule.facts import facts

    facts.cache_clear()          # as bench/schedule_time.py forgets them before timing


def test_kernels_of_one_identity_find_their_default_row_once(monkeypatch):
    """Two kernels computing the same thing on other buffers (an unrolled loop's iterations)
    share the default row the first one found: the second asks nothing of the cost model."""
    import dataclasses

    from emmy.schedule import space as space_module
    from emmy.schedule.targets import get_target

    tp = compile_to(load_expr("F.softmax(torch.randn(64, 500), dim=-1)"), "tile")["tile"].program
    (k,) = tp.kernels
    twin = dataclasses.replace(k, name="k9_twin")
    found = []
    real = Space._found_default
    monkeypatch.setattr(Space, "_found_default", lambda self: found.append(1) or real(self))
    monkeypatch.setattr(space_module, "_DEFAULTS", {})
    target = get_target("sm_90a")
    first = Space(k, target).default()
    assert Space(twin, target).default() == first and len(found) == 1
    other = dataclasses.replace(k, identity="")            # no identity: found afresh
    assert Space(other, target).default() == first and len(found) == 2
