"""The text table's plan ranks only what the table reads (issue 24), and reads the same.

``PlanReads.text_table(top)`` (the default text command) times at every point of the run
only the layouts that can be in the first ``top`` rows, tied with the best, the fastest inside
the memory band or ranked before it, and keeps only the rows up to those in its frame.  On dense,
MoE and MLA models, pretraining, a moving and a constant response length, strict and tied
rankings and a narrow memory band (the band's fastest deep in the ranking), it prints the full
plan's table and reports the same rows, counts, ties, band-fastest layout and rank.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.lengths import ResponseLengths
from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload, PretrainWorkload
from planner.cost.request import PlanRequest
from planner.plan import PlanReads, make_plan
from planner.policy import FILL_POLICY, MemoryPolicy
from planner.ranking import rows_before
from planner.report.text import plan_table

SMALL = GrpoWorkload(train_batch_size=64, rollout_n=4, mini_batch_size=16)
MOVING = replace(SMALL, lengths=ResponseLengths(400.0, 900.0, SMALL.response_length))
NARROW = MemoryPolicy(low=0.5, high=0.6)

# (model, GPUs, workload, memory policy, tie tolerance: None is the model's, top)
JOBS = [
    ("qwen3-8b", 8, MOVING, MemoryPolicy(), None, 10),  # dense
    ("qwen3-8b", 16, MOVING, NARROW, 0.3, 5),  # the band's fastest deep in the ranking
    ("qwen3-8b", 8, MOVING, MemoryPolicy(), 0.0, 3),  # strict
    ("qwen3-30b", 16, MOVING, MemoryPolicy(), None, 10),  # MoE
    ("qwen3-30b", 16, MOVING, NARROW, None, 1),
    ("moonlight-16b", 16, MOVING, MemoryPolicy(), None, 10),  # MLA
    ("qwen3-8b", 8, SMALL, NARROW, None, 10),  # constant lengths: nothing to prune
    ("llama3.1-70b", 2, MOVING, MemoryPolicy(), None, 10),  # nothing fits
]


def request(model: str, gpus: int, workload, policy: MemoryPolicy) -> PlanRequest:
    return PlanRequest(resolve_model(model), ClusterSpec(get_gpu("h100"), gpus, 8), workload,
                       policy=policy)


def assert_same_table(req: PlanRequest, tolerance, top: int) -> None:
    full = make_plan(req, tie_tolerance=tolerance)
    table = make_plan(req, tie_tolerance=tolerance, actors=full.actors,
                      reads=PlanReads.text_table(top))
    assert len(table.candidates) <= len(full.candidates)
    assert table.fitting_count == full.fitting_count
    assert table.fitting_below_top == full.fitting_below_top
    assert table.ties == full.ties
    fill = None
    if full.fitting_count and req.workload.has_rollout:
        fill = make_plan(replace(req, policy=FILL_POLICY), tie_tolerance=0.0,
                         actors=full.actors, reads=PlanReads(keep=1))
    assert plan_table(table, top, fill) == plan_table(full, top, fill)
    if not full.fitting_count:
        return
    fastest, mine = full.fastest_in_band, table.fastest_in_band
    assert (mine is None) == (fastest is None)
    if fastest is not None:
        assert (mine.rank, mine.layout, mine.step_time_s) == \
            (fastest.rank, fastest.layout, fastest.step_time_s)
    # every row it keeps is the full plan's, number for number
    count = len(table.candidates)
    for name in ("tp", "pp", "vpp", "cp", "ep", "micro_batch", "rollout_tp", "step_time_s",
                 "step_time_start_s", "step_time_end_s", "peak_bytes", "within_error_of_best",
                 "rank", "gpu_memory_utilization_fill"):
        np.testing.assert_array_equal(table.candidates[name].to_numpy(),
                                      full.candidates[name].to_numpy()[:count], err_msg=name)


@pytest.mark.parametrize("model, gpus, workload, policy, tolerance, top", JOBS)
def test_the_table_plan_reads_as_the_full_plan(model, gpus, workload, policy, tolerance, top):
    assert_same_table(request(model, gpus, workload, policy), tolerance, top)


def test_the_table_plan_prunes():
    """The pruning runs: most fitting layouts are left untimed at the run's ends, and the
    frame holds the rows up to the band's fastest, not every fitting layout."""
    req = request("qwen3-8b", 16, MOVING, NARROW)
    full = make_plan(req, tie_tolerance=0.3)
    table = make_plan(req, tie_tolerance=0.3, actors=full.actors,
                      reads=PlanReads.text_table(5))
    assert 5 < full.fastest_in_band.rank == len(table.candidates) < full.fitting_count
    assert table.candidates["step_time_start_s"].notna().all()
    from planner.plan import Head, choose_rollout, score_rows

    space = full.actors.space
    cols, actor = choose_rollout(req, space.columns, space.rollouts, None, full.actors.memory)
    rows = score_rows(req, cols, actor, pick_utilization=True, time_rows=Head(5, 0.3, True))
    assert len(table.candidates) <= rows.timed.sum() < full.fitting_count


def test_pretraining_table():
    req = PlanRequest(resolve_model("llama3.1-70b"), ClusterSpec(get_gpu("h100"), 64, 8),
                      PretrainWorkload(seq_len=8192, global_batch=128))
    assert_same_table(req, None, 5)


def test_rows_before_counts_the_rank_order():
    """rows_before(row) is the row's position in the full stable sort (NaN keys last)."""
    from planner.cost.columns import flag_column
    from planner.ranking import rank_order

    rng = np.random.default_rng(3)
    n = 400
    cols = {"tp": np.ones(n, dtype=int), "fits": rng.random(n) < 0.7,
            flag_column("memory_tight"): rng.random(n) < 0.3,
            "step_time_s": rng.integers(0, 6, n).astype(float),
            "peak_bytes": rng.integers(0, 4, n).astype(float)}
    cols["step_time_s"][rng.random(n) < 0.1] = np.nan
    cols["peak_bytes"][rng.random(n) < 0.05] = np.nan
    order = rank_order(cols)
    position = np.empty(n, dtype=int)
    position[order] = np.arange(n)
    assert [rows_before(cols, row) for row in range(n)] == position.tolist()


def test_a_plan_that_keeps_a_few_rows_counts_every_tie():
    """``--mode best``'s colocated plan keeps its first 1,000 rows (``keep`` without the text
    table): :attr:`Plan.ties` counted only the ties inside them (here 3 of 4,498)."""
    req = request("qwen3-8b", 16, MOVING, MemoryPolicy())
    full = make_plan(req, tie_tolerance=0.3)
    kept = make_plan(req, tie_tolerance=0.3, actors=full.actors, reads=PlanReads(keep=3))
    assert full.ties > 3 and len(kept.candidates) == 3
    assert kept.ties == full.ties and kept.fitting_count == full.fitting_count
