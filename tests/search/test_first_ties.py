"""A plan that counts no ties (``PlanReads.best(k)``, ``--mode best``'s
colocated plan) finds every fitting layout's expected step time in its chunks and times fully
only the rows its first ``k`` can be: the same first rows as the plan that ranks every layout,
every column to the bit, in one pass or in chunks (issue 24)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import planner.plan as plan_module
from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.lengths import ResponseLengths
from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cost.request import PlanRequest
from planner.first_ties import rows_for_first_ties
from planner.modes import Launch, get_mode
from planner.modes.sync import RANKS_KEPT
from planner.plan import PlanReads, evaluate_actors, make_plan
from planner.policy import MemoryPolicy

SMALL = GrpoWorkload(train_batch_size=64, rollout_n=4, mini_batch_size=16)
MOVING = replace(SMALL, lengths=ResponseLengths(400.0, 900.0, SMALL.response_length))
NARROW = MemoryPolicy(low=0.5, high=0.6)


def request(model: str, gpus: int, workload=MOVING, policy: MemoryPolicy | None = None,
            gpu: str = "h100") -> PlanRequest:
    return PlanRequest(resolve_model(model), ClusterSpec(get_gpu(gpu), gpus, 8), workload,
                       policy=policy or MemoryPolicy())


JOBS = [
    (request("qwen3-30b", 16), None),  # MoE, the model's tolerance: many ties
    (request("qwen3-8b", 16, policy=NARROW), 0.3),  # wide ties, a narrow band
    (request("moonlight-16b", 16), 0.02),  # MLA, few ties: the strict rows after them
    (request("qwen3-8b", 8, gpu="h20"), 0.0),  # strict: no ties at all
    (request("qwen3-8b", 8, SMALL), None),  # constant lengths: every fitting row timed
]
SHOWN = ("tp", "pp", "vpp", "cp", "ep", "etp", "micro_batch", "recompute", "rollout_tp",
         "gpu_memory_utilization", "step_time_s", "step_time_start_s", "step_time_end_s",
         "peak_bytes", "within_error_of_best", "rank", "time_generate_s_fill")


@pytest.mark.parametrize("chunk", [1 << 40, 2999])
@pytest.mark.parametrize("req, tolerance", JOBS)
def test_first_rows_without_counting_ties(req, tolerance, chunk, monkeypatch):
    actors = evaluate_actors(req)
    full = make_plan(req, tie_tolerance=tolerance, actors=actors)
    monkeypatch.setattr(plan_module, "SCORE_CHUNK_ROWS", chunk)
    ties = full.ties
    for keep in sorted({1, 7, max(ties - 1, 1), ties + 3}):
        head = make_plan(req, tie_tolerance=tolerance, actors=actors,
                         reads=PlanReads.best(keep))
        assert head.rows == min(keep, full.rows)
        assert head.fitting_count == full.fitting_count
        for name in SHOWN:
            np.testing.assert_array_equal(head.candidates[name].to_numpy(),
                                          full.candidates[name].to_numpy()[:keep],
                                          err_msg=f"{name}, keep {keep}")
        # every column of the best, as the plan that times every fitting layout has it
        assert head.records(np.arange(1)) == full.records(np.arange(1))
        if req.workload.moving_lengths:
            with pytest.raises(ValueError, match="count is not known"):
                head.ties
        else:  # nothing pruned: every tie timed and counted
            assert head.ties == ties


def test_rows_for_first_ties_takes_whole_simplicity_groups():
    """Ties (E <= 1.1 * 10) are rows 0-4; by simplicity key their groups are {1, 3} (key 0)
    and {0, 4} (key 1), row 2 (key 0) is no tie; the best (row 0) is always kept."""
    expected = np.array([10.0, 10.5, 30.0, 10.9, 11.0, 10.2])
    key = np.array([1, 0, 0, 0, 1, 2])
    rows = np.arange(6)

    def simplicity(at):
        return [key[at]]

    assert rows_for_first_ties(rows, expected, 1, 0.1, simplicity).tolist() == [0, 1, 3]
    assert rows_for_first_ties(rows, expected, 2, 0.1, simplicity).tolist() == [0, 1, 3]
    assert rows_for_first_ties(rows, expected, 3, 0.1, simplicity).tolist() == [0, 1, 3, 4]
    assert rows_for_first_ties(rows, expected, 5, 0.1, simplicity).tolist() == [0, 1, 3, 4, 5]
    assert rows_for_first_ties(rows, expected, 6, 0.1, simplicity) is None  # 5 ties
    assert rows_for_first_ties(rows, np.full(6, np.nan), 1, 0.1, simplicity) is None


def test_mode_best_colocated_plan_reads_its_best_and_exports_any_kept_rank(tmp_path):
    """``--mode best``'s colocated plan keeps its best alone, without the actor evaluation;
    a job of a later rank is the one of the plan that keeps RANKS_KEPT rows."""
    req = request("qwen3-30b", 16)
    mode = get_mode("sync")
    short, full = mode.plan(req, top=1), make_plan(req)
    assert short.sync_plan.rows == 1 and short.sync_plan.actors is None
    assert short.best.layout == full.candidate(0).layout
    assert short.best.step_time_s == full.candidate(0).step_time_s
    for rank in (1, 2, 40):
        job = mode.job(short, rank, Launch())
        assert job.layout == full.candidate(rank - 1).layout and job.rank == rank
    assert RANKS_KEPT < full.fitting_count
    with pytest.raises(Exception, match=f"keeps the first {RANKS_KEPT} of"):
        mode.job(short, RANKS_KEPT + 1, Launch())
