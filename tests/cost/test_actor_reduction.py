"""A plan's actor evaluation keeps each phase the rollout engine does not join reduced to its
largest stage, computed once for the plans that share it (the text table's filled-GPU plan, a
sizing sweep's GPU types): ``estimate_memory`` and the rollout choice then give, under every
memory policy, the columns of a fresh actor evaluation, to the bit."""

from dataclasses import replace

import numpy as np
import pytest
from conftest import cluster

import planner.plan as plan_module
from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cost.memory import actor_memory, actor_rows, engine_phases, estimate_memory
from planner.cost.request import PlanRequest
from planner.phases import PHASES
from planner.plan import choose_rollout, evaluate_actors
from planner.policy import FILL_POLICY, MemoryPolicy

SMALL = GrpoWorkload(train_batch_size=64, rollout_n=4, mini_batch_size=16)


@pytest.mark.parametrize("held", [False, True])
@pytest.mark.parametrize("sleeps", [True, False])
def test_shared_reduced_actor_gives_the_fresh_columns(sleeps, held, monkeypatch):
    workload = replace(SMALL, free_cache_engine=sleeps)
    request = PlanRequest(resolve_model("qwen3-30b"), cluster(16), workload)
    monkeypatch.setattr(plan_module, "HELD_ACTOR_ROWS", 0 if held else 1 << 40)
    actors = evaluate_actors(request)
    # held per cell: computed when read
    assert (set(actors.memory) == {"cells", "reduced"}) == held
    kept = set(actor_rows(actors.memory, slice(None))["phases"])
    assert kept == set(engine_phases(workload))
    assert (kept < set(PHASES)) == sleeps  # an engine kept awake joins every phase
    space = actors.space
    for policy in (request.policy, FILL_POLICY, MemoryPolicy(0.5, 0.6), request.policy):
        req = replace(request, policy=policy)
        cols, memory = choose_rollout(req, space.columns, space.rollouts, None, actors.memory)
        fresh_cols, fresh = choose_rollout(req, space.columns, space.rollouts, None,
                                           actor_memory(req, space.columns))
        for name, values in fresh_cols.items():
            np.testing.assert_array_equal(cols[name], values, err_msg=name)
        got = estimate_memory(req, cols, pick_utilization=True, actor=memory)
        expected = estimate_memory(req, cols, pick_utilization=True, actor=fresh)
        assert list(got) == list(expected)
        for name, values in expected.items():
            assert got[name].dtype == values.dtype, name
            np.testing.assert_array_equal(got[name], values, err_msg=name)


def test_the_kept_reductions_are_read_only():
    request = PlanRequest(resolve_model("qwen3-8b"), cluster(8), SMALL)
    actors = evaluate_actors(request)
    cols, memory = choose_rollout(request, actors.space.columns, actors.space.rollouts, None,
                                  actors.memory)
    out = estimate_memory(request, cols, pick_utilization=True, actor=memory)
    with pytest.raises(ValueError):
        out["mem_update_actor_bytes"][0] = 0.0


@pytest.mark.parametrize("sleeps", [True, False])
def test_reduced_on_the_tables_equals_the_rows_argmax(sleeps):
    """``actor_memory(reduced=True)`` finds each phase's largest stage on the (combination,
    core row) tables: the same index and bytes as the per-row argmax over the stages of a
    full evaluation, and no per-stage arrays for the phases it reduced."""
    from planner.cost.memory import argmax_rows

    workload = replace(SMALL, free_cache_engine=sleeps)
    request = PlanRequest(resolve_model("qwen3-30b"), cluster(16), workload)
    cols = evaluate_actors(request).space.columns
    full = actor_memory(request, cols)
    reduced = actor_memory(request, cols, reduced=True)
    joined = set(engine_phases(workload))
    assert set(reduced["phases"]) == joined
    assert {name.removeprefix("largest_") for name in reduced["reduced"]
            if name != "host"} == set(PHASES) - joined
    # the busiest stage's host memory, found on the knob patterns' tables
    np.testing.assert_array_equal(reduced["reduced"]["host"], full["parts"].largest("host"))
    for phase in set(PHASES) - joined:
        index, largest = reduced["reduced"][f"largest_{phase}"]
        expected_index, expected = argmax_rows(full["phases"][phase])
        assert index.dtype == np.int8 and not index.flags.writeable
        np.testing.assert_array_equal(index, expected_index)
        np.testing.assert_array_equal(largest, expected)
    for phase in joined:
        for got, expected in zip(reduced["phases"][phase], full["phases"][phase]):
            np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("shuffled", [False, True])
def test_a_reduced_actor_read_in_pieces_equals_every_row_at_once(shuffled):
    """The evaluation held per cell (``reduced``) computes the rows a plan asks for: ranges
    that start and end inside a core row's block of knob combinations, and scattered rows,
    give the values of every row at once, to the bit (each value is its cell's alone)."""
    request = PlanRequest(resolve_model("qwen3-30b"), cluster(16), SMALL)
    cols = evaluate_actors(request).space.columns
    if shuffled:
        order = np.random.default_rng(3).permutation(len(cols["tp"]))
        cols = {name: np.asarray(values)[order] if np.ndim(values) else values
                for name, values in cols.items()}
    held = actor_memory(request, cols, reduced=True, held=True)
    assert set(held) == {"cells", "reduced"}
    whole = actor_rows(held, slice(None))
    n = len(cols["tp"])
    scattered = np.random.default_rng(5).choice(n, size=n // 7, replace=False)
    for rows in (slice(5, 5 + n // 3), slice(n // 3 + 5, n), slice(7, 8), scattered,
                 scattered[:1]):
        got = actor_rows(held, rows)

        def flat(memory):
            out = {f"{phase}/{i}": values for phase, stages in memory["phases"].items()
                   for i, values in enumerate(stages)}
            out.update({f"allocated/{phase}": values
                        for phase, values in memory["allocated"].items()})
            out.update({f"{part}/{i}": stage[part] for i, stage in enumerate(memory["stages"])
                        for part in stage})
            out.update({f"{name}/{i}": value for name, pair in memory["reduced"].items()
                        for i, value in enumerate(pair if isinstance(pair, tuple) else [pair])})
            return out

        expected, mine = flat(whole), flat(got)
        assert list(mine) == list(expected)
        for name, values in expected.items():
            assert mine[name].dtype == values.dtype, name
            np.testing.assert_array_equal(mine[name], values[rows], err_msg=name)
