"""A strict head read without counts under a second memory policy (the text table's filled-GPU
plan, ``PlanReads.first_rows``) is found from the lower bounds a plan of the same request
under the first policy gives its rows' step times (``planner.step_bound``): only the rows
whose bound reaches the head are scored.  Its rows are those of the plan that scores every
row, column for column, on dense, MoE and MLA models, moving and constant lengths, a band where
nothing fits, and one where every fitting layout is memory-tight (issue 24)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import MOVING_GRPO, SMALL_GRPO, h100_request

from planner.plan import (
    PlanReads,
    evaluate_actors,
    make_plan,
    rollout_choice,
    score_rows,
)
from planner.policy import DEFAULT_POLICY, FILL_POLICY, MemoryPolicy
from planner.search.space import SearchOptions
from planner.step_bound import row_bounds

TIGHT = MemoryPolicy(low=0.01, high=0.02)  # every layout that fits peaks above the band


request = h100_request

JOBS = {  # name: request, the second policy, whether the bound finds its head
    "dense-moving": (request("qwen3-8b", 16, MOVING_GRPO), FILL_POLICY, True),
    "dense-constant": (request("qwen3-8b", 8, SMALL_GRPO), FILL_POLICY, True),
    "moe-moving": (request("qwen3-30b", 16, MOVING_GRPO), FILL_POLICY, True),
    "mla-moe-constant": (request("moonlight-16b", 16, SMALL_GRPO), FILL_POLICY, True),
    # the other way round: a filled-GPU plan first, then the default band's head
    "moe-back-to-default": (replace(request("qwen3-30b", 16, MOVING_GRPO),
                                    policy=FILL_POLICY), DEFAULT_POLICY, True),
    # every fitting layout is memory-tight: no incumbent inside the band, every row scored
    "dense-tight": (request("qwen3-8b", 8, MOVING_GRPO), TIGHT, False),
    # nothing fits on one GPU
    "nothing-fits": (request("qwen3-30b", 1, SMALL_GRPO), FILL_POLICY, False),
}


@pytest.mark.parametrize("keep", [1, 3])
@pytest.mark.parametrize("name", list(JOBS))
def test_a_bounded_head_is_the_head_of_every_row_scored(name, keep):
    req, policy, bounded = JOBS[name]
    first = make_plan(req, reads=PlanReads.text_table(5))  # records its rows' step times
    other = replace(req, policy=policy)
    fast = make_plan(other, tie_tolerance=0.0, actors=first.actors,
                     reads=replace(PlanReads.first_rows(keep), fill=True))
    assert fast.bounded == bounded
    full = make_plan(other, tie_tolerance=0.0, actors=evaluate_actors(req),
                     reads=PlanReads(keep=keep))
    assert fast.rows == full.rows
    assert set(fast.columns) == set(full.columns)
    for column in full.columns:
        np.testing.assert_array_equal(np.asarray(fast.columns[column]),
                                      np.asarray(full.columns[column]), err_msg=column)
    lazy = make_plan(other, tie_tolerance=0.0, actors=first.actors,
                     reads=replace(PlanReads.first_rows(keep), lazy=True))
    assert lazy.bounded == bounded
    for column in ("tp", "pp", "rollout_tp", "fits", "step_time_s", "peak_bytes", "rank"):
        np.testing.assert_array_equal(np.asarray(lazy.columns[column]),
                                      np.asarray(full.columns[column]), err_msg=column)
    if bounded:
        assert fast.candidate(0, fitting=True) == full.candidate(0, fitting=True)
        with pytest.raises(ValueError, match="not known"):
            fast.fitting_count
    else:
        assert len(fast.fitting_rows()) == min(full.fitting_count, keep)


@pytest.mark.parametrize("name", ["dense-moving", "moe-moving", "mla-moe-constant"])
def test_the_bound_is_below_every_fitting_rows_step_time(name):
    """Row by row, against every row scored under the second policy: a row that fits may fit,
    and its bound is at most its expected step time; the bound leaves few rows to score."""
    req, policy, _ = JOBS[name]
    first = make_plan(req, reads=PlanReads.text_table(5))
    actors = first.actors
    other = replace(req, policy=policy)
    choice = rollout_choice(other, actors.space.rollouts, None, actors.memory)
    bound, may_fit = row_bounds(actors.records["steps"], other, choice)
    every = score_rows(other, choice.spread(actors.space.columns), actors.memory,
                       pick_utilization=True, time_rows="fitting")
    fits = every.column("fits").astype(bool)
    step = every.column("step_time_s")
    assert fits.any() and (may_fit | ~fits).all()
    known = fits & ~np.isnan(bound)
    assert known.sum() > 0.9 * fits.sum()
    assert (bound[known] <= step[known]).all()
    # without an offload (whose trips the bound leaves out) it is the step time itself, but
    # for the margin (relative to the first policy's times, which may be many times longer)
    cols = actors.space.columns
    plain = known & ~(cols["param_offload"] | cols["optimizer_offload"]
                      | cols["ref_param_offload"]).astype(bool)
    assert plain.any()
    np.testing.assert_allclose(bound[plain], step[plain], rtol=1e-6)
    best = np.min(step[fits & ~every.column("flag_memory_tight").astype(bool)])
    assert np.count_nonzero(may_fit & ~(bound > best)) < fits.sum() / 4


def test_a_bounded_plan_does_not_count_the_layouts_below_the_bands_top():
    """A bounded plan kept its first rows without scoring every layout: the count of those
    that fit below the band's top is not known either (not the count of the kept rows)."""
    req, policy, _ = JOBS["dense-constant"]
    first = make_plan(req, reads=PlanReads.text_table(5))
    fast = make_plan(replace(req, policy=policy), tie_tolerance=0.0, actors=first.actors,
                     reads=PlanReads.first_rows(1))
    assert fast.bounded
    with pytest.raises(ValueError, match="not known"):
        fast.fitting_below_top


# the step terms the bound treats as the policy's alone under other settings (review8): MTP
# drafting (the drafter's weights load with the rollout's), an engine that stays awake through
# training (its whole pool joins every training phase), a fixed gpu_memory_utilization (no
# pick), and the bucketed weight sync
MORE_JOBS = {
    "mtp-drafting": request("mimo-7b", 8, replace(MOVING_GRPO, speculative="mtp")),
    "engine-awake": request("qwen3-8b", 16, replace(MOVING_GRPO, free_cache_engine=False)),
    "fixed-utilization": replace(request("qwen3-30b", 16, MOVING_GRPO),
                                 options=SearchOptions(gpu_memory_utilization=0.5)),
    "bucketed-sync": request("qwen3-30b", 16, replace(MOVING_GRPO, weight_sync="bucketed")),
}


@pytest.mark.parametrize("name", list(MORE_JOBS))
def test_the_bound_holds_and_finds_the_head_under_other_settings(name):
    """Row by row, the bound is at most every fitting row's expected step time under the
    filled-GPU policy, and the bounded head is the head of every row scored."""
    req = MORE_JOBS[name]
    first = make_plan(req, reads=PlanReads.text_table(5))
    actors = first.actors
    other = replace(req, policy=FILL_POLICY)
    utilization = req.options.gpu_memory_utilization
    choice = rollout_choice(other, actors.space.rollouts, utilization, actors.memory)
    bound, may_fit = row_bounds(actors.records["steps"], other, choice)
    every = score_rows(other, choice.spread(actors.space.columns), actors.memory,
                       pick_utilization=utilization is None, time_rows="fitting")
    fits = every.column("fits").astype(bool)
    step = every.column("step_time_s")
    known = fits & ~np.isnan(bound)
    assert known.any() and (may_fit | ~fits).all()
    assert (bound[known] <= step[known]).all()
    fast = make_plan(other, tie_tolerance=0.0, actors=actors, reads=PlanReads.first_rows(1))
    assert fast.bounded
    full = make_plan(other, tie_tolerance=0.0, actors=evaluate_actors(req),
                     reads=PlanReads(keep=1, fill=False))
    for column in ("tp", "pp", "ep", "micro_batch", "rollout_tp", "gpu_memory_utilization",
                   "fits", "step_time_s", "peak_bytes"):
        np.testing.assert_array_equal(np.asarray(fast.columns[column]),
                                      np.asarray(full.columns[column]), err_msg=column)
