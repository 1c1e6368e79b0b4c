"""Parameter counts, per layer kind and per component, in transformers' module tree.

Every count is analytic and names the module it counts; the tests compare each family's total
(and its components) with the model transformers builds on the ``meta`` device.  Multi-token
prediction layers are counted apart (:func:`mtp_params`): transformers does not build them, and
verl trains them only when MTP training is enabled.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from planner.catalog.layers import LayerSpec, MixerKind, MlpKind, VisionTowerSpec

# planner.catalog.models.ModelSpec (models imports this module, so it is not imported back)
ModelSpec = Any


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts per component.  ``attention``, ``norms`` etc. are totals over layers.

    The ``*_per_layer`` fields describe one softmax-attention layer and one dense / MoE
    feed-forward block (the whole model for a homogeneous transformer).  Hybrid models add their
    linear-attention and Mamba layers, per-kind layer counts and the vision tower in the fields
    after ``active_experts_per_layer``; :meth:`by_kind` gives every mixer kind's total."""

    embedding: int
    output_layer: int  # 0 when tied to the embedding
    attention_per_layer: int  # projections, biases, q/k norms, MLA's low-rank norms, sinks
    attention_replicated_per_layer: int  # of which not split by TP (q/k norms, MLA down-proj)
    dense_mlp_per_layer: int
    router_per_layer: int  # gate weight (+ expert bias, shared-expert gate)
    experts_per_layer: int  # all routed experts of one MoE layer
    shared_experts_per_layer: int
    norms_per_layer: int  # input and post-attention norms
    final_norm: int
    num_dense_layers: int
    num_moe_layers: int
    active_experts_per_layer: int  # the top-k routed experts one token passes through
    num_attention_layers: int = -1  # softmax-attention layers; -1: every layer (homogeneous)
    linear_attention_per_layer: int = 0
    num_linear_attention_layers: int = 0
    mamba_per_layer: int = 0
    num_mamba_layers: int = 0
    norms_total: int = -1  # all layer norms when blocks differ (Nemotron-H); -1: per-layer * L
    moe_latent_per_layer: int = 0  # LatentMoE's down/up projections (Nemotron-3 Super)
    vision: int = 0  # the vision tower and its projector (VL models)

    @property
    def num_layers(self) -> int:
        return self.num_dense_layers + self.num_moe_layers

    @property
    def attention_layers(self) -> int:
        return self.num_layers if self.num_attention_layers < 0 else self.num_attention_layers

    @property
    def attention(self) -> int:
        """Softmax-attention parameters of every attention layer."""
        return self.attention_per_layer * self.attention_layers

    @property
    def linear_attention(self) -> int:
        return self.linear_attention_per_layer * self.num_linear_attention_layers

    @property
    def mamba(self) -> int:
        return self.mamba_per_layer * self.num_mamba_layers

    @property
    def dense_mlp(self) -> int:
        return self.dense_mlp_per_layer * self.num_dense_layers

    @property
    def experts(self) -> int:
        return self.experts_per_layer * self.num_moe_layers

    @property
    def shared_experts(self) -> int:
        return (self.shared_experts_per_layer + self.moe_latent_per_layer) * self.num_moe_layers

    @property
    def router(self) -> int:
        return self.router_per_layer * self.num_moe_layers

    @property
    def norms(self) -> int:
        layers = (self.norms_per_layer * self.num_layers if self.norms_total < 0
                  else self.norms_total)
        return layers + self.final_norm

    @property
    def dense_layer(self) -> int:
        """Non-embedding parameters of one dense transformer layer."""
        return self.attention_per_layer + self.dense_mlp_per_layer + self.norms_per_layer

    @property
    def moe_layer_non_expert(self) -> int:
        """Parameters of one MoE layer that are not routed experts (replicated over EP)."""
        return (self.attention_per_layer + self.router_per_layer + self.shared_experts_per_layer
                + self.moe_latent_per_layer + self.norms_per_layer)

    @property
    def dense_layer_replicated(self) -> int:
        """Parameters of a dense layer every TP rank holds in full (norms)."""
        return self.attention_replicated_per_layer + self.norms_per_layer

    @property
    def moe_layer_replicated(self) -> int:
        """Parameters of an MoE layer every TP rank holds in full (norms, router)."""
        return self.attention_replicated_per_layer + self.norms_per_layer + self.router_per_layer

    @property
    def total(self) -> int:
        return (self.embedding + self.output_layer + self.attention + self.linear_attention
                + self.mamba + self.dense_mlp + self.router + self.experts + self.shared_experts
                + self.norms + self.vision)

    @property
    def active(self) -> int:
        """Parameters one text token passes through (routed experts: only its top-k; the vision
        tower is not on a text token's path)."""
        inactive_per_layer = self.experts_per_layer - self.active_experts_per_layer
        return self.total - inactive_per_layer * self.num_moe_layers - self.vision

    def by_kind(self) -> dict[str, int]:
        """Non-embedding parameters per mixer kind and feed-forward kind (norms apart)."""
        out = {"attention": self.attention, "linear_attention": self.linear_attention,
               "mamba": self.mamba, "dense_mlp": self.dense_mlp,
               "moe": self.router + self.experts + self.shared_experts, "norms": self.norms,
               "vision": self.vision}
        return {kind: n for kind, n in out.items() if n}

    def to_dict(self) -> dict[str, int]:
        return {"total": self.total, "active": self.active, "embedding": self.embedding,
                "output_layer": self.output_layer, "attention": self.attention,
                "linear_attention": self.linear_attention, "mamba": self.mamba,
                "dense_mlp": self.dense_mlp, "router": self.router, "experts": self.experts,
                "shared_experts": self.shared_experts, "norms": self.norms,
                "vision": self.vision}


# ---------------------------------------------------------------------------------------------
# Per-kind counts


def attention_params(model: ModelSpec) -> tuple[int, int]:
    """(parameters, of which TP-replicated) of one softmax-attention layer."""
    h = model.hidden_size
    if model.is_mla:
        # DeepSeek-V2 paper (arXiv 2405.04434) §2.1.2, transformers' DeepseekV3Attention:
        # q_a (h x q_lora) + q_a_norm + q_b (q_lora x heads*(nope+rope)), or a plain q_proj;
        # kv_a (h x (kv_lora+rope)) + kv_a_norm + kv_b (kv_lora x heads*(nope+v)); o_proj.
        qk_head = model.qk_nope_head_dim + model.qk_rope_head_dim
        if model.q_lora_rank:
            q_params = (h * model.q_lora_rank + model.q_lora_rank
                        + model.q_lora_rank * model.num_attention_heads * qk_head)
        else:
            q_params = h * model.num_attention_heads * qk_head
        kv_params = (h * (model.kv_lora_rank + model.qk_rope_head_dim) + model.kv_lora_rank
                     + model.kv_lora_rank * model.num_attention_heads
                     * (model.qk_nope_head_dim + model.v_head_dim))
        params = q_params + kv_params + model.num_attention_heads * model.v_head_dim * h
        # Down-projections and their norms are replicated over TP (megatron-core MLA).
        replicated = (h * (model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim)
                      + model.q_lora_rank + model.kv_lora_rank)
        return params, replicated
    q_out = model.num_attention_heads * model.head_dim
    kv_out = 2 * model.num_query_groups * model.head_dim
    gate = q_out if model.attention_output_gate else 0  # Qwen3-Next: q_proj is 2x wide
    params = h * (q_out + gate + kv_out) + q_out * h
    if model.qkv_bias:
        params += q_out + gate + kv_out
    if model.attention_o_bias:
        params += h
    if model.attention_sinks:  # gpt-oss: one learned sink logit per head
        params += model.num_attention_heads
    replicated = 0
    if model.qk_norm_full_width:  # OLMoE: RMSNorm over all q heads and all k heads
        params += q_out + model.num_query_groups * model.head_dim
    elif model.qk_norm:
        params += 2 * model.head_dim  # RMSNorm over head_dim for q and for k
        replicated += 2 * model.head_dim
    return params, replicated


def linear_attention_params(model: ModelSpec) -> int:
    """One Gated DeltaNet layer (transformers' Qwen3NextGatedDeltaNet / Qwen3_5GatedDeltaNet):
    in_proj_qkvz (h x (2k + 2v)) and in_proj_ba (h x 2 n_v) (Qwen3.5 splits them into qkv, z,
    b and a: the same sizes), a depthwise conv1d over the q, k, v channels without bias, A_log
    and dt_bias per value head, an RMSNorm over the value head dim, out_proj (v x h)."""
    g = model.linear_attention
    h = model.hidden_size
    return (h * (2 * g.key_dim + 2 * g.value_dim + 2 * g.num_value_heads)
            + g.conv_dim * g.conv_kernel + 2 * g.num_value_heads + g.value_head_dim
            + g.value_dim * h)


def mamba_params(model: ModelSpec) -> int:
    """One Mamba-2 mixer (transformers' NemotronHMamba2Mixer): in_proj to z, x, B, C and dt
    (``2 d_inner + 2 G N + H``), the depthwise conv1d over x, B, C (+ bias), dt_bias, A_log
    and D per head, the gated RMSNorm over d_inner, out_proj."""
    m = model.mamba
    h = model.hidden_size
    in_out = 2 * m.inner_size + 2 * m.n_groups * m.state_size + m.num_heads
    params = (h * in_out + m.conv_dim * m.conv_kernel + 3 * m.num_heads + m.inner_size
              + m.inner_size * h)
    if m.conv_bias:
        params += m.conv_dim
    if m.proj_bias:
        params += in_out + h
    return params


def dense_mlp_params(model: ModelSpec) -> int:
    matrices = 3 if model.gated_mlp else 2  # SwiGLU gate+up+down, else up+down (relu2)
    params = matrices * model.hidden_size * model.ffn_hidden_size
    if model.mlp_bias:
        params += (matrices - 1) * model.ffn_hidden_size + model.hidden_size
    return params


def moe_params(model: ModelSpec) -> dict[str, int]:
    """One MoE block: router (+ per-expert bias, + shared-expert gate), routed experts, the
    top-k a token uses, shared experts, LatentMoE projections."""
    h = model.hidden_size
    matrices = 3 if model.gated_mlp else 2
    router = model.num_experts * h
    if model.router_bias:
        router += model.num_experts
    if model.shared_expert_gate:
        router += h
    expert_in = model.moe_latent_size or h  # LatentMoE experts work in the latent space
    per_expert = matrices * expert_in * model.moe_ffn_hidden_size
    if model.expert_bias:  # gpt-oss: gate_up bias (2f) and down bias (h)
        per_expert += (matrices - 1) * model.moe_ffn_hidden_size + expert_in
    latent = 0
    if model.moe_latent_size:  # fc1_latent_proj (h -> latent), fc2_latent_proj (latent -> h)
        latent = 2 * h * model.moe_latent_size
        if model.mlp_bias:
            latent += model.moe_latent_size + h
    return {"router": router, "experts": model.num_experts * per_expert,
            "active_experts": model.moe_top_k * per_expert,
            "shared": matrices * h * model.shared_expert_ffn_hidden_size, "latent": latent}


def mixer_params(model: ModelSpec, kind: MixerKind) -> int:
    if kind.is_attention:
        return attention_params(model)[0]
    if kind is MixerKind.LINEAR:
        return linear_attention_params(model)
    if kind is MixerKind.MAMBA:
        return mamba_params(model)
    return 0


def mlp_params(model: ModelSpec, kind: MlpKind) -> int:
    if kind is MlpKind.DENSE:
        return dense_mlp_params(model)
    if kind is MlpKind.MOE:
        moe = moe_params(model)
        return moe["router"] + moe["experts"] + moe["shared"] + moe["latent"]
    return 0


def layer_params(model: ModelSpec, layer: LayerSpec) -> int:
    """Every parameter of one layer (mixer, feed-forward block, its pre-norms)."""
    return (mixer_params(model, layer.mixer) + mlp_params(model, layer.mlp)
            + layer.norms * model.hidden_size)


def vision_params(vision: VisionTowerSpec | None) -> int:
    """The vision tower and the projector into the language model (transformers' module trees:
    ``Qwen3VLVisionModel`` (also Qwen3.5's), ``Qwen2_5_VisionTransformerPretrainedModel``,
    ``Llama4VisionModel`` + ``Llama4MultiModalProjector``)."""
    if vision is None:
        return 0
    d, i, out = vision.hidden_size, vision.intermediate_size, vision.out_hidden_size
    attention = 4 * d * d + 4 * d  # fused qkv and proj, with biases
    if vision.kind == "llama4":
        patches = (vision.image_size // vision.patch_size) ** 2
        layer = attention + 2 * d * i + i + d + 4 * d  # fc1, fc2 with biases; 2 LayerNorms
        return (d + (patches + 1) * d  # class embedding, positional embedding
                + vision.in_channels * vision.patch_size ** 2 * d  # patch embedding, no bias
                + 4 * d  # layernorm_pre, layernorm_post
                + vision.depth * layer
                + i * vision.projector_input_dim + vision.projector_output_dim ** 2  # adapter
                + vision.vision_output_dim * out
                + (out if vision.projector_bias else 0))  # multi_modal_projector
    merged = d * vision.spatial_merge_size ** 2
    patch = vision.in_channels * vision.temporal_patch_size * vision.patch_size ** 2 * d
    if vision.kind == "qwen2_5_vl":
        layer = attention + 3 * d * i + 2 * i + d + 2 * d  # SwiGLU with biases; 2 RMSNorms
        merger = d + merged * merged + merged + out * merged + out  # ln_q, mlp.0, mlp.2
        return patch + vision.depth * layer + merger
    layer = attention + 2 * d * i + i + d + 4 * d  # fc1, fc2 with biases; 2 LayerNorms
    merger = merged * merged + merged + out * merged + out  # linear_fc1, linear_fc2
    # the final merger normalises d channels, each deepstack merger the merged channels
    return (patch + d + vision.num_position_embeddings * d + vision.depth * layer
            + merger + 2 * d + vision.deepstack_layers * (merger + 2 * merged))


def param_counts(model: ModelSpec) -> ParamCounts:
    """Analytic parameter counts (same module tree as transformers' implementations)."""
    h = model.hidden_size
    attention, replicated = attention_params(model)
    moe = moe_params(model) if model.is_moe else dict.fromkeys(
        ("router", "experts", "active_experts", "shared", "latent"), 0)
    mixers = Counter(layer.mixer for layer in model.layers)
    mlps = Counter(layer.mlp for layer in model.layers)
    homogeneous = all(layer.norms == 2 for layer in model.layers)
    num_dense = mlps[MlpKind.DENSE]
    return ParamCounts(
        embedding=model.vocab_size * h,
        output_layer=0 if model.tied_embeddings else model.vocab_size * h,
        attention_per_layer=attention,
        attention_replicated_per_layer=replicated,
        dense_mlp_per_layer=dense_mlp_params(model) if num_dense else 0,
        router_per_layer=moe["router"],
        experts_per_layer=moe["experts"],
        shared_experts_per_layer=moe["shared"],
        norms_per_layer=2 * h,  # RMSNorm weights, no bias
        final_norm=h,
        num_dense_layers=model.num_layers - mlps[MlpKind.MOE] - mlps[MlpKind.NONE],
        num_moe_layers=mlps[MlpKind.MOE],
        active_experts_per_layer=moe["active_experts"],
        num_attention_layers=sum(n for kind, n in mixers.items() if kind.is_attention),
        linear_attention_per_layer=(linear_attention_params(model)
                                    if model.linear_attention else 0),
        num_linear_attention_layers=mixers[MixerKind.LINEAR],
        mamba_per_layer=mamba_params(model) if model.mamba else 0,
        num_mamba_layers=mixers[MixerKind.MAMBA],
        norms_total=-1 if homogeneous else sum(layer.norms for layer in model.layers) * h,
        moe_latent_per_layer=moe["latent"],
        vision=vision_params(model.vision),
    )


def mtp_params(model: ModelSpec) -> int:
    """Parameters of the multi-token-prediction layers, outside the total (transformers does not
    build them; the checkpoint holds them): per layer an input norm for the embedding and one for
    the hidden state, the 2h -> h projection, one decoder layer (attention + the model's last
    feed-forward kind) and the shared head's final norm (DeepSeek-V3 §2.2; Qwen3-Next's
    ``mtp.fc`` / ``pre_fc_norm_*`` have the same sizes).  The embedding and the output layer are
    shared with the main model."""
    if not model.mtp_layers:
        return 0
    h = model.hidden_size
    mixer = MixerKind.MLA if model.is_mla else MixerKind.FULL
    mlp = next((layer.mlp for layer in reversed(model.layers) if layer.mlp is not MlpKind.NONE),
               MlpKind.DENSE)
    layer = layer_params(model, LayerSpec(mixer, mlp))
    return model.mtp_layers * (2 * h + 2 * h * h + layer + h)
