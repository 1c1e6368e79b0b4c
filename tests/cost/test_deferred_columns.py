"""A plan's scoring chunk computes the memory columns no fit or peak reads when they are first
read (``planner.cost.deferred.DeferredColumns``, ``estimate_memory(deferred=True)``): the same
columns, in the same order, with the same bits as computed at once, whichever is read first
(speedR, issue 24)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from conftest import MOVING_GRPO, SMALL_GRPO, h100_request

import planner.plan as plan_module
from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.models import resolve_model
from planner.catalog.workload import PretrainWorkload
from planner.cost.columns import memory_column
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


def _bits(values) -> np.ndarray:
    values = np.asarray(values)
    return values.view(np.uint64) if values.dtype == np.float64 else values


def _former_peak(request, actor: dict, out) -> dict:
    """The former estimate_memory's per-phase largest stage (every joined phase's stages
    lifted by the engine's bytes, then argmax_rows), peak and peak stage (speedV's
    reference): from the rows' spread stages."""
    from planner.cost.memory import (
        _largest_stage,
        argmax_rows,
        engine_of,
        engine_phases,
        max_rows,
    )
    from planner.phases import PHASES, TRAINING_PHASES

    workload = request.workload
    stages = {phase: list(values) for phase, values in actor["phases"].items()}
    resident = max_rows(stages["generate"])
    stages["generate"] = [stage + out["mem_generate_bytes"] - resident
                          for stage in stages["generate"]]
    if engine_of(workload).free_cache_engine:
        stages["weight_sync"] = [stage + out["rollout_weights_bytes"]
                                 for stage in stages["weight_sync"]]
    else:
        for phase in TRAINING_PHASES:
            stages[phase] = [stage + out["rollout_budget_bytes"] for stage in stages[phase]]
    joined = engine_phases(workload)
    worst = {phase: argmax_rows(stages[phase]) if phase in joined
             else _largest_stage(actor, phase) for phase in PHASES}
    zero = np.zeros_like(worst["update_actor"][1])
    peak_phase, peak_bytes = argmax_rows([worst[p][1] if p in workload.phases else zero
                                          for p in PHASES])
    former = {memory_column(phase): worst[phase][1] for phase in PHASES}
    former.update(peak_phase=peak_phase, peak_bytes=peak_bytes, resident=resident,
                  peak_stage=np.choose(peak_phase, [worst[p][0] for p in PHASES]))
    return former


@pytest.mark.parametrize("held", [False, True])
@pytest.mark.parametrize("request_", JOBS[:4])
def test_the_joined_phases_largest_stage_is_the_former_one(request_, held, monkeypatch):
    """speedV: a joined phase's bytes are the lifted largest stage, its stage index found on
    the rows whose peak it is alone, a chunk's joined stages spread when read: each column
    the former code's to the bit (chunks, an index of rows, every row)."""
    from planner.cost.memory import actor_resident_bytes

    cols, actor, pick = _plan_rows(request_, held, monkeypatch)
    n = len(cols["tp"])
    for rows in (slice(5, n - 7), np.arange(n)[::3], slice(None)):
        rows_actor = actor_rows(actor, rows)
        layout = {name: values[rows] if np.ndim(values) else values
                  for name, values in cols.items()}
        out = estimate_memory(request_, layout, pick, rows_actor, deferred=True)
        former = _former_peak(request_, actor_rows(actor, rows), out)
        assert _bits(actor_resident_bytes(rows_actor)).tolist() == \
            _bits(former.pop("resident")).tolist()
        for name, values in former.items():
            assert np.asarray(out[name]).dtype == values.dtype, name
            assert _bits(out[name]).tolist() == _bits(values).tolist(), name


def test_a_lifted_largest_stage_keeps_argmax_rows_rules():
    """NaN, infinities, ties and -0.0 in the stages or the added bytes: the exact path's
    conditions fall back to every stage lifted, and either way argmax_rows' index and bits."""
    from planner.cost.memory import _joined_largest, _peak_stage, argmax_rows, max_rows

    rng = np.random.default_rng(7)
    base = [rng.integers(0, 5, 64).astype(float) * 2.0 ** 40 for _ in range(4)]
    added = rng.integers(1, 1 << 50, 64).astype(float)
    cases = [(base, added), (base, np.full(64, 2.0 ** -60)), (base, -added),
             ([*base[:3], np.where(np.arange(64) % 5 == 0, np.nan, base[3])], added),
             ([np.where(np.arange(64) % 7 == 0, np.inf, base[0]), *base[1:]], added),
             ([np.where(np.arange(64) % 3 == 0, -np.inf, base[0]), *base[1:]], added),
             (base, np.where(np.arange(64) % 4 == 0, -0.0, added)),
             (base, np.where(np.arange(64) % 4 == 0, np.nan, added))]
    rows = np.arange(64)
    for (stages, term), subtract in itertools.product(cases, (False, True)):
        with np.errstate(invalid="ignore"):  # inf - inf
            top = max_rows(stages)
            lift = (term, top) if subtract else (term,)
            lifted = [stage + term - top if subtract else stage + term for stage in stages]
            index, value = argmax_rows(lifted)
            got_index, got_value = _joined_largest(stages, lift, top if subtract else None)
            got_rows = got_index(rows)
        assert _bits(got_value).tolist() == _bits(value).tolist()
        assert got_rows.tolist() == index.tolist()
        picked = _peak_stage(rows % 2, [got_index, got_index])
        assert picked.dtype == np.int64 and picked.tolist() == index.tolist()


def test_short_sequences_per_cp_by_one_division_of_the_length():
    from planner.search.rules import SHORT_SEQUENCE_PER_CP_TOKENS, _short_per_cp

    cp = np.arange(0, 70)
    with np.errstate(all="ignore"):  # (cp 0: the division's warning, its row not flagged)
        for length in (0, 1, 2047, 2048, 4096, 4097, 65536, 131071, 131072, 131073, 4096.0):
            expected = (cp > 1) & (length // cp < SHORT_SEQUENCE_PER_CP_TOKENS)
            assert _short_per_cp(length, cp).tolist() == expected.tolist()


def test_short_sequences_per_cp_no_overflow_in_narrow_or_large_cp():
    """The product ``cp * 2048`` wraps in a narrow integer column (int16 from 16 on, int32
    from 2**20, int64 from 2**52): the flag must still be the division's."""
    from planner.search.rules import _short_per_cp

    for dtype, values in ((np.int16, (2, 15, 16, 17, 32767)), (np.int32, (2, 2**20, 2**31 - 1)),
                          (np.int64, (2, 2**52, 2**62)), (np.uint64, (2, 2**63))):
        cp = np.array(values, dtype=dtype)
        for length in (0, 4095, 4096, 30000, 32767):
            expected = (cp > 1) & (length // cp < 2048)
            assert _short_per_cp(length, cp).tolist() == expected.tolist(), (dtype, length)
