"""The training passes' step groups of a plan's pieces coded per run of one core row
(:class:`planner.cost.timing.Runs`: a held actor evaluation's rows list every knob
combination of each core row in order, issue 24's DeepSeek-V3 x 1024): the same distinct rows,
codes and shared rows as coding every row (:meth:`StepGroups.of`), so the same step times to
the bit."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import MOVING_GRPO, SMALL_GRPO, h100_request

import planner.plan as plan_module
from planner.cost.timing import DistinctRows, StepGroups, step_time_s
from planner.plan import _columns_at, _expected_s, _runs, evaluate_actors, rollout_choice
from planner.search.layout import RowsAt

JOBS = [
    h100_request("qwen3-30b", 16, MOVING_GRPO),  # MoE, moving lengths
    h100_request("qwen3-8b", 8, SMALL_GRPO),  # dense, constant lengths
    h100_request("moonlight-16b", 16, MOVING_GRPO),  # MLA
    h100_request("deepseek-v3", 64, SMALL_GRPO),  # MLA, MoE, MTP
]


def assert_same_rows(mine: DistinctRows, theirs: DistinctRows) -> None:
    assert list(mine.rows) == list(theirs.rows)
    for name in theirs.rows:
        a, b = np.asarray(mine.rows[name]), np.asarray(theirs.rows[name])
        assert a.dtype == b.dtype, name
        np.testing.assert_array_equal(a, b, err_msg=name)
    if theirs.inverse is None:
        assert mine.inverse is None
    else:
        assert mine.inverse.dtype == theirs.inverse.dtype
        np.testing.assert_array_equal(mine.inverse, theirs.inverse)


def assert_same_groups(mine: StepGroups, theirs: StepGroups) -> None:
    for name in ("log_prob", "update", "generate"):
        assert_same_rows(getattr(mine, name), getattr(theirs, name))
    assert (mine.update.rows.coarse is None) == (theirs.update.rows.coarse is None)
    if theirs.update.rows.coarse is not None:
        assert_same_rows(DistinctRows(mine.update.rows.coarse[0], None),
                         DistinctRows(theirs.update.rows.coarse[0], None))
        np.testing.assert_array_equal(mine.update.rows.coarse[1], theirs.update.rows.coarse[1])


@pytest.mark.parametrize("request_, one_fraction", [*((job, False) for job in JOBS),
                                                    (JOBS[0], True)])
def test_groups_coded_per_run_equal_the_rows_coded_one_by_one(request_, one_fraction,
                                                              monkeypatch):
    """``one_fraction``: the CPU optimizer's share one value read throughout (a search's
    constant column)."""
    monkeypatch.setattr(plan_module, "HELD_ACTOR_ROWS", 0)  # held per cell
    actors = evaluate_actors(request_)
    cells = actors.memory["cells"]
    assert cells.in_order and len(cells.knobs) > 1
    k = len(cells.knobs)
    cols = rollout_choice(request_, actors.space.rollouts, None,
                          actors.memory).spread(actors.space.columns)
    if one_fraction:
        cols["optimizer_cpu_fraction"] = np.broadcast_to(0.0, (len(cols["tp"]),))
    else:
        assert len(np.unique(cols["optimizer_cpu_fraction"])) > 1
    n, rng = len(cols["tp"]), np.random.default_rng(3)
    size = n // 3 + 7  # chunks that start inside a core row's block
    compared = 0
    for start in range(0, n, size):
        out = _columns_at(request_, cols, actors.memory, slice(start, start + size), True)
        fitting = np.flatnonzero(np.asarray(out["fits"]).astype(bool))
        every = len(out["fits"])
        for rows in (fitting, fitting[len(fitting) // 3:], fitting[:100],
                     np.sort(rng.choice(every, min(3000, every), replace=False))):
            runs = _runs(out, rows, start, k)
            assert runs.lengths.sum() == len(rows)
            mine_subset, their_subset = RowsAt(out, rows), RowsAt(out, rows)
            mine = StepGroups.of(mine_subset, mine_subset, runs)
            theirs = StepGroups.of(their_subset, their_subset)
            assert_same_groups(mine, theirs)
            np.testing.assert_array_equal(
                step_time_s(request_, mine_subset, mine_subset, mine),
                step_time_s(request_, their_subset, their_subset, theirs))
            np.testing.assert_array_equal(
                _expected_s(request_, RowsAt(out, rows), _runs(out, rows, start, k)),
                _expected_s(request_, RowsAt(out, rows)))
            compared += len(rows) >= 256 and len(runs.lengths) < len(rows)
    assert compared >= 3


def test_an_evaluation_out_of_order_or_held_per_row_codes_every_row(monkeypatch):
    request_ = JOBS[1]
    monkeypatch.setattr(plan_module, "HELD_ACTOR_ROWS", 1 << 40)
    assert "cells" not in evaluate_actors(request_).memory  # score_rows: no runs
    monkeypatch.setattr(plan_module, "HELD_ACTOR_ROWS", 0)
    actors = evaluate_actors(request_)
    space = actors.space.columns
    order = np.random.default_rng(1).permutation(len(space["tp"]))
    shuffled = plan_module.actor_memory(
        request_, {name: values[order] if np.ndim(values) else values
                   for name, values in space.items()}, reduced=True, held=True)
    assert actors.memory["cells"].in_order and not shuffled["cells"].in_order


def test_score_rows_codes_runs_only_for_rows_in_order(monkeypatch):
    """A head's pieces are coded per run where the held rows list each core row's
    combinations in order, and row by row where they do not (shuffled): the same head."""
    request_ = JOBS[1]
    monkeypatch.setattr(plan_module, "HELD_ACTOR_ROWS", 0)
    calls, runs = [], plan_module._runs
    monkeypatch.setattr(plan_module, "_runs", lambda *args: calls.append(1) or runs(*args))
    space = evaluate_actors(request_).space
    heads = []
    for order in (np.arange(len(space.columns["tp"])),
                  np.random.default_rng(1).permutation(len(space.columns["tp"]))):
        cols = {name: values[order] if np.ndim(values) else values
                for name, values in space.columns.items()}
        actor = plan_module.actor_memory(request_, cols, reduced=True, held=True)
        chosen, actor = plan_module.choose_rollout(request_, cols, space.rollouts, None, actor)
        del calls[:]
        rows = plan_module.score_rows(request_, chosen, actor, pick_utilization=True,
                                      time_rows=plan_module.Head(5))
        heads.append(sorted(rows.column("step_time_s")[rows.timed]))
        assert bool(calls) == (order[1] == 1), "runs exactly when the rows are in order"
    assert heads[0] == heads[1]
