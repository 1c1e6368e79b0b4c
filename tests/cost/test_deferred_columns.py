"""A plan's scoring chunk computes the memory columns no fit or peak reads when they are first
read (``planner.cost.deferred.DeferredColumns``, ``estimate_memory(deferred=True)``): the same
columns, in the same order, with the same bits as computed at once, whichever is read first
(speedR, issue 24)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import MOVING_GRPO, SMALL_GRPO, h100_request

import planner.plan as plan_module
from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.models import resolve_model
from planner.catalog.workload import PretrainWorkload
from planner.cost.deferred import DeferredColumns
from planner.cost.memory import actor_rows, estimate_memory
from planner.cost.request import PlanRequest
from planner.plan import _columns_at, choose_rollout, evaluate_actors

JOBS = [
    h100_request("qwen3-30b", 16, MOVING_GRPO),  # MoE, moving lengths
    h100_request("qwen3-8b", 8, SMALL_GRPO),  # dense, constant lengths
    h100_request("moonlight-16b", 16, MOVING_GRPO),  # MLA
    h100_request("qwen3-8b", 8, replace(SMALL_GRPO, free_cache_engine=False)),  # awake engine
    PlanRequest(resolve_model("llama3.1-70b"), ClusterSpec(get_gpu("h100"), 64, 8),
                PretrainWorkload(seq_len=8192, global_batch=128)),  # no rollout
]


def _plan_rows(request: PlanRequest, held: bool, monkeypatch):
    """A plan's rows (the rollout chosen) and its actor evaluation (held per cell or not)."""
    monkeypatch.setattr(plan_module, "HELD_ACTOR_ROWS", 0 if held else 1 << 40)
    actors = evaluate_actors(request)
    space = actors.space
    pick = request.options.gpu_memory_utilization is None
    cols, memory = choose_rollout(request, space.columns, space.rollouts, None, actors.memory)
    return cols, memory, pick


@pytest.mark.parametrize("held", [False, True])
@pytest.mark.parametrize("request_", JOBS)
def test_a_chunks_deferred_columns_are_those_computed_at_once(request_, held, monkeypatch):
    cols, actor, pick = _plan_rows(request_, held, monkeypatch)
    n = len(cols["tp"])
    assert n > 20
    for rows, first in ((slice(3, n // 2 + 3), "weights_bytes"),
                        (slice(n // 2 + 3, n), "alloc_generate_bytes"),
                        (slice(0, n - 1), "peak_stage")):
        chunk = _columns_at(request_, cols, actor, rows, pick)
        assert isinstance(chunk, DeferredColumns)
        # the index path computes every column at once (estimate_memory's dict)
        expected = _columns_at(request_, cols, actor, np.arange(n)[rows], pick)
        assert list(chunk) == list(expected)
        chunk[first]  # a deferred column read first: the others do not change
        for name in expected:
            mine, theirs = np.asarray(chunk[name]), np.asarray(expected[name])
            assert mine.dtype == theirs.dtype, name
            np.testing.assert_array_equal(mine, theirs, err_msg=name)


@pytest.mark.parametrize("held", [False, True])
def test_estimate_memory_deferred_or_not_gives_the_same_columns(held, monkeypatch):
    request = JOBS[0]
    cols, actor, pick = _plan_rows(request, held, monkeypatch)
    rows_actor = actor_rows(actor, slice(None)) if "cells" in actor else actor
    at_once = estimate_memory(request, cols, pick, rows_actor)
    deferred = estimate_memory(request, cols, pick, rows_actor, deferred=True)
    assert type(at_once) is dict and isinstance(deferred, DeferredColumns)
    assert list(deferred) == list(at_once)
    for name in reversed(list(at_once)):
        np.testing.assert_array_equal(deferred[name], at_once[name], err_msg=name)


def test_deferred_columns_compute_once_and_keep_the_order():
    calls = []
    columns = DeferredColumns()
    columns["a"] = 1
    columns.defer("b", lambda: calls.append("b") or 2)
    columns["c"] = 3
    columns["a"] = 4  # set again: keeps its place
    assert list(columns) == ["a", "b", "c"] and len(columns) == 3
    assert "b" in columns and "d" not in columns and not calls
    assert columns["b"] == 2 and columns["b"] == 2 and calls == ["b"]
    chained = DeferredColumns()
    later = DeferredColumns()
    later.defer("e", lambda: 5)
    chained.update_from({"a": 0})
    chained.update_from(later)
    assert list(chained) == ["a", "e"] and chained["e"] == 5 and later["e"] == 5
    with pytest.raises(KeyError):
        columns["d"]
    assert columns.get("d") is None and dict(columns) == {"a": 4, "b": 2, "c": 3}


def test_a_chunk_leaves_no_reference_cycle(monkeypatch):
    """A chunk's columns (deferred ones read or not) and the knob sums (whose prefix memo a
    recursive function holds) are freed as their last reference goes, not when the cyclic
    collector runs: a cycle kept every held chunk's arrays alive until then (the peak RSS)."""
    import gc

    cols, actor, pick = _plan_rows(JOBS[0], True, monkeypatch)
    n = len(cols["tp"])
    gc.collect()
    gc.disable()
    try:
        for read in (False, True):
            chunk = _columns_at(JOBS[0], cols, actor, slice(1, n // 2), pick)
            if read:
                chunk["weights_bytes"], chunk["alloc_update_actor_bytes"]
            del chunk
            assert gc.collect() == 0
    finally:
        gc.enable()
