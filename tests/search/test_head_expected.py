"""A plan read at its head, on a moving response length, finds every fitting layout's expected
step time in its scoring chunks (the step time alone at the run's three points,
``planner.plan._expected_s``) and keeps only the rows whose own expected step time can put
them in the head (``planner.plan._rows_that_can_lead``): no lower bound, so a row timed fully
is one the caller reads.  Its first rows are those of the plan that times every fitting
layout fully, number for number -- the filled-GPU plan's best, the text table's rows, ties
and counts -- on moving lengths, a narrow band, a job whose every fitting layout is
memory-tight, a band whose fastest layout ranks beyond the table's rows, and a constant
length (issue 24)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import MOVING_GRPO, SMALL_GRPO, h100_request

import planner.plan as plan_module
from planner.catalog.lengths import ResponseLengths
from planner.plan import (
    Head,
    PlanReads,
    choose_rollout,
    evaluate_actors,
    make_plan,
    score_rows,
)
from planner.policy import FILL_POLICY, MemoryPolicy

SMALL, MOVING = SMALL_GRPO, MOVING_GRPO
SHRINKING = replace(SMALL, lengths=ResponseLengths(900.0, 300.0, SMALL.response_length))
# the strict ranking's fastest layout inside this band is its 22nd: beyond the table's 10 rows
BAND = MemoryPolicy(low=0.6, high=0.7)
TIGHT = MemoryPolicy(low=0.01, high=0.02)  # every layout that fits peaks above the band


request = h100_request

JOBS = {
    "qwen3-30b-moving": request("qwen3-30b", 16, MOVING),
    "qwen3-8b-band": request("qwen3-8b", 16, MOVING, BAND),
    "moonlight-16b-shrinking": request("moonlight-16b", 16, SHRINKING),
    "qwen3-8b-tight": request("qwen3-8b", 8, MOVING, TIGHT),
    "qwen3-8b-constant": request("qwen3-8b", 8, SMALL),
}
SHOWN = ("tp", "pp", "vpp", "cp", "ep", "etp", "micro_batch", "max_token_len", "recompute",
         "rollout_tp", "rollout_dp", "rollout_ep", "gpu_memory_utilization", "step_time_s",
         "step_time_start_s", "step_time_end_s", "time_update_actor_s", "peak_bytes",
         "within_error_of_best", "rank")


def assert_first_rows(head, full, count: int) -> None:
    for name in SHOWN:
        np.testing.assert_array_equal(np.asarray(head.columns[name])[:count],
                                      np.asarray(full.columns[name])[:count], err_msg=name)


@pytest.mark.parametrize("chunk", [None, 997], ids=["one-pass", "chunked"])
@pytest.mark.parametrize("name", list(JOBS))
def test_a_head_gives_the_first_rows_of_every_layout_timed_fully(name, chunk, monkeypatch):
    """``chunk``: rows per scoring chunk forced (the chunked path keeps the expected step time
    found in the chunks as the ranking's, timing no row again)."""
    req = JOBS[name]
    if chunk is not None:
        monkeypatch.setattr(plan_module, "SCORE_CHUNK_ROWS", chunk)
    actors = evaluate_actors(req)
    for policy, tolerance in ((FILL_POLICY, 0.0), (req.policy, 0.0), (req.policy, None)):
        at = replace(req, policy=policy)
        full = make_plan(at, tie_tolerance=tolerance, actors=actors)  # every fitting row timed
        assert full.fitting_count > 0
        if policy is TIGHT:
            assert np.asarray(full.columns["flag_memory_tight"])[full.fitting_rows()].all()
        for count in (1, 4):
            head = make_plan(at, tie_tolerance=tolerance, actors=actors,
                             reads=PlanReads(keep=count))
            assert_first_rows(head, full, count)
            assert (head.fitting_count, head.ties) == (full.fitting_count, full.ties)
        table = make_plan(at, tie_tolerance=tolerance, actors=actors,
                          reads=PlanReads.text_table(10))
        assert_first_rows(table, full, table.rows)
        if policy is BAND and tolerance == 0.0:
            assert table.rows == 22
        assert (table.ties, table.fitting_below_top) == (full.ties, full.fitting_below_top)
        if full.fastest_in_band is not None:
            assert table.fastest_in_band == full.fastest_in_band


def test_a_moving_head_times_only_the_rows_it_can_keep():
    """The filled-GPU plan's head on a moving length: every fitting row's expected step time is
    found in the chunks, and only the rows of the best's step time are kept timed (no bound
    lets others through); with ties, only the ties and the head's rows."""
    req = replace(JOBS["qwen3-30b-moving"], policy=FILL_POLICY)
    actors = evaluate_actors(req)
    cols, actor = choose_rollout(req, actors.space.columns, actors.space.rollouts, None,
                                 actors.memory)
    every = score_rows(req, cols, actor, pick_utilization=True, time_rows="fitting")
    step = every.column("step_time_s")
    fits = every.column("fits").astype(bool)
    tight = every.column("flag_memory_tight").astype(bool)
    first = fits & ~tight if (fits & ~tight).any() else fits
    best = np.min(step[first])
    best_rows = first & (step == best)
    strict = score_rows(req, cols, actor, pick_utilization=True, time_rows=Head(1))
    np.testing.assert_array_equal(strict.timed, best_rows)
    tolerance = 0.05
    tied = score_rows(req, cols, actor, pick_utilization=True, time_rows=Head(1, tolerance))
    ties = first & (step <= (1 + tolerance) * best * (1 + 1e-9))
    np.testing.assert_array_equal(tied.timed, ties)
    assert 1 < ties.sum() < fits.sum() // 10
