"""Lower a contraction kernel (Tile IR kind `contract`) with its row to Kernel IR.

The tiled product comes from a template (emmy.cuda.gemm for mma.sync and SIMT tiles,
emmy.cuda.gemm_sm90 for wgmma); the compiler's part is the fused epilogue: the Tile IR
statements after the fold (bias, activation, scaling, residual, the store), lowered for one
output element at the template's (batch, row, column) with the accumulator bound to `e_acc`.
REDUCE=split:S:combine launches two functions: the partial products into a scratch buffer,
then a combine that sums them and runs the epilogue; split:S:last one, whose last block of each
tile sums them (a scratch buffer of partials and one of tickets, which stays zero).
"""

from __future__ import annotations

from dataclasses import replace

from emmy.cuda.gemm_spec import (PARTIAL, TICKETS, Body, Epilogue, Gather, GemmConfig,
                                 GemmProblem, VectorGather, WindowGather)
from emmy.kernel_ir import ir as K
from emmy.kernel_ir.elements import (element_epilogue, element_gather, element_vector,
                                     element_window)
from emmy.loop_ir.ir import Load
from emmy.schedule import gemm as G
from emmy.schedule.row import Row
from emmy.schedule.space import template_config
from emmy.schedule.targets import Target
from emmy.tile_ir.ir import TileKernel


def lower_contract(k: TileKernel, row: Row, target: Target) -> K.KProgram:
    problem, config = template_config(G, k, row, target)
    atomic = config.split_mode == "atomic"
    epilogue = make_epilogue(k, atomic=atomic)
    params = tuple(K.Param(b.name, b.type.dtype.c_name, False) for b in k.inputs) + \
        tuple(K.Param(b.name, b.type.dtype.c_name, True) for b in k.outputs)
    summary = _summary(k, problem, config)
    headers: tuple[str, ...] = ()
    if config.inst == "wgmma":
        from emmy.cuda.gemm_sm90 import HEADER, gemm_sm90_body

        body = gemm_sm90_body(problem, config, epilogue, sm_count=target.sm_count,
                              gather=make_gathers(k, problem))
        headers = (HEADER,)
    else:
        from emmy.cuda.gemm import gemm_body

        body = gemm_body(problem, config, epilogue, make_gathers(k, problem))
    if config.split_mode == "last":
        return _last_block_program(k, problem, config, params, body, summary, row, headers)
    if config.split_mode != "combine":
        maps = getattr(body, "tensor_maps", ())
        # a map's buffer is named after the kernel (a program may hold several wgmma kernels);
        # inside the function it keeps the template's parameter name
        unique = {tm.name: f"{k.name}_{tm.name}" for tm in maps}
        f = _function(k.name, params + tuple(K.Param(tm.name, "EmmyTensorMap", False)
                                             for tm in maps), body, summary, row,
                      tuple(replace(tm, name=unique[tm.name]) for tm in maps))
        return K.KProgram(name=k.name, functions=(f,),
                          launches=(K.Launch(f.name, tuple(unique.get(a, a) for a in _args(f))),),
                          temporaries=(), zero_fill=tuple(b.name for b in k.outputs) if atomic
                          else (), headers=headers)
    from emmy.cuda.gemm import combine_body

    scratch = f"{k.name}_partial"
    con = k.contract
    operands = {problem.a.buffer, problem.b.buffer} | {   # and what a computed operand reads
        s.buffer for s in (*con.a.gather, *con.b.gather) if isinstance(s, Load)}
    first = _function(f"{k.name}_partial",
                      tuple(p for p in params if p.name in operands)
                      + (K.Param(PARTIAL, "float", True),), body,
                      summary + (f"partial sums -> {PARTIAL}[{config.split}][batch][m][n]",), row)
    rest = tuple(p for p in params if p.is_output or p.name not in operands or _epilogue_reads(k, p.name))
    second = _function(f"{k.name}_combine", (K.Param(PARTIAL, "float", False),) + rest,
                       combine_body(problem, config, epilogue),
                       (f"sum the {config.split} partials of {PARTIAL}, then the epilogue",), row)
    count = config.split * problem.batch * problem.m * problem.n
    rename = {PARTIAL: scratch}
    return K.KProgram(name=k.name, functions=(first, second),
                      launches=tuple(K.Launch(f.name, tuple(rename.get(a, a) for a in _args(f)))
                                     for f in (first, second)),
                      temporaries=((scratch, "float", count),), zero_fill=(), headers=headers)


def _function(name: str, params, body: Body, summary, row: Row,
              tensor_maps: tuple = ()) -> K.KFunction:
    return K.KFunction(name=name, params=params, grid=body.grid, threads=body.threads,
                       shared_bytes=body.smem_bytes,
                       body=(K.Template(tuple(summary), tuple(body.lines)),), row=str(row),
                       tensor_maps=tensor_maps, min_blocks=body.min_blocks,
                       cluster=body.cluster, persistent=body.persistent)


def _args(f: K.KFunction) -> tuple[str, ...]:
    return tuple(p.name for p in f.params)


def _epilogue_reads(k: TileKernel, buffer: str) -> bool:
    from emmy.loop_ir.ir import Load

    return any(isinstance(s, Load) and s.buffer == buffer for s in k.contract.epilogue)


def make_epilogue(k: TileKernel, *, atomic: bool = False) -> Epilogue:
    """C statements for one output element (and for two neighbouring ones, its `pair`): the
    Tile IR epilogue at (e_bz, e_row, e_col)."""
    con = k.contract
    return element_epilogue(replace(k, atomic=atomic), con.epilogue, con.acc, (con.m, con.n),
                            con.batch, parts={con.m.var: con.a.parts, con.n.var: con.b.parts})


def make_gathers(k: TileKernel, problem: GemmProblem
                 ) -> dict[str, Gather | WindowGather | VectorGather]:
    """The element functions of the gathered operands, by the template's names ("a", "b"):
    the window form where the operand has one, the vector form where a computed operand's
    raw elements come whole vectors at a time, else its statements per element."""
    con = k.contract
    bounds = {a.var: a.extent for a in k.grid}
    out: dict[str, Gather | WindowGather] = {}
    for name, op, spec in (("a", con.a, problem.a), ("b", con.b, problem.b)):
        parts = op.parts or ((con.m if name == "a" else con.n),)
        if op.window is not None:
            out[name] = element_window(op.window, parts, con.k, con.batch, bounds)
        elif spec.vector > 1:     # emmy.schedule.gemm.vector_width
            out[name] = element_vector(k, op, parts, con.k, con.batch, spec.vector, op.k_major,
                                       spec.paired)
        elif op.gathered:
            out[name] = element_gather(k, op.gather, op.value, parts, con.k, con.batch)
    return out


def _last_block_program(k: TileKernel, problem: GemmProblem, config: GemmConfig, params,
                        body: Body, summary, row: Row, headers) -> K.KProgram:
    """split:S:last: one function, whose blocks store their partial sums into a scratch
    buffer and take a ticket for their tile (another buffer, zero before and after each run);
    the last of a tile's S blocks sums the partials and runs the epilogue."""
    from emmy.cuda.gemm import _Plan

    tiles = problem.batch * _Plan(problem, config).tiles
    names = {PARTIAL: f"{k.name}_partial", TICKETS: f"{k.name}_tickets"}
    f = _function(k.name, params + (K.Param(PARTIAL, "float", True),
                                    K.Param(TICKETS, "int", True)), body,
                  summary + (f"partial sums -> {PARTIAL}[{config.split}][batch][m][n], summed "
                             f"by each tile's last block",), row)
    count = config.split * problem.batch * problem.m * problem.n
    return K.KProgram(name=k.name, functions=(f,),
                      launches=(K.Launch(f.name, tuple(names.get(a, a) for a in _args(f))),),
                      temporaries=((names[PARTIAL], "float", count),
                                   (names[TICKETS], "int", tiles)),
                      zero_fill=(), zeroed=(names[TICKETS],), headers=headers)


def _summary(k: TileKernel, p: GemmProblem, c: GemmConfig) -> tuple[str, ...]:
    con = k.contract
    inst = {"mma": "mma.sync m16n8k16 (tensor cores, f32 accumulate)",
            "simt": "f32 FFMA (CUDA cores)", "wgmma": "wgmma.mma_async (sm_90a warpgroups)",
            "tf32": "mma.sync m16n8k8 on tf32-rounded f32 operands (tensor cores)"}
    stage = ("TMA + mbarrier" if c.tma else "cp.async") + f", {c.stages} stages" \
        if c.stages > 1 or c.tma else "synchronous copies, one buffer"
    lines = [f"matrix product {p.batch} x ({p.m} x {p.k}) @ ({p.k} x {p.n}): "
             f"{con.a.buffer} · {con.b.buffer} over {con.k.var}",
             f"  instruction {inst[c.inst]}",
             f"  block tile {c.bm}x{c.bn}x{c.bk}, {c.wm}x{c.wn} warps "
             f"(warp tile {c.bm // c.wm}x{c.bn // c.wn}), staging: {stage}",
             f"  launch order: {'row-major' if c.group == 1 else f'groups of {c.group} tile rows'}"]
    if c.split > 1:
        lines.append(f"  K split over {c.split} blocks ({c.split_mode})")
    lines.append(f"  epilogue: {len(con.epilogue)} statement(s) per element, reading {con.acc}")
    return tuple(lines)
