"""ScoredRows: time columns held for the timed rows only read back as NaN (-1 for a
whole-number column) at the others, in any row order, with the dtype a full column has."""

import numpy as np

from planner.plan import ScoredRows


def _rows() -> ScoredRows:
    timed = np.array([True, False, True, True, False])
    return ScoredRows(untimed={"tp": np.array([1, 2, 4, 8, 16])},
                      times={"step_time_s": np.array([3.0, 1.0, 2.0], dtype=np.float32),
                             "waves": np.array([5, 6, 7], dtype=np.int32)},
                      timed=timed, names=("tp", "step_time_s", "waves"))


def test_untimed_rows_read_nan_or_minus_one():
    rows = _rows()
    np.testing.assert_array_equal(rows.column("step_time_s"), [3.0, np.nan, 1.0, 2.0, np.nan])
    np.testing.assert_array_equal(rows.column("waves"), [5, -1, 6, 7, -1])
    assert rows.column("step_time_s").dtype == np.float64
    assert rows.column("waves").dtype == np.int64


def test_take_in_ranked_order():
    order = np.array([3, 1, 0, 4, 2])
    taken = _rows().take(order)
    np.testing.assert_array_equal(taken["tp"], [8, 2, 1, 16, 4])
    np.testing.assert_array_equal(taken["step_time_s"], [2.0, np.nan, 3.0, np.nan, 1.0])
    np.testing.assert_array_equal(taken["waves"], [7, -1, 5, -1, 6])
