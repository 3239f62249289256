"""The rules of the template spaces (matrix products, flash attention): each refuses a row with
a reason that names the facts, and the refused row is absent from the enumeration."""

from __future__ import annotations

import dataclasses
from functools import lru_cache

import pytest

from emmy.frontend.workload import load_expr, load_file
from emmy.pipeline import compile_to
from emmy.schedule import b2b, flash, gemm
from emmy.schedule.row import parse
from emmy.schedule.space import Space
from emmy.schedule.targets import get_target

SM90, SM80 = get_target("sm_90a"), get_target("sm_80")
# Limits no real target has within the grammar, on made-up variants of sm_90a (named as it, so
# the templates' own checks read sm_90a's table).
SMALL_BLOCKS = dataclasses.replace(SM90, max_threads_per_block=256)
TINY_BLOCKS = dataclasses.replace(SM90, max_threads_per_block=128)
NO_CP_ASYNC = dataclasses.replace(SM90, has_cp_async=False)
SMALL_SHARED = dataclasses.replace(SM90, shared_per_block_optin=100 * 1024)

F32 = "torch.matmul(torch.randn(64, 48), torch.randn(48, 80))"
F16 = "torch.matmul(torch.randn(64, 48).half(), torch.randn(48, 80).half())"
F16_BIG = "torch.matmul(torch.randn(512, 256).half(), torch.randn(256, 512).half())"


@lru_cache(maxsize=None)
def kernel(source: str, sets: tuple = ()):
    w = load_file(source, sets) if source.endswith(".py") else load_expr(source)
    (k,) = compile_to(w, "tile")["tile"].program.kernels
    return k


ATT = ("examples/attention_half.py", ())
ATT_F32 = ("examples/attention.py", ())
ATT_F32_256 = ("examples/attention.py", (("head_dim", 256),))
CHAIN = ("examples/chained_matmul.py", ())
CHAIN_F16 = ("(lambda a, b, c: (a @ b) @ c)(torch.randn(32, 64).half(), "
             "torch.randn(64, 48).half(), torch.randn(48, 16).half())",)
ATT128 = ("examples/attention_half.py", (("head_dim", 128),))
ATT96 = ("examples/attention_half.py", (("head_dim", 96),))
ATT256 = ("examples/attention_half.py", (("head_dim", 256),))
ATT192 = ("examples/attention_half.py", (("head_dim", 192),))
# one K for both heads (a broadcast: head stride 0), which no TMA tensor map describes
ATT_SHARED_K = ("(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, "
                "k.expand(1, 2, 64, 64), v))(torch.randn(1, 2, 64, 64).half(), "
                "torch.randn(1, 1, 64, 64).half(), torch.randn(1, 2, 64, 64).half())",)
NO_TMA = dataclasses.replace(SM90, has_tma=False)
MLA = ("torch.nn.functional.scaled_dot_product_attention(torch.randn(1, 2, 64, 64).half(), "
       "torch.randn(1, 2, 64, 64).half(), torch.randn(1, 2, 64, 128).half())",)
CONV_F16 = ("nn.Conv2d(8, 16, 3, stride=2, padding=1).half()(torch.randn(2, 8, 11, 10).half())")
# an int8 weight laid out (k, n), 44 columns: not whole vectors of 8 (computed one at a time)
INT8_K_N44 = ("(lambda x, q, s: x @ (q.half() * s))(torch.randn(64, 72).half(), "
              "torch.randint(-127, 128, (72, 44)).to(torch.int8), (torch.rand(1, 44) * 0.01).half())")
# a 16-bit product with an f32 output (no 16-bit store to stage), and one whose output rows
# are 84 elements apart (not 16-byte aligned)
F16_F32_OUT = "torch.matmul(torch.randn(64, 48).half(), torch.randn(48, 80).half()).float()"
F16_ODD_ROWS = "torch.matmul(torch.randn(64, 48).half(), torch.randn(84, 48).half().t())"
CASES = {
    "work.threads_per_block": [
        ((F16,), SMALL_BLOCKS, "WORK=warps:4x4 TILE=mma:64x64x16 REDUCE=serial STAGE=smem RASTER=row",
         ("512 threads > 256",)),
        (ATT, TINY_BLOCKS, "WORK=warps:8 TILE=flash:128x32 REDUCE=serial STAGE=smem", ("256 threads > 128",)),
        (CHAIN, TINY_BLOCKS, "WORK=warps:2x4 TILE=simt:32x32x8x16 PLACE=fuse",
         ("256 threads > 128",))],
    "tile.instruction_types": [
        ((F32,), SM90, "WORK=warps:2x2 TILE=mma:64x64x16 REDUCE=serial STAGE=smem RASTER=row",
         ("f16/bf16", "f32", "use simt")),
        ((F16,), SM90, "WORK=warps:2x2 TILE=simt:64x64x16 REDUCE=serial STAGE=smem RASTER=row",
         ("f32 operands", "f16", "mma")),
        (CHAIN, SM90, "WORK=warps:2x2 TILE=mma:32x32x16x16 PLACE=fuse", ("chain is f32", "simt")),
        (CHAIN_F16, SM90, "WORK=warps:2x2 TILE=simt:32x32x8x16 PLACE=fuse", ("use mma",))],
    "tile.tf32_allowed": [
        ((F32,), SM90, "WORK=warps:2x2 TILE=tf32:64x64x16 REDUCE=serial STAGE=smem RASTER=row",
         ("10 mantissa bits", 'set_float32_matmul_precision("high")'))],
    "tile.instruction_set": [
        ((F16,), SM80, "WORK=warps:2x4 TILE=wgmma:128x128x64 REDUCE=serial STAGE=async:3 RASTER=row",
         ("sm_90a instruction", "sm_80")),
        ((INT8_K_N44,), SM90, "WORK=warps:2x2 TILE=wgmma:64x64x64 REDUCE=serial STAGE=async:3 "
         "RASTER=row PLACE=fuse", ("operand B is computed one element at a time", "use mma"))],
    "tile.warp_tile": [
        ((F16,), SM90, "WORK=warps:1x4 TILE=mma:32x32x16 REDUCE=serial STAGE=smem RASTER=row",
         ("32x8 tile must be a multiple of 16x16",)),
        ((F16,), SM90, "WORK=warps:2x1 TILE=wgmma:64x64x64 REDUCE=serial STAGE=async:2 RASTER=row",
         ("warpgroups of 4 warps",))],
    "tile.accumulator_registers": [
        ((F16_BIG,), SM90, "WORK=warps:1x1 TILE=mma:128x128x16 REDUCE=serial STAGE=smem RASTER=row",
         ("512 f32 accumulators per thread > 128",))],
    "tile.fits_problem": [
        ((F16,), SM90, "WORK=warps:4x4 TILE=mma:256x256x16 REDUCE=serial STAGE=smem RASTER=row",
         ("mostly padding", "64x80")),
        (CHAIN, SM90, "WORK=warps:2x2 TILE=simt:128x64x8x16 PLACE=fuse", ("BM=128", "at most 64"))],
    "reduce.split_range": [
        ((F16,), SM90, "WORK=warps:2x2 TILE=mma:64x64x16 REDUCE=split:4:combine STAGE=smem RASTER=row",
         ("fewer than BK=16 of K=48",)),
        ("examples/linear.py", SM90,
         "WORK=warps:2x2 TILE=simt:32x32x8 REDUCE=split:2:atomic STAGE=smem RASTER=row",
         ("f32 accumulator as it is", "split:S:combine"))],
    "stage.kind": [
        ((F16,), SM90, "WORK=warps:2x2 TILE=mma:64x64x16 REDUCE=serial STAGE=tma:3 RASTER=row",
         ("TMA staging feeds wgmma tiles only",))],
    "stage.alignment": [
        ("examples/matmul_half.py", SM90,
         "WORK=warps:2x2 TILE=mma:64x64x32 REDUCE=serial STAGE=async:2 RASTER=row",
         ("16-byte chunks", "126 bytes", "STAGE=smem")),
        (("examples/int8_linear.py", ()), SM90,
         "WORK=warps:2x2 TILE=wgmma:64x64x64 REDUCE=serial STAGE=tma:3 RASTER=row PLACE=fuse",
         ("operand B is computed", "use STAGE=async:N"))],
    "stage.cluster": [
        ((F16,), SM90, "WORK=warps:4x1 TILE=wgmma:64x64x64 REDUCE=serial STAGE=tma:3:cluster:2x1 "
         "RASTER=row", ("one 64x64 tile along m", "use tma:3"))],
    "stage.store": [
        ((F16_F32_OUT,), SM90, "WORK=warps:4x1 TILE=wgmma:64x64x64 REDUCE=serial "
         "STAGE=tma:3:store RASTER=row", ("16-bit row-major output", "drop :store")),
        ((F16_ODD_ROWS,), SM90, "WORK=warps:4x1 TILE=wgmma:64x64x64 REDUCE=serial "
         "STAGE=tma:3:store RASTER=row", ("rows start every 84 elements", "multiples of 8"))],
    "stage.held_registers": [
        ((CONV_F16,), SM90, "WORK=warps:2x2 TILE=mma:32x128x64 REDUCE=serial STAGE=async:3 "
         "RASTER=row", ("gathered operand B", "64 elements per thread > 32", "STAGE=smem"))],
    "stage.shared_budget": [
        ((F16_BIG,), SM80, "WORK=warps:4x4 TILE=mma:256x256x64 REDUCE=serial STAGE=async:4 RASTER=row",
         ("4 stage(s)", "163 KiB per block on sm_80"))],
    "raster.template_builds": [
        ((F16_BIG,), SM90, "WORK=warps:2x4 TILE=wgmma:64x64x64 REDUCE=serial STAGE=async:2 RASTER=row",
         ("warpgroups", "256 threads"))],
    "work.unused_after_cut": [
        (CHAIN, SM90, "WORK=warps:2x2 TILE=simt:32x32x8x16 PLACE=cut",
         ("two matrix products", "_cut0", "WORK=warps:1x1"))],
    "tile.unused_after_cut": [
        (CHAIN, SM90, "WORK=warps:1x1 TILE=simt:64x64x8x16 PLACE=cut",
         ("TILE is unused", "TILE=simt:32x32x8x16"))],
    "tile.template_builds": [
        (CHAIN, SM90, "WORK=warps:1x1 TILE=simt:32x32x8x32 PLACE=fuse",
         ("48 accumulators",))],
    "tile.operand_type": [
        (ATT_F32, SM90, "WORK=warps:4 TILE=flash:64x32 REDUCE=serial STAGE=async:2",
         ("flash:64x32 multiplies f16/bf16", "q, k and v are f32", "simt:BQxBKV")),
        (ATT_F32, SM90, "WORK=warps:8 TILE=wgmma:128x64 REDUCE=serial STAGE=async:2", ("wgmma:128x64",)),
        (ATT, SM90, "WORK=warps:4 TILE=simt:64x32 REDUCE=serial STAGE=async:2",
         ("simt:64x32 is the f32 template", "__half", "flash:BQxBKV"))],
    "tile.wgmma_target": [
        (ATT, SM80, "WORK=warps:8 TILE=wgmma:128x64 REDUCE=serial STAGE=async:2", ("sm_90a instruction", "sm_80"))],
    "tile.wgmma_warpgroups": [
        (ATT, SM90, "WORK=warps:4 TILE=wgmma:128x64 REDUCE=serial STAGE=async:2",
         ("2 consumer warpgroup(s)", "64 query rows", "WORK=warps:8"))],
    "tile.wgmma_head_dim": [
        (ATT96, SM90, "WORK=warps:4 TILE=wgmma:64x64 REDUCE=serial STAGE=async:2",
         ("head dimension 96", "multiple of 64", "flash:BQxBKV")),
        (ATT192, SM90, "WORK=warps:4 TILE=wgmma:64x64 REDUCE=serial STAGE=async:2",
         ("head dimension 192", "N = d", "64, 128, 256"))],
    "tile.v_head_dim": [
        (MLA, SM90, "WORK=warps:4 TILE=wgmma:64x64 REDUCE=serial STAGE=async:2",
         ("q . k over a head dimension of 64 and v over 128", "flash:BQxBKV"))],
    "tile.wgmma_registers": [
        (ATT256, SM90, "WORK=warps:4 TILE=wgmma:64x128 REDUCE=serial STAGE=async:2",
         ("192 f32 accumulators", "over the 160"))],
    "stage.wgmma_shared": [
        (ATT128, SMALL_SHARED, "WORK=warps:8 TILE=wgmma:128x128 REDUCE=serial STAGE=async:2",
         ("161.0 KiB of shared memory", "100 KiB per block"))],
    "tile.rows_per_warp": [
        (ATT, SM90, "WORK=warps:8 TILE=flash:64x32 REDUCE=serial STAGE=smem", ("multiple of 16 rows",))],
    "reduce.split_template": [
        (ATT, SM90, "WORK=warps:4 TILE=wgmma:64x64 REDUCE=split:2:combine STAGE=async:2",
         ("split-KV", "wgmma:64x64", "REDUCE=serial"))],
    "reduce.split_keys": [
        # 70 keys are 3 blocks of 32: runs of 1 leave a fourth split nothing
        (ATT, SM90, "WORK=warps:4 TILE=flash:64x32 REDUCE=split:4:combine STAGE=async:2",
         ("4 splits of 3 key blocks", "without keys")),
        (ATT, SM90, "WORK=warps:4 TILE=flash:64x32 REDUCE=split:8:combine STAGE=async:2",
         ("8 splits of 3 key blocks", "runs of 1"))],
    "stage.async": [
        (ATT, NO_CP_ASYNC, "WORK=warps:4 TILE=flash:64x32 REDUCE=serial STAGE=async:2", ("cp.async needs sm_80",))],
    "stage.tma_wgmma": [
        (ATT, SM90, "WORK=warps:4 TILE=flash:64x32 REDUCE=serial STAGE=tma:2",
         ("TMA producer warpgroup", "cp.async", "STAGE=async:2")),
        (ATT, NO_TMA, "WORK=warps:8 TILE=wgmma:128x64 REDUCE=serial STAGE=tma:2", ("TMA copies need sm_90",)),
        (ATT_F32, SM90, "WORK=warps:4 TILE=simt:64x32 REDUCE=serial STAGE=tma:2",
         ("simt:64x32 (CUDA cores) copies with cp.async",))],
    "stage.tma_tensor_maps": [
        (ATT_SHARED_K, SM90, "WORK=warps:8 TILE=wgmma:128x64 REDUCE=serial STAGE=tma:2",
         ("k's head stride is 0", "tensor map", "STAGE=async:2"))],
    "stage.overlap_wgmma": [
        (ATT, SM90, "WORK=warps:4 TILE=flash:64x32 REDUCE=serial STAGE=async:2:overlap",
         ("pipelines wgmma groups", "mma.sync", "STAGE=async:2"))],
    "stage.template_builds": [
        (ATT128, SM80, "WORK=warps:4 TILE=flash:128x128 REDUCE=serial STAGE=async:2", ("shared memory",)),
        (ATT_F32_256, SM90, "WORK=warps:4 TILE=simt:128x32 REDUCE=serial STAGE=smem",
         ("320 f32 values",))],
}
# a product computing its int8 weight: PLACE=cut leaves each other decision at one value
INT8 = ("examples/int8_linear.py", ())
for _key, _value in (("WORK", "warps:2x2"), ("TILE", "mma:64x64x32"), ("REDUCE", "split:2:combine"),
                     ("STAGE", "async:2"), ("RASTER", "group:8")):
    _row = " ".join(f"{k}={_value if k == _key else v}" for k, v in gemm.CUT_ROW.items()) \
        + " PLACE=cut"
    CASES[f"place.cut_unused_{_key.lower()}"] = [
        (INT8, SM90, _row, ("PLACE=cut makes", f"reads {_key}={gemm.CUT_ROW[_key]}"))]
PARAMS = [pytest.param(rule, *case, id=f"{rule}-{i}")
          for rule, cases in CASES.items() for i, case in enumerate(cases)]


def test_every_template_rule_has_a_case():
    names = {r.name for r in (*gemm.RULES, *flash.RULES, *b2b.RULES)}
    assert names == set(CASES), set(CASES) ^ names


@pytest.mark.parametrize("rule, source, target, text, fragments", PARAMS)
def test_template_rule_refuses_its_row(rule, source, target, text, fragments):
    k = kernel(source[0], source[1]) if isinstance(source, tuple) and len(source) == 2 \
        else kernel(source[0] if isinstance(source, tuple) else source)
    space = Space(k, target)
    row = parse(text)
    refusals = space.check(row)
    assert [r.rule for r in refusals] == [rule], [str(r) for r in refusals]
    for fragment in fragments:
        assert fragment in refusals[0].reason, refusals[0].reason
    assert row not in space.all_rows
