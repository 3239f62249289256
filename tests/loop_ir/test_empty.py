"""Tensors with no elements: an op whose result has none is a constant (no kernel computes
it), a sum or product over no elements is its identity, and a program whose outputs all have
none has no kernels; the runtimes still hand back outputs of the right shape."""

import pytest

from emmy.frontend.workload import load_expr
from emmy.pipeline import compile_to
from tests.tensor_ir.emitted import assert_emitted_cuda_matches_eager

CASES = {
    "softmax of no rows": ("F.softmax(torch.randn(0, 5), dim=1)", 0),
    "amax to no elements": ("torch.randn(3, 0).amax(0)", 0),
    "sum over no elements, to none": ("torch.randn(4, 0, 5).sum(2)", 0),
    "one empty output, one not": ("(torch.randn(4, 0, 5).exp(), torch.randn(3, 4).exp())", 1),
    "a product with k = 0, biased": ("torch.randn(3, 0) @ torch.randn(0, 4) + torch.randn(4)",
                                     1),
    "prod and mean over no elements": ("(torch.randn(3, 0).prod(1), torch.randn(3, 0).mean(1))",
                                       2),
    "cat with an empty part": ("torch.cat([torch.randn(3, 2), torch.randn(3, 0)], 1) * 2", 1),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_programs_with_empty_tensors_compile_and_match_eager(name):
    expr, kernels = CASES[name]
    stages = assert_emitted_cuda_matches_eager(expr)
    assert len(stages["loop"].kernels) == kernels


def test_a_product_over_no_elements_is_its_identity_not_a_matrix_product():
    """mm with k = 0 was a matrix-product kernel that no row could build."""
    stages = compile_to(load_expr("torch.randn(3, 0) @ torch.randn(0, 4) + 1"), "tensor")
    assert "reduce" not in str(stages["tensor"])
