"""The rollout choice's (resident, beside) pairs and its options' pools, computed the fast way
(per kind of core row: planner.cost.engine_pairs; every option's own terms once, broadcast
beside the resident sizes: planner.cost.memory.rollout_memory_of_terms), are the former
computation's to the bit: every row's pair over all rows, and rollout_memory of the repeated
rows."""

from dataclasses import replace

import numpy as np
import pytest
from conftest import MOVING_GRPO, SMALL_GRPO, cluster

import planner.plan as plan_module
from planner.catalog.models import resolve_model
from planner.catalog.workload import PretrainWorkload
from planner.cost import engine_pairs as pairs_module
from planner.cost.engine_pairs import engine_pairs, pairs_of_rows
from planner.cost.memory import (
    actor_memory,
    rollout_layout_terms,
    rollout_memory,
    rollout_memory_of_terms,
)
from planner.cost.request import PlanRequest
from planner.plan import evaluate_actors, rollout_choice
from planner.policy import MemoryPolicy
from planner.search.layout import distinct_bit_patterns

JOBS = {
    "dense": ("qwen3-8b", 8, SMALL_GRPO),
    "moe, moving lengths": ("qwen3-30b", 16, MOVING_GRPO),
    "mla": ("deepseek-v3", 64, SMALL_GRPO),
    "moe, awake engine": ("qwen3-30b", 16, replace(SMALL_GRPO, free_cache_engine=False)),
    "no rollout": ("qwen3-30b", 16, PretrainWorkload()),
}


def _held_actors(job: str, monkeypatch):
    model, gpus, workload = JOBS[job]
    request = PlanRequest(resolve_model(model), cluster(gpus), workload)
    monkeypatch.setattr(plan_module, "HELD_ACTOR_ROWS", 0)  # held per cell
    return request, evaluate_actors(request)


def _same_bits(got, want) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("chunk", [1 << 17, 1000])
@pytest.mark.parametrize("job", list(JOBS))
def test_pairs_per_core_kind_are_those_of_every_row(job, chunk, monkeypatch):
    request, actors = _held_actors(job, monkeypatch)
    memory = actors.memory
    assert "cells" in memory
    joined = (("weight_sync",) if request.workload.has_rollout
              and request.workload.engine.free_cache_engine else
              tuple(phase for phase in ("update_actor", "old_log_prob", "ref")
                    if phase in request.workload.phases))
    fast = pairs_module._per_core_kind(memory["cells"], joined, chunk)
    # the sleeping engine's phases read the parts the kinds are found on: the fast path
    assert (fast is not None) == (joined == ("weight_sync",))
    got = engine_pairs(memory, joined, chunk)
    want = pairs_of_rows(memory, joined, 1 << 17)
    for got_values, want_values in zip(got, want):
        _same_bits(got_values, want_values)
    if fast is not None:
        assert len(fast[0]) < len(memory["cells"])  # fewer pairs than rows
        for fast_values, want_values in zip(fast, want):
            _same_bits(fast_values, want_values)


@pytest.mark.parametrize("utilization", [None, 0.6])
@pytest.mark.parametrize("policy", [MemoryPolicy(), MemoryPolicy(0.5, 0.6)])
@pytest.mark.parametrize("job", list(JOBS))
def test_pools_beside_every_size_are_those_of_the_repeated_rows(job, policy, utilization):
    """rollout_memory_of_terms of the options' terms as a column beside a row of resident
    sizes: each column the one rollout_memory gives the option-major repeated rows (the former
    choice)."""
    model, gpus, workload = JOBS[job]
    request = PlanRequest(resolve_model(model), cluster(gpus), workload, policy=policy)
    rollouts = evaluate_actors(request).space.rollouts
    options = len(rollouts["rollout_tp"])
    capacity = float(request.cluster.gpu.memory_bytes)
    resident = np.concatenate([np.linspace(0.0, 0.95, 41) * capacity, [0.3 * capacity + 0.5]])
    m = len(resident)
    cells = {name: np.repeat(values, m) for name, values in rollouts.items()}
    fixed = None if utilization is None else np.full(options * m, utilization)
    want = rollout_memory(request, cells, np.tile(resident, options), fixed)
    terms = {name: np.asarray(values)[:, None] if np.ndim(values) else values
             for name, values in rollout_layout_terms(request, rollouts).items()}
    got = rollout_memory_of_terms(
        request, terms, resident[None, :],
        None if utilization is None else np.full((options, m), utilization))
    assert list(got) == list(want)
    for name, values in want.items():
        _same_bits(np.broadcast_to(got[name], (options, m)).reshape(-1), np.asarray(values))


@pytest.mark.parametrize("job", ["dense", "moe, moving lengths", "no rollout"])
def test_the_choice_of_a_held_evaluation_is_the_fresh_ones(job, monkeypatch):
    request, held = _held_actors(job, monkeypatch)
    monkeypatch.setattr(plan_module, "HELD_ACTOR_ROWS", 1 << 40)
    fresh = evaluate_actors(request)
    for utilization in (None, 0.7):
        got = rollout_choice(request, held.space.rollouts, utilization, held.memory)
        want = rollout_choice(request, fresh.space.rollouts, utilization, fresh.memory)
        for name in ("resident", "beside", "inverse"):
            _same_bits(getattr(got, name), getattr(want, name))
        for name, values in want.chosen.items():
            _same_bits(got.chosen[name], values)


def test_bit_patterns_tell_signed_zeros_apart_and_match_nans():
    values = np.array([0.0, -0.0, np.nan, 1.0, np.nan, 0.0, -0.0])
    codes = np.array([1, 1, 1, 2, 1, 1, 1])
    first, inverse = distinct_bit_patterns([values, codes], len(values))
    np.testing.assert_array_equal(first, [0, 1, 2, 3])
    np.testing.assert_array_equal(inverse, [0, 1, 2, 3, 2, 0, 1])
    first, inverse = distinct_bit_patterns([], 3)
    np.testing.assert_array_equal(first, [0])
    np.testing.assert_array_equal(inverse, [0, 0, 0])


def test_rows_out_of_order_take_every_row_and_give_the_same_pairs():
    """A held evaluation of shuffled rows (not every combination of each core row in order):
    no pairs per kind (a kind's cells are not a block of rows), every row's, the same pair per
    row as the rows in order."""
    model, gpus, workload = JOBS["mla"]
    request = PlanRequest(resolve_model(model), cluster(gpus), workload)
    cols = evaluate_actors(request).space.columns
    order = np.random.default_rng(5).permutation(len(cols["tp"]))
    shuffled = {name: values[order] if np.ndim(values) else values
                for name, values in cols.items()}
    in_order = actor_memory(request, cols, reduced=True, held=True)
    scattered = actor_memory(request, shuffled, reduced=True, held=True)
    assert in_order["cells"].in_order and not scattered["cells"].in_order
    assert pairs_module._per_core_kind(scattered["cells"], ("weight_sync",), 1000) is None
    resident, beside, inverse = engine_pairs(in_order, ("weight_sync",), 1000)
    got_resident, got_beside, got_inverse = engine_pairs(scattered, ("weight_sync",), 1000)
    _same_bits(got_resident[got_inverse], resident[inverse][order])
    _same_bits(got_beside[got_inverse], beside[inverse][order])
