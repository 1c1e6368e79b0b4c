"""planner.search.layout.RowsAt: columns at some rows, each gathered when first read."""

import numpy as np

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cost.memory import estimate_memory
from planner.cost.request import PlanRequest
from planner.cost.timing import StepGroups, step_columns
from planner.plan import evaluate_actors
from planner.search.layout import RowsAt, scalar_columns


def test_rows_at_reads_like_the_gathered_columns():
    columns = {"a": np.arange(10) * 2, "b": np.linspace(0, 1, 10), "k": np.float64(3.0)}
    index = np.array([7, 1, 1, 4])
    rows = RowsAt(columns, index)
    assert list(rows) == ["a", "b", "k"] and len(rows) == 3 and "b" in rows and "z" not in rows
    assert rows._taken == {}  # asking what is there gathers nothing
    assert scalar_columns(rows) == {"k": 3.0} and rows._taken == {}
    np.testing.assert_array_equal(rows["a"], columns["a"][index])
    assert rows["a"] is rows["a"]  # gathered once
    assert rows["k"] == 3.0 and set(rows._taken) == {"a", "k"}
    few = rows.at(np.array([0, 2]))
    np.testing.assert_array_equal(few["b"], columns["b"][index[[0, 2]]])
    assert dict(few).keys() == columns.keys()


def test_a_step_timed_on_rows_at_reads_few_columns_and_times_the_same():
    request = PlanRequest(resolve_model("qwen3-8b"), ClusterSpec(get_gpu("h100"), 8, 8),
                          GrpoWorkload())
    space = evaluate_actors(request).space
    cols = {name: values for name, values in space.columns.items()}
    n = len(cols["tp"])
    for name in ("rollout_tp", "rollout_dp", "rollout_ep"):
        cols[name] = np.ones(n, dtype=np.int64)
    cols["gpu_memory_utilization"] = np.full(n, 0.5)
    out = {**cols, **estimate_memory(request, cols)}
    index = np.flatnonzero(out["fits"])[::3]
    lazy = RowsAt(out, index)
    gathered = {name: values[index] for name, values in out.items()}
    timed = step_columns(request, lazy, lazy, StepGroups.of(lazy, lazy))
    expected = step_columns(request, gathered, gathered, StepGroups.of(gathered, gathered))
    assert timed.keys() == expected.keys()
    for name in expected:
        np.testing.assert_array_equal(timed[name], expected[name], err_msg=name)
    assert len(lazy._taken) < len(out) / 2  # the step reads a few of the columns


def test_scalar_columns_of_some_names_read_no_other_column():
    from planner.cost.deferred import DeferredColumns

    columns = DeferredColumns()
    columns["a"], columns["k"], columns["j"] = np.arange(4), np.float64(3.0), np.int64(2)
    columns.defer("later", lambda: (_ for _ in ()).throw(AssertionError("read")))
    rows = RowsAt(columns, np.array([3, 0]))
    assert scalar_columns(rows, {"j", "k", "a"}) == {"k": 3.0, "j": 2}  # in the columns' order
    assert list(scalar_columns(rows, {"j", "k"})) == ["k", "j"]
    assert scalar_columns(columns, {"a", "missing"}) == {} and rows._taken == {}
