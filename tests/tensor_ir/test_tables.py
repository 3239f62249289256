"""Constant tables of positions read back as index expressions (emmy.tensor_ir.tables): the
expression found is exact on every entry, reshapes and transposes of ranges are found, and a
read through a lifted constant list is an index map, fused where a gather was not."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from emmy import symbolic
from emmy.tensor_ir.ir import Gather, IndexMap, Iota
from emmy.tensor_ir.tables import MAX_ELEMENTS, table_index
from tests.tensor_ir.conftest import Fn, check_module

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]


def _values(expr: symbolic.Lin, shape) -> np.ndarray:
    grids = np.meshgrid(*(np.arange(n) for n in shape), indexing="ij")
    env = {f"a{i}": g for i, g in enumerate(grids)}
    return np.broadcast_to(symbolic.evaluate(expr, env), shape)


@pytest.mark.parametrize("table, text", [
    (AWQ_REVERSE_ORDER, "(a0 / 2) + (a0 % 2)*4"),
    (AWQ_ORDER, "(a0 / 4) + (a0 % 4)*2"),
    (list(range(8)), "a0"),
    ([7, 6, 5, 4, 3, 2, 1, 0], "-a0 + 7"),
    ([3, 3, 3], "3"),
    ([(i % 3) * 4 + i // 3 for i in range(12)], "(a0 / 3) + (a0 % 3)*4"),   # 3 x 4 transposed
])
def test_reshaped_and_transposed_ranges_are_digit_sums(table, text):
    expr = table_index(np.array(table))
    assert str(expr) == text
    assert np.array_equal(_values(expr, (len(table),)), table)


@pytest.mark.parametrize("table", [[0, 1, 3, 2], [5, 1, 4], [[0, 1], [1, 0]]])
def test_tables_that_are_no_digit_sum_stay_data(table):
    assert table_index(np.array(table)) is None


def test_floats_and_large_tables_stay_data():
    assert table_index(np.array([0.0, 1.0])) is None
    assert table_index(np.arange(MAX_ELEMENTS + 1)) is None
    assert table_index(np.arange(MAX_ELEMENTS)) is not None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.randoms(use_true_random=False),
       st.integers(-3, 3), st.integers(-50, 50), st.integers(1, 3))
def test_any_permuted_reshape_of_a_range_is_found_exactly(dims, rnd, scale, offset, rank):
    """arange(n).reshape(dims).permute(p).reshape(rank dims) * scale + offset: found, and the
    expression equals the table everywhere."""
    n = int(np.prod(dims))
    perm = list(range(len(dims)))
    rnd.shuffle(perm)
    flat = (np.arange(n).reshape(dims).transpose(perm) * scale + offset).reshape(-1)
    cut = sorted(rnd.sample(range(1, len(dims)), min(rank - 1, len(dims) - 1)))
    shape = [int(np.prod(p)) for p in np.split(np.array(dims)[perm], cut)]
    table = flat.reshape(shape)
    expr = table_index(table)
    assert expr is not None, table
    assert np.array_equal(_values(expr, table.shape), table)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-9, 9), min_size=1, max_size=12))
def test_a_found_expression_is_always_exact(values):
    expr = table_index(np.array(values))
    if expr is not None:
        assert np.array_equal(_values(expr, (len(values),)), values)


def test_indexing_with_a_constant_list_is_an_index_map():
    """AWQ's reverse order applied to eight nibbles a word: no Gather left, the same values."""
    def unpack(w):
        shifts = torch.arange(0, 32, 4)
        nibbles = (w[:, :, None] >> shifts).view(w.shape[0], -1)
        order = torch.arange(nibbles.shape[-1]).view(-1, 8)[:, AWQ_REVERSE_ORDER].view(-1)
        return nibbles[:, order] & 15

    w = torch.randint(-2**31, 2**31 - 1, (5, 3), dtype=torch.int32)
    program = check_module(Fn(unpack), w)
    assert not any(isinstance(d, Gather) for d in program.defs)
    assert any(isinstance(d, IndexMap) for d in program.defs)


def test_a_registered_buffer_of_positions_is_read_as_an_index_map():
    """A buffer's values are the program's from compile time on (emmy.compile binds them when
    it compiles), so a buffer of positions folds like a constant; one that is no digit sum
    (GPTQ's g_idx under act-order) stays a gather."""
    class Shuffle(torch.nn.Module):
        def __init__(self, order):
            super().__init__()
            self.register_buffer("order", torch.tensor(order))

        def forward(self, x):
            return x[:, self.order]

    program = check_module(Shuffle(AWQ_REVERSE_ORDER), torch.randn(3, 8))
    assert not any(isinstance(d, Gather) for d in program.defs)
    assert "order" not in program.values
    program = check_module(Shuffle([0, 1, 3, 2, 5, 4, 7, 6][::-1]), torch.randn(3, 8))
    assert any(isinstance(d, Gather) for d in program.defs)


def test_gptq_group_index_buffer_folds_into_one_fused_product():
    """GPTQ's reference forward reading scales and zero points through `g_idx` (a buffer, k //
    128 without act-order): the group index is index arithmetic and the layer one kernel."""
    from emmy.frontend.workload import Workload
    from emmy.pipeline import Options, compile_to

    class GroupIndexed(torch.nn.Module):
        def __init__(self, k=256, n=64, group=128):
            super().__init__()
            self.register_buffer("qweight", torch.randint(0, 16, (k, n), dtype=torch.int32))
            self.register_buffer("zeros", torch.randint(6, 10, (k // group, n),
                                                        dtype=torch.int32))
            self.register_buffer("scales", torch.rand(k // group, n).half() * 0.02 + 0.001)
            self.register_buffer("g_idx", torch.arange(k, dtype=torch.int32) // group)

        def forward(self, x):
            g = self.g_idx.long()
            return x @ ((self.qweight - self.zeros[g]).to(x.dtype) * self.scales[g])

    workload = Workload(name="g_idx", model=GroupIndexed().eval(),
                        inputs=(torch.randn(4, 256).half(),), source="", origin="<test>")
    tile = compile_to(workload, "tile", Options())["tile"].program
    assert len(tile.kernels) == 1 and "g_idx" not in [b.name for b in tile.kernels[0].inputs]


def test_a_tensor_attribute_of_shifts_is_computed_from_an_iota():
    """AutoGPTQ's `self.wf` (a plain tensor attribute, which torch.export lifts as a
    constant) used as values, not positions: the program computes it (no load), so the shifts
    are index arithmetic downstream."""
    class Unpack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wf = torch.tensor(list(range(0, 32, 4)), dtype=torch.int32).unsqueeze(0)

        def forward(self, q):
            return torch.bitwise_right_shift(q.unsqueeze(2), self.wf.unsqueeze(0)) & 15

    program = check_module(Unpack(), torch.randint(-2**31, 2**31 - 1, (4, 3), dtype=torch.int32))
    assert [d.name for d in program.inputs] == ["q"]
    assert any(isinstance(d, Iota) for d in program.defs)


@pytest.mark.parametrize("values", [[0, 10**12], [5, 5, 5], [-3, 4, 11], [[7, 1], [8, 2]]])
def test_tables_of_any_range_are_computed_digit_by_digit(values):
    """Far-apart entries (no iota over their range), constants, negative starts, two axes: the
    same values as eager, from the table's own digits."""
    table = torch.tensor(values)

    class Add(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.t = table

        def forward(self, x):
            return x + self.t

    program = check_module(Add(), torch.randint(-9, 9, table.shape))
    assert [d.name for d in program.inputs] == ["x"]
    assert all(d.type.shape[0] <= max(table.shape) for d in program.defs if isinstance(d, Iota))


def test_a_table_whose_terms_leave_its_type_stays_data():
    """[-2**31, 2**31 - 1] in int32 is -2**31 + (2**32 - 1) * a0: exact, but its term before
    the constant is added holds values int32 does not; it stays a load."""
    class Add(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.t = torch.tensor([-2**31, 2**31 - 1], dtype=torch.int32)

        def forward(self, x):
            return x + self.t

    program = check_module(Add(), torch.randint(-9, 9, (2,), dtype=torch.int32))
    assert sorted(d.name for d in program.inputs) == ["t", "x"]
