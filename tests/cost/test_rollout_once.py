"""``estimate_memory`` evaluates the rollout engine's memory once per distinct (rollout layout,
utilization, resident bytes) and spreads it over the rows: the same values, row by row, as
:func:`planner.cost.memory.rollout_memory` on every row."""

import numpy as np
import pytest
from conftest import cluster

from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cost.memory import _rollout_memory_once, rollout_memory
from planner.cost.request import PlanRequest


@pytest.fixture
def rows():
    rng = np.random.default_rng(2)
    n = 5000
    tp = rng.choice([1, 2, 4, 8], n)
    dp = rng.choice([1, 2], n)
    cols = {"rollout_tp": tp, "rollout_dp": dp,
            "rollout_ep": np.where(rng.random(n) < 0.5, 1, tp * dp),
            "gpu_memory_utilization": rng.choice([0.3, 0.55, 0.9], n)}
    resident = rng.choice(np.linspace(10e9, 70e9, 40), n)  # repeated values, as in a plan
    return cols, resident


@pytest.mark.parametrize("fixed", [False, True])
def test_once_per_distinct_combination_is_every_row_evaluated(rows, fixed):
    cols, resident = rows
    request = PlanRequest(resolve_model("qwen3-30b"), cluster(16), GrpoWorkload())
    utilization = cols["gpu_memory_utilization"] if fixed else None
    expected = rollout_memory(request, cols, resident, utilization)
    got = _rollout_memory_once(request, cols, resident, utilization)
    assert list(got) == list(expected)
    for name, values in expected.items():
        assert got[name].dtype == values.dtype, name
        np.testing.assert_array_equal(got[name], values, err_msg=name)


def test_a_nan_resident_size_is_evaluated_row_by_row(rows):
    cols, resident = rows
    resident = resident.copy()
    resident[::7] = np.nan
    request = PlanRequest(resolve_model("qwen3-30b"), cluster(16), GrpoWorkload())
    expected = rollout_memory(request, cols, resident)
    got = _rollout_memory_once(request, cols, resident, None)
    for name, values in expected.items():
        np.testing.assert_array_equal(got[name], values, err_msg=name)


@pytest.mark.parametrize("fixed", [False, True])
def test_rollout_layouts_past_a_floats_exact_integers_are_coded_by_appearance(rows, fixed):
    """The rows' (TP, DP, EP, utilization) are coded as one mixed-radix number while it stays
    below 2**53 (exact as a float); past it (sizes of 2**20 here, on some rows) by first
    appearance: the same values either way."""
    cols, resident = rows
    some = np.arange(len(resident)) % 3 == 0
    cols = {**cols, **{name: np.where(some, 1 << 20, cols[name])
                       for name in ("rollout_tp", "rollout_dp", "rollout_ep")}}
    test_once_per_distinct_combination_is_every_row_evaluated((cols, resident), fixed)
