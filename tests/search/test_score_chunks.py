"""A plan read at its head scores its rows in chunks (``planner.plan.SCORE_CHUNK_ROWS``) and
keeps of each only the columns its ranking reads and the expected step time of the rows that
fit; the rows that can lead keep that step time alone; the other columns are computed again
for the rows it keeps.  Forced to small chunks, the same plans as one pass over every row:
every column of every kept row, the timed rows and the counts (issue 24)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import MOVING_GRPO, SMALL_GRPO, h100_request

import planner.plan as plan_module
from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.models import resolve_model
from planner.catalog.workload import PretrainWorkload
from planner.cost.request import PlanRequest
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
NARROW = MemoryPolicy(low=0.5, high=0.6)
CHUNK = 3001  # rows per chunk forced on score_rows (a prime)


request = h100_request

JOBS = [
    (request("qwen3-30b", 16, MOVING), None),  # MoE, moving lengths: three points
    (request("qwen3-8b", 16, MOVING, NARROW), 0.3),  # ties, the band's fastest deep
    (request("qwen3-8b", 8, SMALL, NARROW), None),  # constant lengths: one point
    (request("moonlight-16b", 16, MOVING), 0.0),  # MLA, strict
    (PlanRequest(resolve_model("llama3.1-70b"), ClusterSpec(get_gpu("h100"), 64, 8),
                 PretrainWorkload(seq_len=8192, global_batch=128)), None),  # no rollout
]


def assert_same_columns(mine: dict, theirs: dict) -> None:
    assert list(mine) == list(theirs)
    for name in theirs:
        np.testing.assert_array_equal(np.asarray(mine[name]), np.asarray(theirs[name]),
                                      err_msg=name)


def plans(req: PlanRequest, tolerance, monkeypatch, chunk: int, held: bool = False) -> list:
    """``held``: the actor evaluation held per cell, each chunk's arrays computed again."""
    monkeypatch.setattr(plan_module, "SCORE_CHUNK_ROWS", chunk)
    monkeypatch.setattr(plan_module, "HELD_ACTOR_ROWS", 0 if held else 1 << 40)
    actors = evaluate_actors(req)
    out = [make_plan(req, tie_tolerance=tolerance, actors=actors,
                     reads=PlanReads.text_table(10)),
           make_plan(req, tie_tolerance=tolerance, actors=actors, reads=PlanReads(keep=3))]
    if req.workload.has_rollout:
        out.append(make_plan(replace(req, policy=FILL_POLICY), tie_tolerance=0.0,
                             actors=actors, reads=PlanReads(keep=1)))
    return out


@pytest.mark.parametrize("held", [False, True])
@pytest.mark.parametrize("req, tolerance", JOBS)
def test_chunked_plans_equal_one_pass(req, tolerance, held, monkeypatch):
    rows = len(evaluate_actors(req).space.columns["tp"])
    chunk = rows // 4 + 1  # four chunks, the last one shorter
    assert rows > 3 * chunk
    for chunked, whole in zip(plans(req, tolerance, monkeypatch, chunk, held),
                              plans(req, tolerance, monkeypatch, 1 << 40)):
        assert_same_columns(chunked.columns, whole.columns)
        assert (chunked.fitting_count, chunked.ties, chunked.fitting_below_top) == \
            (whole.fitting_count, whole.ties, whole.fitting_below_top)


def test_chunked_scored_rows_equal_one_pass(monkeypatch):
    """score_rows itself: the timed rows, and every column of every row read back (the
    columns a chunked pass did not keep computed again for the rows asked)."""
    req = request("qwen3-30b", 16, MOVING)
    actors = evaluate_actors(req)
    cols, actor = choose_rollout(req, actors.space.columns, actors.space.rollouts, None,
                                 actors.memory)
    scored = {}
    for chunk in (CHUNK, 1 << 40):
        monkeypatch.setattr(plan_module, "SCORE_CHUNK_ROWS", chunk)
        scored[chunk] = score_rows(req, cols, actor, pick_utilization=True,
                                   time_rows=Head(5, 0.1, True))
    chunked, whole = scored[CHUNK], scored[1 << 40]
    assert chunked.rest is not None and whole.rest is None
    assert 0 < chunked.timed.sum() < len(chunked.timed) // 2
    # the timed rows span several chunks, and only their step time is kept (the other time
    # columns computed again for the rows read back)
    assert len(np.unique(np.flatnonzero(chunked.timed) // CHUNK)) > 2
    assert list(chunked.times) == ["step_time_s"] and len(whole.times) > 10
    np.testing.assert_array_equal(chunked.timed, whole.timed)
    assert chunked.names == whole.names
    rows = np.random.default_rng(5).permutation(len(cols["tp"]))[:3000]
    assert_same_columns(chunked.take(rows), whole.take(rows))
    for name in ("mem_generate_bytes", "step_time_s", "unwise_count", "tp"):
        np.testing.assert_array_equal(chunked.column(name, rows), whole.column(name, rows))
