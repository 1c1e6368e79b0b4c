"""Model architectures: the built-in catalog, local ``config.json`` files, and parameter counts.

The catalog ships each model's published Hugging Face ``config.json`` under
``planner/catalog/models_data/``; a user's local model directory or ``config.json`` is read with
transformers' own config classes (any architecture they know), so both paths end in the same
normaliser, :func:`spec_from_hf_config`.

Parameter counts are analytic (:class:`ParamCounts`), per component, and are checked in the tests
against the real module tree transformers builds on the ``meta`` device.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import asdict, dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from planner.bounds import check_number, check_text, load_json, shown
from planner.errors import PlanInputError
from planner.extras import available


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, dense or MoE, with GQA or MLA attention."""

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
    num_dense_layers: int = 0  # leading dense layers of an MoE model (first_k_dense_replace)
    router_bias: bool = False  # DeepSeek-V3's e_score_correction_bias
    shared_expert_gate: bool = False  # Qwen2-MoE's sigmoid gate on the shared expert
    # MLA (DeepSeek-V2/V3); zero when the model uses standard attention
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    mtp_layers: int = 0  # multi-token-prediction layers (not trained by verl; not counted)
    source: str = ""

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

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    @property
    def query_projection_size(self) -> int:
        return self.num_attention_heads * (self.v_head_dim if self.is_mla else self.head_dim)

    @property
    def kv_projection_size(self) -> int:
        return self.num_query_groups * self.head_dim

    @property
    def params(self) -> "ParamCounts":
        return param_counts(self)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts per component.  ``attention``, ``norms`` etc. are totals over layers."""

    embedding: int
    output_layer: int  # 0 when tied to the embedding
    attention_per_layer: int  # projections, biases, q/k norms, MLA's low-rank norms
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

    @property
    def attention(self) -> int:
        return self.attention_per_layer * (self.num_dense_layers + self.num_moe_layers)

    @property
    def dense_mlp(self) -> int:
        return self.dense_mlp_per_layer * self.num_dense_layers

    @property
    def experts(self) -> int:
        return self.experts_per_layer * self.num_moe_layers

    @property
    def shared_experts(self) -> int:
        return self.shared_experts_per_layer * self.num_moe_layers

    @property
    def router(self) -> int:
        return self.router_per_layer * self.num_moe_layers

    @property
    def norms(self) -> int:
        layers = self.num_dense_layers + self.num_moe_layers
        return self.norms_per_layer * layers + self.final_norm

    @property
    def dense_layer(self) -> int:
        """Non-embedding parameters of one dense transformer layer."""
        return self.attention_per_layer + self.dense_mlp_per_layer + self.norms_per_layer

    @property
    def moe_layer_non_expert(self) -> int:
        """Parameters of one MoE layer that are not routed experts (replicated over EP)."""
        return (self.attention_per_layer + self.router_per_layer + self.shared_experts_per_layer
                + self.norms_per_layer)

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
        return (self.embedding + self.output_layer + self.attention + self.dense_mlp
                + self.router + self.experts + self.shared_experts + self.norms)

    @property
    def active(self) -> int:
        """Parameters one token passes through (routed experts: only its top-k)."""
        inactive_per_layer = self.experts_per_layer - self.active_experts_per_layer
        return self.total - inactive_per_layer * self.num_moe_layers

    def to_dict(self) -> dict[str, int]:
        return {"total": self.total, "active": self.active, "embedding": self.embedding,
                "output_layer": self.output_layer, "attention": self.attention,
                "dense_mlp": self.dense_mlp, "router": self.router, "experts": self.experts,
                "shared_experts": self.shared_experts, "norms": self.norms}


def param_counts(model: ModelSpec) -> ParamCounts:
    """Analytic parameter counts (same module tree as transformers' implementations)."""
    h = model.hidden_size
    mlp_matrices = 3 if model.gated_mlp else 2  # SwiGLU gate+up+down, else up+down
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
        attention = q_params + kv_params + model.num_attention_heads * model.v_head_dim * h
        # Down-projections and their norms are replicated over TP (megatron-core MLA).
        replicated = (h * (model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim)
                      + model.q_lora_rank + model.kv_lora_rank)
    else:
        replicated = 0
        q_out = model.num_attention_heads * model.head_dim
        kv_out = 2 * model.num_query_groups * model.head_dim
        attention = h * (q_out + kv_out) + q_out * h
        if model.qkv_bias:
            attention += q_out + kv_out
        if model.qk_norm:
            attention += 2 * model.head_dim  # RMSNorm over head_dim for q and for k
            replicated += 2 * model.head_dim
    router = 0
    experts = shared = active_experts = 0
    if model.is_moe:
        router = model.num_experts * h
        if model.router_bias:
            router += model.num_experts
        if model.shared_expert_gate:
            router += h
        per_expert = mlp_matrices * h * model.moe_ffn_hidden_size
        experts = model.num_experts * per_expert
        active_experts = model.moe_top_k * per_expert
        shared = mlp_matrices * h * model.shared_expert_ffn_hidden_size
    num_dense = model.num_layers - model.num_moe_layers
    return ParamCounts(
        embedding=model.vocab_size * h,
        output_layer=0 if model.tied_embeddings else model.vocab_size * h,
        attention_per_layer=attention,
        attention_replicated_per_layer=replicated,
        dense_mlp_per_layer=mlp_matrices * h * model.ffn_hidden_size if num_dense else 0,
        router_per_layer=router,
        experts_per_layer=experts,
        shared_experts_per_layer=shared,
        norms_per_layer=2 * h,  # RMSNorm weights, no bias
        final_norm=h,
        num_dense_layers=num_dense,
        num_moe_layers=model.num_moe_layers,
        active_experts_per_layer=active_experts,
    )


# ---------------------------------------------------------------------------------------------
# config.json -> ModelSpec


def _first(config: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        value = config.get(key)
        if value is not None:
            return value
    return default


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
    "moe_top_k": (0, 1 << 16), "n_shared_experts": (0, 1 << 12),
    "num_shared_experts": (0, 1 << 12), "first_k_dense_replace": (0, 4096),
    "q_lora_rank": (0, _WIDTH), "kv_lora_rank": (0, _WIDTH), "qk_nope_head_dim": (0, 1 << 16),
    "qk_rope_head_dim": (0, 1 << 16), "v_head_dim": (0, 1 << 16),
    "num_nextn_predict_layers": (0, 4096),
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


def spec_from_hf_config(config: Mapping[str, Any], name: str, source: str = "") -> ModelSpec:
    """Normalise a Hugging Face config dict (any of the common decoder families) to a spec."""
    text_config = config.get("text_config")
    if text_config is not None and not isinstance(text_config, Mapping):
        raise PlanInputError(f"config for {name!r}: text_config {shown(text_config)} is not "
                             f"valid; valid: the language model's config (a JSON object)")
    if isinstance(text_config, Mapping):  # multimodal wrappers: the language model
        config = {**text_config, "model_type": text_config.get(
            "model_type", config.get("model_type", ""))}
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
    kv_heads = int(_first(config, "num_key_value_heads", default=heads))
    head_dim = int(_first(config, "head_dim", default=hidden // heads))
    num_experts = int(_first(config, "num_experts", "num_local_experts", "n_routed_experts",
                             "moe_num_experts", default=0))
    top_k = int(_first(config, "num_experts_per_tok", "moe_top_k", default=0)) if num_experts else 0
    moe_ffn = int(_first(config, "moe_intermediate_size", default=0)) if num_experts else 0
    dense_ffn = int(_first(config, "intermediate_size", default=4 * hidden))
    if num_experts and not moe_ffn:  # Mixtral: every expert is a full-width MLP
        moe_ffn = dense_ffn
    shared_ffn = 0
    shared_gate = False
    if num_experts:
        n_shared = int(_first(config, "n_shared_experts", "num_shared_experts", default=0))
        shared_ffn = n_shared * moe_ffn
        if config.get("shared_expert_intermediate_size"):  # Qwen2-MoE
            shared_ffn = int(config["shared_expert_intermediate_size"])
            shared_gate = True
    first_dense = int(_first(config, "first_k_dense_replace", default=0)) if num_experts else 0
    if num_experts and config.get("mlp_only_layers"):
        raise PlanInputError(f"config for {name!r}: mlp_only_layers "
                             f"{config['mlp_only_layers']} (dense layers amid MoE) is not "
                             f"supported")
    if num_experts and int(_first(config, "decoder_sparse_step", "moe_layer_freq", default=1)) != 1:
        raise PlanInputError(f"config for {name!r}: MoE layers on every k-th layer only "
                             f"(decoder_sparse_step/moe_layer_freq != 1) are not supported")
    kv_lora = int(_first(config, "kv_lora_rank", default=0))
    act = str(_first(config, "hidden_act", "hidden_activation", default="silu"))
    model_type_gated = act in ("silu", "swiglu", "gelu_pytorch_tanh") or "llama" in model_type
    return ModelSpec(
        name=name,
        model_type=model_type,
        num_layers=layers,
        hidden_size=hidden,
        ffn_hidden_size=dense_ffn,
        num_attention_heads=heads,
        num_query_groups=heads if kv_lora else kv_heads,
        head_dim=(int(config.get("qk_nope_head_dim", 0)) + int(config.get("qk_rope_head_dim", 0))
                  if kv_lora else head_dim),
        vocab_size=vocab,
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=bool(_first(config, "attention_bias", "qkv_bias",
                             default=model_type in ("qwen2", "qwen2_moe"))),
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        gated_mlp=model_type_gated,
        num_experts=num_experts,
        moe_top_k=top_k,
        moe_ffn_hidden_size=moe_ffn,
        shared_expert_ffn_hidden_size=shared_ffn,
        num_dense_layers=first_dense,
        router_bias=bool(num_experts) and config.get("topk_method") == "noaux_tc",
        shared_expert_gate=shared_gate,
        q_lora_rank=int(_first(config, "q_lora_rank", default=0)) if kv_lora else 0,
        kv_lora_rank=kv_lora,
        qk_nope_head_dim=int(config.get("qk_nope_head_dim", 0)) if kv_lora else 0,
        qk_rope_head_dim=int(config.get("qk_rope_head_dim", 0)) if kv_lora else 0,
        v_head_dim=int(config.get("v_head_dim", 0)) if kv_lora else 0,
        mtp_layers=int(_first(config, "num_nextn_predict_layers", default=0)),
        source=source or str(config.get("_source", "")),
    )


# ---------------------------------------------------------------------------------------------
# Catalog and lookup

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
}
# Released variants that keep their base model's architecture (only fine-tuned weights), so
# ``Qwen/Qwen2.5-7B-Instruct`` plans as Qwen2.5-7B.  Tried only after an exact match fails, so
# a variant the catalog ships on its own (``Qwen3-8B-Base``) resolves to its own config.
SAME_ARCHITECTURE_SUFFIX = re.compile(r"-(instruct|chat|hf|base)$")


def _key(text: str) -> str:
    """``"Qwen/Qwen2.5-Math-7B"`` -> ``"qwen25math7b"``: the repository name, lower case,
    without punctuation."""
    return re.sub(r"[^a-z0-9]", "", text.strip().lower().split("/")[-1])


def _catalog_dir():
    return resources.files("planner.catalog") / "models_data"


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
    spec_from_hf_config(raw, name=name, source=str(config_file))
    if "model_type" not in raw:
        raise PlanInputError(f"{str(config_file)!r} has no model_type; not a transformers config")
    if not available("transformers"):
        # The normaliser knows every field it reads; transformers only adds class defaults.
        return spec_from_hf_config(raw, name=name, source=str(config_file))
    from transformers import AutoConfig  # lazy: transformers is heavy

    try:
        config = AutoConfig.for_model(**raw)
    except Exception as error:  # noqa: BLE001 - transformers raises ValueError, TypeError,
        # KeyError and huggingface_hub's StrictDataclassFieldValidationError for bad fields
        raise PlanInputError(f"{str(config_file)!r}: transformers cannot read it "
                             f"({str(error).splitlines()[0]})") from None
    values = {**raw, **config.to_dict()}
    return spec_from_hf_config(values, name=name, source=str(config_file))


def catalog_name(text: str) -> str | None:
    """The catalog model a name or alias refers to (case and punctuation ignored), or None."""
    return _lookup(text)


def resolve_model(name_or_path: str) -> ModelSpec:
    """A catalog name or alias, or a local model directory / config.json path."""
    if not name_or_path.strip():
        raise PlanInputError("--model is empty; give a catalog name or a config.json path")
    check_text("--model", name_or_path, what="a catalog name or a config.json path")
    found = _lookup(name_or_path)
    if found is not None:
        return builtin_model(found)
    path = Path(name_or_path).expanduser()
    if path.exists():
        return load_model_config_path(path)
    index = _alias_index()
    close = difflib.get_close_matches(_key(name_or_path), list(index), n=4, cutoff=0.5)
    hint = ", ".join(dict.fromkeys(index[c] for c in close))
    raise PlanInputError(
        f"unknown model {name_or_path!r}: not a catalog name (models are matched by their "
        f"exact name, never by a similar one) nor an existing path; pass the model's directory "
        f"or its config.json"
        + (f", or one of the closest catalog names: {hint}" if hint
           else "; `plan-parallel models` lists the catalog"))
