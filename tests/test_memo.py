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
