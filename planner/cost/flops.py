"""Floating-point operations of a forward pass, per token and per sequence, per layer kind.

Physical counts (what the GPUs execute): 2 FLOPs per multiply-add of every linear layer a token
passes through (attention and linear-attention projections, Mamba projections and conv1d, the
dense MLP or its top-k routed experts plus shared experts, the router, the output layer), and
per layer kind the token-mixing work of a sequence of ``s`` tokens:

* causal softmax attention: ``2 * pairs * heads * (d_qk + d_v)`` (Q.K^T and A.V), with
  ``pairs = s^2 / 2`` for full attention and MLA, ``s*w - w^2/2`` for a sliding window of ``w``
  (each query sees at most ``w`` keys), and ``sum(c^2 / 2)`` over the chunks of chunked local
  attention;
* Gated DeltaNet and Mamba-2: a fixed cost per token, ``5 * heads * d_k * d_v`` (Mamba:
  ``d_head * d_state``) for the state update and readout: the forward share of verl's Gated
  DeltaNet recurrence count (``15 * d_k * d_v * n_v`` per token for forward + backward,
  ``verl/utils/flops_counter.py::_compute_qwen3_5_gdn_recurrence_flops``), applied to Mamba's
  state the same way.

Backward is twice the forward (Narayanan et al. 2021, §5.1: 2x for weight and input gradients).

:func:`verl_training_flops_per_sequence` restates verl's own convention (``FlopsCounter``), so
predicted MFU compares with verl's ``perf/mfu/actor``: ``6 * N * tokens`` for the matmul
parameters ``N`` a token uses with the embedding counted as a matmul (``2*V*h``), plus
``3 * units * heads * (d_qk + d_v)`` for attention, where ``units`` is ``s^2`` per full layer and
``s * min(s, w)`` per sliding layer, plus the recurrence above.  Where verl's per-family function
departs from that (Qwen-MoE ignores shared experts, Qwen3-VL takes ``head_dim = h / heads``, the
Llama/Qwen2 function ignores sliding windows) the quirk is restated per ``model_type`` in
:data:`VERL_QUIRKS`, and the tests check equality with ``ESTIMATE_FUNC``.  For model types verl
has no function for (its MFU is then 0) the same convention is applied as is, with chunked local
attention (Llama-4) counted ``sum(c^2)`` over chunks and Mamba-2 layers like Gated DeltaNet.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from planner.catalog.layers import LayerSpec, MixerKind, MlpKind
from planner.catalog.models import ModelSpec
from planner.catalog.params import moe_params

# verl 0.9.1 ``flops_counter.ESTIMATE_FUNC``: the model types verl reports MFU for (others: 0).
VERL_FLOPS_MODEL_TYPES = frozenset({
    "qwen2", "llama", "qwen2_moe", "qwen2_vl", "qwen2_5_vl", "qwen3", "qwen3_moe", "qwen3_vl",
    "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "deepseek_v3", "minicpmv", "minicpmo", "mistral",
    "gemma3_text", "seed_oss", "apertus", "glm4v", "gpt_oss", "mimo", "hy_v3"})
# Where verl's function for a model type departs from the layer-kind convention.
IGNORES_SHARED_EXPERTS = "ignores shared experts and their gate; every layer counted as MoE"
HEAD_DIM_FROM_HIDDEN = "head_dim taken as hidden_size / heads"
IGNORES_WINDOWS = "every layer counted as full attention"
VERL_QUIRKS = {
    "qwen2_moe": (IGNORES_SHARED_EXPERTS,), "qwen3_moe": (IGNORES_SHARED_EXPERTS,),
    "qwen3_vl_moe": (IGNORES_SHARED_EXPERTS,), "qwen3_vl": (HEAD_DIM_FROM_HIDDEN,),
    "qwen2_vl": (HEAD_DIM_FROM_HIDDEN,), "qwen2_5_vl": (HEAD_DIM_FROM_HIDDEN,),
    **{t: (IGNORES_WINDOWS,) for t in ("qwen2", "llama", "qwen3", "mistral", "mimo")},
}
RECURRENT_FORWARD_FACTOR = 5  # verl's 15 per token for forward + backward, / 3


def verl_reports_mfu(model: ModelSpec) -> bool:
    """Whether verl's FlopsCounter knows this model type (else it logs MFU 0)."""
    return model.model_type in VERL_FLOPS_MODEL_TYPES


# ---------------------------------------------------------------------------------------------
# Matmul parameters per token


def _attention_matmul(model: ModelSpec, head_dim: int | None = None) -> float:
    """Projection weights of one softmax-attention layer (no biases, norms or sinks)."""
    h = model.hidden_size
    if model.is_mla:
        qk_head = model.qk_nope_head_dim + model.qk_rope_head_dim
        q = (h * model.q_lora_rank + model.q_lora_rank * model.num_attention_heads * qk_head
             if model.q_lora_rank else h * model.num_attention_heads * qk_head)
        return float(q + h * (model.kv_lora_rank + model.qk_rope_head_dim)
                     + model.kv_lora_rank * model.num_attention_heads
                     * (model.qk_nope_head_dim + model.v_head_dim)
                     + model.num_attention_heads * model.v_head_dim * h)
    d = head_dim or model.head_dim
    q_out = model.num_attention_heads * d
    gate = q_out if model.attention_output_gate else 0
    return float(h * (q_out + gate + 2 * model.num_query_groups * d) + q_out * h)


def _linear_attention_matmul(model: ModelSpec) -> float:
    """Gated DeltaNet's in/out projections and its depthwise conv1d (verl counts both)."""
    g = model.linear_attention
    h = model.hidden_size
    return float(h * (2 * g.key_dim + 3 * g.value_dim + 2 * g.num_value_heads)
                 + g.conv_kernel * g.conv_dim)


def _mamba_matmul(model: ModelSpec) -> float:
    m = model.mamba
    h = model.hidden_size
    return float(h * (2 * m.inner_size + 2 * m.n_groups * m.state_size + m.num_heads)
                 + m.inner_size * h + m.conv_kernel * m.conv_dim)


def linear_params_per_token(model: ModelSpec) -> dict[str, float]:
    """Matmul parameters one token passes through, per layer class (norms excluded)."""
    return dict(_linear_params_per_token(model))


@lru_cache(maxsize=32)
def _linear_params_per_token(model: ModelSpec) -> dict[str, float]:
    """:func:`linear_params_per_token`, computed once per model (the time model asks for it
    at every call; read-only: callers get a copy)."""
    h = model.hidden_size
    mlp_matrices = 3 if model.gated_mlp else 2
    moe = moe_params(model) if model.is_moe else {"active_experts": 0, "shared": 0, "latent": 0}
    return {
        "attention": _attention_matmul(model),
        "linear_attention": _linear_attention_matmul(model) if model.linear_attention else 0.0,
        "mamba": _mamba_matmul(model) if model.mamba else 0.0,
        "dense_mlp": float(mlp_matrices * h * model.ffn_hidden_size),
        "router": float(model.num_experts * h),
        "routed_experts": float(mlp_matrices * (model.moe_latent_size or h)
                                * model.moe_ffn_hidden_size * model.moe_top_k),
        "shared_experts": float(moe["shared"] + moe["latent"]
                                + (h if model.shared_expert_gate else 0)),
        "output_layer": float(model.vocab_size * h),
    }


def _layer_matmul(model: ModelSpec, layer: LayerSpec, linear: dict[str, float],
                  attention: float | None = None) -> float:
    """Matmul parameters of one layer (``attention`` replaces a softmax layer's count)."""
    mixer = {MixerKind.LINEAR: linear["linear_attention"], MixerKind.MAMBA: linear["mamba"],
             MixerKind.NONE: 0.0}.get(layer.mixer, linear["attention"] if attention is None
                                      else attention)
    mlp = {MlpKind.DENSE: linear["dense_mlp"], MlpKind.NONE: 0.0}.get(
        layer.mlp, linear["router"] + linear["routed_experts"] + linear["shared_experts"])
    return mixer + mlp


@lru_cache(maxsize=32)
def active_linear_params_per_token(model: ModelSpec) -> float:
    """Matmul parameters one token passes through in the whole model (every layer, the routed
    experts it is sent to, the output layer): ``2 x`` this is a token's forward matmul FLOPs.
    Cached per model: a loop over the layers that the generation time asks for at every call
    (a sizing sweep: over a thousand times)."""
    linear = linear_params_per_token(model)
    return (sum(_layer_matmul(model, layer, linear) for layer in model.layers)
            + linear["output_layer"])


# ---------------------------------------------------------------------------------------------
# Token mixing per layer kind


def attention_pairs(layer: LayerSpec, seq_lens) -> np.ndarray:
    """Causal (query, key) pairs of one attention layer for sequences of the given lengths."""
    s = np.asarray(seq_lens, dtype=np.float64)
    if layer.mixer is MixerKind.SLIDING:
        w = float(layer.window)
        return np.where(s > w, s * w - w * w / 2, s * s / 2)
    if layer.mixer is MixerKind.CHUNKED:
        c = float(layer.window)
        full, rest = np.floor(s / c), np.mod(s, c)
        return full * c * c / 2 + rest * rest / 2
    return s * s / 2


def _head_dims(model: ModelSpec) -> tuple[int, int]:
    if model.is_mla:
        return model.qk_nope_head_dim + model.qk_rope_head_dim, model.v_head_dim
    return model.head_dim, model.head_dim


def attention_core_flops_per_layer(model: ModelSpec, seq_len_squared) -> np.ndarray:
    """Causal core attention forward FLOPs of one full-attention layer for sequences with sum
    of s^2 given."""
    d_qk, d_v = _head_dims(model)
    return np.asarray(seq_len_squared, dtype=np.float64) * model.num_attention_heads * (d_qk + d_v)


def recurrent_flops_per_token(model: ModelSpec, layer: LayerSpec) -> float:
    """Forward state update and readout of one Gated DeltaNet / Mamba-2 layer per token."""
    if layer.mixer is MixerKind.LINEAR:
        g = model.linear_attention
        return float(RECURRENT_FORWARD_FACTOR * g.num_value_heads * g.key_head_dim
                     * g.value_head_dim)
    if layer.mixer is MixerKind.MAMBA:
        m = model.mamba
        return float(RECURRENT_FORWARD_FACTOR * m.num_heads * m.head_dim * m.state_size)
    return 0.0


@lru_cache(maxsize=32)
def _mixer_groups(model: ModelSpec) -> dict[tuple[MixerKind, int], int]:
    """Layers per (mixer kind, window), in layer order of first appearance (a loop over the
    layers, once per model; read-only)."""
    counts: dict[tuple[MixerKind, int], int] = {}
    for layer in model.layers:
        key = (layer.mixer, layer.window)
        counts[key] = counts.get(key, 0) + 1
    return counts


def mixing_flops_per_sequence(model: ModelSpec, seq_lens) -> np.ndarray:
    """Forward token-mixing FLOPs (attention cores, recurrences) of whole sequences: per
    attention layer ``2 heads (d_qk + d_v)`` per causal (query, key) pair it computes
    (:func:`attention_pairs`: all, the last ``w``, or the current chunk), per Gated DeltaNet /
    Mamba-2 layer :func:`recurrent_flops_per_token` per token."""
    s = np.asarray(seq_lens, dtype=np.float64)
    total = np.zeros_like(s)
    for (kind, window), count in _mixer_groups(model).items():
        layer = LayerSpec(kind, MlpKind.DENSE, window)  # the mixer alone matters here
        if kind is MixerKind.NONE:
            continue
        if kind.kv_grows:
            total = total + count * attention_core_flops_per_layer(model, s * s)
        elif kind.is_attention:
            total = total + count * attention_core_flops_per_layer(model, 2 * attention_pairs(
                layer, s))
        else:
            total = total + count * s * recurrent_flops_per_token(model, layer)
    return total


def decode_mixing_flops_per_token(model: ModelSpec, context) -> np.ndarray:
    """Forward token-mixing FLOPs of one decoded token after ``context`` tokens: an attention
    layer scores and sums the keys it attends to (all, the last ``w``, the chunk so far); a
    Gated DeltaNet / Mamba-2 layer updates and reads its state, whatever the context."""
    ctx = np.asarray(context, dtype=np.float64)
    total = np.zeros_like(ctx)
    for (kind, window), count in _mixer_groups(model).items():
        if kind.kv_grows:
            seen = ctx
        elif kind is MixerKind.SLIDING:
            seen = np.minimum(ctx, float(window))
        elif kind is MixerKind.CHUNKED:
            seen = np.mod(ctx, float(window))
        else:  # recurrent, or no mixer (0)
            total = total + count * recurrent_flops_per_token(model,
                                                              LayerSpec(kind, MlpKind.DENSE))
            continue
        total = total + count * attention_core_flops_per_layer(model, 2 * seen)
    return total


def mixing_flops_per_layer(model: ModelSpec, sequences, seq_len) -> np.ndarray:
    """Forward token-mixing FLOPs of a mean layer for ``sequences`` sequences of ``seq_len``
    tokens (a transformer's: the attention core of one layer)."""
    if kv_grows_only(model):
        return attention_core_flops_per_layer(model, sequences * np.asarray(seq_len) ** 2)
    return sequences * mixing_flops_per_sequence(model, seq_len) / model.num_layers


@lru_cache(maxsize=32)
def kv_grows_only(model: ModelSpec) -> bool:
    """Every layer full attention or MLA (a loop over the layers, once per model)."""
    return all(layer.mixer.kv_grows for layer in model.layers)


@lru_cache(maxsize=32)
def mixer_matmul_per_layer(model: ModelSpec) -> float:
    """Mean token-mixer matmul parameters per layer (attention, Gated DeltaNet or Mamba-2
    projections; none for an MLP-only layer): what a stage's mixers cost per layer when it
    holds the model's mix of layer kinds."""
    linear = linear_params_per_token(model)
    per_kind = {MixerKind.LINEAR: linear["linear_attention"], MixerKind.MAMBA: linear["mamba"],
                MixerKind.NONE: 0.0}
    total = sum(count * per_kind.get(kind, linear["attention"])
                for (kind, _), count in _mixer_groups(model).items())
    return total / model.num_layers


def forward_flops_per_sequence(model: ModelSpec, seq_lens) -> np.ndarray:
    """Forward FLOPs of each sequence (matmuls and token mixing, every layer kind)."""
    s = np.asarray(seq_lens, dtype=np.float64)
    return 2.0 * active_linear_params_per_token(model) * s + mixing_flops_per_sequence(model, s)


def forward_flops(model: ModelSpec, tokens, seq_len_squared) -> np.ndarray:
    """Forward FLOPs for ``tokens`` tokens in sequences whose squared lengths sum as given.

    Windowed and recurrent layers need the lengths themselves: they are taken equal, ``s =
    sum(s^2) / sum(s)`` each (exact for the planner's fixed-length batches)."""
    tokens = np.asarray(tokens, dtype=np.float64)
    squares = np.asarray(seq_len_squared, dtype=np.float64)
    per_token = 2.0 * active_linear_params_per_token(model)
    if not model.is_hybrid and kv_grows_only(model):
        return tokens * per_token + model.num_layers * attention_core_flops_per_layer(model,
                                                                                     squares)
    s = np.divide(squares, tokens, out=np.zeros_like(squares), where=tokens > 0)
    count = np.divide(tokens, s, out=np.zeros_like(tokens), where=s > 0)
    return tokens * per_token + count * mixing_flops_per_sequence(model, s)


def training_flops(model: ModelSpec, tokens, seq_len_squared) -> np.ndarray:
    """Model FLOPs of forward + backward (3x forward), no recomputation."""
    return 3 * forward_flops(model, tokens, seq_len_squared)


# ---------------------------------------------------------------------------------------------
# verl's FlopsCounter convention


@lru_cache(maxsize=32)
def _verl_matmul_per_token(model: ModelSpec) -> float:
    quirks = VERL_QUIRKS.get(model.model_type, ())
    h = model.hidden_size
    head_dim = model.hidden_size // model.num_attention_heads if HEAD_DIM_FROM_HIDDEN in quirks \
        else None
    attention = _attention_matmul(model, head_dim)
    linear = linear_params_per_token(model)
    if IGNORES_SHARED_EXPERTS in quirks:
        moe = linear["router"] + linear["routed_experts"]
        return (model.num_layers * (attention + moe)
                + 2.0 * model.vocab_size * h)  # embedding and output layer
    return (sum(_layer_matmul(model, layer, linear, attention) for layer in model.layers)
            + 2.0 * model.vocab_size * h)


def verl_attention_units(model: ModelSpec, layer: LayerSpec, seq_lens) -> np.ndarray:
    """verl's quadratic units of one attention layer: ``s^2`` (full), ``s * min(s, w)``
    (sliding, as ``_estimate_gpt_oss_flops``), ``sum(c^2)`` over chunks (chunked)."""
    s = np.asarray(seq_lens, dtype=np.float64)
    if IGNORES_WINDOWS in VERL_QUIRKS.get(model.model_type, ()):
        return s * s
    if layer.mixer is MixerKind.SLIDING:
        return s * np.minimum(s, float(layer.window))
    return 2.0 * attention_pairs(layer, s)


def verl_training_flops_per_sequence(model: ModelSpec, seq_lens) -> np.ndarray:
    """Forward + backward FLOPs of each sequence in verl ``FlopsCounter``'s convention."""
    s = np.asarray(seq_lens, dtype=np.float64)
    quirks = VERL_QUIRKS.get(model.model_type, ())
    if HEAD_DIM_FROM_HIDDEN in quirks:
        d_qk = d_v = model.hidden_size // model.num_attention_heads
    else:
        d_qk, d_v = _head_dims(model)
    total = 6.0 * _verl_matmul_per_token(model) * s
    for layer in model.layers:
        if layer.mixer.is_attention:
            total = total + 3.0 * verl_attention_units(model, layer, s) \
                * model.num_attention_heads * (d_qk + d_v)
        else:
            total = total + 3.0 * recurrent_flops_per_token(model, layer) * s
    return total


def verl_training_flops(model: ModelSpec, tokens, seq_len_squared) -> np.ndarray:
    """verl's ``FlopsCounter`` count for ``tokens`` tokens whose squared lengths sum as given
    (windowed and recurrent layers: equal lengths, as :func:`forward_flops`)."""
    tokens = np.asarray(tokens, dtype=np.float64)
    squares = np.asarray(seq_len_squared, dtype=np.float64)
    s = np.divide(squares, tokens, out=np.zeros_like(squares), where=tokens > 0)
    count = np.divide(tokens, s, out=np.zeros_like(tokens), where=s > 0)
    return count * verl_training_flops_per_sequence(model, s)
