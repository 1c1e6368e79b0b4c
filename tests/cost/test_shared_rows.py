"""The step's groups found from the rows over the fields both training passes share (speedQ,
issue 24): the same groups as each pass coding every field, and the update timed on the shared
rows (what reads those fields alone) the same, to the bit, at every point of a moving run."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import TIMED_MODELS, timed_rows

from planner.cost.timing import (
    LOG_PROB_FIELDS,
    UPDATE_FIELDS,
    DistinctRows,
    LayoutRows,
    StepGroups,
    grpo_step,
    step_time_s,
    update_phase_s,
)
from planner.cost.trajectory import node_lengths, request_at
from planner.search.layout import RowsAt, rows_column, share_rows, unique_rows


def same_bits(mine, theirs) -> bool:
    """Equal to the bit (NaN and -0.0 included)."""
    mine, theirs = np.asarray(mine), np.asarray(theirs)
    if mine.dtype.kind == "f":
        return mine.shape == theirs.shape and np.array_equal(
            mine.astype(np.float64).view(np.uint64), theirs.astype(np.float64).view(np.uint64))
    return np.array_equal(mine, theirs)


@pytest.fixture(scope="module", params=TIMED_MODELS)
def case(request):
    return timed_rows(request.param)


def test_the_groups_are_those_of_each_pass_coding_every_field(case):
    _, rows = case
    groups = StepGroups.of(rows, rows)
    for mine, names in ((groups.log_prob, LOG_PROB_FIELDS), (groups.update, UPDATE_FIELDS)):
        theirs = DistinctRows.of(rows, names)  # every field coded by this call alone
        assert same_bits(mine.inverse, theirs.inverse)
        assert mine.rows.keys() == theirs.rows.keys()
        for name, values in theirs.rows.items():
            assert same_bits(mine.rows[name], values), name


def test_the_update_on_the_shared_rows_times_as_on_its_own_rows(case):
    """Every column of the update pass, at the run's three points (its layout terms
    memoised across them, as a plan reads them)."""
    request, rows = case
    groups = StepGroups.of(rows, rows)
    assert groups.update.rows.coarse is not None  # the case takes the shared rows
    shared, at = groups.update.rows.coarse
    assert shared is groups.log_prob.rows and len(at) == len(groups.update.rows["tp"])
    own = LayoutRows(dict(groups.update.rows))  # the same rows, no shared rows
    for point in node_lengths(request.workload.lengths):
        moved = request_at(request, point)
        mine, theirs = update_phase_s(moved, groups.update.rows), update_phase_s(moved, own)
        assert mine.keys() == theirs.keys()
        for name, values in theirs.items():
            assert same_bits(mine[name], values), name


def test_the_step_on_rows_at_with_constant_columns_times_as_row_by_row(case):
    """A plan's pieces: the rows at an index of the chunk's columns, the search's constant
    columns read from one element (not gathered); the step time at each point and every
    column of the step as timed row by row."""
    request, rows = case
    n = len(rows["tp"])
    chunk = dict(rows)
    for name in ("dynamic_batch", "log_prob_micro_batch", "distributed_optimizer"):
        if name in chunk:
            chunk[name] = np.broadcast_to(np.asarray(rows[name])[:1], (n,))
    index = np.arange(0, n, 2)
    piece = RowsAt(chunk, index)
    gathered = {name: np.asarray(values)[index] if np.ndim(values) else values
                for name, values in chunk.items()}
    direct = DistinctRows(LayoutRows(gathered), None)
    groups = StepGroups.of(piece, piece)
    assert "dynamic_batch" not in piece._taken  # found without gathering it
    for point in node_lengths(request.workload.lengths):
        moved = request_at(request, point)
        assert same_bits(step_time_s(moved, piece, piece, groups),
                         step_time_s(moved, gathered, gathered,
                                     StepGroups(direct, direct, direct)))
    mine = grpo_step(request, piece, piece, groups)
    theirs = grpo_step(request, gathered, gathered, StepGroups(direct, direct, direct))
    for name, values in theirs.items():
        assert same_bits(mine[name], values), name


def test_a_log_prob_field_that_varies_keeps_the_update_on_its_own_rows(case):
    """Where the log-prob pass's own fields vary its rows are not the shared rows: the
    update is timed on its own rows, the same numbers."""
    request, rows = case
    varied = dict(rows)
    n = len(rows["tp"])
    varied["log_prob_micro_batch"] = np.where(np.arange(n) % 3 == 0, 2, 1)
    groups = StepGroups.of(varied, varied)
    assert groups.update.rows.coarse is None
    direct = DistinctRows(LayoutRows(varied), None)
    at = request_at(request, node_lengths(request.workload.lengths)[1])
    assert same_bits(step_time_s(at, varied, varied, groups),
                     step_time_s(at, varied, varied, StepGroups(direct, direct, direct)))


RNG = np.random.default_rng(33)


@pytest.mark.parametrize("shared", [("a", "b"), ("a", "b", "c"), ("tp", "a", "d")])
def test_unique_rows_from_shared_codes_is_unique_rows(shared):
    """Rows coded over some fields first (share_rows), then each call over a superset codes
    the rest from those codes: the same rows and inverse as coding every field; a call whose
    fields do not include them codes every field."""
    n = 5000
    cols = {"tp": RNG.integers(0, 3, n), "a": RNG.integers(0, 2**40, n) % 5 * 2**40,
            "b": RNG.choice([0.1, 0.2, 0.3], n), "c": np.broadcast_to(np.int64(3), (n,)),
            "d": RNG.integers(0, 2**62, n) % 7 * 2**58, "e": RNG.integers(0, 2, n) > 0}
    codes_of: dict = {}
    assert share_rows(cols, shared, codes_of) == len(unique_rows(cols, shared)[0]["tp"])
    for names in (("tp", "a", "b", "c", "d"), (*shared, "e"), shared, ("b", "e")):
        few, inverse = unique_rows(cols, names, codes_of)
        want_few, want_inverse = unique_rows(cols, names)
        assert same_bits(inverse, want_inverse), names
        for name in cols:
            assert same_bits(few[name], want_few[name]), (names, name)


def test_rows_column_reads_a_constant_column_without_gathering_it():
    columns = {"k": np.broadcast_to(np.int64(4), (10,)), "v": np.arange(10)}
    rows = RowsAt(columns, np.array([1, 5, 7]))
    constant = rows_column(rows, "k")
    assert constant.strides == (0,) and same_bits(constant, [4, 4, 4]) and rows._taken == {}
    assert same_bits(rows_column(rows, "v"), [1, 5, 7]) and "v" in rows._taken
    assert same_bits(rows_column({"k": np.arange(3)}, "k"), [0, 1, 2])


def test_the_weight_sync_reads_its_fields_alone_and_times_as_on_every_row(case):
    """The weight sync is timed on the distinct rows of its fields (WEIGHT_SYNC_FIELDS, held
    equal by the log-prob and generate groups together), spread: what it reads is among them,
    and its total the same as on every row."""
    from planner.cost import timing

    request, rows = case
    # its fields alone (a read of any other column would raise) time as every column
    alone = timing.weight_sync_s(request, {name: rows[name]
                                           for name in timing.WEIGHT_SYNC_FIELDS})
    for name, values in timing.weight_sync_s(request, rows).items():
        assert same_bits(alone[name], values), name
    assert set(timing.WEIGHT_SYNC_FIELDS) <= set(LOG_PROB_FIELDS) | set(
        timing.GENERATE_FIELDS) | {"tp"}
    groups = StepGroups.of(rows, rows)
    assert same_bits(timing._sync_total_s(request, rows, groups),
                     timing.weight_sync_s(request, rows)["total_s"])


def test_the_generation_of_a_few_rows_is_kept_per_request_and_values(case):
    """A plan's pieces share their rollouts' few distinct rows: the generation's total is
    kept per request and values (read-only), the same numbers as generate_s."""
    from planner.cost import timing

    request, rows = case
    few = StepGroups.of(rows, rows).generate.rows
    assert len(few["rollout_tp"]) <= timing.GENERATE_KEPT_ROWS
    for point in node_lengths(request.workload.lengths):
        moved = request_at(request, point)
        kept = timing._generate_total_s(moved, few)
        assert same_bits(kept, timing.generate_s(moved, few, few)["total_s"])
        assert not kept.flags.writeable
        assert timing._generate_total_s(moved, LayoutRows(few)) is kept
