"""Time of the separate-pool modes (planner/cost/pool_time.py): the pipelined bucketed sync, the
streaming rollout's in-flight bound, and the published 1-step-off runs they were checked on
(benchmarks/async_accuracy.py)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cost.efficiency import CostModel, load_efficiency
from planner.cost.memory import rollout_memory
from planner.cost.pool_time import StreamingLimits, pool_sync_s, streaming_generate_s
from planner.cost.request import PlanRequest
from planner.cost.timing import generate_s
from planner.placement import ROLLOUT_RESIDENT_BYTES, pool_cluster
from planner.search.layout import Layout

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

H100 = get_gpu("h100")
WHOLE = ClusterSpec(H100, 32, 8)
WORK = GrpoWorkload(train_batch_size=64, rollout_n=16, prompt_length=512, response_length=4096,
                    mini_batch_size=16)


def _sync(weight_sync: str, model_name: str = "qwen3-30b"):
    model = resolve_model(model_name)
    layout = Layout(tp=2, pp=1, ep=8, dp=8, rollout_tp=2)
    work = dataclasses.replace(WORK, weight_sync=weight_sync)
    return pool_sync_s(PlanRequest(model, WHOLE, work, cost=CostModel.fixed(load_efficiency(H100, "bf16"))), pool_cluster(WHOLE, 16), layout.to_columns())


def test_bucketed_sync_pipelines_gather_broadcast_and_packing():
    """NeMo RL's double-buffered packed broadcast: the slowest stage sets the pace."""
    parts = _sync("bucketed")
    slowest = max(float(parts[name][0]) for name in ("gather_s", "broadcast_s", "latency_s"))
    assert float(parts["total_s"][0]) == pytest.approx(slowest + float(parts["load_s"][0]))
    assert float(parts["total_s"][0]) < sum(float(parts[name][0]) for name in
                                            ("gather_s", "broadcast_s", "latency_s", "load_s"))


def test_per_tensor_sync_adds_its_stages():
    """verl's per-tensor sync: gather, broadcast and load one tensor after the other."""
    parts = _sync("per_tensor")
    assert float(parts["total_s"][0]) == pytest.approx(sum(
        float(parts[name][0]) for name in ("gather_s", "broadcast_s", "latency_s", "load_s")))


@pytest.mark.parametrize("gpus", [8, 16])
def test_streaming_runs_at_most_one_steps_sequences_and_skips_the_tail(gpus):
    model = resolve_model("qwen2.5-7b")
    pool = pool_cluster(WHOLE, gpus)
    layout = Layout(tp=1, pp=1, dp=gpus, rollout_tp=1)
    cols = layout.to_columns()
    eff = load_efficiency(H100, "bf16")
    memory = rollout_memory(PlanRequest(model, pool, WORK), cols, np.array([ROLLOUT_RESIDENT_BYTES]), np.array([0.9]))
    streaming = streaming_generate_s(PlanRequest(model, pool, WORK, cost=CostModel.fixed(eff)), cols, memory)
    whole_batch = generate_s(PlanRequest(model, pool, WORK, cost=CostModel.fixed(eff)), cols, memory)
    seqs_per_rank = WORK.sequences_per_step / gpus
    # a 7B model on a whole H100 holds far more than one step's sequences: the in-flight bound
    # (NeMo's collector semaphore, verl's staleness) is what limits the running batch
    assert float(streaming["decode_batch"][0]) == pytest.approx(seqs_per_rank)
    # without the long tail, streaming is faster than waiting for the batch's longest response
    assert float(streaming["total_s"][0]) < float(whole_batch["total_s"][0])


def test_verl_fully_async_runs_at_most_16_prompts_per_rollout_server():
    """verl's rollouter admits len(server_handles) * 16 prompts at once (n sequences each), and
    at most required_samples * (1 + staleness) * trigger per parameter version."""
    from planner.modes import get_mode
    from planner.modes.fully_async import VERL_PROMPTS_PER_SERVER
    from planner.placement import AsyncOptions

    def streaming_limits(mode, workload, settings):
        return get_mode(mode, settings).streaming(workload)

    model = resolve_model("qwen2.5-7b")
    work = GrpoWorkload(train_batch_size=128, rollout_n=8, prompt_length=512,
                        response_length=4096, mini_batch_size=32)
    pool = pool_cluster(WHOLE, 16)
    cols = Layout(tp=1, pp=1, dp=16, rollout_tp=4).to_columns()  # 4 servers of 4 GPUs
    eff = load_efficiency(H100, "bf16")
    memory = rollout_memory(PlanRequest(model, pool, work), cols, np.array([ROLLOUT_RESIDENT_BYTES]), np.array([0.9]))
    limits = streaming_limits("fully-async", work, AsyncOptions(staleness_threshold=0.5))
    # mini-batch 32 prompts x 1.5 x 4 mini-batches per sync
    assert limits.max_in_flight_prompts == 32 * 1.5 * 4
    verl = streaming_generate_s(PlanRequest(model, pool, work, cost=CostModel.fixed(eff)), cols, memory, limits)
    unbounded = streaming_generate_s(PlanRequest(model, pool, work, cost=CostModel.fixed(eff)), cols, memory, StreamingLimits(max_in_flight_prompts=limits.max_in_flight_prompts))
    # 16 prompts per server x n=8 = 128 sequences per server; without verl's per-server cap
    # the staleness bound alone would admit 192 x 8 / 4 = 384 (vLLM's max_num_seqs: 256)
    assert float(verl["decode_batch"][0]) == VERL_PROMPTS_PER_SERVER * work.rollout_n == 128
    assert float(unbounded["decode_batch"][0]) == work.max_num_seqs
    assert float(verl["total_s"][0]) > float(unbounded["total_s"][0])
    assert streaming_limits("one-step-off", work, AsyncOptions()) is None


def test_published_one_step_off_runs():
    """The NeMo RL v0.4/v0.5 1-step-off rows against their colocated twins (printed in full by
    ``python benchmarks/async_accuracy.py``)."""
    from async_accuracy import evaluate

    results, _ = evaluate()
    by_row = {r["row"]["row_id"]: r for r in results}
    assert len(results) == 17
    pairs = [r for r in results if r["partner"] is not None]
    errors = np.abs([r["speedup_error"] for r in pairs])
    assert len(pairs) == 15
    # before the pipelined sync and the streaming rollout: 8 of 15 within 20%, MAPE 28.8%
    assert (errors <= 0.20).sum() >= 11 and errors.mean() < 0.18
    # DeepSeek-V3 on 512 H100 (v0.4, v0.5): rollout-bound behind a 1.3 TB refit, once -58%
    for row in ("4", "14"):
        assert abs(by_row[row]["speedup_error"]) < 0.10
        assert by_row[row]["predicted"]["bottleneck"] == "rollout"
    # the model's best whole-node split, given each run's own layouts, is the published one or
    # one node from it
    assert all(r["best_split"]["nodes_off"] <= 1 for r in results)


def test_an_illegal_published_split_is_skipped_with_its_reason(tmp_path):
    """A row whose trainer pool the actor's layout does not divide (EP 16 on 8 trainer GPUs) is
    skipped and counted with the reason, as rl_data skips rows, not raised (issue 26)."""
    import csv

    from async_accuracy import evaluate
    from calibration_data import default_path

    with open(default_path("grpo_runs.csv"), newline="") as handle:
        reader = csv.DictReader(handle)
        row = next(r for r in reader if r["row_id"] == "8")  # Qwen3-30B-A3B, 16 gen / 16 train
        fields = reader.fieldnames
    row = {**row, "actor_ep": "16", "gpu_count": "32", "colocated": "no (24 gen / 8 train)"}
    path = tmp_path / "runs.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerow(row)
    results, skipped = evaluate(path)
    assert results == []
    [(reason, count)] = skipped.items()
    assert count == 1 and "not legal on its pools" in reason and "does not divide 8" in reason


def test_the_trainer_pool_holds_no_rollout_engine():
    """Separate pools: no KV pool or rollout weights beside the actor (the trainer's peak does
    not move with the rollout's settings, and is the actor's own phase peak)."""
    from planner.cost.memory import actor_memory
    from planner.placement import async_workload, trainer_memory

    model = resolve_model("qwen2.5-7b")
    pool = ClusterSpec(H100, 8, 8)
    work = async_workload(WORK)  # free_cache_engine off, as verl's async recipes run
    cols = Layout(tp=2, pp=1, dp=4, rollout_tp=1, gpu_memory_utilization=0.9).to_columns()
    held = trainer_memory(PlanRequest(model, pool, work), cols)
    freed = trainer_memory(PlanRequest(model, pool, dataclasses.replace(work, free_cache_engine=True)), cols)
    assert float(held["trainer_peak_bytes"][0]) == float(freed["trainer_peak_bytes"][0])
    actor = actor_memory(PlanRequest(model, pool, work), cols)
    assert float(held["trainer_peak_bytes"][0]) == max(
        float(np.max(actor["phases"][phase], axis=0)[0])
        for phase in ("ref", "update_actor", "weight_sync"))
    assert bool(held["trainer_fits"][0])
