"""Lower an attention kernel (Tile IR kind `attention`) with its row to Kernel IR: one
flash-attention launch from the template (emmy.cuda.attention on mma.sync, or
emmy.cuda.attention_sm90 on wgmma when the row's TILE is wgmma:..., or emmy.cuda.attention_simt
on CUDA cores for f32 operands, TILE=simt:...); the compiler's part is the
store of each output element (the cast to the output type, the output's layout). A split-KV
row (REDUCE=split:S:combine) launches two functions: the template's blocks write partial
outputs to a scratch buffer, a combine kernel merges them and stores; split:S:last one, whose
last block of each query block merges them (a scratch buffer of partials and one of tickets,
which stays zero)."""

from __future__ import annotations

from dataclasses import replace

from emmy.cuda.gemm_spec import PARTIAL, TICKETS
from emmy.kernel_ir import ir as K
from emmy.kernel_ir.elements import element_lines
from emmy.schedule import flash as F
from emmy.schedule.row import Row
from emmy.schedule.space import template_config
from emmy.schedule.targets import Target
from emmy.tile_ir.ir import Axis, TileKernel


def lower_attention(k: TileKernel, row: Row, target: Target) -> K.KProgram:
    from emmy.cuda.attention import attention_body

    att = k.attention
    problem, config = template_config(F, k, row, target)
    items = tuple(x for x in (att.cast, att.store) if x is not None)
    acc = att.cast.arg if att.cast else att.store.value
    dim = Axis(att.d_var, att.dim_v)

    def store(bz: str, h: str, row_: str, col: str, value: str) -> list[str]:
        # the batch axes (batch, heads) flatten row-major, as element_lines decodes them
        g = problem.query_heads
        if g > 1:            # query row r of key/value head h is query head h * g + r
            h, row_ = f"({h}) * {g} + ({row_})", "0"
        flat = f"(long long)({bz}) * {problem.heads * g} + ({h})"
        lines = element_lines(k, items, acc, (att.query, dim), att.batch, (flat, row_, col, value))
        return ["{", *("  " + line for line in lines), "}"]

    headers: tuple[str, ...] = ()
    if config.inst == "wgmma":
        from emmy.cuda.attention_sm90 import HEADER, attention_sm90_body

        body = attention_sm90_body(problem, config, store)
        headers = (HEADER,)
        how = (f"  flash (wgmma): {config.bq} queries per block ({config.bq // 64} consumer "
               f"warpgroup(s) of 64 rows), {config.bkv} keys per step; online softmax",
               "  Q K^T on wgmma m64n{}k16 from shared memory, P V on wgmma m64n{}k16 with P in "
               "registers (f32 accumulate); K/V {}".format(
                   config.bkv, problem.d, "double-buffered by cp.async" if config.stages > 1
                   else "copied synchronously"))
        if getattr(config, "tma", False):
            how = (how[0], how[1].replace(
                "double-buffered by cp.async",
                "in a 2-stage ring loaded by a TMA producer warpgroup (full/empty mbarriers)"))
        if getattr(config, "overlap", False):
            how += ("  overlapped: S of key block j and P V of block j - 1 are issued "
                    "together; the softmax of block j runs while P V does",)
    elif config.inst == "simt":
        from emmy.cuda.attention_simt import attention_simt_body

        body = attention_simt_body(problem, config, store)
        how = (f"  flash (CUDA cores): {config.bq} queries per block, {config.bkv} keys per "
               f"step, {config.warps} warps; online softmax (running max and sum, rescaled "
               f"output)",
               "  Q K^T and P V as f32 FMAs (4 row groups x 8 key lanes a warp; P through "
               "shared memory); K/V " + ("double-buffered by cp.async" if config.stages > 1
                                        else "copied synchronously"))
    else:
        body = attention_body(problem, config, store)
        how = (f"  flash: {config.bq} queries per block, {config.bkv} keys per step, "
               f"{config.warps} warps; online softmax (running max and sum, rescaled output)",
               "  Q K^T and P V on mma.sync m16n8k16 (f32 accumulate); K/V "
               + ("double-buffered by cp.async" if config.stages > 1 else "copied synchronously"))
    params = tuple(K.Param(b.name, b.type.dtype.c_name, False) for b in k.inputs) + \
        tuple(K.Param(b.name, b.type.dtype.c_name, True) for b in k.outputs)
    # TMA rows: a parameter per tensor map (after the buffers), filled by the runtime; its
    # buffer is named after the kernel (as emmy.kernel_ir.gemm does: a program may hold several)
    maps = getattr(body, "tensor_maps", ())
    unique = {tm.name: f"{k.name}_{tm.name}" for tm in maps}
    params += tuple(K.Param(tm.name, "EmmyTensorMap", False) for tm in maps)
    grouped = (f" (one query a head: the {problem.query_heads} query heads of each key/value "
               f"head as its query rows)" if problem.query_heads > 1 else "")
    summary = (f"attention {problem.batch}x{problem.heads} heads, {problem.sq} queries x "
               f"{problem.sk} keys, head dim {problem.d}"
               f"{f' (v and out {problem.dv})' if problem.dv != problem.d else ''}, "
               f"scale {problem.scale:g}{grouped}"
               f"{', causal' if problem.causal else ''}"
               f"{f', q.k rounded to {problem.rounded}' if problem.rounded else ''}", *how)
    if config.splits > 1:
        return _split(k, row, params, problem, config, body, store, summary)
    f = K.KFunction(name=k.name, params=params, grid=body.grid, threads=body.threads,
                    shared_bytes=body.smem_bytes, body=(K.Template(summary, tuple(body.lines)),),
                    row=str(row), tensor_maps=tuple(replace(tm, name=unique[tm.name])
                                                    for tm in maps),
                    min_blocks=body.min_blocks)
    return K.KProgram(name=k.name, functions=(f,), launches=(K.Launch(f.name, tuple(
        unique.get(p.name, p.name) for p in params)),), temporaries=(), zero_fill=(),
        headers=headers)


def _split(k: TileKernel, row: Row, params, problem, config, body, store,
           summary) -> K.KProgram:
    """Split-KV: the template's blocks write partials to `<kernel>_partial`; then a combine
    kernel stores the output (emmy.cuda.attention.combine_body), or (split_mode "last") the
    last block of each query block does, counting its blocks in `<kernel>_tickets`."""
    from emmy.cuda.attention import _qblocks, combine_body, partial_floats

    scratch = {PARTIAL: f"{k.name}_partial", TICKETS: f"{k.name}_tickets"}
    temporaries = ((scratch[PARTIAL], "float", partial_floats(problem, config)),)
    inputs = tuple(p for p in params if not p.is_output)
    outputs = tuple(p for p in params if p.is_output)
    if config.split_mode == "last":
        blocks = problem.batch * problem.heads * _qblocks(problem, config)
        f = K.KFunction(
            name=k.name, params=params + (K.Param(PARTIAL, "float", True),
                                          K.Param(TICKETS, "int", True)),
            grid=body.grid, threads=body.threads, shared_bytes=body.smem_bytes,
            body=(K.Template(summary + (f"  split-KV: {config.splits} blocks per query block, "
                                        f"partial outputs and row log-sum-exp -> {PARTIAL}, "
                                        f"combined by each query block's last block",),
                             tuple(body.lines)),),
            row=str(row), min_blocks=body.min_blocks)
        return K.KProgram(name=k.name, functions=(f,), launches=(K.Launch(f.name, tuple(
            scratch.get(p.name, p.name) for p in f.params)),),
            temporaries=temporaries + ((scratch[TICKETS], "int", blocks),), zero_fill=(),
            zeroed=(scratch[TICKETS],), headers=())
    first = K.KFunction(
        name=f"{k.name}_partial", params=inputs + (K.Param(PARTIAL, "float", True),),
        grid=body.grid, threads=body.threads, shared_bytes=body.smem_bytes,
        body=(K.Template(summary + (f"  split-KV: {config.splits} blocks per query block, "
                                    f"partial outputs and row log-sum-exp -> {PARTIAL}",),
                         tuple(body.lines)),),
        row=str(row), min_blocks=body.min_blocks)
    comb = combine_body(problem, config, store)
    second = K.KFunction(
        name=f"{k.name}_combine", params=(K.Param(PARTIAL, "float", False),) + outputs,
        grid=comb.grid, threads=comb.threads, shared_bytes=0,
        body=(K.Template((f"combine the {config.splits} splits of {PARTIAL}: weighted by "
                          f"2^(lse - max lse), then stored",), comb.lines),), row=str(row))
    return K.KProgram(name=k.name, functions=(first, second),
                      launches=tuple(K.Launch(f.name, tuple(scratch.get(p.name, p.name)
                                                            for p in f.params))
                                     for f in (first, second)),
                      temporaries=temporaries, zero_fill=(), headers=())
