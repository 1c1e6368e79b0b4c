"""Speculative decoding with MTP layers and the MTP layers in the actor: decode time, rollout
and training memory, weight sync, with the numbers worked by hand."""

import dataclasses

import numpy as np
import pytest

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.models import builtin_model
from planner.catalog.workload import GrpoWorkload, default_acceptance_length
from planner.cost.efficiency import CostModel, load_efficiency
from planner.cost.layer_kinds import EngineCache, kv_cache_layout, recurrent_state_bytes_layer
from planner.cost.memory import actor_memory, kv_bytes_per_token, rollout_memory
from planner.cost.request import PlanRequest
from planner.cost.speculative import (
    decode_steps,
    drafter_kv_bytes_per_token,
    drafter_weight_bytes,
    mtp_param_split,
    mtp_stage_params,
    mtp_tensor_count,
)
from planner.cost.timing import (
    decode_step_s,
    draft_forward_s,
    generate_s,
    synced_params,
    synced_tensor_count,
    tensor_count,
    weight_sync_s,
)
from planner.errors import PlanInputError
from planner.search.layout import Layout

H100 = get_gpu("h100")
DSV3 = builtin_model("DeepSeek-V3")
MIMO = builtin_model("MiMo-7B")
OFF = GrpoWorkload()
MTP1 = GrpoWorkload(speculative="mtp")


def request(model, workload, gpus=8):
    return PlanRequest(model, ClusterSpec(H100, gpus, 8), workload,
                       cost=CostModel.fixed(load_efficiency(H100, "bf16")))


def cols(**values):
    values = {"sequence_parallel": values.get("tp", 1) > 1, **values}
    return Layout(**values).to_columns()


# --- inputs ------------------------------------------------------------------------------------


def test_default_acceptance_length_is_leviathans_series_at_85_percent():
    # k = 1: 1 + 0.85; k = 3: 1 + 0.85 + 0.7225 + 0.614125
    assert default_acceptance_length(1) == pytest.approx(1.85)
    assert default_acceptance_length(3) == pytest.approx(3.186625)
    assert MTP1.acceptance_length == 1.85 and MTP1.tokens_per_verification == 1.85
    assert GrpoWorkload(speculative="mtp", speculative_tokens=3).acceptance_length == 3.1866
    assert GrpoWorkload(speculative="mtp", acceptance_length=1.6).acceptance_length == 1.6
    assert OFF.tokens_per_verification == 1.0 and OFF.draft_tokens == 0


@pytest.mark.parametrize("values, words", [
    (dict(speculative="draft"), "separate draft model"),
    (dict(speculative="eagle3"), "EAGLE-3"),
    (dict(acceptance_length=1.5), "needs --speculative mtp"),
    (dict(speculative_tokens=3), "--speculative-tokens 3 needs --speculative mtp"),
    (dict(speculative="mtp", acceptance_length=2.5), "between 1 and"),
    (dict(speculative="mtp", speculative_tokens=0), "--speculative-tokens"),
    (dict(speculative="mtp", fused_kernels=True), "fused kernels"),
])
def test_bad_speculation_settings_are_refused_by_name(values, words):
    with pytest.raises(PlanInputError, match=words):
        GrpoWorkload(**values)


def test_mtp_on_a_model_without_mtp_layers_is_refused():
    qwen = builtin_model("Qwen3-8B")
    for workload in (MTP1, GrpoWorkload(train_mtp=True)):
        with pytest.raises(PlanInputError, match="no MTP layers.*check_mtp_config"):
            request(qwen, workload)
    request(MIMO, MTP1)  # MiMo-7B has one MTP layer


# --- rollout memory ------------------------------------------------------------------------------


def test_drafter_weights_and_kv_by_hand():
    # DeepSeek-V3's MTP layer: 11,274,289,152 routed-expert parameters (256 x 3 x 7168 x 2048)
    # of 11,610,068,224; at TP8 without EP, bf16: 2 x (335,779,072 + 11,274,289,152) / 8
    assert mtp_param_split(DSV3) == (335_779_072, 11_274_289_152)
    assert drafter_weight_bytes(DSV3, 8, 1) == 2_902_517_056
    # rollout EP16 splits the experts 16 ways: 2 x (335,779,072 / 8 + 11,274,289,152 / 16)
    assert drafter_weight_bytes(DSV3, 8, 16) == 2 * (335_779_072 / 8 + 11_274_289_152 / 16)
    # one MLA layer: a (512 + 64)-element latent in bf16 on every rank
    assert drafter_kv_bytes_per_token(DSV3, 8) == 1152
    assert kv_bytes_per_token(DSV3, cols(rollout_tp=8)) == 61 * 1152


def test_the_pool_holds_the_drafters_kv_and_the_lookahead_slots():
    layout = cols(tp=1, pp=1, dp=8, rollout_tp=8, gpu_memory_utilization=0.9)
    resident = np.zeros(1)
    plain = rollout_memory(request(DSV3, OFF, 8), layout, resident)
    spec = rollout_memory(request(DSV3, MTP1, 8), layout, resident)
    assert spec["rollout_weights_bytes"] - plain["rollout_weights_bytes"] == 2_902_517_056
    # the KV bytes left over, now at 62 x 1152 bytes per token
    kv = spec["kv_cache_bytes"]
    assert spec["kv_cache_tokens_per_gpu"] == np.floor(kv / (62 * 1152))
    assert spec["kv_state_tokens_per_seq"] == 1  # k = 1 lookahead slot
    assert plain["kv_state_tokens_per_seq"] == 0


def test_recurrent_layers_keep_k_more_state_pages_and_conv_columns():
    qwen35 = builtin_model("Qwen3.5-35B-A3B")
    # vLLM MambaSpec(num_speculative_blocks=k): 2 pages with prefix caching + k
    assert kv_cache_layout(qwen35, EngineCache(speculative_tokens=2)).state_pages == 4
    assert kv_cache_layout(qwen35, EngineCache(prefix_caching=False,
                                               speculative_tokens=3)).state_pages == 4
    assert kv_cache_layout(qwen35).state_pages == 2
    # the conv state keeps k more columns: 2 x conv_dim (2 x 16 x 128 + 32 x 128 = 8192) x 2 B
    linear = qwen35.layers[0].mixer
    assert (recurrent_state_bytes_layer(qwen35, linear, 1, speculative_tokens=2)
            - recurrent_state_bytes_layer(qwen35, linear, 1)) == 2 * 8192 * 2


# --- decode time ---------------------------------------------------------------------------------


def test_a_verification_step_reads_the_weights_once_and_adds_k_drafter_forwards():
    """Memory-bound decode (MiMo-7B, 8 sequences at TP1): the target's step costs the same
    with k + 1 query tokens (weights and K/V read once), plus k drafter forwards."""
    layout = cols(rollout_tp=1)
    for k in (1, 3):
        spec = GrpoWorkload(speculative="mtp", speculative_tokens=k)
        plain = decode_step_s(request(MIMO, OFF), layout, 8, 2048)
        verify = decode_step_s(request(MIMO, spec), layout, 8, 2048)
        draft = draft_forward_s(request(MIMO, spec), layout, 8, 2048)
        assert verify["total_s"] == pytest.approx(plain["total_s"] + k * draft["total_s"])


def test_the_drafter_forward_reads_its_layer_the_output_layer_and_its_kv():
    """One MiMo-7B drafter forward at TP1, 8 sequences of context 2048: bf16 MTP weights
    (210,790,400 parameters) + the output layer (621,281,280) + its K/V (8 KV heads x 128 x 2
    x 2 B = 4096 B per token), all at the calibrated decode HBM bandwidth."""
    eff = load_efficiency(H100, "bf16")
    hbm = H100.hbm_bandwidth_bytes_per_s * eff.decode_hbm
    expected = (2 * 210_790_400 + 2 * 621_281_280 + 8 * 2048 * 4096) / hbm
    draft = draft_forward_s(request(MIMO, MTP1), cols(rollout_tp=1), 8, 2048)
    assert draft["roofline_s"] == pytest.approx(expected)


def test_generation_takes_acceptance_length_fewer_steps():
    layout = cols(tp=1, pp=1, dp=8, rollout_tp=1, gpu_memory_utilization=0.6)
    small = dict(train_batch_size=16, mini_batch_size=16, rollout_n=4)  # 8 sequences a GPU
    plain, spec = (generate_s(request(MIMO, w), layout,
                              rollout_memory(request(MIMO, w), layout, np.zeros(1)))
                   for w in (GrpoWorkload(**small), GrpoWorkload(speculative="mtp", **small)))
    # the cache holds all 8 sequences either way, so the token steps are the same
    assert spec["decode_steps"] == pytest.approx(plain["decode_steps"] / 1.85)
    assert decode_steps(1336, MTP1) == pytest.approx(722.162, abs=1e-3)
    assert spec["total_s"] < plain["total_s"]


# --- the actor and the weight sync -----------------------------------------------------------


def test_mtp_parameters_sit_on_the_last_stage_when_built():
    # TP2, EP8, ETP1: 335,779,072 / 2 and 11,274,289,152 / 8
    dense, experts = mtp_stage_params(DSV3, MTP1, 2, 8, 1)
    assert (dense, experts) == (167_889_536, 1_409_286_144)
    assert mtp_stage_params(DSV3, OFF, 2, 8, 1) == (0, 0)
    layout = cols(tp=1, pp=2, dp=4, micro_batch=1)
    plain = actor_memory(request(MIMO, OFF), layout)["stages"]
    built = actor_memory(request(MIMO, MTP1), layout)["stages"]
    # STAGES = first, last, ...: only the last carries the 210,790,400 MTP parameters
    assert built[0]["weights"] == plain[0]["weights"]
    assert built[1]["weights"] - plain[1]["weights"] == 2 * 210_790_400
    assert built[1]["grads"] - plain[1]["grads"] == 4 * 210_790_400  # fp32 main grads
    # speculation alone does not run the MTP block: no activations or second loss
    assert built[1]["train_activations"] == plain[1]["train_activations"]
    trained = actor_memory(request(MIMO, GrpoWorkload(train_mtp=True)), layout)["stages"]
    assert trained[1]["train_logits"] == pytest.approx(2 * plain[1]["train_logits"])
    assert (trained[1]["train_activations"] > plain[1]["train_activations"]).all()
    assert trained[0]["train_activations"] == plain[0]["train_activations"]


def test_weight_sync_carries_the_mtp_layers_when_built():
    # DeepSeek-V3's MTP layer: MLA 7 + router and its bias 2 + 256 x 3 experts + shared 3
    # + 2 norms = 782 tensors, plus enorm, hnorm, eh_proj, shared_head.norm
    assert mtp_tensor_count(DSV3) == 786
    assert synced_tensor_count(DSV3, MTP1) == tensor_count(DSV3) + 786
    assert synced_tensor_count(DSV3, OFF) == tensor_count(DSV3)
    assert synced_params(DSV3, MTP1) - synced_params(DSV3, OFF) == 11_610_068_224
    layout = cols(tp=8, pp=1, dp=1, rollout_tp=8)
    trained_only = dataclasses.replace(OFF, train_mtp=True)  # exported, not loaded by vLLM
    plain, train, spec = (weight_sync_s(request(DSV3, w), layout)
                          for w in (OFF, trained_only, MTP1))
    assert train["comm_s"] > plain["comm_s"] and train["compute_s"] == plain["compute_s"]
    assert spec["compute_s"] > plain["compute_s"]  # vLLM's drafter loads them too
