"""Per-layer-kind physics worked out by hand: vLLM's cache pages and states, decode traffic,
training activations, weight-sync tensors, and the architecture summary."""

import numpy as np
import pytest

from planner.catalog.layers import MixerKind
from planner.catalog.models import builtin_model
from planner.cost.architecture import architecture_summary
from planner.cost.layer_kinds import (
    EngineCache,
    concurrent_sequences,
    decode_bytes_per_step,
    kv_cache_bytes_per_sequence,
    kv_cache_bytes_per_token,
    kv_cache_layout,
    mixer_activation_bytes_per_token,
    recurrent_state_bytes_layer,
    weight_sync_tensors,
)
from planner.errors import PlanInputError

Q35 = "Qwen3.5-35B-A3B"


def test_full_attention_bytes_by_hand():
    """Qwen3-30B-A3B: 48 layers x 4 KV heads x (K + V) x 128 x bf16 = 96 KiB per token; a
    sequence holds whole 16-token pages."""
    model = builtin_model("Qwen3-30B-A3B")
    assert int(kv_cache_bytes_per_token(model)) == 48 * 4 * 2 * 128 * 2 == 98304
    assert int(kv_cache_bytes_per_sequence(model, 8000)) == 500 * 16 * 98304  # cdiv(8000, 16)
    # TP 8 over 4 KV heads: one head replicated per rank
    assert int(kv_cache_bytes_per_token(model, tp=8)) == 48 * 1 * 2 * 128 * 2


def test_mla_caches_one_latent_on_every_rank():
    model = builtin_model("DeepSeek-V3")
    per_token = 61 * (512 + 64) * 2
    assert int(kv_cache_bytes_per_token(model, tp=1)) == per_token
    assert int(kv_cache_bytes_per_token(model, tp=8)) == per_token


def test_gated_deltanet_state_by_hand():
    """Qwen3.5-35B-A3B at TP 1: conv state 3 x (2*16*128 + 32*128) bf16 + recurrent state
    32 x 128 x 128 at its config's float32 (vLLM gated_delta_net_state_shape / dtype)."""
    model = builtin_model(Q35)
    conv = 3 * 8192 * 2
    state = 32 * 128 * 128 * 4
    assert int(recurrent_state_bytes_layer(model, MixerKind.LINEAR)) == conv + state == 2146304
    assert int(recurrent_state_bytes_layer(model, MixerKind.LINEAR, tp=2)) == (conv + state) // 2


def test_mamba2_state_by_hand():
    """Nemotron-3-Nano: conv 3 x (64*64 + 2*8*128) bf16, SSM 64 x 64 x 128 float32."""
    model = builtin_model("NVIDIA-Nemotron-3-Nano-30B-A3B")
    expected = 3 * (4096 + 2048) * 2 + 64 * 64 * 128 * 4
    assert int(recurrent_state_bytes_layer(model, MixerKind.MAMBA)) == expected


def test_hybrid_allocator_aligns_pages_as_vllm_does():
    """vLLM _align_hybrid_block_size for Qwen3.5 at TP 1: attention page per token
    2 KV heads x (256 + 256) x 2 B = 2048 B; block 16 * cdiv(2146304, 16 * 2048) = 1056 tokens;
    the state page is padded to 1056 * 2048 B; 10 full + 30 linear layers make groups of 10."""
    layout = kv_cache_layout(builtin_model(Q35), EngineCache(tp=1))
    assert layout.block_tokens == 1056 and layout.page_bytes == 1056 * 2048 == 2162688
    assert layout.group_size == 10
    assert sorted((k.value, n) for k, _, n in layout.groups) == [("full_attention", 1),
                                                                ("linear_attention", 3)]
    # 8K tokens: 8 attention pages + 3 linear groups x 2 state pages (prefix caching on)
    assert int(layout.blocks_per_sequence(8192)) == 8 + 3 * 2
    assert int(kv_cache_bytes_per_sequence(builtin_model(Q35), 8192)) == 14 * 2162688 * 10
    no_prefix = kv_cache_layout(builtin_model(Q35), EngineCache(tp=1, prefix_caching=False))
    assert int(no_prefix.blocks_per_sequence(8192)) == 8 + 3


def test_sliding_and_chunked_layers_cap_their_pages():
    oss = kv_cache_layout(builtin_model("gpt-oss-120b"))
    assert oss.group_size == 18 and oss.block_tokens == 16
    # full: 512 pages at 8K; sliding(128): cdiv(128, 16) + 1 = 9 pages, however long
    assert int(oss.blocks_per_sequence(8192)) == 512 + 9
    assert int(oss.blocks_per_sequence(64)) == 4 + 4
    scout = kv_cache_layout(builtin_model("Llama-4-Scout-17B-16E"))
    assert int(scout.blocks_per_sequence(20000)) == 1250 + 3 * (512 + 1)
    whole = kv_cache_layout(builtin_model("gpt-oss-120b"), EngineCache(hybrid_allocator=False))
    assert int(whole.blocks_per_sequence(8192)) == 512  # sliding layers allocated as full


def test_hybrid_runs_3x_more_sequences_at_the_same_pool():
    """1K prompt + 7K response, one 60 GiB pool at rollout TP 1: Qwen3.5-35B-A3B (10 of 40
    layers grow a cache) holds >= 3x the sequences of Qwen3-30B-A3B (48 of 48) with one state
    page per sequence (mamba_cache_mode "none"); with prefix caching's two state pages the
    advantage is 2.6x, and at TP 4 (Qwen3.5's 2 KV heads are replicated, Qwen3-30B's 4 split)
    it falls to about 2x -- the planner must not assume the headline ratio."""
    pool = 60 * 2 ** 30
    full = int(concurrent_sequences(builtin_model("Qwen3-30B-A3B"), pool, 8192))
    hybrid = int(concurrent_sequences(builtin_model(Q35), pool, 8192,
                                      EngineCache(prefix_caching=False)))
    assert hybrid >= 3 * full
    aligned = int(concurrent_sequences(builtin_model(Q35), pool, 8192))
    assert 2.5 * full <= aligned < 3 * full
    nxt = int(concurrent_sequences(builtin_model("Qwen3-Next-80B-A3B"), pool, 8192,
                                   EngineCache(prefix_caching=False)))
    assert nxt >= 3 * full
    tp4 = int(concurrent_sequences(builtin_model(Q35), pool, 8192,
                                   EngineCache(tp=4, prefix_caching=False)))
    assert tp4 < 2.5 * int(concurrent_sequences(builtin_model("Qwen3-30B-A3B"), pool, 8192,
                                                EngineCache(tp=4)))


def test_decode_reads_state_not_sequence():
    model = builtin_model(Q35)
    short, long = (decode_bytes_per_step(model, ctx) for ctx in (1000, 100000))
    assert short["linear_attention"] == long["linear_attention"] == 30 * 2 * 2146304
    per_token = 2 * 2 * 256 * 2
    assert int(long["full_attention"]) == 10 * 100001 * per_token
    oss = decode_bytes_per_step(builtin_model("gpt-oss-120b"), 100000)
    assert int(oss["sliding_attention"]) == 18 * 129 * 8 * 2 * 64 * 2


def test_activation_bytes_by_hand():
    model = builtin_model(Q35)
    # gated attention: Q, K, V, output, gate and gated product (2 B each)
    hq = 16 * 256
    hk = 2 * 256
    assert float(mixer_activation_bytes_per_token(model, MixerKind.FULL, tp=2)) == \
        2 * (hq + 2 * hk + hq + hq + hq) / 2
    # Gated DeltaNet: conv input 8192, q k v 8192, z + norm in/out 3*4096, A a b beta
    # (64 + 3) * 32 in bf16; g 32 and q/k rstd 2*16 in fp32
    bf16 = 8192 + 8192 + 3 * 4096 + 67 * 32
    assert float(mixer_activation_bytes_per_token(model, MixerKind.LINEAR)) == \
        2 * bf16 + 4 * (32 + 32)
    nano = builtin_model("NVIDIA-Nemotron-3-Nano-30B-A3B")
    zxbcdt = 2 * 4096 + 2 * 8 * 128 + 64
    assert float(mixer_activation_bytes_per_token(nano, MixerKind.MAMBA)) == \
        2 * (zxbcdt + 2 * 4096) + 4 * 8


def test_weight_sync_tensor_counts():
    counts = weight_sync_tensors(builtin_model("Qwen3-8B"))
    # q, k, v, o, q_norm, k_norm + gate, up, down + 2 norms, per layer; embed, norm, lm_head
    assert counts == {"full_attention+dense": 36 * 11, "other": 3}
    q35 = weight_sync_tensors(builtin_model(Q35))
    moe = 1 + 256 * 3 + 3 + 1  # router, experts, shared expert and its gate
    assert q35["linear_attention+moe"] == 30 * (9 + moe + 2)
    assert q35["full_attention+moe"] == 10 * (6 + moe + 2)


def test_unknown_cache_dtype_is_refused():
    with pytest.raises(PlanInputError, match="fp6"):
        kv_cache_bytes_per_token(builtin_model("Qwen3-8B"), kv_dtype="fp6")


def test_architecture_summary():
    pytest.importorskip("numpy")
    summary = architecture_summary(builtin_model(Q35), 1024, 7168)
    data = summary.to_dict()
    assert data["family"] == "Qwen3.5/3.6" and data["verl_route"] == "megatron-bridge"
    assert data["layer_counts"] == {"linear_attention": 30, "full_attention": 10}
    assert data["kv_cache_bytes_per_token"] == 10 * 2048
    assert data["kv_cache_bytes_per_sequence"] == 14 * 2162688 * 10
    assert data["total_params"] == builtin_model(Q35).params.total
    assert 0 < data["train_tflops_per_sequence"] and data["verl_reports_mfu"]
    assert not architecture_summary(builtin_model("GLM-4.5-Air"), 1024, 7168).verl_reports_mfu
    assert np.isfinite(data["train_tflops_per_sequence"])
