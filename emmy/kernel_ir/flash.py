"""Lower an attention kernel (Tile IR kind `attention`) with its row to Kernel IR: one
flash-attention launch from the template (emmy.cuda.attention); the compiler's part is the
store of each output element (the cast to the output type, the output's layout)."""

from __future__ import annotations

from emmy.cuda.emit import _block as emit_block
from emmy.kernel_ir import ir as K
from emmy.kernel_ir.context import Fn
from emmy.kernel_ir.elements import stmts
from emmy.schedule import flash as F
from emmy.schedule.row import Row
from emmy.schedule.space import template_config
from emmy.schedule.targets import Target
from emmy.symbolic import var
from emmy.tile_ir.ir import TileKernel


def flash_config(k: TileKernel, row: Row, target: Target):
    return template_config(F, k, row, target)


def lower_attention(k: TileKernel, row: Row, target: Target) -> K.KProgram:
    from emmy.cuda.attention import attention_body

    att = k.attention
    problem, config = flash_config(k, row, target)
    items = tuple(x for x in (att.cast, att.store) if x is not None)
    acc = att.cast.arg if att.cast else att.store.value
    names = ["e_b", "e_h"][2 - len(att.batch):] if att.batch else []
    env = {ax.var: var(n) for ax, n in zip(att.batch, names)}
    env |= {att.query.var: var("e_row"), att.d_var: var("e_col")}
    bounds = {"e_b": problem.batch, "e_h": problem.heads, "e_row": problem.sq, "e_col": problem.d}
    shapes = {b.name: b.type.shape for b in (*k.inputs, *k.outputs)}
    from emmy.tile_ir.values import value_types

    def store(bz: str, h: str, row_: str, col: str, value: str) -> list[str]:
        fn = Fn(k, None, value_types(items), shapes, dict(bounds))
        body = stmts(fn, items, "", env, lane0_stores=False, accs={acc: "e_val"})
        return ["{", f"  const long long e_b = {bz};", f"  const long long e_h = {h};",
                f"  const int e_row = {row_};", f"  const int e_col = {col};",
                f"  const float e_val = {value};", *emit_block(body, 1), "}"]

    body = attention_body(problem, config, store)
    params = tuple(K.Param(b.name, b.type.dtype.c_name, False) for b in k.inputs) + \
        tuple(K.Param(b.name, b.type.dtype.c_name, True) for b in k.outputs)
    summary = (f"attention {problem.batch}x{problem.heads} heads, {problem.sq} queries x "
               f"{problem.sk} keys, head dim {problem.d}, scale {problem.scale:g}"
               f"{', causal' if problem.causal else ''}",
               f"  flash: {config.bq} queries per block, {config.bkv} keys per step, "
               f"{config.warps} warps; online softmax (running max and sum, rescaled output)",
               "  Q K^T and P V on mma.sync m16n8k16 (f32 accumulate); K/V "
               + ("double-buffered by cp.async" if config.stages > 1 else "copied synchronously"))
    f = K.KFunction(name=k.name, params=params, grid=body.grid, threads=body.threads,
                    shared_bytes=body.smem_bytes, body=(K.Template(summary, tuple(body.lines)),),
                    row=str(row))
    return K.KProgram(name=k.name, functions=(f,), launches=(K.Launch(f.name, tuple(
        p.name for p in params)),), temporaries=(), zero_fill=())
