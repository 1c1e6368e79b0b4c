"""The layer kinds wired into the cost model: rollout cache memory and concurrency, decode traffic
and prefill/training mixing FLOPs read each layer's kind (issue 22 phase B)."""

import dataclasses

import numpy as np
from conftest import cluster

from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cost.flops import (
    decode_mixing_flops_per_token,
    mixer_matmul_per_layer,
    mixing_flops_per_layer,
    mixing_flops_per_sequence,
)
from planner.cost.memory import (
    decode_cache_bytes,
    estimate_memory,
    kv_bytes_per_token,
    sequence_state_tokens,
)
from planner.cost.request import PlanRequest
from planner.cost.timing import generate_s, rollout_concurrency
from planner.search.layout import Layout


def cols_of(**values):
    values = {"sequence_parallel": values.get("tp", 1) > 1, **values}
    return Layout(**values).to_columns()


# Qwen3.5-35B-A3B: 40 layers, every 4th full attention (2 KV heads x 256), 30 Gated DeltaNet
# layers (16 key heads, 32 value heads, 128 x 128, conv kernel 4, fp32 state).
QWEN35_FULL_TOKEN_BYTES = 10 * 2 * 2 * 256 * 2  # K and V of 10 layers, bf16
QWEN35_GDN_STATE = 3 * (2 * 16 * 128 + 32 * 128) * 2 + 32 * 128 * 128 * 4  # conv + state
QWEN35_BLOCK = 16 * -(-QWEN35_GDN_STATE // (16 * 2 * 2 * 256 * 2))  # hybrid-aligned page


def test_growing_kv_counts_only_full_attention_layers():
    model = resolve_model("Qwen3.5-35B-A3B")
    assert QWEN35_BLOCK == 1056
    assert float(kv_bytes_per_token(model, cols_of(rollout_tp=1))[0]) == QWEN35_FULL_TOKEN_BYTES
    # gpt-oss-20b: 12 of 24 layers full attention, 8 KV heads x 64 (the windowed ones add a
    # fixed amount per sequence instead)
    oss = resolve_model("gpt-oss-20b")
    assert float(kv_bytes_per_token(oss, cols_of(rollout_tp=1))[0]) == 12 * 2 * 8 * 64 * 2


def test_state_pages_per_sequence_by_hand():
    """Qwen3.5: 30 GDN layers in 3 groups of 10 (the 10 full layers set the group size), two
    state pages each with prefix caching (mamba_cache_mode="align"), a page padded to the
    attention page of 1056 tokens; the growing K/V rounded up to whole 1056-token blocks."""
    model = resolve_model("Qwen3.5-35B-A3B")
    page = QWEN35_BLOCK * 2 * 2 * 256 * 2
    fixed = 3 * 2 * page * 10
    rounding = 8 * QWEN35_BLOCK - 8192
    expected = fixed / QWEN35_FULL_TOKEN_BYTES + rounding
    state = sequence_state_tokens(model, cols_of(rollout_tp=1), GrpoWorkload(), 8192)
    assert float(state[0]) == expected == 6592
    # without prefix caching one state page per group
    alone = sequence_state_tokens(model, cols_of(rollout_tp=1),
                                  GrpoWorkload(prefix_caching=False), 8192)
    assert float(alone[0]) == 3 * page * 10 / QWEN35_FULL_TOKEN_BYTES + rounding
    # a transformer keeps nothing beside its K/V
    dense = resolve_model("Qwen3-30B-A3B")
    assert float(sequence_state_tokens(dense, cols_of(rollout_tp=1), GrpoWorkload(),
                                       8192)[0]) == 0


def test_sliding_layers_add_their_window_pages():
    """gpt-oss-20b: 12 sliding layers (window 128) in one group of 12: cdiv(128, 16) + 1 = 9
    pages of 16 tokens per sequence, whatever its length."""
    model = resolve_model("gpt-oss-20b")
    per_token = 12 * 2 * 8 * 64 * 2
    page = 16 * 2 * 8 * 64 * 2
    state = sequence_state_tokens(model, cols_of(rollout_tp=1), GrpoWorkload(), 8192)
    assert float(state[0]) == 9 * page * 12 / per_token == 144


def _concurrency(name, pool_bytes, tp=1):
    model = resolve_model(name)
    workload = GrpoWorkload(prompt_length=1024, response_length=7168, mean_response_length=7168,
                            max_num_seqs=100_000)
    cols = cols_of(rollout_tp=tp)
    tokens = np.floor(pool_bytes / kv_bytes_per_token(model, cols, workload))
    state = sequence_state_tokens(model, cols, workload, workload.sequence_length)
    return float(rollout_concurrency(workload, tokens, state)[0])


def test_hybrid_runs_3x_more_sequences_than_transformer_of_its_size():
    pool = 60 * 2**30
    hybrid = _concurrency("Qwen3-Next-80B-A3B", pool)
    transformer = _concurrency("Qwen2.5-72B", pool)
    assert hybrid >= 3 * transformer
    # and the state is not free: fewer than the growing K/V alone would allow
    model = resolve_model("Qwen3-Next-80B-A3B")
    kv_only = pool / kv_bytes_per_token(model, cols_of(rollout_tp=1))[0] / 8192
    assert hybrid < 0.8 * kv_only


def test_rollout_memory_fits_states_and_concurrency():
    model = resolve_model("Qwen3.5-35B-A3B")
    workload = GrpoWorkload(prompt_length=1024, response_length=7168)
    request = PlanRequest(model, cluster(8, "H200"), workload)
    cols = cols_of(ep=8, dp=8, rollout_tp=1, rollout_dp=8, rollout_ep=8,
                   gpu_memory_utilization=0.5)
    out = estimate_memory(request, cols)
    assert float(out["kv_state_tokens_per_seq"][0]) == 6592
    # the concurrency at the maximum length counts each sequence's state pages
    per_seq = 1024 / workload.rollout_n + 7168 + 6592
    assert float(out["rollout_concurrent_seqs"][0]) == min(
        np.floor(out["kv_cache_tokens_per_gpu"][0] / per_seq), workload.max_num_seqs)
    times = generate_s(request, cols, out)
    assert np.isfinite(times["total_s"][0])


def test_linear_layers_read_their_state_not_the_sequence():
    model = resolve_model("Qwen3.5-35B-A3B")
    cols = cols_of(rollout_tp=1)
    short, long = (float(decode_cache_bytes(model, cols, GrpoWorkload(), c)[0])
                   for c in (1000, 9000))
    # only the 10 full-attention layers' reads grow with the context
    assert long - short == 8000 * QWEN35_FULL_TOKEN_BYTES
    assert short == 1000 * QWEN35_FULL_TOKEN_BYTES + 30 * 2 * QWEN35_GDN_STATE
    # a transformer: the whole context's K/V, as before
    dense = resolve_model("Qwen3-30B-A3B")
    assert float(decode_cache_bytes(dense, cols, GrpoWorkload(), 1000)[0]) == \
        1000 * float(kv_bytes_per_token(dense, cols)[0])


def test_window_caps_decode_and_prefill_mixing():
    oss = resolve_model("gpt-oss-20b")
    full_only = dataclasses.replace(
        oss, layers=tuple(dataclasses.replace(layer, mixer="full_attention", window=0)
                          for layer in oss.layers))
    per_pair = 2.0 * oss.num_attention_heads * 2 * oss.head_dim
    # decode at 8000 tokens: 12 layers see 8000 keys, 12 see 128
    assert float(decode_mixing_flops_per_token(oss, 8000)) == per_pair * (12 * 8000 + 12 * 128)
    assert float(decode_mixing_flops_per_token(full_only, 8000)) == per_pair * 24 * 8000
    # prefill of 4096 tokens: the sliding layers compute s*w - w^2/2 pairs
    s, w = 4096.0, 128.0
    assert float(mixing_flops_per_sequence(oss, s)) == per_pair * (12 * s * s / 2
                                                                  + 12 * (s * w - w * w / 2))


def test_training_mean_layer_by_kind():
    model = resolve_model("Qwen3.5-35B-A3B")
    dense = resolve_model("Qwen3-30B-A3B")
    from planner.cost.flops import attention_core_flops_per_layer, linear_params_per_token
    linear = linear_params_per_token(model)
    assert mixer_matmul_per_layer(model) == (10 * linear["attention"]
                                             + 30 * linear["linear_attention"]) / 40
    assert mixer_matmul_per_layer(dense) == linear_params_per_token(dense)["attention"]
    # a transformer's mean layer is one attention core, exactly as before
    assert float(mixing_flops_per_layer(dense, 4, 8192)) == float(
        attention_core_flops_per_layer(dense, 4 * 8192 ** 2))
    assert float(mixing_flops_per_layer(model, 4, 8192)) == float(
        4 * mixing_flops_per_sequence(model, 8192) / 40)


# --- megatron-core's rules for linear-attention and Mamba layers ----------------------------

def _broken(name, **values):
    from planner.search.rules import explain
    layout = {"tp": 1, "pp": 1, "vpp": 1, "cp": 1, "ep": 1, "etp": 1, "dp": 1,
              "micro_batch": 1, "rollout_tp": 1, "rollout_dp": 1, "rollout_ep": 1, **values}
    layout["dp"] = 1
    model = resolve_model(name)
    world = layout["tp"] * layout["cp"]
    return {rule: message for rule, message in explain(model, cluster(world), GrpoWorkload(),
                                                         layout)}


def test_gated_deltanet_heads_divide_by_tp_and_refuse_cp():
    # Qwen3.5-35B-A3B: 16 key heads, 32 value heads, 16 attention heads, 2 KV heads
    assert "tp_divides_linear_attention_heads" not in _broken("Qwen3.5-35B-A3B", tp=4)
    broken = _broken("Qwen3.5-35B-A3B", tp=32)
    assert "tp_divides_linear_attention_heads" in broken
    assert "16 key, 32 value" in broken["tp_divides_linear_attention_heads"]
    cp = _broken("Qwen3.5-35B-A3B", cp=2)
    assert cp["cp_linear_attention"] == (
        "context_parallel_size 2: Qwen3.5-35B-A3B's Gated DeltaNet layers run without context "
        "parallelism in megatron-core 0.16.1 (CP must be 1)")
    # a transformer keeps CP
    assert "cp_linear_attention" not in _broken("Qwen3-30B-A3B", cp=2)


def test_attention_sinks_and_sliding_windows_refuse_cp():
    """gpt-oss (Megatron-Bridge's GPTOSSProvider: softmax_type 'learnable', window_size (128, 0)
    on every other layer): Transformer Engine's attention takes a learnable softmax under context
    parallelism only with cp_comm_type a2a, and a sliding window not with p2p -- verl leaves
    megatron-core's p2p, so CP > 1 has no attention backend."""
    broken = _broken("gpt-oss-20b", cp=2)
    assert broken["cp_attention_sinks"] == (
        "context_parallel_size 2: gpt-oss-20b's attention sinks and sliding-window layers have "
        "no Transformer Engine attention backend under context parallelism with cp_comm_type "
        "p2p, which verl runs (TE takes a learnable softmax only with a2a, a window not with "
        "p2p); CP must be 1")
    assert "cp_attention_sinks" not in _broken("gpt-oss-20b", cp=1)
    assert "cp_attention_sinks" not in _broken("Qwen3-30B-A3B", cp=2)


def test_mamba_heads_and_groups_divide_by_tp_and_cp():
    model = resolve_model("NVIDIA-Nemotron-3-Nano-30B-A3B")
    heads, groups = model.mamba.num_heads, model.mamba.n_groups
    assert heads % 8 == 0 and groups == 8
    assert "tp_divides_mamba_heads" not in _broken("NVIDIA-Nemotron-3-Nano-30B-A3B", tp=8)
    assert "tp_divides_mamba_heads" in _broken("NVIDIA-Nemotron-3-Nano-30B-A3B", tp=16)
    # CP: heads per TP rank must divide by CP; groups per TP rank (8/2 = 4) split or replicate
    assert "cp_divides_mamba_heads" not in _broken("NVIDIA-Nemotron-3-Nano-30B-A3B", tp=2, cp=8)
    assert "cp_divides_mamba_heads" in _broken("NVIDIA-Nemotron-3-Nano-30B-A3B", tp=2, cp=3)


# --- output: the architecture object, the model line, verl's MFU -------------------------------

def test_estimate_json_carries_the_architecture(capsys):
    import json

    from planner.cli.main import main
    argv = ["estimate", "--model", "Qwen3.5-35B-A3B", "--gpus", "8", "--gpu-type", "h200",
            "--prompt-length", "1024", "--response-length", "7168", "--tp", "1", "--ep", "8",
            "--format", "json"]
    assert main(argv) in (0, 1)  # 1: the peak sits above the memory band (still reported)
    arch = json.loads(capsys.readouterr().out)["architecture"]
    assert arch["layer_counts"] == {"linear_attention": 30, "full_attention": 10}
    assert arch["mlp_counts"] == {"moe": 40}
    assert arch["kv_cache_bytes_per_token"] == QWEN35_FULL_TOKEN_BYTES
    # 8192 tokens: 8 attention blocks of 1056 tokens + 3 GDN groups x 2 state pages, each
    # block id spanning 10 layers' pages
    page = QWEN35_BLOCK * 2 * 2 * 256 * 2
    assert arch["sequence_tokens"] == 8192
    assert arch["kv_cache_bytes_per_sequence"] == (8 + 3 * 2) * page * 10
    assert arch["verl_reports_mfu"] is True and arch["train_tflops_per_sequence"] > 0


def test_text_names_layer_kinds_and_verl_mfu_zero(capsys):
    from planner.cli.main import main
    argv = ["estimate", "--model", "NVIDIA-Nemotron-3-Nano-30B-A3B", "--gpus", "8",
            "--gpu-type", "h200", "--prompt-length", "1024", "--response-length", "1024",
            "--tp", "1", "--ep", "8"]
    assert main(argv) in (0, 1)
    text = capsys.readouterr().out
    assert "(verl logs MFU 0 for model_type nemotron_h: no FlopsCounter function)" in text
    from planner.report.text import layer_kinds_text
    assert layer_kinds_text(resolve_model("Qwen3.5-35B-A3B")) == \
        " (30 linear_attention + 10 full_attention)"
    assert layer_kinds_text(resolve_model("Qwen3-30B-A3B")) == ""
    # Nemotron-H's MoE blocks are layers without a mixer: the counts add up to its 52 layers
    nano = resolve_model("NVIDIA-Nemotron-3-Nano-30B-A3B")
    assert nano.num_layers == 52 and layer_kinds_text(nano) == \
        " (23 mamba2 + 6 full_attention + 23 moe-only)"


# --- export: the bridge verl builds the model through ------------------------------------------

def _settings(name):
    from planner.search.layout import Layout
    from planner.verl.export import job_settings
    model = resolve_model(name)
    ep = 8 if model.is_moe else 1
    layout = Layout(tp=1, ep=ep, dp=8, rollout_tp=1, rollout_dp=8 if model.is_moe else 1,
                    rollout_ep=ep if model.is_moe else 1)
    return {s.key: s.value for s in job_settings(model, cluster(8), GrpoWorkload(), layout,
                                                 model_path="m", train_files="t",
                                                 val_files="v")}


def test_export_writes_the_bridge_a_family_needs():
    key = "actor_rollout_ref.actor.megatron.vanilla_mbridge"
    # Mixtral is registered only in the legacy mbridge (model_type dispatch)
    assert _settings("Mixtral-8x7B")[key] is True
    # Megatron-Bridge's AutoBridge is verl's default: nothing written
    qwen = _settings("Qwen3.5-35B-A3B")
    assert key not in qwen and "actor_rollout_ref.actor.megatron.use_mbridge" not in qwen


# --- training: stage weights, activations and weight sync by layer kind -----------------------

def test_stage_weights_sum_to_the_model_by_layer_kind():
    from planner.cost.memory import actor_params_per_gpu, layer_group_params
    for name in ("Qwen3.5-35B-A3B", "NVIDIA-Nemotron-3-Nano-30B-A3B", "Qwen3-30B-A3B"):
        model = resolve_model(name)
        p = model.params
        (dense_split, dense_full), (moe_split, moe_full) = layer_group_params(model)
        dense = model.num_layers - model.num_moe_layers
        layers = (dense * (dense_split + dense_full)
                  + model.num_moe_layers * (moe_split + moe_full + p.experts_per_layer))
        assert layers + p.embedding + p.output_layer + p.final_norm + p.vision == p.total
        # one rank, no parallelism: every parameter but the vision tower
        non_expert, expert = actor_params_per_gpu(model, cols_of())[0]
        assert float(non_expert[0] + expert[0]) == p.total - p.vision
    # Qwen3.5's mean layer holds 3 Gated DeltaNet mixers for each attention one: fewer
    # parameters than 40 attention layers would
    model = resolve_model("Qwen3.5-35B-A3B")
    p = model.params
    moe_split, moe_full = layer_group_params(model)[1]
    assert moe_split + moe_full == (10 * p.attention_per_layer + 30 * p.linear_attention_per_layer
                                    ) / 40 + p.router_per_layer + p.shared_experts_per_layer \
        + p.norms_per_layer


def test_training_activations_by_mixer_kind():
    from planner.catalog.layers import MixerKind
    from planner.cost.layer_kinds import mixer_activation_bytes_per_token
    from planner.cost.memory import activation_bytes_per_token
    model = resolve_model("Qwen3.5-35B-A3B")
    attention_only = dataclasses.replace(
        model, layers=tuple(dataclasses.replace(layer, mixer="full_attention")
                            for layer in model.layers))
    cols = cols_of(tp=2)
    hybrid = float(activation_bytes_per_token(model, cols, True)[0])
    full = float(activation_bytes_per_token(attention_only, cols, True)[0])
    gdn = float(mixer_activation_bytes_per_token(model, MixerKind.LINEAR, 2))
    attn = float(mixer_activation_bytes_per_token(model, MixerKind.FULL, 2))
    # the transformer formula keeps Q, K, V and the output (2 bytes each over TP 2); the
    # hybrid's mean layer 3/4 of a Gated DeltaNet's tensors and 1/4 of a gated attention's
    plain_attention = 2 * (16 * 256 + 2 * 2 * 256 + 16 * 256) / 2
    assert np.isclose(hybrid - full, 0.75 * gdn + 0.25 * attn - plain_attention)
    # Nemotron-H: the MoE layers have no mixer and one norm; the Mamba/attention layers no MLP
    nemotron = resolve_model("NVIDIA-Nemotron-3-Nano-30B-A3B")
    mamba_group = float(activation_bytes_per_token(nemotron, cols_of(), False)[0])
    layers = [layer for layer in nemotron.layers if layer.mlp.value != "moe"]
    mixers = sum(float(mixer_activation_bytes_per_token(nemotron, layer.mixer, 1))
                 for layer in layers) / len(layers)
    h = nemotron.hidden_size
    assert np.isclose(mamba_group, mixers + 2 * 2 * h)  # one norm: its input and output


def test_weight_sync_counts_each_layer_kind():
    from planner.cost.timing import tensor_count
    nemotron = resolve_model("NVIDIA-Nemotron-3-Nano-30B-A3B")
    from planner.cost.layer_kinds import weight_sync_tensors
    assert tensor_count(nemotron) == sum(weight_sync_tensors(nemotron).values())
    # a transformer keeps its calibrated count
    assert tensor_count(resolve_model("Qwen3-30B-A3B")) == 48 * (8 + 1 + 3 * 128) + 3
