"""config.json -> the per-layer description of a model: every key variant of the families verl
runs on Megatron, read by one set of rules (a raw file and transformers' ``to_dict()`` of it
both end here).

Each reader names its keys and the family that writes them; where a family computes a layout
from a few keys (``full_attention_interval``, ``no_rope_layers``, ``decoder_sparse_step``), the
rule is transformers' own (the file is cited), so a raw config and transformers' view of it give
the same layers.  A layer type this module does not know is an error naming it.
"""

from __future__ import annotations

from typing import Any, Mapping

from planner.bounds import shown
from planner.catalog.layers import (
    GatedDeltaNetSpec,
    LayerSpec,
    Mamba2Spec,
    MixerKind,
    MlpKind,
    VisionTowerSpec,
)
from planner.errors import PlanInputError


def first(config: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    """The value of the first key present and not null."""
    for key in keys:
        value = config.get(key)
        if value is not None:
            return value
    return default


def _int(config: Mapping[str, Any], name: str, *keys: str, default: Any = None) -> int:
    """An integer read from the first key present; a per-layer list of one value (Hunyuan's
    ``moe_topk: [8, 8, ...]``) counts as that value."""
    value = first(config, *keys, default=default)
    if isinstance(value, (list, tuple)):
        distinct = set(value)
        if len(distinct) != 1:
            raise PlanInputError(f"config for {name!r}: {keys[0]} {shown(value)} differs between "
                                 f"layers; valid: one value for every layer")
        value = distinct.pop()
    try:
        return int(value)
    except (TypeError, ValueError):
        raise PlanInputError(f"config for {name!r}: {keys[0]} {shown(value)} is not an "
                             f"integer") from None


# ---------------------------------------------------------------------------------------------
# Families by model_type: facts their config.json leaves implicit

# Per-head q/k RMSNorm (transformers' q_norm/k_norm over head_dim).
QK_NORM_PER_HEAD = frozenset({
    "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe",
    "qwen3_5_moe_text", "qwen3_vl", "qwen3_vl_text", "qwen3_vl_moe", "qwen3_vl_moe_text",
    "dots1", "hunyuan_v1_moe"})
# q/k RMSNorm over all heads at once (OLMoE's q_norm(h) and k_norm(kv_heads * head_dim)).
QK_NORM_FULL_WIDTH = frozenset({"olmoe"})
# q, k, v biases unless the config says otherwise.
QKV_BIAS_DEFAULT = frozenset({"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_vl_text", "qwen2_5_vl",
                              "qwen2_5_vl_text", "mimo"})
# Q projection that also emits a sigmoid output gate (Qwen3-Next "gated attention"; verl's
# flops_counter: "Qwen3.5 full attention q_proj also emits a sigmoid gate").
ATTENTION_OUTPUT_GATE = frozenset({"qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe",
                                   "qwen3_5_moe_text"})
# Routers with a per-expert score-correction bias (DeepSeek's noaux_tc and its descendants) or a
# plain bias (gpt-oss), whatever topk_method says.
ROUTER_BIAS = frozenset({"deepseek_v3", "kimi_k2", "glm4_moe", "glm4_moe_lite", "ernie4_5_moe",
                         "nemotron_h", "gpt_oss", "dots1"})
# Sliding windows a family's transformers config class supplies when config.json omits the key
# (GptOssConfig.sliding_window = 128).
FAMILY_SLIDING_WINDOW = {"gpt_oss": 128}
VISION_KINDS = {"qwen3_vl": "qwen3_vl", "qwen3_vl_moe": "qwen3_vl", "qwen3_5": "qwen3_vl",
                "qwen3_5_moe": "qwen3_vl", "qwen2_5_vl": "qwen2_5_vl", "llama4": "llama4"}
# Keys of layouts this module does not read (and verl does not run on Megatron): an error,
# never a silent full-attention model.
UNREAD_LAYOUT_KEYS = {
    "attn_layer_period": "Jamba's attention/Mamba-1 interleave",
    "expert_layer_period": "Jamba's MoE interleave",
    "mamba_d_ssm": "Falcon-H1's parallel attention+Mamba layers",
    "mamba_expand": "Mamba-1 layers",
    "zero_expert_num": "LongCat-Flash's zero-computation experts and paired sub-layers",
}


def text_part(config: Mapping[str, Any]) -> dict[str, Any]:
    """The language model's config: a multimodal wrapper's ``text_config`` over the outer keys
    (the outer ``model_type``, ``architectures`` and ``vision_config`` are kept)."""
    text = config.get("text_config")
    merged = dict(config) if text is None else {
        **{k: v for k, v in config.items() if k != "text_config"}, **text,
        "model_type": str(config.get("model_type") or text.get("model_type", "")),
        "text_model_type": str(text.get("model_type", ""))}
    if text is not None and config.get("tie_word_embeddings") is not None:
        # transformers 5 ties a composite model's head by the outer config's flag
        merged["tie_word_embeddings"] = config["tie_word_embeddings"]
    if merged.get("num_hidden_layers") is None and merged.get("model_type") == "nemotron_h":
        blocks = nemotron_blocks(merged, str(merged.get("model_type")))
        if blocks is not None:  # transformers 5 drops the key: the block list is the truth
            merged["num_hidden_layers"] = len(blocks)
    return merged


def architecture_of(config: Mapping[str, Any]) -> str:
    """The class named in ``architectures`` (what Megatron-Bridge dispatches on), or ''."""
    names = config.get("architectures")
    if isinstance(names, (list, tuple)) and names and isinstance(names[0], str):
        return names[0]
    return ""


# ---------------------------------------------------------------------------------------------
# MoE


def num_experts(config: Mapping[str, Any], name: str) -> int:
    return _int(config, name, "num_experts", "num_local_experts", "n_routed_experts",
                "moe_num_experts", default=0)


def experts_per_token(config: Mapping[str, Any], name: str) -> int:
    """Top-k under every family's key: ``num_experts_per_tok`` (most), ``moe_top_k``,
    ``moe_k`` (ERNIE-4.5), ``moe_topk`` (Hunyuan, LongCat-Flash)."""
    return _int(config, name, "num_experts_per_tok", "moe_top_k", "moe_k", "moe_topk", default=0)


def expert_width(config: Mapping[str, Any], name: str, dense_width: int) -> int:
    """One routed expert's FFN width.  A present ``moe_intermediate_size`` of 0 in an MoE
    config is an input error (issue 26); Mixtral-style configs without the key use the dense
    width; gpt-oss's experts are ``intermediate_size`` wide; LongCat names it
    ``expert_ffn_hidden_size``."""
    if "moe_intermediate_size" in config and config["moe_intermediate_size"] is not None:
        width = _int(config, name, "moe_intermediate_size")
        if width <= 0:
            raise PlanInputError(f"config for {name!r}: moe_intermediate_size {width} for an "
                                 f"MoE model ({num_experts(config, name)} experts); valid: the "
                                 f"width of one expert's FFN, a positive integer")
        return width
    return _int(config, name, "expert_ffn_hidden_size", default=dense_width)


def shared_expert_width(config: Mapping[str, Any], name: str, expert: int) -> tuple[int, bool]:
    """(width of all shared experts together, whether a sigmoid gate scales them).

    Qwen2-MoE / Qwen3-Next / Qwen3.5 give ``shared_expert_intermediate_size`` (one gated shared
    expert); Nemotron-H ``moe_shared_expert_intermediate_size``; DeepSeek, GLM, Kimi give a count
    (``n_shared_experts``), ERNIE ``moe_num_shared_experts``, Hunyuan ``num_shared_expert``, each
    of the routed width."""
    if config.get("shared_expert_intermediate_size"):
        return _int(config, name, "shared_expert_intermediate_size"), True
    if config.get("moe_shared_expert_intermediate_size"):
        return _int(config, name, "moe_shared_expert_intermediate_size"), False
    if str(config.get("model_type", "")).startswith("llama4"):  # one shared expert, always
        return expert, False
    count = _int(config, name, "n_shared_experts", "num_shared_experts", "moe_num_shared_experts",
                 "num_shared_expert", default=0)
    return count * expert, False


def mlp_kinds(config: Mapping[str, Any], name: str, layers: int, model_type: str) -> list[MlpKind]:
    """Dense or MoE per layer, from whichever keys the family writes:

    * ``mlp_layer_types`` (``dense``/``sparse``, GLM-4.7-Flash and Hunyuan-V3 in transformers);
    * ``moe_layers`` or ``interleave_moe_layer_step`` (Llama-4: ``configuration_llama4.py``);
    * ``moe_layer_start_index``/``moe_layer_end_index``/``moe_layer_interval`` (ERNIE-4.5:
      ``modeling_ernie4_5_moe.py``);
    * ``first_k_dense_replace`` and ``moe_layer_freq`` (DeepSeek-V2/V3, GLM-4.5, Kimi-K2: MoE when
      ``i >= k and i % freq == 0``, DeepSeek's remote modeling code);
    * ``mlp_only_layers`` and ``decoder_sparse_step`` (Qwen-MoE: MoE when ``i`` is not in the
      list and ``(i + 1) % step == 0``, ``modeling_qwen3_moe.py``)."""
    if not num_experts(config, name):
        return [MlpKind.DENSE] * layers
    if isinstance(config.get("mlp_layer_types"), (list, tuple)):
        kinds = list(config["mlp_layer_types"])
        _check_length(name, "mlp_layer_types", kinds, layers)
        known = {"dense": MlpKind.DENSE, "sparse": MlpKind.MOE, "moe": MlpKind.MOE}
        for kind in kinds:
            if kind not in known:
                raise PlanInputError(f"config for {name!r}: mlp_layer_types has {kind!r}; "
                                     f"valid: {', '.join(known)}")
        return [known[kind] for kind in kinds]
    if model_type in ("llama4", "llama4_text"):
        moe = config.get("moe_layers")
        if moe is None:
            step = _int(config, name, "interleave_moe_layer_step", default=1)
            moe = range(step - 1, layers, step)
        moe = set(int(i) for i in moe)
        return [MlpKind.MOE if i in moe else MlpKind.DENSE for i in range(layers)]
    if "moe_layer_start_index" in config or "moe_layer_interval" in config:
        start = _int(config, name, "moe_layer_start_index", default=0)
        end = _int(config, name, "moe_layer_end_index", default=layers - 1)
        if end < 0:
            end = layers - 1
        interval = max(_int(config, name, "moe_layer_interval", default=1), 1)
        return [MlpKind.MOE if (i + 1) % interval == 0 and start <= i <= end else MlpKind.DENSE
                for i in range(layers)]
    first_dense = _int(config, name, "first_k_dense_replace", default=0)
    freq = max(_int(config, name, "moe_layer_freq", default=1), 1)
    only_dense = set(int(i) for i in (config.get("mlp_only_layers") or ()))
    step = max(_int(config, name, "decoder_sparse_step", default=1), 1)
    return [MlpKind.MOE if (i >= first_dense and i % freq == 0 and i not in only_dense
                            and (i + 1) % step == 0) else MlpKind.DENSE
            for i in range(layers)]


# ---------------------------------------------------------------------------------------------
# Mixers

LAYER_TYPE_NAMES = {
    "full_attention": MixerKind.FULL, "attention": MixerKind.FULL,
    "sliding_attention": MixerKind.SLIDING, "chunked_attention": MixerKind.CHUNKED,
    "linear_attention": MixerKind.LINEAR,
}
# Nemotron-H's blocks: hybrid_override_pattern characters and layers_block_type names
# (transformers ``NemotronHConfig._pattern_to_list``).
NEMOTRON_PATTERN = {"M": "mamba", "E": "moe", "*": "attention", "-": "mlp"}
NEMOTRON_BLOCKS = {
    "mamba": (MixerKind.MAMBA, MlpKind.NONE), "attention": (MixerKind.FULL, MlpKind.NONE),
    "moe": (MixerKind.NONE, MlpKind.MOE), "mlp": (MixerKind.NONE, MlpKind.DENSE),
}


def _check_length(name: str, key: str, values, layers: int) -> None:
    if len(values) != layers:
        raise PlanInputError(f"config for {name!r}: {key} has {len(values)} entries for "
                             f"num_hidden_layers {layers}; valid: one per layer")


def nemotron_blocks(config: Mapping[str, Any], name: str) -> list[str] | None:
    """Nemotron-H's block list from ``layers_block_type`` (transformers) or
    ``hybrid_override_pattern`` (the published config; ``|`` marks pipeline cuts, which
    Megatron-Bridge strips)."""
    blocks = config.get("layers_block_type")
    if blocks is None and isinstance(config.get("layer_types"), (list, tuple)) \
            and set(config["layer_types"]) <= set(NEMOTRON_BLOCKS):
        blocks = config["layer_types"]
    if blocks is None and config.get("hybrid_override_pattern") is not None:
        pattern = str(config["hybrid_override_pattern"]).replace("|", "")
        unknown = sorted(set(pattern) - set(NEMOTRON_PATTERN))
        if unknown:
            raise PlanInputError(f"config for {name!r}: hybrid_override_pattern has layer "
                                 f"type(s) {', '.join(map(repr, unknown))}; valid: "
                                 f"{', '.join(f'{c} ({n})' for c, n in NEMOTRON_PATTERN.items())}")
        blocks = [NEMOTRON_PATTERN[c] for c in pattern]
    if blocks is None:
        return None
    for block in blocks:
        if block not in NEMOTRON_BLOCKS:
            raise PlanInputError(f"config for {name!r}: layers_block_type has layer type "
                                 f"{block!r}; valid: {', '.join(NEMOTRON_BLOCKS)}")
    return list(blocks)


def mixer_names(config: Mapping[str, Any], name: str, layers: int,
                model_type: str) -> list[str]:
    """The layer-type name of every layer (``full_attention``, ``sliding_attention``, ...):
    ``layer_types`` when the config lists them, else the family's rule in transformers:
    ``full_attention_interval`` (Qwen3-Next: full when ``(i + 1) % n == 0``), ``no_rope_layers``
    (Llama-4: RoPE layers use chunked attention), ``sliding_window`` with ``use_sliding_window``
    and ``max_window_layers`` (Qwen2/3), every layer sliding (Mistral), alternating
    sliding/full (gpt-oss)."""
    kinds = config.get("layer_types")
    if kinds is not None:
        if not isinstance(kinds, (list, tuple)):
            raise PlanInputError(f"config for {name!r}: layer_types {shown(kinds)} is not a "
                                 f"list; valid: one layer type per layer")
        _check_length(name, "layer_types", kinds, layers)
        return [str(kind) for kind in kinds]
    if "full_attention_interval" in config or model_type in ATTENTION_OUTPUT_GATE:
        interval = _int(config, name, "full_attention_interval", default=4)
        return ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                for i in range(layers)]
    if model_type in ("llama4", "llama4_text"):
        rope = config.get("no_rope_layers") or [
            int((i + 1) % _int(config, name, "no_rope_layer_interval", default=4) != 0)
            for i in range(layers)]
        _check_length(name, "no_rope_layers", rope, layers)
        chunked = config.get("attention_chunk_size") is not None
        return ["chunked_attention" if uses_rope and chunked else "full_attention"
                for uses_rope in rope]
    window = config.get("sliding_window")
    if model_type == "gpt_oss":
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
    if model_type in ("mistral", "mixtral") and window:
        return ["sliding_attention"] * layers
    if window and config.get("use_sliding_window"):
        start = _int(config, name, "max_window_layers", default=0)
        return ["sliding_attention" if i >= start else "full_attention" for i in range(layers)]
    return ["full_attention"] * layers


def read_layers(config: Mapping[str, Any], name: str, layers: int, model_type: str,
                mla: bool) -> tuple[LayerSpec, ...]:
    """Every layer's mixer and feed-forward kind, with its window."""
    blocks = nemotron_blocks(config, name) if model_type == "nemotron_h" else None
    if blocks is not None:
        return tuple(LayerSpec(*NEMOTRON_BLOCKS[block]) for block in blocks)
    mlps = mlp_kinds(config, name, layers, model_type)
    out = []
    for type_name, mlp in zip(mixer_names(config, name, layers, model_type), mlps):
        kind = LAYER_TYPE_NAMES.get(type_name)
        if kind is None:
            raise PlanInputError(f"config for {name!r}: layer type {type_name!r} is not one "
                                 f"plan-parallel models; valid: {', '.join(LAYER_TYPE_NAMES)}")
        window = 0
        if kind is MixerKind.SLIDING:
            window = _int(config, name, "sliding_window",
                          default=FAMILY_SLIDING_WINDOW.get(model_type, 0))
            if window <= 0:
                raise PlanInputError(f"config for {name!r}: sliding_attention layers need "
                                     f"sliding_window, got {shown(config.get('sliding_window'))}")
        elif kind is MixerKind.CHUNKED:
            window = _int(config, name, "attention_chunk_size", default=0)
            if window <= 0:
                raise PlanInputError(f"config for {name!r}: chunked_attention layers need "
                                     f"attention_chunk_size, got "
                                     f"{shown(config.get('attention_chunk_size'))}")
        elif kind is MixerKind.FULL and mla:
            kind = MixerKind.MLA
        out.append(LayerSpec(kind, mlp, window))
    return tuple(out)


def check_layout_keys(config: Mapping[str, Any], name: str, model_type: str) -> None:
    """Refuse, by name, the hybrid layouts this module does not read."""
    for key, what in UNREAD_LAYOUT_KEYS.items():
        if config.get(key) is not None and not (key == "zero_expert_num"
                                                and not config.get(key)):
            raise PlanInputError(f"config for {name!r} (model_type {model_type!r}): {key} "
                                 f"describes {what}, which plan-parallel does not model; "
                                 f"`plan-parallel models --supported` lists what it plans")


# ---------------------------------------------------------------------------------------------
# Recurrent mixers and vision towers


def read_linear_attention(config: Mapping[str, Any], name: str) -> GatedDeltaNetSpec:
    """Gated DeltaNet geometry (``linear_num_key_heads``, ``linear_num_value_heads``,
    ``linear_key_head_dim``, ``linear_value_head_dim``, ``linear_conv_kernel_dim``; Qwen3.5's
    ``mamba_ssm_dtype`` is the recurrent state's dtype)."""
    missing = [key for key in ("linear_num_key_heads", "linear_num_value_heads",
                               "linear_key_head_dim", "linear_value_head_dim")
               if config.get(key) is None]
    if missing:
        raise PlanInputError(f"config for {name!r}: linear_attention layers need "
                             f"{', '.join(missing)}")
    return GatedDeltaNetSpec(
        num_key_heads=_int(config, name, "linear_num_key_heads"),
        num_value_heads=_int(config, name, "linear_num_value_heads"),
        key_head_dim=_int(config, name, "linear_key_head_dim"),
        value_head_dim=_int(config, name, "linear_value_head_dim"),
        conv_kernel=_int(config, name, "linear_conv_kernel_dim", default=4),
        state_dtype=str(first(config, "mamba_ssm_dtype", "mamba_ssm_cache_dtype", default="")),
    )


def read_mamba(config: Mapping[str, Any], name: str) -> Mamba2Spec:
    """Mamba-2 geometry under Nemotron-H's keys and their ``mamba_*`` aliases."""
    heads = _int(config, name, "mamba_num_heads", "mamba_n_heads", default=0)
    head_dim = _int(config, name, "mamba_head_dim", "mamba_d_head", default=0)
    if not heads or not head_dim:
        raise PlanInputError(f"config for {name!r}: Mamba layers need mamba_num_heads and "
                             f"mamba_head_dim")
    return Mamba2Spec(
        num_heads=heads, head_dim=head_dim,
        state_size=_int(config, name, "ssm_state_size", "mamba_d_state", default=128),
        n_groups=_int(config, name, "n_groups", "mamba_n_groups", default=1),
        conv_kernel=_int(config, name, "conv_kernel", "mamba_d_conv", default=4),
        conv_bias=bool(first(config, "use_conv_bias", "mamba_conv_bias", default=True)),
        proj_bias=bool(first(config, "use_bias", "mamba_proj_bias", default=False)),
        ssm_state_dtype=str(first(config, "mamba_ssm_cache_dtype", "mamba_ssm_dtype",
                                  default="")),
    )


def read_vision(config: Mapping[str, Any], name: str, model_type: str,
                text_hidden: int) -> VisionTowerSpec | None:
    """The vision tower of a VL wrapper config (its ``vision_config``), or None."""
    vision = config.get("vision_config")
    kind = VISION_KINDS.get(model_type)
    if not isinstance(vision, Mapping) or kind is None:
        return None
    if kind == "llama4":
        return VisionTowerSpec(
            kind=kind, hidden_size=_int(vision, name, "hidden_size"),
            depth=_int(vision, name, "num_hidden_layers"),
            intermediate_size=_int(vision, name, "intermediate_size"),
            num_heads=_int(vision, name, "num_attention_heads"),
            out_hidden_size=text_hidden, patch_size=_int(vision, name, "patch_size"),
            in_channels=_int(vision, name, "num_channels", default=3),
            image_size=_int(vision, name, "image_size"),
            projector_input_dim=_int(vision, name, "projector_input_dim"),
            projector_output_dim=_int(vision, name, "projector_output_dim"),
            vision_output_dim=_int(vision, name, "vision_output_dim"),
            projector_bias=bool(vision.get("multi_modal_projector_bias", False)))
    return VisionTowerSpec(
        kind=kind, hidden_size=_int(vision, name, "hidden_size", "embed_dim"),
        depth=_int(vision, name, "depth"),
        intermediate_size=_int(vision, name, "intermediate_size", default=0),
        num_heads=_int(vision, name, "num_heads"),
        out_hidden_size=_int(vision, name, "out_hidden_size", default=text_hidden),
        patch_size=_int(vision, name, "patch_size"),
        in_channels=_int(vision, name, "in_channels", "in_chans", default=3),
        temporal_patch_size=_int(vision, name, "temporal_patch_size", default=2),
        spatial_merge_size=_int(vision, name, "spatial_merge_size", default=2),
        num_position_embeddings=_int(vision, name, "num_position_embeddings", default=0),
        deepstack_layers=len(vision.get("deepstack_visual_indexes") or ()))


def mtp_layers(config: Mapping[str, Any], name: str) -> int:
    """Multi-token-prediction layers: ``num_nextn_predict_layers`` (DeepSeek-V3, GLM-4.5, MiMo,
    Nemotron-H) or ``mtp_num_hidden_layers`` (Qwen3.5)."""
    return _int(config, name, "num_nextn_predict_layers", "mtp_num_hidden_layers", default=0)
