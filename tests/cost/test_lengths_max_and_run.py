"""Issue 23's rule for what follows which length: memory -- the KV pool and the micro-batches a
pipeline holds in flight -- is judged at the maximum length, time over the run's trajectory of
the mean.  ``choose_rollout`` picks each actor layout's rollout by its generation time expected
over the run (planner/plan.py), and with dynamic batches the in-flight micro-batches are those
of a step whose responses all reach the maximum (planner/search/batches.py memory_count)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.lengths import ResponseLengths
from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cost.columns import memory_column
from planner.cost.memory import actor_rows, rollout_memory
from planner.cost.request import PlanRequest
from planner.cost.timing import generate_s
from planner.cost.trajectory import NODES, WEIGHTS, workload_at
from planner.plan import (
    ROLLOUT_FIELDS,
    choose_rollout,
    estimate_layout,
    evaluate_actors,
    with_chosen_rollout,
)
from planner.search.batches import update_batches
from planner.search.layout import Layout

H100x8 = ClusterSpec(get_gpu("h100"), 8, 8)
# responses that grow from 500 to 7,000 of 8,192 tokens over the run
LENGTHS = ResponseLengths(start_tokens=500, end_tokens=7000, max_tokens=8192)


def _fastest_rollout(request: PlanRequest, rollouts: dict, resident: tuple[float, float],
                     mean_tokens: tuple[float, ...]) -> tuple[int, ...]:
    """Brute force: the rollout option that fits beside ``resident`` bytes -- the actor's in
    generation and in the weight sync, where the sleeping engine wakes its weights --, inside
    the memory band where one does, and generates fastest, its time the weighted mean over
    ``mean_tokens`` (the trajectory's nodes, or one fixed mean)."""
    resident, at_sync = resident
    n = len(rollouts["rollout_tp"])
    memory = rollout_memory(request, rollouts, np.full(n, resident))
    at_utilization = rollout_memory(request, rollouts, np.zeros(n),
                                    memory["gpu_memory_utilization"])
    weights = WEIGHTS if len(mean_tokens) == 3 else (1.0,)
    seconds = sum(weight * generate_s(replace(request, workload=workload_at(
        request.workload, mean)), rollouts, at_utilization)["total_s"]
        for weight, mean in zip(weights, mean_tokens))
    peak = np.maximum(memory["mem_generate_bytes"], at_sync + memory["rollout_weights_bytes"])
    inside = peak <= request.policy.high * H100x8.gpu.memory_bytes
    seconds = np.where(memory["rollout_fits"].astype(bool), seconds + np.where(inside, 0, 1e6),
                       np.inf)
    best = int(np.argmin(seconds))
    return tuple(int(rollouts[name][best]) for name in ROLLOUT_FIELDS)


def test_choose_rollout_picks_the_fastest_generation_over_the_run_not_at_the_mean():
    workload = GrpoWorkload(response_length=8192, lengths=LENGTHS)
    request = PlanRequest(resolve_model("qwen3-8b"), H100x8, workload)
    actors = evaluate_actors(request)
    chosen, memory = choose_rollout(request, actors.space.columns, actors.space.rollouts, None,
                                    actors.memory)
    phases = actor_rows(memory, slice(None))["phases"]  # the evaluation is held per cell
    resident = np.max(phases["generate"], axis=0)
    at_sync = np.max(phases["weight_sync"], axis=0)
    nodes = tuple(LENGTHS.at(fraction) for fraction in NODES)
    disagree = 0
    for size in np.unique(resident)[::7][:12]:  # a spread of the actor layouts' resident sizes
        row = int(np.flatnonzero(resident == size)[0])
        sizes = (float(size), float(at_sync[row]))
        over_run = _fastest_rollout(request, actors.space.rollouts, sizes, nodes)
        at_mean = _fastest_rollout(request, actors.space.rollouts, sizes,
                                   (float(workload.mean_response_length),))
        disagree += over_run != at_mean
        assert tuple(int(chosen[name][row]) for name in ROLLOUT_FIELDS) == over_run
    assert disagree  # the case matters: long late responses favour another engine


def test_fill_gpu_generation_is_expected_over_the_run_like_the_rows_own():
    """``fill_gpu``'s step swaps the row's expected generation for the filled pool's: both are
    expectations over the run, so with the same pool (nothing to grow) they agree."""
    workload = GrpoWorkload(response_length=8192, lengths=LENGTHS)
    request = PlanRequest(resolve_model("qwen3-8b"), H100x8, workload)
    layout = Layout(tp=2, dp=4, rollout_tp=2, rollout_dp=1, gpu_memory_utilization=0.9)
    estimate = estimate_layout(request, layout)
    row = estimate.row
    assert row["gpu_memory_utilization_fill"] == pytest.approx(0.9)
    assert row["time_generate_s_fill"] == pytest.approx(row["time_generate_s"], rel=1e-9)


# --- memory at the maximum length ---------------------------------------------------------------

# Qwen2.5-7B, PP4 x DP2, dynamic batches of one maximal sequence (prompt 1024 + response 2048):
# each rank updates 4 sequences per mini-batch (1 prompt x n=8 over DP2)
DYNAMIC = Layout(tp=1, pp=4, dp=2, dynamic_batch=True, max_token_len=3072)


def _workload(mean: int) -> GrpoWorkload:
    return GrpoWorkload(train_batch_size=8, rollout_n=8, mini_batch_size=1, prompt_length=1024,
                        response_length=2048, mean_response_length=mean)


def test_in_flight_micro_batches_are_those_of_responses_at_the_maximum():
    short = update_batches(_workload(200), DYNAMIC.to_columns())
    longest = update_batches(_workload(2048), DYNAMIC.to_columns())
    # time follows the mean: 4 x 1224 tokens pack into 2 micro-batches; at the maximum, 4
    assert (short.count[0], longest.count[0]) == (2, 4)
    assert short.memory_count[0] == longest.memory_count[0] == 4


def test_pipeline_memory_does_not_depend_on_the_mean_response_length():
    """The first stage holds PP micro-batches in flight when the responses reach the maximum;
    a short mean must not shrink the memory verdict."""
    model = resolve_model("qwen2.5-7b")
    rows = [estimate_layout(PlanRequest(model, H100x8, _workload(mean)), DYNAMIC).row
            for mean in (200, 1024, 2048)]
    update = memory_column("update_actor")
    assert rows[0][update] == rows[1][update] == rows[2][update]
    assert rows[0]["peak_bytes"] == rows[2]["peak_bytes"]
    # ... while the update's time still follows the mean
    assert rows[0]["time_update_actor_s"] < rows[2]["time_update_actor_s"]


def test_choose_rollout_keeps_the_peak_inside_the_band_where_an_option_does():
    """DeepSeek-V3 on 256 H100s: for this actor layout a 128-GPU engine replica generates faster
    over the run than the 256-GPU one, but its experts (1/128 per GPU) woken for the weight
    sync lift the step's peak above the band; the choice is the fastest option inside it."""
    model = resolve_model("deepseek-v3")
    cluster = ClusterSpec(get_gpu("h100"), 256, 8)
    workload = GrpoWorkload(train_batch_size=1024, rollout_n=5, mini_batch_size=256,
                            response_length=1024,
                            lengths=ResponseLengths(start_tokens=544, end_tokens=1024,
                                                    max_tokens=1024))
    request = PlanRequest(model, cluster, workload)
    actor = dict(tp=1, pp=8, ep=16, dp=32, recompute="full", param_offload=True,
                 optimizer_cpu_fraction=1.0, first_stage_layers=7, last_stage_layers=6,
                 dynamic_batch=True, max_token_len=2048)
    chosen = with_chosen_rollout(request, Layout(**actor).to_columns(), None)
    picked = {name: chosen[name][0].item() for name in (*ROLLOUT_FIELDS,
                                                         "gpu_memory_utilization")}
    inside = estimate_layout(request, Layout(**actor, **picked)).row
    assert inside["memory_utilization"] <= request.policy.high
    faster = estimate_layout(request, Layout(**actor, rollout_tp=1, rollout_dp=128,
                                             rollout_ep=128), pick_utilization=True).row
    assert faster["time_generate_s"] < inside["time_generate_s"]
    assert faster["memory_utilization"] > request.policy.high
