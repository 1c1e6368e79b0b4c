"""A plan's ranked layouts as numpy columns (what the text table reads, without pandas) and as
the DataFrame built from them on first use (JSON, CSV, --write, sizing): the same rows."""

import math

import numpy as np

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cost.request import PlanRequest
from planner.plan import PlanReads, make_plan
from planner.policy import MemoryPolicy
from planner.results import ColocatedCandidate, Placement


def _same(a, b) -> bool:
    return a.keys() == b.keys() and all(
        a[k] == b[k] or (isinstance(a[k], float) and math.isnan(a[k]) and math.isnan(b[k]))
        for k in a)


def _plan(policy=None, gpus=8):
    request = PlanRequest(resolve_model("qwen3-8b"), ClusterSpec(get_gpu("h100"), gpus, 8),
                          GrpoWorkload())
    if policy is not None:
        request = PlanRequest(request.model, request.cluster, request.workload,
                              policy=policy)
    return make_plan(request)


def test_records_are_the_frames_records_and_the_frame_waits_for_its_first_reader():
    plan = _plan()
    assert "candidates" not in plan.__dict__  # nothing built the DataFrame yet
    rows = np.array([0, 3, plan.rows - 1, 1])
    records = plan.records(rows)
    assert "candidates" not in plan.__dict__
    frame = plan.candidates.iloc[rows].to_dict("records")
    assert all(_same(mine, theirs) for mine, theirs in zip(records, frame, strict=True))
    assert all(type(mine[k]) is type(theirs[k]) for mine, theirs in zip(records, frame)
               for k in mine)
    assert isinstance(records[0]["recompute"], str) and isinstance(records[0]["peak_phase"],
                                                                   str)


def test_what_the_text_table_reads_equals_the_frames():
    # a tight band: some fitting layouts fall outside it, so fitting rows need not lead
    for plan in (_plan(), _plan(MemoryPolicy.parse("0.3-0.5"), gpus=4)):
        frame = plan.candidates
        fitting = plan.fitting
        np.testing.assert_array_equal(plan.fitting_rows(),
                                      np.flatnonzero(frame["fits"].to_numpy()))
        assert plan.fitting_count == int(frame["fits"].sum()) == len(fitting)
        assert plan.ties == int(frame["within_error_of_best"].sum())
        placement = Placement.shared(plan.cluster)
        want = [ColocatedCandidate.from_row(row, placement)
                for row in fitting.head(7).to_dict("records")]
        assert plan.top(7, fitting=True) == want
        assert plan.candidate(2, fitting=True) == ColocatedCandidate.from_row(
            fitting.iloc[2].to_dict(), placement)
        assert plan.candidate(-1) == ColocatedCandidate.from_row(frame.iloc[-1].to_dict(),
                                                                 placement)


def test_lazy_columns_are_the_eager_ones_and_gather_only_what_is_read():
    # PlanReads(lazy=True) (a sizing sweep's plans, which ask for no fill columns): the same
    # columns, in the same order, with the same values and types, each gathered from the scored
    # rows when first read
    request = PlanRequest(resolve_model("qwen3-8b"), ClusterSpec(get_gpu("h100"), 8, 8),
                          GrpoWorkload(), policy=MemoryPolicy.parse("0.3-0.5"))
    eager = make_plan(request, reads=PlanReads(fill=False))
    lazy = make_plan(request, reads=PlanReads.sweep())
    assert not eager.fitting_rows().size == eager.rows  # misses kept: untimed rows too
    rows = np.array([0, 5, eager.rows - 1, 2])
    assert list(lazy.columns) == list(eager.columns) and len(lazy.columns) == len(eager.columns)
    # a record read before any column is gathered: the row's columns alone
    records = lazy.records(rows)
    assert lazy.columns._gathered.keys() <= {"tp"}
    assert all(_same(mine, theirs) and all(type(mine[k]) is type(theirs[k]) for k in mine)
               for mine, theirs in zip(records, eager.records(rows), strict=True))
    assert "step_time_s" in lazy.columns and "no_such_column" not in lazy.columns
    assert set(lazy.columns._gathered) <= {"tp", "step_time_s"}
    for name, values in eager.columns.items():
        mine = lazy.columns[name]
        assert mine.dtype == values.dtype, name
        np.testing.assert_array_equal(mine, values)
    assert lazy.fitting_count == eager.fitting_count and lazy.ties == eager.ties
