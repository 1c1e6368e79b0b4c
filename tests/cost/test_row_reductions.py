"""The row-wise reductions the memory model uses over per-stage arrays equal numpy's stacked
ones, value for value and dtype for dtype (NaN, ties and mixed dtypes included)."""

import numpy as np
import pytest

from planner.cost.memory import argmax_rows, max_rows


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
