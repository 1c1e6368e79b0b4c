"""What the phase functions compute of the layouts alone is computed once per
:class:`LayoutRows` and shared by the run's three points (issue 24): the same numbers to the bit
as computed afresh at each point (a plain dict has no memo), on several jobs; a memo made for
one cluster or rollout precision is not read for another."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import TIMED_MODELS, timed_rows

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.cost.request import PlanRequest
from planner.cost.timing import (
    LayoutRows,
    generate_s,
    log_prob_phase_s,
    update_phase_s,
)
from planner.cost.trajectory import node_lengths, request_at


@pytest.fixture(scope="module", params=TIMED_MODELS)
def case(request):
    return timed_rows(request.param)


def phases(request: PlanRequest, rows) -> dict:
    return {"log_prob": log_prob_phase_s(request, rows), "update": update_phase_s(request, rows),
            "generate": generate_s(request, rows, rows)}


def assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for phase, columns in want.items():
        assert got[phase].keys() == columns.keys(), phase
        for name, values in columns.items():
            np.testing.assert_array_equal(got[phase][name], values, err_msg=f"{phase} {name}")


def test_memoised_layout_terms_equal_fresh_ones_at_every_point_of_the_run(case):
    request, rows = case
    shared = LayoutRows(rows)
    for point in node_lengths(request.workload.lengths):
        at = request_at(request, point)
        assert_same(phases(at, shared), phases(at, dict(rows)))
    assert {"pipeline_terms", "training_passes", "update_terms", "comm_links",
            "decode_terms", "stage_layers", "prefill"} <= {key[0] for key in shared.memo}


def test_a_memo_is_not_read_for_another_cluster_or_rollout_precision(case):
    request, rows = case
    shared = LayoutRows(rows)
    phases(request, shared)
    other_gpu = request.on(ClusterSpec(get_gpu("a100"), request.cluster.num_gpus, 4))
    assert_same(phases(other_gpu, shared), phases(other_gpu, dict(rows)))
    fp8 = replace(request, workload=replace(request.workload, rollout_precision="fp8"))
    assert_same(phases(fp8, shared), phases(fp8, dict(rows)))



@pytest.mark.parametrize("change", [
    {"prompt_length": 4096}, {"rollout_n": 8}, {"train_batch_size": 128},
    {"prefix_caching": False}, {"overlap_grad_reduce": True}, {"adam_moment_bytes": 2},
    {"free_cache_engine": False}, {"precision": "fp8"}], ids=lambda change: next(iter(change)))
def test_a_memo_is_not_read_for_another_workload(case, change):
    """Each workload field a memoised term reads is in its key: a memo made for one workload
    gives another the numbers computed afresh."""
    request, rows = case
    shared = LayoutRows(rows)
    phases(request, shared)
    other = replace(request, workload=replace(request.workload, **change))
    assert_same(phases(other, shared), phases(other, dict(rows)))
