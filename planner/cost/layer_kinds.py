"""Per-layer-kind physics: rollout cache memory, decode traffic, training activations and weight
sync tensors of each layer kind (:mod:`planner.catalog.layers`).

Pure functions of the model and a few integers; sequence lengths and TP degrees may be numpy
arrays (one value per candidate), so they vectorise over a search space.

Rollout memory follows vLLM's hybrid KV-cache allocator (vLLM 0.24, the version verl 0.9.1's
``vllm`` extra pins), which sizes every layer kind by its ``KVCacheSpec``
(``vllm/v1/kv_cache_interface.py``):

* full attention (``FullAttentionSpec``): a page of ``block_size`` tokens holds
  ``block_size * kv_heads * (head_size + head_size_v) * dtype`` bytes and a sequence needs
  ``cdiv(len, block_size)`` pages; MLA (``MLAAttentionSpec``) one latent of
  ``kv_lora_rank + qk_rope_head_dim`` per token, replicated on every TP rank;
* sliding window (``SlidingWindowSpec``): only the last ``window - 1`` tokens plus the new one,
  ``cdiv(window, block_size) + 1`` pages (the ``+1``: the window need not start on a page);
  chunked local attention (``ChunkedLocalAttentionSpec``): the current chunk, likewise;
* Gated DeltaNet and Mamba-2 (``MambaSpec``): one page of fixed size holding the conv state
  (``(conv_kernel - 1) x conv_dim / tp`` at the conv dtype) and the recurrent/SSM state
  (``heads / tp x d_k x d_v``, Mamba ``heads / tp x head_dim x d_state``, at the SSM cache
  dtype, ``vllm/model_executor/layers/mamba/mamba_utils.py``); with prefix caching on (verl's
  default ``enable_prefix_caching: true``) vLLM's ``mamba_cache_mode="align"`` keeps two pages
  per sequence (``MambaSpec.max_memory_usage_bytes``: ``2 + num_speculative_blocks``), else one;
  speculative decoding adds ``num_speculative_blocks = num_speculative_tokens`` pages.

The allocator then unifies the page size (``vllm/platforms/interface.py``,
``_align_hybrid_block_size``): the attention block grows to ``align * cdiv(mamba_page,
align * attention_page_per_token)`` tokens (``align`` = 16, the FlashAttention kernel's block
multiple and vLLM's default ``block_size``) and the Mamba page is padded to the attention page;
layers of each kind are cut into groups of ``group_size`` layers (the fewest layers of any kind,
or the most when no kind has 1.5x the fewest), padding the last group of a kind
(``vllm/v1/core/kv_cache_utils.py::_get_kv_cache_groups_uniform_page_size``).  One block id
spans ``group_size`` tensors, so a block costs ``page * group_size`` bytes and a sequence needs
its pages in every group.  With the hybrid allocator off, sliding and chunked layers are
allocated as full attention (``FullAttentionSpec``'s docstring).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.catalog.layers import LayerSpec, MixerKind, MlpKind
from planner.catalog.models import ModelSpec
from planner.errors import PlanInputError

# Bytes per element of the cache and state dtypes vLLM accepts (``kv_cache_dtype``,
# ``mamba_ssm_cache_dtype``; "auto" is resolved by the caller to the model dtype).
DTYPE_BYTES = {"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2, "float32": 4,
               "fp32": 4, "float": 4, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
VLLM_BLOCK_SIZE = 16  # CacheConfig.block_size default; FlashAttention's kernel block multiple
HYBRID_GROUP_SLACK = 1.5  # _get_kv_cache_groups_uniform_page_size: max < 1.5 * min -> max
ALIGN_STATE_PAGES = 2  # mamba_cache_mode="align" (prefix caching): MambaSpec keeps 2 pages
FLA_CHUNK = 64  # Gated DeltaNet chunk length in FLA's chunk_gated_delta_rule (the WY matrix A)
ACTIVATION_BYTES = 2  # bf16 activations
FP32_BYTES = 4


def dtype_bytes(dtype: str, default: str = "bfloat16") -> int:
    """Bytes per element of a cache dtype name; empty or "auto" means ``default``."""
    name = (dtype or default).lower()
    if name == "auto":
        name = default
    if name not in DTYPE_BYTES:
        raise PlanInputError(f"cache dtype {dtype!r} is not known; valid: "
                             f"{', '.join(sorted(DTYPE_BYTES))}")
    return DTYPE_BYTES[name]


def _i(value) -> np.ndarray:
    return np.asarray(value, dtype=np.int64)


def _cdiv(a, b):
    return -(-np.asarray(a) // np.asarray(b))


# ---------------------------------------------------------------------------------------------
# Per-layer cache and state sizes (one TP rank)


def kv_bytes_per_token_layer(model: ModelSpec, kind: MixerKind, tp=1,
                             kv_dtype: str = "bfloat16") -> np.ndarray:
    """K/V bytes one token takes in one attention layer on one TP rank: GQA splits KV heads over
    TP and replicates them when TP exceeds them; MLA caches one latent on every rank."""
    if not kind.is_attention:
        return np.zeros_like(_i(tp))
    element = dtype_bytes(kv_dtype)
    if kind is MixerKind.MLA:
        return np.zeros_like(_i(tp)) + element * (model.kv_lora_rank + model.qk_rope_head_dim)
    heads = np.maximum(model.num_query_groups // _i(tp), 1)
    return heads * 2 * model.head_dim * element


def recurrent_state_bytes_layer(model: ModelSpec, kind: MixerKind, tp=1,
                                model_dtype: str = "bfloat16",
                                speculative_tokens: int = 0) -> np.ndarray:
    """Conv + recurrent (SSM) state bytes of one Gated DeltaNet / Mamba-2 layer for one sequence
    on one TP rank (vLLM ``MambaStateShapeCalculator``: the conv state keeps
    ``conv_kernel - 1 + speculative_tokens`` columns at the model dtype)."""
    tp = _i(tp)
    conv_bytes = dtype_bytes(model_dtype)
    if kind is MixerKind.LINEAR:
        g = model.linear_attention
        conv = (g.conv_kernel - 1 + speculative_tokens) * (g.conv_dim // tp) * conv_bytes
        state = (g.num_value_heads // tp) * g.key_head_dim * g.value_head_dim \
            * dtype_bytes(g.state_dtype, model_dtype)
        return conv + state
    if kind is MixerKind.MAMBA:
        m = model.mamba
        # vLLM replicates a single group on every rank (extra_groups_for_head_shards)
        groups = np.where(m.n_groups % tp == 0, m.n_groups // tp, 1)
        conv_dim = m.inner_size // tp + 2 * groups * m.state_size
        conv = (m.conv_kernel - 1 + speculative_tokens) * conv_dim * conv_bytes
        state = (m.num_heads // tp) * m.head_dim * m.state_size \
            * dtype_bytes(m.ssm_state_dtype, model_dtype)
        return conv + state
    return np.zeros_like(tp)


# ---------------------------------------------------------------------------------------------
# vLLM's hybrid allocator


def _cache_kind(layer: LayerSpec, hybrid_allocator: bool) -> tuple[MixerKind, int] | None:
    """The KV-cache spec a layer gets: (kind, window); None for a layer without cache."""
    if layer.mixer is MixerKind.NONE:
        return None
    if layer.mixer.is_windowed and not hybrid_allocator:
        return (MixerKind.FULL, 0)
    return (layer.mixer, layer.window)


@dataclass(frozen=True)
class KvCacheLayout:
    """How vLLM lays out one rank's cache for a model (scalars: one TP degree)."""

    block_tokens: int  # tokens per attention page after hybrid alignment
    page_bytes: int  # bytes of one page of one layer (equal for every layer kind)
    group_size: int  # layers sharing one block id (tensors per block)
    groups: tuple[tuple[MixerKind, int, int], ...]  # (kind, window, number of groups)
    state_pages: int  # pages a recurrent group holds per sequence

    @property
    def block_bytes(self) -> int:
        """Bytes one block id costs across the ``group_size`` tensors."""
        return self.page_bytes * self.group_size

    def blocks_per_sequence(self, seq_len) -> np.ndarray:
        """Pages a sequence of ``seq_len`` tokens (prompt + response so far) holds per group,
        summed over groups."""
        s = _i(seq_len)
        b = self.block_tokens
        total = np.zeros_like(s)
        for kind, window, count in self.groups:
            if kind.kv_grows:
                pages = _cdiv(s, b)
            elif kind.is_windowed:
                pages = np.minimum(_cdiv(s, b), _cdiv(window, b) + 1)
            else:
                pages = np.full_like(s, self.state_pages)
            total = total + count * pages
        return total

    def bytes_per_sequence(self, seq_len) -> np.ndarray:
        return self.blocks_per_sequence(seq_len) * self.block_bytes

    @property
    def growing_bytes_per_token(self) -> float:
        """Bytes each token adds to a sequence's cache: the groups whose K/V grows."""
        growing = sum(count for kind, _, count in self.groups if kind.kv_grows)
        return growing * self.block_bytes / self.block_tokens

    def fixed_bytes_per_sequence(self, seq_len) -> np.ndarray:
        """Bytes of a sequence of ``seq_len`` tokens outside its growing K/V: the window-capped
        pages and the recurrent/SSM state pages."""
        s = _i(seq_len)
        b = self.block_tokens
        total = np.zeros_like(s)
        for kind, window, count in self.groups:
            if kind.is_windowed:
                total = total + count * np.minimum(_cdiv(s, b), _cdiv(window, b) + 1)
            elif kind.is_recurrent:
                total = total + count * self.state_pages
        return total * self.block_bytes

    def concurrent_sequences(self, pool_bytes, seq_len) -> np.ndarray:
        """Sequences of ``seq_len`` tokens a pool of ``pool_bytes`` holds at once."""
        blocks = np.floor_divide(_i(pool_bytes), self.block_bytes)
        return blocks // np.maximum(self.blocks_per_sequence(seq_len), 1)


@dataclass(frozen=True)
class EngineCache:
    """How one rank of a vLLM rollout engine keeps its cache: tensor parallel ``tp``, the cache
    and model dtypes, the page size in tokens (``block_size``), prefix caching (verl's default
    on), speculative tokens and the hybrid allocator (vLLM's default on)."""

    tp: int = 1
    kv_dtype: str = "bfloat16"
    model_dtype: str = "bfloat16"
    block_size: int = VLLM_BLOCK_SIZE
    prefix_caching: bool = True
    speculative_tokens: int = 0
    hybrid_allocator: bool = True


VLLM_DEFAULTS = EngineCache()  # verl's rollout defaults: TP 1, BF16 cache, prefix caching on


def kv_cache_layout(model: ModelSpec, cache: EngineCache = EngineCache()) -> KvCacheLayout:
    """vLLM's cache layout for one rank of a rollout engine kept as ``cache`` says."""
    tp, kv_dtype, block_size = cache.tp, cache.kv_dtype, cache.block_size
    speculative_tokens, hybrid_allocator = cache.speculative_tokens, cache.hybrid_allocator
    kinds = [k for k in (_cache_kind(layer, hybrid_allocator) for layer in model.layers) if k]
    if not kinds:
        raise PlanInputError(f"model {model.name}: no layer keeps a cache")
    counts: dict[tuple[MixerKind, int], int] = {}
    for kind in kinds:
        counts[kind] = counts.get(kind, 0) + 1
    attention = [k for k in counts if k[0].is_attention]
    recurrent = [k for k in counts if k[0].is_recurrent]
    token_bytes = {int(kv_bytes_per_token_layer(model, k[0], tp, kv_dtype)) for k in attention}
    if len(token_bytes) > 1:
        raise PlanInputError(f"model {model.name}: attention layers with different page sizes "
                             f"({sorted(token_bytes)} bytes per token) are not modelled")
    state_page = max((int(recurrent_state_bytes_layer(model, k[0], tp, cache.model_dtype,
                                                      speculative_tokens))
                      for k in recurrent), default=0)
    block = block_size
    if attention:
        per_token = token_bytes.pop()
        if state_page:  # _align_hybrid_block_size: attention page >= state page
            align = max(VLLM_BLOCK_SIZE, block_size)
            block = max(block_size, align * -(-state_page // (align * per_token)))
        page = block * per_token
    else:  # attention-free (pure Mamba) models: one state page per layer
        page = state_page
    least, most = min(counts.values()), max(counts.values())
    group_size = most if most < HYBRID_GROUP_SLACK * least else least
    if len(counts) == 1:
        group_size = least  # one kind: every layer in one group (uniform type)
    groups = tuple((kind, window, -(-n // group_size)) for (kind, window), n in counts.items())
    # MambaSpec(num_speculative_blocks=num_speculative_tokens): one more state page per
    # drafted token, whatever the cache mode (vllm/model_executor/layers/mamba/abstract.py)
    state_pages = (ALIGN_STATE_PAGES if cache.prefix_caching else 1) + speculative_tokens
    return KvCacheLayout(block, page, group_size, groups, state_pages)


def kv_cache_bytes_per_sequence(model: ModelSpec, seq_len,
                                cache: EngineCache = EngineCache()) -> np.ndarray:
    """Everything vLLM keeps for one sequence of ``seq_len`` tokens on one rank: growing K/V,
    window-capped pages and fixed states, page-rounded as the allocator rounds them."""
    return kv_cache_layout(model, cache).bytes_per_sequence(seq_len)


def kv_cache_bytes_per_token(model: ModelSpec, tp=1, kv_dtype: str = "bfloat16") -> np.ndarray:
    """Bytes per token of the layers whose cache grows with every token (full attention, MLA),
    on one rank, without page rounding."""
    total = np.zeros_like(_i(tp))
    for layer in model.layers:
        if layer.mixer.kv_grows:
            total = total + kv_bytes_per_token_layer(model, layer.mixer, tp, kv_dtype)
    return total


def concurrent_sequences(model: ModelSpec, pool_bytes, seq_len,
                         cache: EngineCache = EngineCache()) -> np.ndarray:
    """Sequences of ``seq_len`` tokens that fit at once in a cache pool of ``pool_bytes`` on one
    rank (vLLM's ``num_gpu_blocks`` over the blocks one sequence needs)."""
    return kv_cache_layout(model, cache).concurrent_sequences(pool_bytes, seq_len)


# ---------------------------------------------------------------------------------------------
# Decode traffic


def decode_bytes_per_step(model: ModelSpec, context, tp=1, kv_dtype: str = "bfloat16",
                          model_dtype: str = "bfloat16") -> dict[str, np.ndarray]:
    """Cache bytes one decode step moves for one sequence with ``context`` tokens before it, on
    one rank, per mixer kind: an attention layer reads the K/V of the tokens it attends to
    (all of them, the last ``window``, or its chunk so far) and writes one token's; a Gated
    DeltaNet / Mamba layer reads and writes its fixed state, whatever the context."""
    ctx = _i(context)
    out: dict[str, np.ndarray] = {}
    for layer in model.layers:
        kind = layer.mixer
        if kind is MixerKind.NONE:
            continue
        if kind.is_attention:
            per_token = kv_bytes_per_token_layer(model, kind, tp, kv_dtype)
            if kind is MixerKind.SLIDING:
                seen = np.minimum(ctx, layer.window)
            elif kind is MixerKind.CHUNKED:
                seen = np.mod(ctx, layer.window)  # tokens of the current chunk before this one
            else:
                seen = ctx
            moved = (seen + 1) * per_token
        else:
            moved = 2 * recurrent_state_bytes_layer(model, kind, tp, model_dtype)
        out[kind.value] = out.get(kind.value, 0) + moved
    return out


# ---------------------------------------------------------------------------------------------
# Training activations


def mixer_activation_bytes_per_token(model: ModelSpec, kind: MixerKind, tp=1) -> np.ndarray:
    """Bytes the token mixer of one layer keeps for backward per token on one TP rank (bf16;
    the layer norms, residual stream and feed-forward block are the caller's, as in
    ``planner.cost.memory.activation_bytes_per_token``).

    * Softmax attention (Korthikanti et al. 2022, Table 2, with flash attention so no score
      matrix is kept): Q, K, V and the attention output, ``2 (h_q + h_k + h_v + h_o)``; a gated
      attention (Qwen3-Next) also keeps the gate and the gated product, ``2 (h_q + h_o)``.
      Sliding and chunked windows keep the same tensors (the window only skips work).  MLA
      keeps its latents, replicated over TP, and the up-projected Q, K, V.
    * Gated DeltaNet (megatron-core ``GatedDeltaNet`` over FLA's ``chunk_gated_delta_rule``,
      whose ``ChunkGatedDeltaRuleFunction.forward`` saves q, k, v, g, beta and the WY matrix
      ``A`` of ``64`` columns per value head, recomputing the chunk states in backward): the
      conv1d input (``conv_dim``), q, k, v, the output gate ``z``, the output before and after
      the gated RMSNorm (``2 v``), ``a``/``b`` and beta per value head and ``A`` in bf16; the
      decay ``g`` and the q/k L2-norm reciprocals in fp32.
    * Mamba-2 (megatron-core ``MambaMixer`` with ``use_mem_eff_path`` over mamba_ssm's
      ``mamba_split_conv1d_scan_combined``, which saves the in_proj output ``zxbcdt`` and
      ``out_x`` and recomputes the conv and the scan in backward): ``zxbcdt``
      (``2 d_inner + 2 G N + H``), ``out_x`` and out_proj's input (``d_inner`` each), and the
      gated norm's rstd per group in fp32."""
    tp = np.asarray(tp, dtype=np.float64)
    b = ACTIVATION_BYTES
    if kind is MixerKind.MLA:
        qk_head = model.qk_nope_head_dim + model.qk_rope_head_dim
        heads = model.num_attention_heads
        latents = b * (model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim)
        return latents + b * (2 * heads * qk_head + 2 * heads * model.v_head_dim) / tp
    if kind.is_attention:
        hq = ho = model.num_attention_heads * model.head_dim
        hk = model.num_query_groups * model.head_dim
        gate = (hq + ho) if model.attention_output_gate else 0
        return b * (hq + 2 * hk + ho + gate) / tp
    if kind is MixerKind.LINEAR:
        g = model.linear_attention
        per_value_head = FLA_CHUNK + 3  # A, a, b and beta
        bf16 = (g.conv_dim + 2 * g.key_dim + g.value_dim + 3 * g.value_dim
                + per_value_head * g.num_value_heads)
        fp32 = g.num_value_heads + 2 * g.num_key_heads
        return (b * bf16 + FP32_BYTES * fp32) / tp
    if kind is MixerKind.MAMBA:
        m = model.mamba
        zxbcdt = 2 * m.inner_size + 2 * m.n_groups * m.state_size + m.num_heads
        return (b * (zxbcdt + 2 * m.inner_size) + FP32_BYTES * m.n_groups) / tp
    return np.zeros_like(tp)


# ---------------------------------------------------------------------------------------------
# Weight sync


def layer_tensor_count(model: ModelSpec, layer: LayerSpec) -> int:
    """Tensors of one layer in a Hugging Face checkpoint (what verl hands vLLM's
    ``load_weights`` one by one): mixer, feed-forward block and norms."""
    mixer = 0
    if layer.mixer is MixerKind.MLA:
        # q_a_proj, q_a_layernorm, q_b_proj (or q_proj); kv_a_proj_with_mqa, kv_a_layernorm,
        # kv_b_proj; o_proj
        mixer = (3 if model.q_lora_rank else 1) + 3 + 1
    elif layer.mixer.is_attention:
        mixer = (4 + (3 if model.qkv_bias else 0) + (1 if model.attention_o_bias else 0)
                 + (2 if model.qk_norm or model.qk_norm_full_width else 0)
                 + (1 if model.attention_sinks else 0))
    elif layer.mixer is MixerKind.LINEAR:
        # in_proj_qkvz, in_proj_ba (Qwen3.5: qkv, z, b, a), conv1d, dt_bias, A_log, norm,
        # out_proj
        mixer = 9 if model.model_type.startswith("qwen3_5") else 7
    elif layer.mixer is MixerKind.MAMBA:
        # in_proj, conv1d (+ bias), dt_bias, A_log, D, norm, out_proj (+ biases)
        mixer = 7 + (1 if model.mamba.conv_bias else 0) + (2 if model.mamba.proj_bias else 0)
    mlp_matrices = 3 if model.gated_mlp else 2
    if layer.mlp is MlpKind.DENSE:
        mlp = mlp_matrices
    elif layer.mlp is MlpKind.MOE:
        # gpt-oss and the fused-expert checkpoints still arrive per expert through the bridge
        experts = model.num_experts * (mlp_matrices + (2 if model.expert_bias else 0))
        shared = (mlp_matrices if model.shared_expert_ffn_hidden_size else 0) \
            + (1 if model.shared_expert_gate else 0)
        latent = 2 if model.moe_latent_size else 0
        mlp = 1 + (1 if model.router_bias else 0) + experts + shared + latent
    else:
        mlp = 0
    return mixer + mlp + layer.norms


def weight_sync_tensors(model: ModelSpec) -> dict[str, int]:
    """Checkpoint tensors per layer kind (``"<mixer>+<mlp>"`` labels) and ``"other"``
    (embedding, final norm, output layer unless tied)."""
    out: dict[str, int] = {}
    for layer in model.layers:
        key = f"{layer.mixer.value}+{layer.mlp.value}"
        out[key] = out.get(key, 0) + layer_tensor_count(model, layer)
    out["other"] = 2 + (0 if model.tied_embeddings else 1)
    return out
