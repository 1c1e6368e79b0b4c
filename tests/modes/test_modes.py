"""Training modes (planner/placement.py, planner/cost/pool_time.py): pool arithmetic, memory per
pool, sync as today's plan, rollout-pool throughput, and the fully-async export validating."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cli.main import main
from planner.cost.efficiency import CostModel, load_efficiency
from planner.cost.pool_time import SyncCycle, overlapped_steady_state, streamed_steady_state
from planner.cost.request import PlanRequest
from planner.modes import get_mode
from planner.output import candidate_json
from planner.placement import (
    AsyncOptions,
    async_workload,
    best_rollout,
    pool_cluster,
    pool_splits,
    rollout_pool,
    split_problems,
    standalone_utilization,
    trainer_memory,
)
from planner.plan import estimate_layout, make_plan
from planner.search.layout import Layout
from planner.search.space import SearchOptions

H100 = get_gpu("h100")
MODEL = resolve_model("qwen3-8b")
WORK = GrpoWorkload(train_batch_size=256, rollout_n=8, prompt_length=1024, response_length=4096,
                    mini_batch_size=64)
SMALL = SearchOptions(micro_batches=(1, 2), vpp=(1,), recompute=("none", "full"))


def plan_mode(request, mode, top=None):
    """The mode's plan, its candidates in their JSON contract."""
    plan = get_mode(mode).plan(request, top=top)
    return SimpleNamespace(best=candidate_json(plan.best),
                           candidates=[candidate_json(c) for c in plan.candidates])


def streaming_limits(mode, workload, settings):
    return get_mode(mode, settings).streaming(workload)


def steady_state(mode, generate, train, sync, **cycle):
    if mode == "one-step-off":
        return overlapped_steady_state(generate, train, sync)
    return streamed_steady_state(generate, train, sync, SyncCycle(**cycle))


def test_pool_splits_are_whole_nodes_across_nodes_and_any_size_in_one():
    assert pool_splits(ClusterSpec(H100, 32, 8)) == [8, 16, 24]
    assert pool_splits(ClusterSpec(H100, 4, 8)) == [1, 2, 3]


def test_split_problems_name_the_broken_arithmetic():
    cluster = ClusterSpec(H100, 32, 8)
    assert split_problems(cluster, 16, 16) == []
    assert any("not the cluster's 32" in p for p in split_problems(cluster, 16, 8))
    assert any("not whole nodes" in p for p in split_problems(cluster, 12, 20))
    assert any("at least one GPU" in p for p in split_problems(cluster, 32, 0))
    assert split_problems(ClusterSpec(H100, 8, 8), 3, 5) == []  # one node: any split


def test_memory_is_checked_per_pool():
    """A layout that overflows colocated (actor state resident beside vLLM at 0.9) fits on
    separate pools: the trainer's GPUs hold no engine, the rollout's no actor."""
    cluster = ClusterSpec(H100, 16, 8)
    layout = Layout(tp=4, pp=1, dp=4, micro_batch=1, rollout_tp=1, gpu_memory_utilization=0.9)
    colocated = estimate_layout(PlanRequest(MODEL, cluster, WORK), layout).row
    assert not colocated["fits"]
    work = async_workload(WORK)
    trainer = trainer_memory(PlanRequest(MODEL, pool_cluster(cluster, 8), work), Layout(tp=4, dp=2, micro_batch=1).to_columns())
    assert trainer["trainer_fits"][0]
    assert trainer["trainer_peak_bytes"][0] < colocated["mem_generate_bytes"]
    eff = load_efficiency(H100, "bf16")
    pool = rollout_pool(PlanRequest(MODEL, pool_cluster(cluster, 8), work, options=SearchOptions(), cost=CostModel.fixed(eff)), None)
    assert np.all(pool["gpu_memory_utilization"] == standalone_utilization(cluster))
    assert np.all(pool["rollout_peak_bytes"][pool["fits"]] <= H100.memory_bytes)
    # the trainer pool's search honours memory: a candidate's two peaks are its own pools'
    plan = plan_mode(PlanRequest(MODEL, cluster, WORK, options=SMALL), "one-step-off")
    best = plan.best
    assert best["pools"]["trainer"]["peak_memory_gib"] * 2**30 <= H100.memory_bytes
    assert best["pools"]["rollout"]["peak_memory_gib"] * 2**30 <= H100.memory_bytes
    assert best["placement"] == {"trainer_gpus": 8, "rollout_gpus": 8, "colocated": False,
                                 "trainer_nodes": 1, "rollout_nodes": 1}


def test_sync_mode_is_todays_plan_exactly():
    cluster = ClusterSpec(H100, 8, 8)
    today = make_plan(PlanRequest(MODEL, cluster, WORK, options=SMALL))
    sync = plan_mode(PlanRequest(MODEL, cluster, WORK, options=SMALL), "sync", top=5)
    for row, candidate in zip(today.fitting.head(5).to_dict("records"), sync.candidates):
        assert candidate["mode"] == "sync"
        assert candidate["placement"]["trainer_gpus"] == candidate["placement"]["rollout_gpus"] == 8
        assert candidate["step_time_s"] == round(float(row["step_time_s"]), 3)
        assert candidate["peak_memory_gib"] == round(float(row["peak_bytes"]) / 2**30, 2)


@pytest.mark.parametrize("streaming", [None, streaming_limits("fully-async", WORK,
                                                               AsyncOptions())])
def test_bigger_rollout_pool_never_lowers_generation_throughput(streaming):
    eff = load_efficiency(H100, "bf16")
    work = async_workload(WORK)
    base = ClusterSpec(H100, 64, 8)
    throughput = []
    for gpus in (8, 16, 24, 32, 48, 56):
        best = best_rollout(rollout_pool(PlanRequest(MODEL, pool_cluster(base, gpus), work, options=SearchOptions(), cost=CostModel.fixed(eff)), streaming))
        throughput.append(work.sequences_per_step / best.generate_s)
    assert all(b >= a * (1 - 1e-9) for a, b in zip(throughput, throughput[1:])), throughput


def test_steady_state_overlaps_the_pools():
    one = steady_state("one-step-off", 100.0, 60.0, 5.0)
    assert float(one["step_time_s"]) == 105.0
    assert bool(one["rollout_bound"]) and float(one["trainer_idle"]) == pytest.approx(45 / 105)
    # fully-async, 4 mini-batches a step, one sync per step: without staleness the last
    # mini-batch's update is exposed (60/4); staleness 0.25 x 4 hides it
    exposed = steady_state("fully-async", 100.0, 60.0, 5.0, mini_batches_per_step=4,
                           trigger_parameter_sync_step=4, staleness_threshold=0.0)
    assert float(exposed["step_time_s"]) == 100.0 + 15.0 + 5.0
    hidden = steady_state("fully-async", 100.0, 60.0, 5.0, mini_batches_per_step=4,
                          trigger_parameter_sync_step=4, staleness_threshold=0.25)
    assert float(hidden["step_time_s"]) == 105.0
    twice = steady_state("fully-async", 100.0, 60.0, 5.0, mini_batches_per_step=4,
                         trigger_parameter_sync_step=2, staleness_threshold=0.5)
    assert float(twice["step_time_s"]) == 110.0  # two syncs a step


def test_fully_async_write_passes_validate(tmp_path, capsys):
    out = tmp_path / "job"
    code = main(["--model", "qwen3-8b", "--gpus", "16", "--gpu-type", "h100",
                 "--train-batch-size", "256", "--rollout-n", "8", "--mini-batch-size", "64",
                 "--mode", "fully-async", "--format", "json", "--write", str(out)])
    assert code == 0
    plan = json.loads(capsys.readouterr().out)
    best = plan["candidates"][0]
    assert best["mode"] == "fully-async"
    assert best["placement"]["trainer_gpus"] + best["placement"]["rollout_gpus"] == 16
    script = (out / "run_grpo.sh").read_text()
    assert "python3 -m verl.experimental.fully_async_policy.fully_async_main" in script
    for key in ("rollout.nnodes=1", "async_training.trigger_parameter_sync_step=4",
                "actor_rollout_ref.hybrid_engine=False", "data.train_batch_size=0"):
        assert key in script
    assert json.loads((out / "plan.json").read_text())["mode"] == "fully-async"
    pytest.importorskip("verl")
    code = main(["validate", str(out / "run_grpo.sh"), "--gpu-type", "h100", "--gpus", "16",
                 "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report["findings"]
    assert report["mode"] == "fully-async"
    assert report["placement"]["rollout_gpus"] == best["placement"]["rollout_gpus"]
    assert report["memory"]["trainer"]["peak_memory_gib"] == \
        best["pools"]["trainer"]["peak_memory_gib"]
    # the pools must add up to the cluster
    code = main(["validate", str(out / "run_grpo.sh"), "--gpu-type", "h100", "--gpus", "24",
                 "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1
    assert any(f["check"] == "pools" and "not the cluster's 24" in f["message"]
               for f in report["findings"])


def test_best_mode_prints_every_mode_with_speedup(capsys):
    code = main(["--model", "qwen3-8b", "--gpus", "16", "--gpu-type", "h100",
                 "--train-batch-size", "256", "--rollout-n", "8", "--mini-batch-size", "64",
                 "--micro-batch", "1", "--mode", "best"])
    text = capsys.readouterr().out
    assert code == 0
    for mode in ("sync", "one-step-off", "fully-async"):
        assert mode in text
    assert "vs sync" in text and "1.00x" in text and "change the algorithm" in text
    assert AsyncOptions().trigger_for(WORK) == 4


@pytest.mark.parametrize("mode", ["one-step-off", "fully-async"])
def test_async_yaml_and_script_both_validate(tmp_path, capsys, mode):
    pytest.importorskip("verl")
    out = tmp_path / mode
    assert main(["--model", "qwen3-8b", "--gpus", "16", "--gpu-type", "h100",
                 "--train-batch-size", "256", "--rollout-n", "8", "--mini-batch-size", "64",
                 "--micro-batch", "1", "--mode", mode, "--write", str(out)]) == 0
    capsys.readouterr()
    for name in ("run_grpo.sh", "grpo.yaml"):
        code = main(["validate", str(out / name), "--gpu-type", "h100", "--gpus", "16",
                     "--format", "json"])
        report = json.loads(capsys.readouterr().out)
        assert code == 0, (name, report["findings"])
        assert report["mode"] == mode
        assert report["placement"]["trainer_gpus"] + report["placement"]["rollout_gpus"] == 16
