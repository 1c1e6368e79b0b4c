"""Floating-point operations of a forward pass, per token and per sequence.

Physical counts (what the GPUs execute): 2 FLOPs per multiply-add of every linear layer a token
passes through (attention projections, the dense MLP or its top-k routed experts plus shared
experts, the router, the output layer), and causal core attention
``2 * s^2 * heads * (d_qk + d_v) / 2`` per sequence of ``s`` tokens and per layer
(Q.K^T and A.V, each 2*s^2*heads*d, halved by the causal mask).  Backward is twice the
forward (Narayanan et al. 2021, §5.1: 2x for weight and input gradients).

:func:`verl_training_flops` restates verl's own convention (``verl/utils/flops_counter.py``), which
additionally counts the embedding lookup as a matmul (``emd_and_lm_head_N = 2*V*h``); the tests
check it equals verl's estimate exactly, and MFU is reported on that convention so it matches
verl's ``perf/mfu/actor``.
"""

from __future__ import annotations

import numpy as np

from planner.catalog.models import ModelSpec


def linear_params_per_token(model: ModelSpec) -> dict[str, float]:
    """Matmul parameters one token passes through, per layer class (norms excluded)."""
    p = model.params
    h = model.hidden_size
    # attention projections without biases and norms
    if model.is_mla:
        qk_head = model.qk_nope_head_dim + model.qk_rope_head_dim
        q = (h * model.q_lora_rank + model.q_lora_rank * model.num_attention_heads * qk_head
             if model.q_lora_rank else h * model.num_attention_heads * qk_head)
        attention = (q + h * (model.kv_lora_rank + model.qk_rope_head_dim)
                     + model.kv_lora_rank * model.num_attention_heads
                     * (model.qk_nope_head_dim + model.v_head_dim)
                     + model.num_attention_heads * model.v_head_dim * h)
    else:
        q_out = model.num_attention_heads * model.head_dim
        attention = h * (q_out + 2 * model.num_query_groups * model.head_dim) + q_out * h
    mlp_matrices = 3 if model.gated_mlp else 2
    return {
        "attention": float(attention),
        "dense_mlp": float(mlp_matrices * h * model.ffn_hidden_size),
        "router": float(model.num_experts * h),
        "routed_experts": float(p.active_experts_per_layer),
        "shared_experts": float(p.shared_experts_per_layer),
        "output_layer": float(model.vocab_size * h),
    }


def active_linear_params_per_token(model: ModelSpec) -> float:
    """Matmul parameters one token passes through in the whole model (every layer, the routed
    experts it is sent to, the output layer): ``2 x`` this is a token's forward matmul FLOPs."""
    linear = linear_params_per_token(model)
    dense_layers = model.num_layers - model.num_moe_layers
    return (model.num_layers * linear["attention"] + dense_layers * linear["dense_mlp"]
            + model.num_moe_layers * (linear["router"] + linear["routed_experts"]
                                      + linear["shared_experts"])
            + linear["output_layer"])


def attention_core_flops_per_layer(model: ModelSpec, seq_len_squared) -> np.ndarray:
    """Causal core attention forward FLOPs of one layer for sequences with sum of s^2 given."""
    if model.is_mla:
        d_qk = model.qk_nope_head_dim + model.qk_rope_head_dim
        d_v = model.v_head_dim
    else:
        d_qk = d_v = model.head_dim
    return np.asarray(seq_len_squared, dtype=np.float64) * model.num_attention_heads * (d_qk + d_v)


def forward_flops(model: ModelSpec, tokens, seq_len_squared) -> np.ndarray:
    """Forward FLOPs for ``tokens`` tokens in sequences whose squared lengths sum as given."""
    linear = linear_params_per_token(model)
    dense_layers = model.num_layers - model.num_moe_layers
    per_token = 2 * (model.num_layers * linear["attention"] + dense_layers * linear["dense_mlp"]
                     + model.num_moe_layers * (linear["router"] + linear["routed_experts"]
                                               + linear["shared_experts"])
                     + linear["output_layer"])
    attention = model.num_layers * attention_core_flops_per_layer(model, seq_len_squared)
    return np.asarray(tokens, dtype=np.float64) * per_token + attention


def training_flops(model: ModelSpec, tokens, seq_len_squared) -> np.ndarray:
    """Model FLOPs of forward + backward (3x forward), no recomputation."""
    return 3 * forward_flops(model, tokens, seq_len_squared)


def verl_training_flops(model: ModelSpec, tokens, seq_len_squared) -> np.ndarray:
    """verl's ``FlopsCounter`` count: our training FLOPs plus the embedding counted as a matmul
    (6 * V * h per token), as ``flops_counter.py`` does.  ``tokens`` is the sum of sequence
    lengths, ``seq_len_squared`` the sum of their squares."""
    embedding_as_matmul = 6.0 * model.vocab_size * model.hidden_size * np.asarray(tokens, float)
    return training_flops(model, tokens, seq_len_squared) + embedding_as_matmul
