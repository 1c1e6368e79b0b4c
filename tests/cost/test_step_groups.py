"""Each GRPO phase is timed once per distinct row of the fields it reads (issue 24): the field
lists cover everything the phase functions read, and the grouped step equals the step timed
row by row, number for number; the step time alone (``step_time_s``, what a plan's head ranks
by) equals the step's, to the bit, at every point of the run."""

from __future__ import annotations

import numpy as np
import pytest

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cost.memory import estimate_memory
from planner.cost.request import PlanRequest
from planner.cost.timing import (
    GENERATE_FIELDS,
    LOG_PROB_FIELDS,
    UPDATE_FIELDS,
    DistinctRows,
    StepGroups,
    generate_s,
    grpo_step,
    log_prob_phase_s,
    step_time_s,
    update_phase_s,
)
from planner.plan import choose_rollout, evaluate_actors

SMALL = GrpoWorkload(train_batch_size=64, rollout_n=4, mini_batch_size=16)


class Recording(dict):
    """Columns that remember which names were read."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.read: set[str] = set()

    def __getitem__(self, name):
        self.read.add(name)
        return super().__getitem__(name)

    def get(self, name, default=None):
        self.read.add(name)
        return super().get(name, default)

    def __contains__(self, name):
        self.read.add(name)
        return super().__contains__(name)

    def __iter__(self):  # reading every column: the test must see it
        self.read.update(self.keys())
        return super().__iter__()


def scored(model: str, gpus: int):
    request = PlanRequest(resolve_model(model), ClusterSpec(get_gpu("h100"), gpus, 8), SMALL)
    actors = evaluate_actors(request)
    cols, actor = choose_rollout(request, actors.space.columns, actors.space.rollouts, None,
                                 actors.memory)
    memory = estimate_memory(request, cols, pick_utilization=True, actor=actor)
    return request, {**cols, **memory}


CASES = ["qwen3-8b", "qwen3-30b", "deepseek-v3", "Qwen3-Next-80B-A3B"]
GPUS = {"deepseek-v3": 64}


@pytest.fixture(scope="module", params=CASES)
def case(request):
    return scored(request.param, GPUS.get(request.param, 16))


def test_the_field_lists_cover_what_each_phase_reads(case):
    request, rows = case
    for phase, names in ((log_prob_phase_s, LOG_PROB_FIELDS), (update_phase_s, UPDATE_FIELDS)):
        recording = Recording(rows)
        phase(request, recording)
        assert recording.read <= set(names), (phase.__name__, recording.read - set(names))
    recording = Recording(rows)
    generate_s(request, recording, recording)
    assert recording.read <= set(GENERATE_FIELDS), recording.read - set(GENERATE_FIELDS)


def test_grouped_step_equals_the_step_timed_row_by_row(case):
    request, rows = case
    groups = StepGroups.of(rows, rows)
    assert groups.update.inverse is not None  # the case is large enough to group
    assert len(groups.log_prob.rows["tp"]) < len(rows["tp"])
    direct = DistinctRows(rows, None)
    grouped = grpo_step(request, rows, rows, groups)
    plain = grpo_step(request, rows, rows, StepGroups(direct, direct, direct))
    assert grouped.keys() == plain.keys()
    for name, values in plain.items():
        np.testing.assert_array_equal(grouped[name], values, err_msg=name)


def test_the_step_time_alone_equals_the_steps_at_every_point_of_the_run(case):
    """What a plan's head ranks by without the step's other columns: the same operations on
    the same values, so the same numbers to the bit -- grouped or not, offload trips and all,
    at the start, middle and end of a moving length."""
    from dataclasses import replace

    from planner.catalog.lengths import ResponseLengths
    from planner.cost.trajectory import node_lengths, request_at

    request, rows = case
    moving = replace(request, workload=replace(
        request.workload, lengths=ResponseLengths(300.0, 900.0, request.workload.response_length)))
    direct = DistinctRows(rows, None)
    assert rows["param_offload"].any() and rows["optimizer_offload"].any()
    for groups in (StepGroups.of(rows, rows), StepGroups(direct, direct, direct)):
        for point in node_lengths(moving.workload.lengths):
            at = request_at(moving, point)
            np.testing.assert_array_equal(step_time_s(at, rows, rows, groups),
                                          grpo_step(at, rows, rows, groups)["step_time_s"])
    np.testing.assert_array_equal(step_time_s(request, rows, rows, None),
                                  grpo_step(request, rows, rows)["step_time_s"])


def test_the_layer_ranks_of_distinct_rows_are_found_once_for_every_point_of_the_run():
    from planner.cost.timing import LayoutRows, of_layouts

    rows = LayoutRows({"tp": np.array([1, 2])})
    calls = []
    first = of_layouts(rows, "ranks", "model", lambda: calls.append(1) or len(calls))
    assert of_layouts(rows, "ranks", "model", lambda: calls.append(1) or len(calls)) == first
    assert of_layouts(rows, "ranks", "other", lambda: calls.append(1) or len(calls)) == 2
    assert of_layouts(dict(rows), "ranks", "model", lambda: calls.append(1) or len(calls)) == 3
    assert dict(rows) == {"tp": rows["tp"]}  # a dict for every other reader


def test_the_weight_sync_and_offload_trips_are_timed_once_for_every_point_of_the_run(
        case, monkeypatch):
    """They read nothing of the mean response length (StepGroups.point_free): equal at every
    point, and computed once for the three when the groups are shared."""
    from dataclasses import replace

    from planner.catalog.lengths import ResponseLengths
    from planner.cost import timing
    from planner.cost.trajectory import node_lengths, request_at

    request, rows = case
    moving = replace(request, workload=replace(
        request.workload, lengths=ResponseLengths(300.0, 900.0, request.workload.response_length)))
    points = [request_at(moving, point) for point in node_lengths(moving.workload.lengths)]
    assert len({at.workload.mean_response_length for at in points}) == 3
    for at in points[1:]:
        for name, values in timing.weight_sync_s(points[0], rows).items():
            np.testing.assert_array_equal(timing.weight_sync_s(at, rows)[name], values)
        for mine, first in zip(timing._offload_trips(at, rows, rows),
                               timing._offload_trips(points[0], rows, rows)):
            np.testing.assert_array_equal(mine, first)
    calls = []
    original = timing.weight_sync_s
    monkeypatch.setattr(timing, "weight_sync_s", lambda *a: calls.append(1) or original(*a))
    groups = StepGroups.of(rows, rows)
    for at in points:
        timing.step_time_s(at, rows, rows, groups)
    assert len(calls) == 1
    timing.step_time_s(points[0], dict(rows), rows, groups)  # other columns: computed again
    assert len(calls) == 2


def test_the_point_free_key_is_every_compared_field_but_the_mean_length():
    """What the run's points share (``StepGroups.point_free``'s memo) is keyed on every field
    of the request its equality compares -- a field added later included -- and on the
    workload's fields but its mean response length (review8: the key listed the fields by
    hand)."""
    from dataclasses import fields, replace

    from planner.cost.timing import _apart_from_mean_length
    from planner.cost.trajectory import request_at
    from planner.policy import FILL_POLICY

    request = PlanRequest(resolve_model("qwen3-8b"), ClusterSpec(get_gpu("h100"), 8, 8), SMALL)
    key = _apart_from_mean_length(request)
    assert len(key) == sum(1 for item in fields(request) if item.compare)
    assert _apart_from_mean_length(request_at(request, 300.0)) == key
    assert _apart_from_mean_length(replace(request, policy=FILL_POLICY)) != key
    assert _apart_from_mean_length(replace(request, workload=replace(
        SMALL, rollout_n=8))) != key


def test_the_groups_of_a_scoring_chunk_read_only_their_fields(case):
    """A plan's piece of a scoring chunk (a :class:`planner.search.layout.RowsAt` of a
    :class:`planner.cost.deferred.DeferredColumns` whose memory columns are computed when
    read): its groups read the fields the phases read alone -- every other deferred column
    stays deferred -- and are those of the plain columns (the scalars among the fields
    kept), so the step time is the same to the bit."""
    from planner.cost.deferred import DeferredColumns
    from planner.search.layout import RowsAt

    request, rows = case
    fields = {"tp", *LOG_PROB_FIELDS, *UPDATE_FIELDS, *GENERATE_FIELDS}
    chunk, computed = DeferredColumns(), []
    for name, values in rows.items():
        if name in fields or np.ndim(values) == 0:
            chunk[name] = values
        else:
            chunk.defer(name, lambda name=name, values=values: computed.append(name) or values)
    chunk["unread_scalar"] = np.float64(2.0)
    # a field of one value as a 0-d column: kept on the distinct rows
    chunk["log_prob_micro_batch"] = np.int64(np.asarray(rows["log_prob_micro_batch"])[0])
    plain = {**rows, "log_prob_micro_batch": chunk["log_prob_micro_batch"]}
    index = np.arange(0, len(rows["tp"]), 2)
    subset = RowsAt(chunk, index)
    groups = StepGroups.of(subset, subset)
    assert computed == []
    assert "unread_scalar" not in groups.log_prob.rows
    assert groups.log_prob.rows["log_prob_micro_batch"] == chunk["log_prob_micro_batch"]
    taken = {name: values if np.ndim(values) == 0 else np.asarray(values)[index]
             for name, values in plain.items()}
    theirs = StepGroups.of(taken, taken)
    for mine, their in ((groups.log_prob, theirs.log_prob), (groups.update, theirs.update)):
        for name in mine.rows:
            np.testing.assert_array_equal(mine.rows[name], their.rows[name], err_msg=name)
        np.testing.assert_array_equal(mine.inverse, their.inverse)
    steps = [step_time_s(request, subset, subset, groups)]
    # what the offload trips read
    assert set(computed) <= {"weights_bytes", "optimizer_bytes", "param_offload",
                             "optimizer_offload", "ref_param_offload"}
    steps.append(step_time_s(request, taken, taken, None))
    np.testing.assert_array_equal(*steps)
