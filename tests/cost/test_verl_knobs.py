"""verl's knobs in the cost model and the export: each moves the quantity it exists for, by
the amount its mechanism says, and survives a trip through verl's own config."""

import dataclasses

import numpy as np
import pytest
from conftest import cluster

from planner.catalog.models import builtin_model, resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cost.request import PlanRequest
from planner.errors import PlanInputError
from planner.plan import estimate_layout
from planner.search.layout import Layout, modules_mask
from planner.search.pipeline import layout_ranks, parse_layout, pipeline_split
from planner.units import GIB

MODEL = resolve_model("qwen2.5-7b")
BASE = Layout(tp=2, dp=4, micro_batch=2, rollout_tp=2, gpu_memory_utilization=0.5)


def row(layout=BASE, workload=None, model=MODEL, gpus=8):
    workload = GrpoWorkload() if workload is None else workload
    return estimate_layout(PlanRequest(model, cluster(gpus), workload), layout).row


def test_cpu_optimizer_moves_the_optimizer_state_to_the_host_and_costs_time():
    gpu, host = row(), row(dataclasses.replace(BASE, optimizer_cpu_fraction=1.0))
    assert host["optimizer_bytes"] == 0 and gpu["optimizer_bytes"] > 0
    # megatron-core's HybridDeviceOptimizer keeps per parameter of this GPU's shard
    # (distributed optimizer over DP 4, TP 2): an fp32 copy of the parameter and of its
    # gradient, and two fp32 Adam moments -- 16 bytes
    shard_params = MODEL.params.total / 2 / 4
    moved = host["host_bytes_per_gpu"] - gpu["host_bytes_per_gpu"]
    assert moved == pytest.approx(16 * shard_params, rel=0.02)
    assert host["time_update_actor_s"] > gpu["time_update_actor_s"]
    half = row(dataclasses.replace(BASE, optimizer_cpu_fraction=0.5))
    assert half["optimizer_bytes"] == pytest.approx(gpu["optimizer_bytes"] / 2, rel=0.01)


def test_bf16_adam_moments_shrink_the_optimizer_by_a_third():
    fp32 = row()["optimizer_bytes"]
    bf16 = row(workload=GrpoWorkload(adam_moment_bytes=2))["optimizer_bytes"]
    assert bf16 / fp32 == pytest.approx(8 / 12, rel=0.01)  # 4 + 2 + 2 of 4 + 4 + 4 bytes


def test_fused_kernels_drop_the_vocabulary_sized_logits():
    plain, fused = row(), row(workload=GrpoWorkload(fused_kernels=True))
    assert fused["train_logits_bytes"] < plain["train_logits_bytes"] / 4
    assert fused["mem_update_actor_bytes"] < plain["mem_update_actor_bytes"]


def test_kl_in_neither_loss_nor_reward_skips_the_reference():
    workload = GrpoWorkload(use_kl_loss=False)
    assert "ref" not in workload.phases
    assert row(workload=workload)["time_ref_s"] == 0
    assert "ref" in GrpoWorkload(use_kl_loss=False, use_kl_in_reward=True).phases


def test_bypassing_old_log_prob_skips_that_phase():
    workload = GrpoWorkload(bypass_old_log_prob=True)
    assert "old_log_prob" not in workload.phases
    assert row(workload=workload)["time_old_log_prob_s"] == 0


def test_cuda_graphs_take_rollout_memory_that_eager_mode_leaves_to_the_kv_cache():
    graphs, eager = row(), row(workload=GrpoWorkload(enforce_eager=True))
    assert eager["kv_cache_bytes"] > graphs["kv_cache_bytes"]
    assert eager["rollout_budget_bytes"] == graphs["rollout_budget_bytes"]


def test_fp8_rollout_halves_rollout_weights_and_doubles_kv_tokens():
    bf16, fp8 = row(), row(workload=GrpoWorkload(rollout_precision="fp8"))
    # vLLM's fp8 quantises the linear layers; the embedding and output layer stay bf16
    params = MODEL.params
    kept_bf16_bytes = 2 * (params.embedding + params.output_layer) / BASE.rollout_tp
    expected = (bf16["rollout_weights_bytes"] - kept_bf16_bytes) / 2 + kept_bf16_bytes
    assert fp8["rollout_weights_bytes"] == pytest.approx(expected, rel=0.02)
    assert fp8["kv_cache_tokens_per_gpu"] > 2 * bf16["kv_cache_tokens_per_gpu"]


def test_a_rollout_that_keeps_its_cache_holds_it_through_training():
    sleeps = row()
    awake = row(workload=GrpoWorkload(free_cache_engine=False))
    held = awake["mem_update_actor_bytes"] - sleeps["mem_update_actor_bytes"]
    assert held == pytest.approx(sleeps["rollout_budget_bytes"], rel=0.05)


def test_token_budget_sets_the_update_activations():
    small = row(dataclasses.replace(BASE, dynamic_batch=True, max_token_len=2048))
    large = row(dataclasses.replace(BASE, dynamic_batch=True, max_token_len=8192))
    ratio = large["train_activations_bytes"] / small["train_activations_bytes"]
    assert 3.0 < ratio <= 4.0  # activations grow with the tokens of one micro-batch


def test_more_recompute_modules_keep_fewer_activations():
    def activations(names):
        layout = dataclasses.replace(BASE, recompute="selective",
                                     recompute_modules=modules_mask(names))
        return row(layout)["train_activations_bytes"]

    none = row()["train_activations_bytes"]
    attention = activations(["core_attn"])
    more = activations(["core_attn", "layernorm"])
    most = activations(["core_attn", "layernorm", "mlp"])
    full = row(dataclasses.replace(BASE, recompute="full"))["train_activations_bytes"]
    assert none >= attention > more > most > full


def test_qwen3_235b_on_pp8_with_embedding_and_loss_counted_as_layers():
    """verl's run_qwen3-235b_megatron_96gb.sh: 94 layers, PP 8, both accounted: 12 per rank,
    11 transformer layers on the first and the last."""
    first, middle, last, valid = pipeline_split(94, np.array([8]), None, None, [True], [True])
    assert (int(first[0]), int(middle[0]), int(last[0]), bool(valid[0])) == (11, 12, 11, True)
    assert not pipeline_split(94, np.array([8]))[3][0]  # 94 % 8: no even split


def test_a_layout_string_gives_each_rank_its_layers():
    """Stage i of PP x VPP stages runs on rank i % PP (megatron-core PipelineParallelLayerLayout)."""
    text = "Et*3|(t*4|)*6,tL"  # 28 layers, 8 stages: PP 4 x VPP 2
    assert parse_layout(text) == ["Ettt"] + ["tttt"] * 6 + ["tL"]
    assert layout_ranks(text, 4, 28) == [["Ettt", "tttt"], ["tttt", "tttt"], ["tttt", "tttt"],
                                          ["tttt", "tL"]]
    with pytest.raises(PlanInputError, match="places 27 transformer layers"):
        layout_ranks("Et*2|(t*4|)*6,tL", 4, 28)
    with pytest.raises(PlanInputError, match="MTP"):
        layout_ranks("Et*3|(t*4|)*6,tmL", 4, 28)


@pytest.mark.needs("verl")
def test_every_knob_survives_verls_config_and_reads_back():
    from planner.verl import config as verl_config
    from planner.verl.export import job_overrides
    from planner.verl.job import layout_of, read_job, workload_of

    model = builtin_model("Qwen3-30B-A3B")
    workload = GrpoWorkload(fused_kernels=True, enforce_eager=True, free_cache_engine=True,
                            max_num_batched_tokens=16384, prefix_caching=False,
                            use_kl_loss=False, entropy_chunk_tokens=2048,
                            adam_moment_bytes=2, overlap_grad_reduce=True)
    layout = Layout(tp=2, pp=2, ep=4, etp=1, dp=4, account_embedding=True, account_loss=True,
                    recompute="selective", recompute_modules=modules_mask(["core_attn",
                                                                           "moe_act"]),
                    optimizer_cpu_fraction=1.0, dynamic_batch=True, max_token_len=8192,
                    log_prob_max_token_len=16384, rollout_tp=2, rollout_dp=8, rollout_ep=16,
                    gpu_memory_utilization=0.7)
    overrides = job_overrides(model, cluster(16), workload, layout, model_path="/m",
                              train_files="/t.parquet", val_files="/v.parquet")
    config, unknown = verl_config.compose(overrides)
    assert unknown == []
    assert verl_config.verl_checks(config) == []
    job, problems = read_job(verl_config.to_plain(config))
    assert problems == []
    assert layout_of(job, model.is_moe).to_dict() == layout.to_dict()
    read = workload_of(job).to_dict()
    assert {k: read[k] for k in ("fused_kernels", "enforce_eager", "free_cache_engine",
                                 "max_num_batched_tokens", "prefix_caching", "use_kl_loss",
                                 "entropy_chunk_tokens", "adam_moment_bytes",
                                 "overlap_grad_reduce")} == \
        {k: getattr(workload, k) for k in ("fused_kernels", "enforce_eager",
                                           "free_cache_engine", "max_num_batched_tokens",
                                           "prefix_caching", "use_kl_loss",
                                           "entropy_chunk_tokens", "adam_moment_bytes",
                                           "overlap_grad_reduce")}


def test_reported_memory_is_in_gib():
    assert row()["peak_bytes"] / GIB < 200
