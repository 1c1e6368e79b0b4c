"""Layer kinds: a model is a list of layers, each a token mixer and a feed-forward block.

A decoder layer is described by two kinds (data, not code paths):

* its **mixer**, the part that moves information between tokens: full causal attention,
  sliding-window attention (a window of ``window`` tokens), chunked local attention (Llama-4:
  tokens attend within their ``window``-token chunk), multi-head latent attention (MLA,
  DeepSeek-V2/V3), Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5), a Mamba-2 SSM
  (Nemotron-H), or none (a Nemotron-H block that is only an MLP or MoE);
* its **feed-forward** block: a dense MLP, a mixture of experts, or none (a Nemotron-H block
  that is only a mixer).

The geometry shared by all layers of one kind (heads, head dims, state sizes) lives on the
model (:class:`GatedDeltaNetSpec`, :class:`Mamba2Spec` and ``ModelSpec``'s attention fields), so
memory and time are sums over the layer list of per-kind functions of that geometry.  An unknown
kind is an error naming it, never a default.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from enum import Enum
from typing import Iterable

from planner.errors import PlanInputError


class MixerKind(str, Enum):
    """How a layer mixes tokens (the value is the name printed and written to JSON)."""

    FULL = "full_attention"
    SLIDING = "sliding_attention"
    CHUNKED = "chunked_attention"
    MLA = "mla"
    LINEAR = "linear_attention"  # Gated DeltaNet
    MAMBA = "mamba2"
    NONE = "none"

    @property
    def is_attention(self) -> bool:
        """Softmax attention with a K/V cache (full, windowed or latent)."""
        return self in (MixerKind.FULL, MixerKind.SLIDING, MixerKind.CHUNKED, MixerKind.MLA)

    @property
    def kv_grows(self) -> bool:
        """The cache of this layer grows with every token of the sequence (full attention, MLA)."""
        return self in (MixerKind.FULL, MixerKind.MLA)

    @property
    def is_windowed(self) -> bool:
        return self in (MixerKind.SLIDING, MixerKind.CHUNKED)

    @property
    def is_recurrent(self) -> bool:
        """A fixed-size state per sequence (Gated DeltaNet, Mamba-2), not a K/V cache."""
        return self in (MixerKind.LINEAR, MixerKind.MAMBA)


class MlpKind(str, Enum):
    DENSE = "dense"
    MOE = "moe"
    NONE = "none"


@dataclass(frozen=True)
class LayerSpec:
    """One decoder layer: its mixer, its feed-forward block and, for windowed attention, the
    window (sliding) or chunk (chunked) size in tokens."""

    mixer: MixerKind
    mlp: MlpKind
    window: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "mixer", MixerKind(self.mixer))
        object.__setattr__(self, "mlp", MlpKind(self.mlp))
        if self.mixer.is_windowed and self.window <= 0:
            raise PlanInputError(f"{self.mixer.value} layer needs a positive window, "
                                 f"got {self.window}")
        if not self.mixer.is_windowed and self.window:
            raise PlanInputError(f"{self.mixer.value} layer has no window (got {self.window})")
        if self.mixer is MixerKind.NONE and self.mlp is MlpKind.NONE:
            raise PlanInputError("a layer needs a mixer or a feed-forward block")

    @property
    def norms(self) -> int:
        """Pre-norms of the layer: one before the mixer, one before the feed-forward block."""
        return (self.mixer is not MixerKind.NONE) + (self.mlp is not MlpKind.NONE)

    @property
    def label(self) -> str:
        """``sliding_attention(128)+moe``: the kind as printed."""
        mixer = self.mixer.value + (f"({self.window})" if self.window else "")
        return f"{mixer}+{self.mlp.value}"


@dataclass(frozen=True)
class GatedDeltaNetSpec:
    """Gated DeltaNet linear attention (Yang et al. 2024, arXiv 2412.06464), as Qwen3-Next and
    Qwen3.5 configure it (``linear_*`` keys of their config.json).

    ``state_dtype`` is the recurrent state's cache dtype (``mamba_ssm_dtype``: Qwen3.5 ships
    ``float32``); empty means the model dtype (vLLM's ``mamba_ssm_cache_dtype="auto"``)."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    state_dtype: str = ""

    def __post_init__(self) -> None:
        for name in ("num_key_heads", "num_value_heads", "key_head_dim", "value_head_dim",
                     "conv_kernel"):
            if getattr(self, name) <= 0:
                raise PlanInputError(f"linear attention: {name} must be positive, "
                                     f"got {getattr(self, name)}")
        if self.num_value_heads % self.num_key_heads:
            raise PlanInputError(f"linear attention: linear_num_value_heads "
                                 f"{self.num_value_heads} is not a multiple of "
                                 f"linear_num_key_heads {self.num_key_heads}")

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv1d: q and k (key side) and v (vLLM ``conv_dim``)."""
        return 2 * self.key_dim + self.value_dim


@dataclass(frozen=True)
class Mamba2Spec:
    """A Mamba-2 mixer (Dao & Gu 2024, arXiv 2405.21060) as Nemotron-H configures it.

    ``ssm_state_dtype`` is the SSM state's cache dtype (``mamba_ssm_cache_dtype``); empty means
    the model dtype."""

    num_heads: int
    head_dim: int
    state_size: int
    n_groups: int
    conv_kernel: int
    conv_bias: bool = True
    proj_bias: bool = False
    ssm_state_dtype: str = ""

    def __post_init__(self) -> None:
        for name in ("num_heads", "head_dim", "state_size", "n_groups", "conv_kernel"):
            if getattr(self, name) <= 0:
                raise PlanInputError(f"Mamba-2: {name} must be positive, "
                                     f"got {getattr(self, name)}")
        if self.num_heads % self.n_groups:
            raise PlanInputError(f"Mamba-2: mamba_num_heads {self.num_heads} is not a multiple "
                                 f"of n_groups {self.n_groups}")

    @property
    def inner_size(self) -> int:
        """``d_inner = heads * head_dim`` (the expanded width of the mixer)."""
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv1d: x, B and C (``d_inner + 2 * n_groups * d_state``)."""
        return self.inner_size + 2 * self.n_groups * self.state_size


@dataclass(frozen=True)
class VisionTowerSpec:
    """The vision encoder of a vision-language model (its parameters count in the total, as
    transformers' ``...ForConditionalGeneration`` holds them; a text token never passes through
    it).  ``kind`` selects the module tree: ``qwen3_vl`` (Qwen3-VL and Qwen3.5), ``qwen2_5_vl``,
    ``llama4``."""

    kind: str
    hidden_size: int
    depth: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int  # the language model's width the merger projects to
    patch_size: int
    in_channels: int = 3
    temporal_patch_size: int = 1
    spatial_merge_size: int = 1
    num_position_embeddings: int = 0
    deepstack_layers: int = 0
    # Llama-4 only
    image_size: int = 0
    projector_input_dim: int = 0
    projector_output_dim: int = 0
    vision_output_dim: int = 0
    projector_bias: bool = False

    KINDS = ("qwen3_vl", "qwen2_5_vl", "llama4")

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise PlanInputError(f"vision tower {self.kind!r} is not modelled; "
                                 f"valid: {', '.join(self.KINDS)}")


# ---------------------------------------------------------------------------------------------
# Layer lists


def run_lengths(layers: Iterable[LayerSpec]) -> list[tuple[LayerSpec, int]]:
    """Consecutive equal layers collapsed: ``[(layer, count), ...]`` in model order."""
    runs: list[tuple[LayerSpec, int]] = []
    for layer in layers:
        if runs and runs[-1][0] == layer:
            runs[-1] = (layer, runs[-1][1] + 1)
        else:
            runs.append((layer, 1))
    return runs


def attended_layer(layer: LayerSpec, seq_len: int) -> LayerSpec:
    """``layer`` as sequences of at most ``seq_len`` tokens run it: a sliding window or a chunk
    of at least ``seq_len`` tokens masks nothing, so the layer is full attention for every cost.
    vLLM agrees: ``SlidingWindowManager.remove_skipped_blocks`` frees the blocks before token
    ``num_computed_tokens - sliding_window + 1`` and ``ChunkedLocalAttentionManager`` those
    before the current chunk (``vllm/v1/core/single_type_kv_cache_manager.py``), none of a
    sequence within its window, which keeps a page per ``block_size`` tokens as full attention
    does; the attention kernel's window masks no key."""
    if layer.mixer.is_windowed and layer.window >= seq_len:
        return LayerSpec(MixerKind.FULL, layer.mlp)
    return layer


def mixer_counts(layers: Iterable[LayerSpec]) -> dict[str, int]:
    """Layers per mixer kind, e.g. ``{"linear_attention": 36, "full_attention": 12}``."""
    return dict(Counter(layer.mixer.value for layer in layers))


def mlp_counts(layers: Iterable[LayerSpec]) -> dict[str, int]:
    return dict(Counter(layer.mlp.value for layer in layers))


def layer_summary(layers: Iterable[LayerSpec]) -> str:
    """``36 linear_attention + 12 full_attention; 48 moe``: the kinds on one line."""
    layers = tuple(layers)
    mixers = Counter(layer.mixer.value + (f"({layer.window})" if layer.window else "")
                     for layer in layers if layer.mixer is not MixerKind.NONE)
    mlps = Counter(layer.mlp.value for layer in layers if layer.mlp is not MlpKind.NONE)
    return (" + ".join(f"{n} {kind}" for kind, n in mixers.items()) + "; "
            + " + ".join(f"{n} {kind}" for kind, n in mlps.items()))
