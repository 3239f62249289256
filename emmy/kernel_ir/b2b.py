"""Lower a fused chain of two products (Tile IR kind `chain`) with a PLACE=fuse row to Kernel
IR: one back-to-back launch from the template (emmy.cuda.chain). The compiler's parts are the
producer's epilogue applied to each element of the intermediate (`mid`: bias, activation, the
program's rounding) and the consumer's epilogue per output element."""

from __future__ import annotations

from emmy.kernel_ir import ir as K
from emmy.kernel_ir.elements import element_epilogue, element_lines
from emmy.loop_ir.ir import Store
from emmy.schedule import b2b as B
from emmy.schedule.row import Row
from emmy.schedule.space import template_config
from emmy.schedule.targets import Target
from emmy.tile_ir.ir import TileKernel


def lower_chain(k: TileKernel, row: Row, target: Target) -> K.KProgram:
    from emmy.cuda.chain import chain_body

    fc = k.chain
    problem, config = template_config(B, k, row, target)
    first, second = fc.first.contract, fc.second.contract
    (store,) = [s for s in first.epilogue if isinstance(s, Store)]
    produce = tuple(s for s in first.epilogue if s is not store)

    def mid(bz: str, r: str, col: str, acc: str) -> tuple[list[str], str]:
        value = "e_acc" if store.value == first.acc else store.value   # no statements between
        return element_lines(fc.first, produce, first.acc, (fc.i, fc.k2), fc.batch,
                             (bz, r, col, acc)), value

    epilogue = element_epilogue(fc.second, second.epilogue, second.acc, (fc.i, fc.j), fc.batch)
    body = chain_body(problem, config, mid, epilogue)
    params = tuple(K.Param(b.name, b.type.dtype.c_name, False) for b in k.inputs) + \
        tuple(K.Param(b.name, b.type.dtype.c_name, True) for b in k.outputs)
    inst = "mma.sync m16n8k16 (f32 accumulate)" if config.inst == "mma" else "f32 FFMA"
    summary = (f"chained products {problem.batch} x ({problem.m} x {problem.k1}) @ "
               f"({problem.k1} x {problem.k2}) @ ({problem.k2} x {problem.n}): "
               f"{fc.a.buffer} · {fc.b.buffer} -> mid -> · {fc.c.buffer}",
               f"  back to back: a {config.bm}x{config.bn} output tile per block on "
               f"{config.wm}x{config.wn} warps, {inst}; the intermediate's {config.bm}x"
               f"{config.bk2} slices ({config.bk1} of K1 per step) recomputed per column tile "
               "in shared memory, never stored",
               f"  producer epilogue {len(produce)} statement(s) per intermediate element, "
               f"consumer epilogue {len(second.epilogue)} per output element")
    f = K.KFunction(name=k.name, params=params, grid=body.grid, threads=body.threads,
                    shared_bytes=body.smem_bytes, body=(K.Template(summary, tuple(body.lines)),),
                    row=str(row))
    return K.KProgram(name=k.name, functions=(f,),
                      launches=(K.Launch(f.name, tuple(p.name for p in params)),),
                      temporaries=(), zero_fill=())
