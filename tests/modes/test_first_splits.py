"""A split mode's plan of its first splits (``--mode best``'s, ``plan(top=...)``) lists what
the plan of every split lists first, number for number, while searching fewer trainer pools
(issue 24; planner/placement.py first_splits, trainer_floor_s)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.lengths import ResponseLengths
from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cost.request import PlanRequest
from planner.modes import get_mode
from planner.modes.registry import plan_all
from planner.placement import (
    best_trainer,
    pool_cluster,
    pool_splits,
    split_request,
    sync_floor_s,
    trainer_floor_s,
)
from planner.search.space import SearchOptions

# the DAPO recipe's shape, smaller: the mean response length moves over the run
DAPO = GrpoWorkload(train_batch_size=128, rollout_n=8, prompt_length=1024, response_length=4096,
                    mini_batch_size=16, lengths=ResponseLengths(2000.0, 2800.0, 4096))
FIXED = GrpoWorkload(train_batch_size=64, rollout_n=4, mini_batch_size=16)
JOBS = {
    "qwen3-30b x 64 h20, moving lengths": PlanRequest(
        resolve_model("qwen3-30b"), ClusterSpec(get_gpu("h20"), 64, 8), DAPO),
    "qwen3-8b x 64 h100": PlanRequest(
        resolve_model("qwen3-8b"), ClusterSpec(get_gpu("h100"), 64, 8), FIXED),
    "qwen2.5-7b x 8 h100, one node": PlanRequest(
        resolve_model("qwen2.5-7b"), ClusterSpec(get_gpu("h100"), 8, 8), DAPO),
}


def searched(cache: dict) -> set[int]:
    """The trainer pools whose search ran (planner.placement.plan_splits' cache)."""
    return {key[1] for key in cache if key[0] == "trainer"}


@pytest.mark.parametrize("job", list(JOBS))
@pytest.mark.parametrize("mode", ["one-step-off", "fully-async"])
def test_first_splits_are_the_full_plans_first(job, mode):
    request = JOBS[job]
    full = get_mode(mode).plan(request)
    assert full.first is None and len(full.candidates) > 3
    for top in (1, 3):
        cache: dict = {}
        first = get_mode(mode).plan(request, top=top, cache=cache)
        assert first.first == top
        # the same candidates, ranks and every number (frozen dataclasses compare by value)
        assert first.candidates == full.candidates[:top]
        assert first.best == full.best
        assert first.splits_tried == full.splits_tried
        assert len(searched(cache)) < full.splits_tried  # some pools proved slower, unsearched


@pytest.mark.parametrize("job", list(JOBS))
def test_mode_best_is_the_exhaustive_best(job):
    """``--mode best`` (``plan_all``) against every split's plan: the search option
    ``exhaustive`` lists every split."""
    request = JOBS[job]
    pruned = plan_all(request)
    exhaustive = plan_all(replace(request, options=SearchOptions(exhaustive=True)))
    assert [plan.first for plan in exhaustive] == [None] * len(exhaustive)
    for mine, every in zip(pruned[1:], exhaustive[1:]):
        assert mine.candidates == every.candidates[:1]


@pytest.mark.parametrize("job", list(JOBS))
def test_trainer_floor_is_below_the_chosen_layouts_seconds(job):
    """At each node of the run, no layout of a trainer pool trains faster than its floor; the
    floor is no trivial one (at least half the chosen layout's seconds: it ranks by memory
    too, and the fastest layout may not fit)."""
    request = split_request(JOBS[job])
    for gpus in pool_splits(request.cluster):
        on_pool = request.on(pool_cluster(request.cluster, gpus))
        floor, chosen = trainer_floor_s(on_pool), best_trainer(on_pool)
        if chosen is None:
            continue
        seconds = np.asarray(chosen.train_at_nodes_s)
        assert floor.shape == seconds.shape
        assert np.all(floor <= seconds)
        assert np.all(floor >= 0.5 * seconds)


@pytest.mark.parametrize("job", list(JOBS))
@pytest.mark.parametrize("mode", ["one-step-off", "fully-async"])
def test_sync_floor_is_below_every_splits_sync(job, mode):
    """The sync of an actor without model parallelism bounds every split's parameter sync,
    per-tensor (verl) and bucketed (NeMo RL)."""
    for sync in ("per_tensor", "bucketed"):
        request = replace(JOBS[job], workload=replace(JOBS[job].workload, weight_sync=sync))
        cache: dict = {}
        plan = get_mode(mode).plan(request, cache=cache)
        rollouts = {key[1]: choice for key, choice in cache.items() if key[0] == "rollout"}
        for candidate in plan.candidates:
            placement = candidate.placement
            trainer = pool_cluster(request.cluster, placement.trainer_gpus)
            floor = sync_floor_s(plan.request, trainer, rollouts[placement.rollout_gpus])
            assert 0 < floor <= candidate.param_sync.total


def test_write_of_a_later_rank_plans_every_split(tmp_path):
    """``plan --mode best --write --rank 2`` exports the winning mode's second split, which its
    first-split plan does not list: the CLI plans that mode's every split for it."""
    from planner.cli.main import main

    args = ["--model", "qwen3-8b", "--gpus", "32", "--gpu-type", "h100", "--train-batch-size",
            "64", "--rollout-n", "4", "--mini-batch-size", "16", "--mode", "best"]
    assert main([*args, "--write", str(tmp_path / "job"), "--rank", "2"]) == 0
    assert any((tmp_path / "job").iterdir())


def test_a_known_split_that_does_not_fit_ends_the_pruning():
    """A split whose known step does not fit (the choices always fit; here made not to) ranks
    after every split that fits: the pruning stops and every split left is scored, so the
    first splits are still the full ranking's."""
    from planner.placement import (
        best_rollout,
        first_splits,
        ranked,
        rollout_pool,
        score_splits,
    )

    request = split_request(JOBS["qwen3-30b x 64 h20, moving lengths"])
    schedule = get_mode("one-step-off")
    full_best = schedule.plan(request).best.placement.trainer_gpus

    def trainer_for(pool):
        chosen = best_trainer(request.on(pool))
        if pool.num_gpus != full_best:
            return chosen
        return replace(chosen, usage=replace(chosen.usage, fits=False))

    def rollout_for(pool):
        return best_rollout(rollout_pool(request.on(pool), None))

    def floor_for(pool):
        return trainer_floor_s(request.on(pool))

    splits = pool_splits(request.cluster)
    every, _ = score_splits(schedule, request, splits, (trainer_for, rollout_for))
    found, _ = first_splits(schedule, request, splits, (trainer_for, rollout_for, floor_for), 2)
    assert ranked(found)[:2] == ranked(every)[:2]
    assert len(found) > 2  # the pruning ended at the split that does not fit
    assert ranked(every)[-1].placement.trainer_gpus == full_best
