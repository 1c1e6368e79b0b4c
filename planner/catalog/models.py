"""Model architectures: the built-in catalog, local ``config.json`` files, and parameter counts.

The catalog ships each model's published Hugging Face ``config.json`` under
``planner/catalog/models_data/``; a user's local model directory or ``config.json`` is read with
transformers' own config classes (any architecture they know), so both paths end in the same
normaliser, :func:`spec_from_hf_config`, which reads the per-layer description
(:mod:`planner.catalog.hf_config`, kinds in :mod:`planner.catalog.layers`).  A model outside
the set verl runs on Megatron (:mod:`planner.catalog.support`) is refused by name.

Parameter counts are analytic (:mod:`planner.catalog.params`), per component and per layer kind,
and are checked in the tests against the real module tree transformers builds on the ``meta``
device.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, fields, replace
from functools import cache, cached_property, lru_cache
from pathlib import Path
from typing import Any, Mapping

from planner.bounds import check_number, check_text, load_json, shown
from planner.catalog import hf_config
from planner.catalog.layers import (
    GatedDeltaNetSpec,
    LayerSpec,
    Mamba2Spec,
    MixerKind,
    MlpKind,
    VisionTowerSpec,
    attended_layer,
    layer_summary,
    mixer_counts,
    run_lengths,
)
from planner.catalog.params import ParamCounts, mtp_params, param_counts
from planner.catalog.support import check_supported
from planner.errors import PlanInputError
from planner.extras import available

__all__ = ["ModelSpec", "ParamCounts", "param_counts", "spec_from_hf_config", "resolve_model",
           "builtin_model", "builtin_config_dict", "catalog_names", "catalog_name",
           "load_model_config_path", "check_config_fields", "local_model_path"]


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only model as a list of layers (:class:`LayerSpec`): softmax attention (GQA,
    sliding, chunked, MLA), Gated DeltaNet or Mamba-2 mixers; dense or MoE feed-forward blocks;
    an optional vision tower.

    The fields before ``source`` keep their meaning for homogeneous transformers (every layer
    full attention or MLA, MoE after ``num_dense_layers`` leading dense layers); ``layers`` is
    derived from them when not given.  ``to_dict()`` writes ``layers`` run-length encoded and
    ``ModelSpec(**spec.to_dict())`` reads it back."""

    name: str
    model_type: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int  # dense MLP width (dense layers only for MoE models)
    num_attention_heads: int
    num_query_groups: int  # KV heads (GQA); equals heads for MHA; heads for MLA
    head_dim: int
    vocab_size: int
    tied_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    gated_mlp: bool = True  # SwiGLU: gate, up and down projections
    # MoE
    num_experts: int = 0
    moe_top_k: int = 0
    moe_ffn_hidden_size: int = 0
    shared_expert_ffn_hidden_size: int = 0  # all shared experts together
    num_dense_layers: int = 0  # dense layers of an MoE model (first_k_dense_replace, ...)
    router_bias: bool = False  # DeepSeek-V3's e_score_correction_bias, gpt-oss's router bias
    shared_expert_gate: bool = False  # Qwen2-MoE's sigmoid gate on the shared expert
    # MLA (DeepSeek-V2/V3); zero when the model uses standard attention
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    mtp_layers: int = 0  # multi-token-prediction layers (outside the total; mtp_params)
    source: str = ""
    # The per-layer description (hybrid models) and the details of the families that need them
    architecture: str = ""  # config.json's architectures[0], what Megatron-Bridge dispatches on
    layers: tuple[LayerSpec, ...] = ()
    linear_attention: GatedDeltaNetSpec | None = None
    mamba: Mamba2Spec | None = None
    vision: VisionTowerSpec | None = None
    attention_output_gate: bool = False  # Qwen3-Next/3.5: q_proj also emits a sigmoid gate
    attention_o_bias: bool = False  # gpt-oss: o_proj has a bias too
    attention_sinks: bool = False  # gpt-oss: a learned sink logit per head
    qk_norm_full_width: bool = False  # OLMoE: q/k RMSNorm over all heads
    expert_bias: bool = False  # gpt-oss: expert gate_up and down biases
    mlp_bias: bool = False  # Nemotron-H's mlp_bias
    moe_latent_size: int = 0  # Nemotron-3 Super's LatentMoE width
    # config.json's max_position_embeddings: the longest prompt + response verl's rollout
    # serves (vllm_async_server: max_model_len <= it); 0: the config states none
    max_position_embeddings: int = 0

    def __post_init__(self) -> None:
        for field_name in ("num_layers", "hidden_size", "num_attention_heads",
                           "num_query_groups", "head_dim", "vocab_size"):
            if getattr(self, field_name) <= 0:
                raise PlanInputError(f"model {self.name}: {field_name} must be positive, "
                                     f"got {getattr(self, field_name)}")
        if self.num_attention_heads % self.num_query_groups:
            raise PlanInputError(
                f"model {self.name}: num_attention_heads {self.num_attention_heads} is not a "
                f"multiple of num_key_value_heads {self.num_query_groups}")
        if self.num_experts:
            if not 0 < self.moe_top_k <= self.num_experts:
                raise PlanInputError(f"model {self.name}: experts per token {self.moe_top_k} "
                                     f"must be in 1..{self.num_experts}")
            if self.moe_ffn_hidden_size <= 0:
                raise PlanInputError(f"model {self.name}: MoE model needs moe_intermediate_size")
        if not 0 <= self.num_dense_layers <= self.num_layers:
            raise PlanInputError(f"model {self.name}: first dense layers {self.num_dense_layers}"
                                 f" outside 0..{self.num_layers}")
        self._normalise_structures()
        self._check_layers()

    def _normalise_structures(self) -> None:
        """Accept the JSON form of the nested specs (``to_dict()``'s output) and derive the
        homogeneous layer list when none is given."""
        set_ = object.__setattr__
        for field_name, cls in (("linear_attention", GatedDeltaNetSpec), ("mamba", Mamba2Spec),
                                ("vision", VisionTowerSpec)):
            value = getattr(self, field_name)
            if isinstance(value, Mapping):
                set_(self, field_name, cls(**value))
        if not self.layers or _homogeneous(self.layers):
            # A homogeneous layer list is a function of the fields above: derive it, so that
            # dataclasses.replace(spec, num_layers=..., num_experts=...) stays consistent.
            mixer = MixerKind.MLA if self.kv_lora_rank else MixerKind.FULL
            dense = self.num_dense_layers if self.num_experts else self.num_layers
            set_(self, "layers", tuple(LayerSpec(mixer, MlpKind.DENSE if i < dense
                                                 else MlpKind.MOE)
                                       for i in range(self.num_layers)))
            return
        layers: list[LayerSpec] = []
        for entry in self.layers:
            if isinstance(entry, LayerSpec):
                layers.append(entry)
            elif isinstance(entry, Mapping):  # {"mixer", "mlp", "window", "count"}
                count = int(entry.get("count", 1))
                layer = LayerSpec(entry["mixer"], entry["mlp"], int(entry.get("window", 0)))
                layers.extend([layer] * count)
            else:
                raise PlanInputError(f"model {self.name}: layer {shown(entry)} is not a layer")
        set_(self, "layers", tuple(layers))

    def _check_layers(self) -> None:
        if len(self.layers) != self.num_layers:
            raise PlanInputError(f"model {self.name}: {len(self.layers)} layer kinds for "
                                 f"{self.num_layers} layers")
        kinds = {layer.mixer for layer in self.layers}
        needs = {MixerKind.LINEAR: ("linear_attention", self.linear_attention),
                 MixerKind.MAMBA: ("mamba", self.mamba)}
        for kind, (what, spec) in needs.items():
            if kind in kinds and spec is None:
                raise PlanInputError(f"model {self.name}: {kind.value} layers without the "
                                     f"{what} geometry")
        if MixerKind.MLA in kinds and not self.kv_lora_rank:
            raise PlanInputError(f"model {self.name}: MLA layers need kv_lora_rank")
        if any(layer.mlp is MlpKind.MOE for layer in self.layers) and not self.num_experts:
            raise PlanInputError(f"model {self.name}: MoE layers without experts")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def linear_bias(self) -> bool:
        """megatron-core's ``add_bias_linear``: the checkpoint's linear layers carry biases, so
        the bridge builds them (Megatron-Bridge's GPTOSSProvider: ``add_bias_linear=True``)."""
        return self.expert_bias or self.attention_o_bias

    def __hash__(self) -> int:
        # the dataclass's hash of every field, computed once: the cost model's caches look a
        # model up thousands of times (a sizing sweep), and each hash walks its layer list
        return self._field_hash

    @cached_property
    def _field_hash(self) -> int:
        # the fields the dataclass's own hash reads (those compared, unless hash= says)
        return hash(tuple(getattr(self, f.name) for f in fields(self)
                          if (f.compare if f.hash is None else f.hash)))

    def __getstate__(self) -> dict:
        # a cached hash of strings is this process's: a copy made elsewhere computes its own
        return {name: value for name, value in self.__dict__.items() if name != "_field_hash"}

    @cached_property  # a function of the frozen fields: computed once (the cost model asks often)
    def num_moe_layers(self) -> int:
        return sum(layer.mlp is MlpKind.MOE for layer in self.layers)

    @cached_property
    def is_hybrid(self) -> bool:
        """Any layer that is not full attention / MLA with a feed-forward block."""
        return any(not layer.mixer.kv_grows or layer.mlp is MlpKind.NONE
                   for layer in self.layers)

    @property
    def query_projection_size(self) -> int:
        return self.num_attention_heads * (self.v_head_dim if self.is_mla else self.head_dim)

    @property
    def kv_projection_size(self) -> int:
        return self.num_query_groups * self.head_dim

    @cached_property
    def params(self) -> ParamCounts:
        return param_counts(self)

    @property
    def mtp_params(self) -> int:
        """Parameters of the MTP layers (not in ``params.total``)."""
        return mtp_params(self)

    # --- layer helpers ---------------------------------------------------------------------

    def count(self, mixer: MixerKind | str | None = None, mlp: MlpKind | str | None = None) -> int:
        """Layers of a mixer kind and/or feed-forward kind."""
        return sum((mixer is None or layer.mixer is MixerKind(mixer))
                   and (mlp is None or layer.mlp is MlpKind(mlp)) for layer in self.layers)

    @property
    def layer_counts(self) -> dict[str, int]:
        """Layers per mixer kind (``{"linear_attention": 36, "full_attention": 12}``)."""
        return mixer_counts(self.layers)

    @property
    def kv_layers(self) -> int:
        """Layers whose K/V cache grows with every token (full attention, MLA)."""
        return sum(layer.mixer.kv_grows for layer in self.layers)

    @property
    def attention_layers(self) -> int:
        """Softmax-attention layers of any kind (full, sliding, chunked, MLA)."""
        return sum(layer.mixer.is_attention for layer in self.layers)

    @property
    def layer_summary(self) -> str:
        return layer_summary(self.layers)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["layers"] = [{"mixer": layer.mixer.value, "mlp": layer.mlp.value,
                          "window": layer.window, "count": count}
                         for layer, count in run_lengths(self.layers)]
        for field_name in ("linear_attention", "mamba", "vision"):
            value = getattr(self, field_name)
            out[field_name] = asdict(value) if value is not None else None
        return out


def _homogeneous(layers) -> bool:
    """Every layer full attention (or every layer MLA) with a feed-forward block, dense layers
    first: the transformer the scalar fields describe on their own."""
    layers = [layer if isinstance(layer, LayerSpec) else None for layer in layers]
    if not layers or None in layers:
        return False
    mixers = {layer.mixer for layer in layers}
    if len(mixers) != 1 or not mixers <= {MixerKind.FULL, MixerKind.MLA}:
        return False
    mlps = [layer.mlp for layer in layers]
    if MlpKind.NONE in mlps:
        return False
    first_moe = mlps.index(MlpKind.MOE) if MlpKind.MOE in mlps else len(mlps)
    return all(mlp is MlpKind.MOE for mlp in mlps[first_moe:])


@lru_cache(maxsize=64)
def model_at_length(model: ModelSpec, seq_len: int) -> ModelSpec:
    """``model`` as sequences of at most ``seq_len`` tokens run it: every sliding-window or
    chunked layer whose window holds the whole sequence becomes full attention
    (:func:`planner.catalog.layers.attended_layer`); ``model`` itself when none does.  Cached:
    a request asks once per workload, a sizing sweep many times for the same few."""
    layers = tuple(attended_layer(layer, seq_len) for layer in model.layers)
    return model if layers == model.layers else replace(model, layers=layers)


def windows_within(given: ModelSpec, costed: ModelSpec) -> str:
    """What :func:`model_at_length` turned to full attention, as printed (``32
    sliding_attention(4096)``); empty when nothing."""
    turned = [layer for layer, now in zip(given.layers, costed.layers) if layer != now
              and layer.mixer.is_windowed]
    if not turned:
        return ""
    return layer_summary(turned).split(";")[0].strip()


# ---------------------------------------------------------------------------------------------
# config.json -> ModelSpec

_first = hf_config.first

# config.json fields the planner reads as integers -> (low, high): what real models use, with
# wide margins (the largest published configs: hidden 16,384 / 128 layers / 256 experts /
# 256k vocabulary).  Each is checked before use, so no transformers default hides a bad one.
REQUIRED_FIELDS = ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size")
_WIDTH = 1 << 20
INTEGER_FIELDS = {
    "hidden_size": (1, _WIDTH), "num_attention_heads": (1, 1 << 16),
    "num_hidden_layers": (1, 4096), "vocab_size": (1, 1 << 24),
    "num_key_value_heads": (1, 1 << 16), "head_dim": (1, 1 << 16),
    "intermediate_size": (1, 1 << 24), "moe_intermediate_size": (0, 1 << 24),
    "shared_expert_intermediate_size": (0, 1 << 24), "num_experts": (0, 1 << 16),
    "num_local_experts": (0, 1 << 16), "n_routed_experts": (0, 1 << 16),
    "moe_num_experts": (0, 1 << 16), "num_experts_per_tok": (0, 1 << 16),
    "moe_top_k": (0, 1 << 16), "moe_k": (0, 1 << 16), "n_shared_experts": (0, 1 << 12),
    "num_shared_experts": (0, 1 << 12), "moe_num_shared_experts": (0, 1 << 12),
    "first_k_dense_replace": (0, 4096), "moe_layer_freq": (1, 4096),
    "decoder_sparse_step": (1, 4096), "interleave_moe_layer_step": (1, 4096),
    "q_lora_rank": (0, _WIDTH), "kv_lora_rank": (0, _WIDTH), "qk_nope_head_dim": (0, 1 << 16),
    "qk_rope_head_dim": (0, 1 << 16), "v_head_dim": (0, 1 << 16),
    "num_nextn_predict_layers": (0, 4096), "mtp_num_hidden_layers": (0, 4096),
    "sliding_window": (0, 1 << 30), "attention_chunk_size": (0, 1 << 30),
    "full_attention_interval": (1, 4096), "linear_num_key_heads": (1, 1 << 16),
    "linear_num_value_heads": (1, 1 << 16), "linear_key_head_dim": (1, 1 << 16),
    "linear_value_head_dim": (1, 1 << 16), "linear_conv_kernel_dim": (1, 1 << 10),
    "mamba_num_heads": (1, 1 << 16), "mamba_head_dim": (1, 1 << 16),
    "ssm_state_size": (1, 1 << 16), "n_groups": (1, 1 << 16), "conv_kernel": (1, 1 << 10),
    "moe_latent_size": (0, _WIDTH), "moe_shared_expert_intermediate_size": (0, 1 << 24),
    "max_position_embeddings": (1, 1 << 40),
}


def check_config_fields(config: Mapping[str, Any], name: str) -> None:
    """Every size the planner reads from a config.json: present where required, an integer
    (``4096.0`` counts), finite and in range; the message names the field."""
    for key in REQUIRED_FIELDS:
        if config.get(key) is None:
            raise PlanInputError(f"config for {name!r} lacks {key!r}; not a decoder LLM "
                                 f"config.json (required: {', '.join(REQUIRED_FIELDS)})")
    for key, (low, high) in INTEGER_FIELDS.items():
        if config.get(key) is not None:
            check_number(f"config for {name!r}: {key}", config[key], low, high, integer=True)


def _text_config(config: Mapping[str, Any], name: str) -> dict[str, Any]:
    text_config = config.get("text_config")
    if text_config is not None and not isinstance(text_config, Mapping):
        raise PlanInputError(f"config for {name!r}: text_config {shown(text_config)} is not "
                             f"valid; valid: the language model's config (a JSON object)")
    return hf_config.text_part(config)


def spec_from_hf_config(config: Mapping[str, Any], name: str, source: str = "") -> ModelSpec:
    """Normalise a Hugging Face config dict (any family verl runs on Megatron) to a spec."""
    config = _text_config(config, name)
    check_config_fields(config, name)
    try:
        model_type = str(config.get("model_type", ""))
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        layers = int(config["num_hidden_layers"])
        vocab = int(config["vocab_size"])
    except KeyError as missing:
        raise PlanInputError(f"config for {name!r} lacks {missing.args[0]!r}; not a decoder "
                             f"LLM config.json") from None
    except (TypeError, ValueError) as bad:
        raise PlanInputError(f"config for {name!r} has a non-integer size: {bad}") from None
    hf_config.check_layout_keys(config, name, model_type)
    kv_heads = int(_first(config, "num_key_value_heads", default=heads))
    head_dim = int(_first(config, "head_dim", default=hidden // heads))
    kv_lora = int(_first(config, "kv_lora_rank", default=0))
    layer_specs = hf_config.read_layers(config, name, layers, model_type, mla=bool(kv_lora))
    # experts only where a layer holds them: a dense Nemotron-H (no 'E' blocks) gets
    # n_routed_experts=8 from transformers' NemotronHConfig defaults, and builds none
    num_experts = (hf_config.num_experts(config, name)
                   if any(layer.mlp is MlpKind.MOE for layer in layer_specs) else 0)
    top_k = hf_config.experts_per_token(config, name) if num_experts else 0
    dense_ffn = int(_first(config, "intermediate_size_mlp", "intermediate_size",
                           default=4 * hidden))
    moe_ffn = shared_ffn = 0
    shared_gate = False
    if num_experts:
        moe_ffn = hf_config.expert_width(config, name, int(_first(
            config, "intermediate_size", default=4 * hidden)))
        shared_ffn, shared_gate = hf_config.shared_expert_width(config, name, moe_ffn)
    kinds = {layer.mixer for layer in layer_specs}
    act = str(_first(config, "mlp_hidden_act", "hidden_act", "hidden_activation",
                     default="silu"))
    model_type_gated = act in ("silu", "swiglu", "gelu_pytorch_tanh") or "llama" in model_type
    qk_full = model_type in hf_config.QK_NORM_FULL_WIDTH
    return ModelSpec(
        name=name,
        model_type=model_type,
        num_layers=len(layer_specs),
        hidden_size=hidden,
        ffn_hidden_size=dense_ffn,
        num_attention_heads=heads,
        num_query_groups=heads if kv_lora else kv_heads,
        head_dim=(int(config.get("qk_nope_head_dim", 0)) + int(config.get("qk_rope_head_dim", 0))
                  if kv_lora else head_dim),
        vocab_size=vocab,
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=bool(_first(config, "attention_bias", "qkv_bias",
                             *(("use_bias",) if model_type.startswith("ernie") else ()),
                             default=model_type in hf_config.QKV_BIAS_DEFAULT)),
        qk_norm=(model_type in hf_config.QK_NORM_PER_HEAD
                 or config.get("text_model_type") in hf_config.QK_NORM_PER_HEAD
                 or (bool(config.get("use_qk_norm")) and model_type == "glm4_moe")),
        gated_mlp=model_type_gated,
        num_experts=num_experts,
        moe_top_k=top_k,
        moe_ffn_hidden_size=moe_ffn,
        shared_expert_ffn_hidden_size=shared_ffn,
        num_dense_layers=(sum(layer.mlp is MlpKind.DENSE for layer in layer_specs)
                          if num_experts else 0),
        router_bias=bool(num_experts) and (config.get("topk_method") == "noaux_tc"
                                           or model_type in hf_config.ROUTER_BIAS),
        shared_expert_gate=shared_gate,
        q_lora_rank=int(_first(config, "q_lora_rank", default=0)) if kv_lora else 0,
        kv_lora_rank=kv_lora,
        qk_nope_head_dim=int(config.get("qk_nope_head_dim", 0)) if kv_lora else 0,
        qk_rope_head_dim=int(config.get("qk_rope_head_dim", 0)) if kv_lora else 0,
        v_head_dim=int(config.get("v_head_dim", 0)) if kv_lora else 0,
        mtp_layers=hf_config.mtp_layers(config, name),
        source=source or str(config.get("_source", "")),
        architecture=hf_config.architecture_of(config),
        layers=layer_specs,
        linear_attention=(hf_config.read_linear_attention(config, name)
                          if MixerKind.LINEAR in kinds else None),
        mamba=hf_config.read_mamba(config, name) if MixerKind.MAMBA in kinds else None,
        vision=hf_config.read_vision(config, name, model_type, hidden),
        attention_output_gate=bool(_first(config, "attn_output_gate", default=(
            model_type in hf_config.ATTENTION_OUTPUT_GATE))),
        attention_o_bias=((model_type == "gpt_oss" and bool(config.get("attention_bias", True)))
                          or (model_type.startswith("ernie") and bool(config.get("use_bias")))),
        attention_sinks=model_type == "gpt_oss",
        qk_norm_full_width=qk_full,
        expert_bias=model_type == "gpt_oss",
        mlp_bias=bool(config.get("mlp_bias", False)),
        moe_latent_size=int(_first(config, "moe_latent_size", default=0)) if num_experts else 0,
        max_position_embeddings=int(config.get("max_position_embeddings") or 0),
    )


# ---------------------------------------------------------------------------------------------
# Catalog and lookup

# Families whose published config.json names a model_type only their remote code defines
# (Kimi-K2's ``kimi_k2``, MiMo's ``mimo``): read by the normaliser's own rules.
REMOTE_CODE_TYPES = frozenset({"kimi_k2", "mimo"})

# Short names users type, beyond the normalised canonical names (case/punctuation ignored).
EXTRA_ALIASES = {
    "qwen3-30b": "Qwen3-30B-A3B",
    "qwen3-moe": "Qwen3-30B-A3B",
    "qwen3-235b": "Qwen3-235B-A22B",
    "qwen3-30b-base": "Qwen3-30B-A3B-Base",
    "llama3-8b": "Llama-3.1-8B",
    "llama3-70b": "Llama-3.1-70B",
    "llama3-405b": "Llama-3.1-405B",
    "mixtral": "Mixtral-8x7B",
    "dsv3": "DeepSeek-V3",
    "deepseek-r1": "DeepSeek-V3",  # DeepSeek-R1 is DeepSeek-V3's architecture
    "moonlight": "Moonlight-16B-A3B",
    "moonlight-16b": "Moonlight-16B-A3B",
    "qwen3.5-35b": "Qwen3.5-35B-A3B",
    "qwen3.6-35b-a3b": "Qwen3.5-35B-A3B",  # Qwen3.6 ships Qwen3.5's architecture and config
    "qwen3.5-397b": "Qwen3.5-397B-A17B",
    "qwen3.5-122b": "Qwen3.5-122B-A10B",
    # nvidia/Qwen3.6-27B-NVFP4's config (ai-dynamo/aiconfigurator) has every size of Qwen3.5-27B
    "qwen3.6-27b": "Qwen3.5-27B",
    # GLM-4.7's config.json differs from GLM-4.6's in no architecture field (zai-org/GLM-4.7-FP8's
    # config in ai-dynamo/aiconfigurator; a public diff of the GLM-4.5/4.6/4.7 configs)
    "glm-4.7": "GLM-4.6",
    "qwen3-next": "Qwen3-Next-80B-A3B",
    "qwen3-next-80b-a3b-thinking": "Qwen3-Next-80B-A3B",
    "nemotron-3-nano": "NVIDIA-Nemotron-3-Nano-30B-A3B",
    "nvidia-nemotron-3-nano-30b-a3b-bf16": "NVIDIA-Nemotron-3-Nano-30B-A3B",
    "nemotron-3-super": "NVIDIA-Nemotron-3-Super-120B-A12B",
    "nvidia-nemotron-3-super-120b-a12b-bf16": "NVIDIA-Nemotron-3-Super-120B-A12B",
    "kimi-k2-instruct": "Kimi-K2",
    "llama-4-scout": "Llama-4-Scout-17B-16E",
    "llama-4-maverick": "Llama-4-Maverick-17B-128E",
    "mimo-7b-rl": "MiMo-7B",
    "mimo-7b-base": "MiMo-7B",
}
# Released variants that keep their base model's architecture (only fine-tuned weights), so
# ``Qwen/Qwen2.5-7B-Instruct`` plans as Qwen2.5-7B.  Tried only after an exact match fails, so
# a variant the catalog ships on its own (``Qwen3-8B-Base``) resolves to its own config.
SAME_ARCHITECTURE_SUFFIX = re.compile(r"-(instruct|chat|hf|base)$")


def _key(text: str) -> str:
    """``"Qwen/Qwen2.5-Math-7B"`` -> ``"qwen25math7b"``: the repository name, lower case,
    without punctuation."""
    return re.sub(r"[^a-z0-9]", "", text.strip().lower().split("/")[-1])


def _catalog_dir() -> Path:
    # the package's own directory, not importlib.resources: its readers import zipfile and
    # tempfile (about 12 ms of a plan's start), and the planner is installed as files
    return Path(__file__).parent / "models_data"


@cache
def catalog_names() -> tuple[str, ...]:
    return tuple(sorted(entry.name[:-5] for entry in _catalog_dir().iterdir()
                        if entry.name.endswith(".json")))


@cache
def _alias_index() -> dict[str, str]:
    index: dict[str, str] = {}
    for name in catalog_names():
        if _key(name) in index:  # two catalog files one name cannot tell apart
            raise AssertionError(f"catalog names {index[_key(name)]} and {name} collide")
        index[_key(name)] = name
    for alias, name in EXTRA_ALIASES.items():
        if name in catalog_names():
            index.setdefault(_key(alias), name)
    return index


def _lookup(text: str) -> str | None:
    """Exact name or alias first; then without a same-architecture suffix (``-Instruct``)."""
    index = _alias_index()
    found = index.get(_key(text))
    if found is None:
        stem = SAME_ARCHITECTURE_SUFFIX.sub("", text.strip().lower().split("/")[-1])
        found = index.get(_key(stem))
    return found


@cache
def builtin_model(name: str) -> ModelSpec:
    text = (_catalog_dir() / f"{name}.json").read_text()
    return spec_from_hf_config(json.loads(text), name)


def builtin_config_dict(name: str) -> dict[str, Any]:
    """The shipped config.json of a catalog model, as a dict."""
    return json.loads((_catalog_dir() / f"{name}.json").read_text())


def load_model_config_path(path: Path) -> ModelSpec:
    """Read a local model directory or config.json with transformers' config classes."""
    config_file = path / "config.json" if path.is_dir() else path
    if not config_file.is_file():
        raise PlanInputError(f"model path {str(path)!r} has no config.json")
    raw = load_json(config_file, "model config.json", kind=None)  # size and depth bounded
    if not isinstance(raw, dict):
        raise PlanInputError(f"{str(config_file)!r} is not a JSON object")
    name = path.name if path.is_dir() else path.parent.name or config_file.stem
    # The sizes the planner needs must be in the file itself: transformers would fill a missing
    # one with its class default, a different model than the user's.
    check_config_fields(_text_config(raw, name), name)
    if "model_type" not in raw:
        raise PlanInputError(f"{str(config_file)!r} has no model_type; not a transformers config")
    if not isinstance(raw["model_type"], str):
        raise PlanInputError(f"{str(config_file)!r}: model_type {shown(raw['model_type'])} is "
                             f"not a string; valid: a transformers model type such as 'qwen3'")
    values = raw
    if available("transformers"):
        from transformers import AutoConfig  # lazy: transformers is heavy
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

        if raw["model_type"] in CONFIG_MAPPING_NAMES or raw["model_type"] not in REMOTE_CODE_TYPES:
            try:
                config = AutoConfig.for_model(**raw)
            except Exception as error:  # noqa: BLE001 - transformers raises ValueError,
                # TypeError, KeyError and StrictDataclassFieldValidationError for bad fields
                # transformers puts the reason on the lines after a heading ("Class validation
                # error for validator ...:"): keep them, on one line and bounded
                reason = " ".join(line.strip() for line in str(error).splitlines()
                                  if line.strip())
                if len(reason) > 400:
                    reason = reason[:397] + "..."
                raise PlanInputError(f"{str(config_file)!r}: transformers cannot read it "
                                     f"({reason})") from None
            values = {**raw, **config.to_dict()}
    # else: the normaliser knows every field it reads; transformers only adds class defaults
    check_supported(values, name)
    spec_from_hf_config(raw, name=name, source=str(config_file))
    try:
        return spec_from_hf_config(values, name=name, source=str(config_file))
    except PlanInputError as error:
        # the file alone reads; a value transformers' class filled in does not (Qwen2Config's
        # num_key_value_heads=32 where config.json sets none): say where it came from
        given = _text_config(raw, name)
        filled = [key for key, value in _text_config(values, name).items()
                  if key not in given and f"{key} {value}" in str(error)]
        if not filled:
            raise
        defaults = ", ".join(f"{key}={_text_config(values, name)[key]}" for key in filled)
        raise PlanInputError(f"{error} ({defaults}: transformers' class default for model_type "
                             f"{raw['model_type']!r}, which {str(config_file)!r} does not set; "
                             f"set it there)") from None


def catalog_name(text: str) -> str | None:
    """The catalog model a name or alias refers to (case and punctuation ignored), or None."""
    return _lookup(text)


def local_model_path(name_or_path: str) -> Path | None:
    """The local config.json, or model directory holding one, that ``--model`` names (None:
    not one -- a catalog name)."""
    path = Path(name_or_path).expanduser()
    return path if path.is_file() or (path / "config.json").is_file() else None


def resolve_model(name_or_path: str) -> ModelSpec:
    """A catalog name or alias, or a local model directory / config.json path."""
    if not name_or_path.strip():
        raise PlanInputError("--model is empty; give a catalog name or a config.json path")
    check_text("--model", name_or_path, what="a catalog name or a config.json path")
    local = local_model_path(name_or_path)
    if local is not None:
        # a local download named after its model (~/models/Qwen3-8B) is read from its own file
        return load_model_config_path(local)
    path = Path(name_or_path).expanduser()
    found = _lookup(name_or_path)
    if found is not None:
        return builtin_model(found)
    if path.exists():
        return load_model_config_path(path)
    index = _alias_index()
    import difflib  # an unknown name's hint alone: not at every start

    close = difflib.get_close_matches(_key(name_or_path), list(index), n=4, cutoff=0.5)
    hint = ", ".join(dict.fromkeys(index[c] for c in close))
    raise PlanInputError(
        f"unknown model {name_or_path!r}: not a catalog name (models are matched by their "
        f"exact name, never by a similar one) nor an existing path; pass the model's directory "
        f"or its config.json"
        + (f", or one of the closest catalog names: {hint}" if hint
           else "; `plan-parallel models` lists the catalog"))
