"""The row-wise reductions the memory model uses over per-stage arrays equal numpy's stacked
ones, value for value and dtype for dtype (NaN, ties and mixed dtypes included)."""

import numpy as np
import pytest

from planner.cost.memory import argmax_rows, max_rows, pick_rows


@pytest.fixture
def stages():
    rng = np.random.default_rng(7)
    arrays = [rng.integers(0, 5, 1000).astype(float) for _ in range(4)]  # many ties
    arrays[1][::97] = np.nan
    arrays[3] = arrays[3].astype(np.int64)  # a whole-number stage among float ones
    return arrays


def test_max_rows_is_numpys_max_over_the_stack(stages):
    expected = np.max(stages, axis=0)
    got = max_rows(stages)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_argmax_rows_takes_the_first_largest_and_never_a_nan(stages):
    before = [values.copy() for values in stages]
    index, best = argmax_rows(stages)
    # the reference: a strict ``>`` scan, as the rows' peak stage was always chosen
    ref_best, ref_index = np.asarray(stages[0], dtype=float), np.zeros(1000, dtype=np.int64)
    for i, values in enumerate(stages[1:], start=1):
        larger = values > ref_best
        ref_index = np.where(larger, i, ref_index)
        ref_best = np.where(larger, values, ref_best)
    np.testing.assert_array_equal(index, ref_index)
    np.testing.assert_array_equal(best, ref_best)
    assert index.dtype == np.int64 and best.dtype == np.float64
    for values, kept in zip(stages, before):  # the inputs are left as they were
        np.testing.assert_array_equal(values, kept)


def test_pick_rows_is_numpys_choose(stages):
    index, _ = argmax_rows(stages)
    expected = np.choose(index, stages)
    got = pick_rows(index, stages)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def _copyto_argmax(arrays):
    """argmax_rows as it was: a masked copy per array (the reference of the branch-free one)."""
    best = np.array(arrays[0], dtype=np.result_type(*arrays))
    index = np.zeros(best.shape, dtype=np.int64)
    for i, values in enumerate(arrays[1:], start=1):
        larger = values > best
        np.copyto(index, i, where=larger)
        np.copyto(best, values, where=larger)
    return index, best


REDUCED = {
    "bytes": lambda rng: [rng.integers(1, 9, 5000) * 1e9 for _ in range(4)],
    "nan among them": lambda rng: [np.where(rng.random(5000) < 0.1, np.nan,
                                            rng.integers(1, 9, 5000) * 1.0) for _ in range(4)],
    "signed zeros": lambda rng: [rng.choice([0.0, -0.0, 1.0], 5000) for _ in range(3)],
    "integers": lambda rng: [rng.integers(0, 4, 5000) for _ in range(5)],
    "one array": lambda rng: [rng.random(50)],
}


@pytest.mark.parametrize("name", list(REDUCED))
def test_the_branch_free_argmax_is_the_masked_copys(name):
    arrays = REDUCED[name](np.random.default_rng(11))
    index, best = argmax_rows(arrays)
    want_index, want_best = _copyto_argmax(arrays)
    assert index.dtype == want_index.dtype and best.dtype == want_best.dtype
    np.testing.assert_array_equal(index, want_index)
    np.testing.assert_array_equal(best.view(np.uint8), want_best.view(np.uint8))


@pytest.mark.parametrize("low, high", [(0, 5), (-1, 6)])
def test_pick_rows_of_integers_is_the_masked_copys(low, high):
    """Stage indices picked per row by a sum (in range) or masked copies (out of range: the
    first array's value, as before)."""
    rng = np.random.default_rng(12)
    arrays = [rng.integers(0, 4, 3000).astype(np.int8) for _ in range(5)]
    arrays[0] = arrays[0].astype(np.int64)
    index = rng.integers(low, high, 3000)
    want = np.array(arrays[0], dtype=np.int64)
    for i, values in enumerate(arrays[1:], start=1):
        np.copyto(want, values, where=index == i)
    got = pick_rows(index, arrays)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
