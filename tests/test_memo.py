"""Stage results kept by the identity of the IR objects they come from (emmy.memo): the same
answer as computing afresh, computed once."""

from emmy.frontend.workload import load_expr
from emmy.memo import ByIdentity
from emmy.pipeline import Options, compile_to, resume_from


def test_a_result_is_made_once_per_object_and_extra_key():
    table, made = ByIdentity(kept=3), []
    a, b = [1], [1]                      # equal, not the same object

    def make(tag):
        return lambda: made.append(tag) or tag

    assert table(a, "x", make("a")) == "a" and table(a, "x", make("again")) == "a"
    assert table(b, "x", make("b")) == "b" and table(a, "y", make("ay")) == "ay"
    assert made == ["a", "b", "ay"]
    table([2], "x", make("full"))        # the fourth entry: the table starts over
    assert table(a, "x", make("a2")) == "a2"


def test_rows_of_one_kernel_reuse_the_other_kernels_ir_and_match_a_fresh_compile():
    w = load_expr("torch.softmax(torch.randn(64, 300), -1) @ torch.randn(300, 32)")
    front = compile_to(w, "loop")
    first = resume_from(front, "cuda", Options())
    kernels = [k.name for k in first["tile"].program.kernels]
    assert len(kernels) == 2
    row = "WORK=warps:1x2 TILE=simt:32x32x8 REDUCE=serial STAGE=smem RASTER=row"
    again = resume_from(front, "cuda", Options(rows={kernels[1]: row}))
    assert again["kernel"].kernels[0] is first["kernel"].kernels[0]      # taken, not rebuilt
    assert again["kernel"].kernels[1] is not first["kernel"].kernels[1]
    fresh = compile_to(load_expr("torch.softmax(torch.randn(64, 300), -1) @ "
                                 "torch.randn(300, 32)"), "cuda", Options(rows={kernels[1]: row}))
    assert [u.source for u in again["cuda"].units] == [u.source for u in fresh["cuda"].units]


def test_estimates_through_the_memos_match_estimates_made_afresh():
    """A kernel's Space and its launches' work counts are kept (emmy.schedule.space.space_of,
    emmy.runtime.costmodel.api); the L2 state is not: a row's modeled time after other rows
    were estimated equals the time a fresh compile of the same rows models."""
    from emmy.runtime.costmodel import estimate_compiled
    from emmy.schedule.space import space_of
    from emmy.schedule.targets import get_target

    expr = "torch.softmax(torch.randn(64, 300), -1) * torch.randn(300).sigmoid()"
    front = compile_to(load_expr(expr), "loop")
    base = resume_from(front, "tile", Options())["tile"].program
    k = base.kernels[0]
    sm90, sm80 = get_target("sm_90a"), get_target("sm_80")
    assert space_of(k, sm90) is space_of(k, sm90) and space_of(k, sm80) is not space_of(k, sm90)
    rows = [str(r) for r in space_of(k, sm90).sample(4, 2)]
    kept = [estimate_compiled(resume_from(front, "cuda", Options(rows={k.name: r}))).seconds
            for r in rows + rows]
    fresh = [estimate_compiled(compile_to(load_expr(expr), "cuda", Options(rows={k.name: r})))
             .seconds for r in rows]
    assert kept == fresh + fresh
