"""Per-GPU memory of every GRPO phase, vectorised over layouts.

verl colocates the actor (Megatron), the reference model and the rollout engine (vLLM/SGLang) on
the same GPUs and switches between them each step.  For every layout this module returns the
peak of each phase on the worst-loaded rank — the first pipeline stage (most in-flight
activations, the embedding) or the last (output layer and the RL log-prob buffers) — with a
breakdown, in bytes.

Sources and scope
-----------------
* Weights, gradients, optimizer: Megatron-LM ``megatron/training/theoretical_memory_usage.py``
  (``compute_weight_and_optimizer_memory``): 18 bytes/param (bf16 weight 2, fp32 main grad 4,
  fp32 master weight + Adam m + v 12), or ``6 + 12/DP`` with the distributed optimizer; most
  loaded shard = (block/PP + embedding)/TP.  Here the layer split follows the actual stage
  (uneven first/last stages), routed-expert weights are divided by EP*ETP and their optimizer
  state by the expert data-parallel size ``world/(ETP*EP*PP)`` (megatron-core's expert grid), and
  the dense optimizer state by DP*CP (megatron-core shards it over the data-parallel group
  *with* context parallelism).  With CP = 1, EP = 1 this is exactly the Megatron formula.
* Activations: Korthikanti et al. 2022 (arXiv 2205.05198), Table 2 and §4: per layer
  ``s*b*h*(34/t)`` with sequence parallelism and selective recompute, i.e. Megatron's
  ``s*b*h*(18 + 4*ffn/h)/t``.  This model writes the same sum term by term so it holds for GQA,
  SwiGLU and MLA; with multi-head attention, a GeLU MLP of 4h and dropout on it reduces to the
  paper's 34 (checked in the tests).  It assumes flash attention (no s^2 score matrix; the
  paper's ``5as/h`` term never exists), and no dropout (today's LLMs set it to 0).
  Pipeline in-flight micro-batches follow megatron-core's 1F1B/interleaved warm-up
  (``schedules.py``): rank r holds ``min(pp - r, m)`` micro-batches, or with VPP
  ``min(2(pp-r-1) + (vpp-1)pp + 1, m*vpp)`` model chunks of ``layers/vpp`` layers; for rank 0
  this is Megatron's ``(1 + (pp-1)/(pp*vpp))`` interleaving penalty.
* Beyond both sources: MoE activations (router logits, dispatched tokens through the experts,
  balanced routing), context parallelism (sequence split over CP), full recompute (layer inputs
  plus one layer's working set), parameter/optimizer offload between phases as verl does it, the
  RL log-prob buffers of the last stage (logits upcast to fp32 for log-softmax and entropy, and
  their gradient), the reference model, and the rollout engine's memory budget and KV cache.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial, reduce

import numpy as np

from planner.catalog.hardware import ClusterSpec
from planner.catalog.layers import MixerKind, MlpKind
from planner.catalog.models import ModelSpec
from planner.catalog.params import layer_params
from planner.catalog.workload import RolloutEngine
from planner.cost.columns import memory_column, part_column, working_set_column
from planner.cost.deferred import DeferredColumns
from planner.cost.flops import kv_grows_only
from planner.cost.knob_sums import (
    PHASE_SUMS,
    CombinationTables,
    KnobPatterns,
    SumConstants,
    stage_states,
)
from planner.cost.layer_kinds import (
    VLLM_BLOCK_SIZE,
    EngineCache,
    decode_bytes_per_step,
    kv_cache_bytes_per_token,
    kv_cache_layout,
    mixer_activation_bytes_per_token,
)
from planner.cost.request import PlanRequest
from planner.cost.speculative import (
    drafter_kv_bytes_per_token,
    drafter_weight_bytes,
    lookahead_tokens,
    mtp_is_moe,
    mtp_stage_params,
    trains_mtp,
)
from planner.phases import PHASES, TRAINING_PHASES
from planner.search.batches import log_prob_batches, update_batches
from planner.search.layout import (
    DEFAULT_SELECTIVE_MODULES,
    LAYOUT_FIELDS,
    RECOMPUTE_MODULES,
    Columns,
    RowsAt,
    distinct,
    distinct_pair,
    sorted_distinct,
    unique_rows,
)
from planner.search.pipeline import layout_ranks, pipeline_split
from planner.units import GIB, MIB

# --- bytes per element ----------------------------------------------------------------------
WEIGHT_BYTES = 2  # bf16 parameters (Megatron mixed precision)
MAIN_GRAD_BYTES = 4  # fp32 main gradients (Megatron formula's 6 = 2 + 4; verl's default)
MASTER_WEIGHT_BYTES = 4  # fp32 master copy the distributed optimizer keeps
OPTIMIZER_BYTES = MASTER_WEIGHT_BYTES + 2 * 4  # + Adam exp_avg + exp_avg_sq in fp32
# Megatron's CPU optimizer (megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py) keeps,
# per offloaded parameter on the host: an fp32 copy of the parameter and a pinned fp32 copy of
# its gradient, and the Adam moments.
CPU_OPTIMIZER_COPY_BYTES = 4 + 4
ACTIVATION_BYTES = 2  # bf16 activations
ROUTER_LOGIT_BYTES = 4  # fp32 router (moe_router_dtype=fp32; megatron-core's default is bf16)
TOKEN_ID_BYTES = 8  # int64 input ids (Megatron formula's "8 * s * b")
# verl's log-probs (verl/utils/megatron/tensor_parallel.py -> megatron-core
# tensor_parallel/cross_entropy.py vocab_parallel_cross_entropy): the bf16 logits (2) are copied
# to fp32 (4), exponentiated in place and kept as the softmax for backward, whose gradient is
# computed in place -- 6 bytes per logit at the peak, in training as in a forward; the actor's
# old-log-prob pass also computes the entropy (+4, an fp32 softmax, or a chunk of it with
# entropy_from_logits_with_chunking).
LOGITS_BYTES = 2 + 4
ENTROPY_BYTES = 4
# verl's fused kernel (use_fused_kernels; verl/utils/kernel/kernels.py efficient_entropy_forward)
# never materialises the logits: per token it keeps fp32 log-prob, entropy, max, accumulators
# (5 x 4 B) and three fp32 partials per 1,024-entry vocabulary split.
FUSED_BYTES_PER_TOKEN = 5 * 4
FUSED_BYTES_PER_SPLIT = 3 * 4
FUSED_VOCAB_PER_SPLIT = 1024

# --- fixed overheads ----------------------------------------------------------------------------
# CUDA context + cuBLAS/cuDNN workspaces outside PyTorch's pool: ~500-600 MiB on Hopper per
# process (torch.cuda.mem_get_info before/after the first cuBLAS call).
CUDA_CONTEXT_BYTES = 600 * MIB
# NCCL channel buffers: NCCL_BUFFSIZE 4 MiB x 2 directions x channels (up to 32) per
# communicator peer set; ~1 GiB over the TP/PP/DP/CP/EP communicators of a Megatron rank.
NCCL_BUFFER_BYTES = 1 * GIB
# PyTorch caching-allocator fragmentation on transient tensors: PyTorch's memory docs and
# Megatron-LM's theoretical-memory comparisons put reserved/allocated at ~1.05-1.15.
FRAGMENTATION_FRACTION = 0.10
# verl's bucketed actor->rollout weight transfer (rollout.checkpoint_engine
# update_weights_bucket_megabytes default 512).
WEIGHT_SYNC_BUCKET_BYTES = 512 * MIB
# vLLM's CUDA-graph pool: vLLM logs "Graph capturing finished ... took 0.4-1.2 GiB" for
# dense models at the default capture sizes (up to 512); counted inside its budget.
CUDA_GRAPH_POOL_BYTES = 1 * GIB
# vLLM's own workspace beside the profiled activations (cuBLAS, torch.compile, attention
# metadata): a few hundred MiB in its memory-profiling log.
ROLLOUT_WORKSPACE_BYTES = 512 * MIB
# gpu_memory_utilization the planner picks: enough KV cache for the replica's whole batch,
# rounded up to this step, between these bounds.
UTILIZATION_STEP = 0.05
UTILIZATION_MIN = 0.30
UTILIZATION_MAX = 0.90
# Left free beside the rollout budget for what neither PyTorch's pool nor vLLM's budget counts
# (vLLM's NCCL communicators, the Ray worker's own context).
ROLLOUT_HEADROOM_FRACTION = 0.05
# Host memory of one verl worker process beside what it offloads: Python, PyTorch and the CUDA
# runtime's host allocations, the Ray actor, pinned staging buffers (RSS of a Megatron worker
# before any offload, ~10 GiB); and per node Ray's object store and the data batches.
HOST_WORKER_BYTES = 10 * GIB
HOST_NODE_BYTES = 64 * GIB


def _f(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


# A workload without a rollout runs no engine, yet the columns of every phase are filled (the
# outputs' schema holds each phase of PHASES): the phases it does not run are sized with this
# nominal engine -- verl's defaults, one sequence at a time -- and never set its peak (only the
# phases a step runs do, estimate_memory).
NOMINAL_ENGINE = RolloutEngine(max_num_seqs=1)


def engine_of(workload) -> RolloutEngine:
    """The rollout engine the memory model sizes: the workload's, the nominal one of a workload
    without a rollout, verl's defaults for none (a bare formula check)."""
    if workload is None:
        return RolloutEngine()
    return workload.engine or NOMINAL_ENGINE


# Pipeline ranks the model evaluates: the ends hold the embedding or the output layer and the
# log-prob buffers; of the middle ranks, the early one holds the most in-flight activations
# (rank 1 of an even or uneven split; with a layout string the earliest middle rank with the
# most layers) and the late one the most MoE layers (rank pp-2, past any leading dense layers;
# with a layout string the latest middle rank with the most layers).  The worst rank of a
# pipeline is always one of these four.
STAGES = ("first", "last", "early middle", "late middle")


@dataclass(frozen=True)
class RankLayers:
    """What one pipeline rank holds, per layout: layer counts and which ends it carries."""

    dense: np.ndarray
    moe: np.ndarray
    rank: np.ndarray  # pipeline rank, for the in-flight micro-batch count
    embedding: np.ndarray  # bool: holds the input embedding
    head: np.ndarray  # bool: holds the output layer, final norm and the loss


_FIELDS = ("dense", "moe", "rank", "embedding", "head")


def _split_ranks(model: ModelSpec, cols: Columns) -> list[RankLayers]:
    """The four ranks of an even/uneven/accounted split (ranks 1 and pp-2 repeat the ends
    when PP <= 2)."""
    pp = cols["pp"]
    first, middle, last, _ = pipeline_split(
        model.num_layers, pp, cols.get("first_stage_layers"), cols.get("last_stage_layers"),
        cols.get("account_embedding"), cols.get("account_loss"))
    dense_total = model.num_layers - model.num_moe_layers
    middle_exists = pp > 2

    def build(start, count, rank, embedding, head):
        dense = np.clip(dense_total - start, 0, count)
        return RankLayers(dense, count - dense, rank, embedding, head)

    single = pp == 1
    ranks = [build(0, first, np.zeros_like(pp), np.ones_like(pp, dtype=bool), single),
             build(model.num_layers - last, last, pp - 1, single, np.ones_like(pp, dtype=bool))]
    second = build(first, middle, np.ones_like(pp), np.zeros_like(pp, dtype=bool),
                   np.zeros_like(pp, dtype=bool))
    before_last = build(model.num_layers - last - middle, middle, pp - 2,
                        np.zeros_like(pp, dtype=bool), np.zeros_like(pp, dtype=bool))
    for middle_rank, end in ((second, ranks[0]), (before_last, ranks[1])):
        ranks.append(RankLayers(*(np.where(middle_exists, getattr(middle_rank, f), getattr(end, f))
                                  for f in _FIELDS)))
    return ranks


def _layout_string_ranks(model: ModelSpec, layout: str, pp: int) -> list[tuple]:
    """The four representative ranks of one layout string, as (dense, moe, rank, embedding,
    head) tuples: layers are numbered in the order of the string's stages."""
    per_rank = layout_ranks(layout, pp, model.num_layers)
    dense_total = model.num_layers - model.num_moe_layers
    vpp = len(per_rank[0])
    indices: list[list[int]] = [[] for _ in range(pp)]
    next_layer = 0
    for v in range(vpp):
        for rank in range(pp):
            count = per_rank[rank][v].count("t")
            indices[rank] += list(range(next_layer, next_layer + count))
            next_layer += count

    def describe(rank: int) -> tuple:
        dense = sum(index < dense_total for index in indices[rank])
        text = "".join(per_rank[rank])
        return (dense, len(indices[rank]) - dense, rank, "E" in text, "L" in text)

    middle = list(range(1, pp - 1)) or [0, pp - 1]
    early = max(middle, key=lambda rank: (len(indices[rank]), -rank))
    late = max(middle, key=lambda rank: (describe(rank)[1], len(indices[rank]), rank))
    return [describe(0), describe(pp - 1), describe(early), describe(late)]


def rank_layers(model: ModelSpec, cols: Columns) -> list[RankLayers]:
    """The four representative ranks of :data:`STAGES` for every layout."""
    ranks = _split_ranks(model, cols)
    layouts = cols.get("pipeline_layout")
    if layouts is None:
        return ranks
    strings = np.flatnonzero(np.asarray(layouts) != "")
    if not len(strings):
        return ranks
    arrays = [{f: np.array(getattr(r, f)).copy() for f in _FIELDS} for r in ranks]
    for index in strings:
        for slot, values in enumerate(_layout_string_ranks(model, str(layouts[index]),
                                                           int(cols["pp"][index]))):
            for name, value in zip(_FIELDS, values):
                arrays[slot][name][index] = value
    return [RankLayers(**values) for values in arrays]


def layer_group_params(model: ModelSpec) -> tuple[tuple[float, float], tuple[float, float]]:
    """(split by TP, held in full) parameters of a mean non-MoE layer and of a mean MoE layer
    without its routed experts, the means over the model's layers of that feed-forward kind
    (:func:`planner.catalog.params.layer_params` per layer: its mixer -- attention, Gated
    DeltaNet, Mamba-2 or none -- its feed-forward block and norms).  A pipeline stage holds
    ``count x mean``: exact in total, and per stage where the stage holds the model's mix of
    layer kinds.  Every TP rank holds the norms, the router and the attention's replicated
    part in full.  For a transformer these are its one layer's counts."""
    p = model.params
    if not model.is_hybrid:
        return ((p.dense_layer - p.dense_layer_replicated, p.dense_layer_replicated),
                (p.moe_layer_non_expert - p.moe_layer_replicated, p.moe_layer_replicated))
    h = model.hidden_size
    groups = {True: [0.0, 0.0, 0], False: [0.0, 0.0, 0]}  # is MoE -> split, full, layers
    for layer in model.layers:
        moe = layer.mlp is MlpKind.MOE
        total = layer_params(model, layer) - (p.experts_per_layer if moe else 0)
        full = (layer.norms * h + (p.router_per_layer if moe else 0)
                + (p.attention_replicated_per_layer if layer.mixer.is_attention else 0))
        group = groups[moe]
        group[0] += total - full
        group[1] += full
        group[2] += 1

    def mean(group) -> tuple[float, float]:
        return (group[0] / max(group[2], 1), group[1] / max(group[2], 1))

    return mean(groups[False]), mean(groups[True])


def actor_params_per_gpu(model: ModelSpec, cols: Columns, ranks: list[RankLayers] | None = None):
    """(non-expert, expert) parameters held by a rank of each of :data:`STAGES`.

    Non-expert parameters are split by TP except norms, the router and MLA's down-projections,
    which every TP rank holds in full; routed experts are split by EP*ETP.  The last stage holds
    the output layer, or with tied embeddings a copy of the embedding (Megatron keeps word
    embeddings on both ends and all-reduces their gradients).
    """
    p = model.params
    tp, pp = _f(cols["tp"]), cols["pp"]
    expert_shards = _f(cols["ep"] * cols["etp"])
    head_params = np.where(pp > 1, p.output_layer or p.embedding, p.output_layer)
    (dense_split, dense_replicated), (moe_split, moe_replicated) = layer_group_params(model)
    out = []
    for r in ranks or rank_layers(model, cols):
        split = (r.dense * dense_split + r.moe * moe_split
                 + np.where(r.embedding, p.embedding, 0) + np.where(r.head, head_params, 0))
        replicated = (r.dense * dense_replicated + r.moe * moe_replicated
                      + np.where(r.head, p.final_norm, 0))
        out.append((split / tp + replicated, r.moe * p.experts_per_layer / expert_shards))
    return out


def optimizer_shards(cluster: ClusterSpec, cols: Columns):
    """(dense, expert) data-parallel shards of the distributed optimizer's state.

    megatron-core shards dense state over the data-parallel group *with* context parallelism,
    and expert state over the expert DP group world/(ETP*EP*PP) -- only when EP > 1; with
    EP = 1 experts are dense and follow DP*CP.  Without the distributed optimizer nothing is
    sharded."""
    dense = np.where(cols["distributed_optimizer"], cols["dp"] * cols["cp"], 1)
    expert_dp = np.where(cols["ep"] > 1,
                         cluster.num_gpus // (cols["etp"] * cols["ep"] * cols["pp"]),
                         cols["dp"] * cols["cp"])
    expert = np.where(cols["distributed_optimizer"], np.maximum(expert_dp, 1), 1)
    return _f(dense), _f(expert)


def optimizer_params_all(model: ModelSpec, cluster: ClusterSpec, cols: Columns,
                         ranks: list[RankLayers] | None = None) -> list[np.ndarray]:
    """Parameters whose optimizer state one GPU owns, on a rank of each of :data:`STAGES`."""
    dense, expert_shards = optimizer_shards(cluster, cols)
    return [non_expert / dense + expert / expert_shards
            for non_expert, expert in actor_params_per_gpu(model, cols, ranks)]


def optimizer_state_bytes(workload=None) -> int:
    """Bytes of optimizer state per parameter: fp32 master + the two Adam moments (fp32, or
    bf16 with the precision-aware optimizer's exp_avg_dtype/exp_avg_sq_dtype)."""
    moments = getattr(workload, "adam_moment_bytes", 4)
    return MASTER_WEIGHT_BYTES + 2 * moments


def cpu_fraction(cols: Columns) -> np.ndarray:
    n = len(cols["tp"])
    return _f(cols.get("optimizer_cpu_fraction", np.zeros(n)))


def static_bytes_all(model: ModelSpec, cluster: ClusterSpec, cols: Columns,
                     ranks: list[RankLayers] | None = None, workload=None):
    """Weights, main grads and the optimizer state on the GPU, on a rank of each of
    :data:`STAGES`.  Grads are fp32 unless the job reduces them in bf16
    (``grad_reduce_in_fp32``); Megatron's CPU optimizer keeps ``optimizer_cpu_fraction`` of the
    state on the host instead."""
    grad_bytes = MAIN_GRAD_BYTES if getattr(workload, "grad_reduce_in_fp32", True) else 2
    state = optimizer_state_bytes(workload)
    on_gpu = 1 - cpu_fraction(cols)
    out = []
    all_ranks = ranks or rank_layers(model, cols)
    shards = optimizer_params_all(model, cluster, cols, all_ranks)
    for (non_expert, expert), owned in zip(actor_params_per_gpu(model, cols, all_ranks), shards):
        params = non_expert + expert
        out.append((WEIGHT_BYTES * params, grad_bytes * params, state * owned * on_gpu))
    return out


def _recompute_bits(cols: Columns, recompute) -> dict[str, np.ndarray]:
    """Which megatron-core ``recompute_modules`` a selective layout recomputes, per layout."""
    recompute = np.asarray(recompute)
    n = len(cols["tp"])
    mask = np.asarray(cols.get("recompute_modules", np.zeros(n, dtype=np.int64)))
    mask = np.where((recompute == 1) & (mask == 0), DEFAULT_SELECTIVE_MODULES, mask)
    mask = np.where(recompute == 1, mask, 0)
    return {name: (mask >> bit) & 1 > 0 for bit, name in enumerate(RECOMPUTE_MODULES)}


def activation_bytes_per_layer(model: ModelSpec, cols: Columns, tokens: np.ndarray,
                               moe: bool, recompute: np.ndarray | int = 0,
                               hidden_dropout: bool = False) -> np.ndarray:
    """Bytes one layer keeps for backward for ``tokens`` tokens (per CP rank) on one GPU
    (:func:`activation_bytes_per_token` times the tokens)."""
    n = len(cols["tp"])
    recompute = np.broadcast_to(np.asarray(recompute), (n,))
    # The per-token bytes depend on a few small integers only: compute them once per distinct
    # combination (one int64 key; each field below 2**13) and broadcast.
    fields = [np.asarray(cols["tp"], dtype=np.int64), np.asarray(cols["etp"], dtype=np.int64),
              np.asarray(cols["sequence_parallel"]).astype(np.int64),
              np.asarray(recompute, dtype=np.int64),
              np.asarray(cols.get("recompute_modules", np.zeros(n)), dtype=np.int64)]
    key = fields[0]
    for field in fields[1:]:
        key = key * 8192 + field
    first, inverse = distinct(key)
    # and once per model: a sizing sweep's plans ask for the same few combinations thousands
    # of times (each value is the same element-wise arithmetic on one row as on many)
    known = _per_token_memo(model, moe, hidden_dropout)
    keys = key[first].tolist()
    new = first[[i for i, value in enumerate(keys) if value not in known]]
    if len(new):
        few = {"tp": fields[0][new], "etp": fields[1][new],
               "sequence_parallel": fields[2][new].astype(bool),
               "recompute_modules": fields[4][new]}
        values = activation_bytes_per_token(model, few, moe, fields[3][new], hidden_dropout)
        known.update(zip(key[new].tolist(), np.asarray(values, dtype=np.float64).tolist()))
    per_token = np.array([known[value] for value in keys], dtype=np.float64)
    return _f(tokens) * per_token[inverse]


@lru_cache(maxsize=64)
def _per_token_memo(model: ModelSpec, moe: bool, hidden_dropout: bool) -> dict[int, float]:
    """:func:`activation_bytes_per_token` of one model by :func:`activation_bytes_per_layer`'s
    key of the fields it reads, filled as they are asked for."""
    return {}


def activation_bytes_per_token(model: ModelSpec, cols: Columns, moe: bool,
                               recompute: np.ndarray | int = 0,
                               hidden_dropout: bool = False) -> np.ndarray:
    """Bytes one layer keeps for backward per token (per CP rank) on one GPU.

    Korthikanti et al. 2022 §4.1, term by term (bf16 = 2 bytes per element):
    replicated over TP unless sequence parallel: LN1 input 2h, QKV input 2h, LN2 input 2h,
    MLP input 2h (+ dropout masks h each when dropout is on);
    split over TP: Q, K, V 2(hq+hk+hv), attention output 2*ho, MLP activation input
    2*ffn (x2 gated), second linear input 2*ffn.  MHA + 4h GeLU MLP + dropout: 34*s*b*h.
    ``recompute``: 0 none, 1 selective, 2 full (only the layer input is kept; the recomputed
    layer's working set is added by the caller).  Selective drops what megatron-core's
    ``recompute_modules`` recompute (``cols["recompute_modules"]``, default core_attn +
    layernorm + moe_act): layernorm -- the norms' outputs; moe_act -- the expert activation
    output; mla_up_proj -- MLA's up-projected Q, K, V (the latents stay); mlp -- a dense layer's
    MLP internals; moe -- the whole MoE block (router and experts); shared_experts -- the shared
    expert's internals; core_attn -- nothing with flash attention (no score matrix).
    """
    h = model.hidden_size
    tp = _f(cols["tp"])
    sp_shards = np.where(cols["sequence_parallel"].astype(bool) & (cols["tp"] > 1), tp, 1.0)
    recompute = np.asarray(recompute)
    bits = _recompute_bits(cols, recompute)
    if model.is_mla:
        qk_head = model.qk_nope_head_dim + model.qk_rope_head_dim
        hq = hk = model.num_attention_heads * qk_head
        hv = ho = model.num_attention_heads * model.v_head_dim
        # compressed q and kv latents are computed before the TP split
        latents = ACTIVATION_BYTES * (model.q_lora_rank + model.kv_lora_rank
                                      + model.qk_rope_head_dim)
        qkv = np.where(bits["mla_up_proj"], 0, ACTIVATION_BYTES * (hq + hk + hv))
    else:
        hq = ho = model.num_attention_heads * model.head_dim
        hk = hv = model.num_query_groups * model.head_dim
        latents = 0
        qkv = ACTIVATION_BYTES * (hq + hk + hv)
    gated = 2 if model.gated_mlp else 1
    dropout_masks = 2 * h if hidden_dropout else 0  # 1 byte per element, two masks
    ln_outputs = np.where(bits["layernorm"], 0, 2 * ACTIVATION_BYTES * h)  # QKV and MLP inputs
    replicated = 2 * ACTIVATION_BYTES * h + ln_outputs + dropout_masks  # LN inputs + LN outputs
    attention_split = qkv + ACTIVATION_BYTES * ho
    mixer = latents + attention_split / tp
    mlp_share = 1.0
    if model.is_hybrid:
        # the mean layer of this feed-forward kind: its mixers' own tensors by kind
        # (layer_kinds.mixer_activation_bytes_per_token), one norm per sub-block it has, the
        # feed-forward block where it has one (Nemotron-H's layers hold one sub-block each)
        layers = [layer for layer in model.layers if (layer.mlp is MlpKind.MOE) == moe]
        count = max(len(layers), 1)
        kinds = Counter(layer.mixer for layer in layers)
        mixer = sum(n * mixer_activation_bytes_per_token(model, kind, tp)
                    for kind, n in kinds.items()) / count
        replicated = replicated * sum(layer.norms for layer in layers) / (2 * count)
        mlp_share = sum(layer.mlp is not MlpKind.NONE for layer in layers) / count
    per_token = replicated / sp_shards + mixer
    if moe:
        k, f = model.moe_top_k, model.moe_ffn_hidden_size
        # Router on the sequence-parallel shard: fp32 logits over all experts.
        router = ROUTER_LOGIT_BYTES * model.num_experts / sp_shards
        # Balanced routing: each rank processes k expert slots per local token; with ETP the
        # tokens are gathered over ETP and the expert FFN is split, so FFN terms are unchanged.
        etp = _f(cols["etp"])
        act_output = np.where(bits["moe_act"], 0, ACTIVATION_BYTES * f)
        # Per routed copy the grouped GEMMs keep their inputs: the dispatched token (FC1, h,
        # gathered over ETP) and the activation output (FC2); the activation keeps FC1's
        # output.  megatron-core >= 0.12 applies the routing probabilities inside the
        # activation (weighted_bias_swiglu, transformer/moe/experts.py), so no expert output
        # is kept for their gradient.
        routed = k * (ACTIVATION_BYTES * h * etp + ACTIVATION_BYTES * gated * f
                      + act_output) / sp_shards
        fs = model.shared_expert_ffn_hidden_size
        shared = np.where(bits["shared_experts"], 0, ACTIVATION_BYTES * (gated * fs + fs) / tp)
        block = np.where(bits["moe"], 0, router + routed + shared)
        per_token = per_token + block
    else:
        f = model.ffn_hidden_size
        per_token = per_token + mlp_share * np.where(bits["mlp"], 0,
                                                     ACTIVATION_BYTES * (gated * f + f) / tp)
    full = recompute == 2
    layer_input = ACTIVATION_BYTES * h / sp_shards
    return np.where(full, layer_input, per_token)


@dataclass(frozen=True)
class LayerActivations:
    """What one dense and one MoE layer keep for backward on one GPU, per row
    (:func:`activation_bytes_per_layer`; ``moe`` None for a model without MoE layers): the
    same on every pipeline stage, so computed once for a batch of layouts and read per
    stage."""

    dense: np.ndarray
    moe: np.ndarray | None

    @classmethod
    def of(cls, model: ModelSpec, cols: Columns, tokens, recompute=0) -> "LayerActivations":
        return cls(activation_bytes_per_layer(model, cols, tokens, False, recompute),
                   activation_bytes_per_layer(model, cols, tokens, True, recompute)
                   if model.is_moe else None)

    def on_rank(self, ranks: RankLayers) -> np.ndarray:
        """What the layers of a rank keep for backward."""
        total = ranks.dense * self.dense
        if self.moe is not None:
            total = total + ranks.moe * self.moe
        return total

    def working_set(self, ranks: RankLayers) -> np.ndarray:
        """One layer's full activations (these being a layer's without recompute): what
        recompute or a forward-only pass holds at a time."""
        dense = np.where(ranks.dense > 0, self.dense, 0)
        if self.moe is None:
            return dense
        return np.maximum(dense, np.where(ranks.moe > 0, self.moe, 0))


def kept_activations(cols, ranks: RankLayers, none: LayerActivations,
                     kept_per_layer: LayerActivations):
    """(bytes one micro-batch leaves for backward on a rank, bytes the recompute of one chunk
    adds while it runs), from a layer's activations without recompute (``none``) and at the
    rows' recompute level (``kept_per_layer``).

    Full recompute (megatron-core ``recompute_granularity=full``): ``uniform`` keeps the input
    of every chunk of ``recompute_num_layers`` layers and recomputes a whole chunk at a time;
    ``block`` recomputes the first ``recompute_num_layers`` layers of each model chunk (the
    rest keep everything) one layer at a time."""
    recompute = cols["recompute"]
    layers = _f(ranks.dense + ranks.moe)
    n = len(cols["tp"])
    chunk = np.maximum(_f(cols.get("recompute_num_layers", np.ones(n))), 1)
    block = np.asarray(cols.get("recompute_block", np.zeros(n))).astype(bool)
    vpp = _f(cols["vpp"])
    working = none.working_set(ranks)
    none = none.on_rank(ranks)
    kept = kept_per_layer.on_rank(ranks)
    full = recompute == 2
    uniform_kept = np.ceil(layers / chunk) * (kept / np.maximum(layers, 1))
    recomputed = np.minimum(chunk * vpp, layers)
    block_kept = (recomputed * kept + (layers - recomputed) * none) / np.maximum(layers, 1)
    full_kept = np.where(block, block_kept, uniform_kept)
    full_working = np.where(block, working, np.minimum(chunk, np.maximum(layers, 1)) * working)
    return np.where(full, full_kept, kept), np.where(full, full_working, 0.0)


def in_flight_stage_equivalents(cols: Columns, m: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Micro-batches' worth of a stage's layers held by pipeline rank ``rank`` (megatron-core
    1F1B and interleaved warm-up, ``pipeline_parallel/schedules.py``)."""
    pp, vpp = cols["pp"], cols["vpp"]
    plain = np.minimum(pp - rank, m)
    chunks = np.minimum(2 * (pp - rank - 1) + (vpp - 1) * pp + 1, m * vpp)
    return _f(np.where(vpp > 1, chunks / vpp, plain))


def logits_bytes(model: ModelSpec, workload, cols: Columns, tokens: np.ndarray,
                 kind: str) -> np.ndarray:
    """The last stage's log-prob buffers for ``tokens`` tokens: ``train`` (logits, fp32 copy and
    its gradient), ``actor`` (forward with entropy), ``ref`` (forward, log-probs only)."""
    vocab_split = _f(model.vocab_size) / cols["tp"]
    tokens = _f(tokens)
    if workload.fused_kernels:
        splits = np.ceil(vocab_split / FUSED_VOCAB_PER_SPLIT)
        return tokens * (FUSED_BYTES_PER_TOKEN + FUSED_BYTES_PER_SPLIT * splits)
    per_token = LOGITS_BYTES
    out = tokens * vocab_split * per_token
    if kind == "actor":
        chunk = workload.entropy_chunk_tokens
        entropy_tokens = np.minimum(tokens, chunk) if chunk else tokens
        out = out + entropy_tokens * vocab_split * ENTROPY_BYTES
    return out


def rollout_weight_bytes(model: ModelSpec, cols: Columns, workload=None) -> np.ndarray:
    """Rollout weights per GPU: attention and dense parts split by TP, experts by EP (if on);
    with an FP8 rollout the linear layers hold 1 byte per weight (embedding and output layer
    stay bf16)."""
    p = model.params
    linear_bytes = 1 if engine_of(workload).precision == "fp8" else WEIGHT_BYTES
    ends = p.embedding + p.output_layer
    non_expert = p.total - p.experts - ends
    expert_shards = np.where(cols["rollout_ep"] > 1, cols["rollout_ep"], cols["rollout_tp"])
    tp = _f(cols["rollout_tp"])
    return (WEIGHT_BYTES * ends / tp + linear_bytes * non_expert / tp
            + linear_bytes * p.experts / _f(expert_shards))


def drafter_rollout_bytes(model: ModelSpec, cols: Columns, workload) -> np.ndarray:
    """The MTP drafter's weights on one rollout GPU when the rollout speculates with them
    (vLLM loads them beside the target; :func:`planner.cost.speculative.drafter_weight_bytes`),
    else zero."""
    if not lookahead_tokens(workload):
        return np.zeros(len(cols["rollout_tp"]))
    linear_bytes = 1 if engine_of(workload).precision == "fp8" else WEIGHT_BYTES
    return drafter_weight_bytes(model, cols["rollout_tp"], cols["rollout_ep"], linear_bytes)


def drafter_kv_per_token(model: ModelSpec, cols: Columns, workload) -> np.ndarray:
    """K/V bytes per token the MTP drafter's attention adds to one rank's pool when the rollout
    speculates, else zero."""
    if not lookahead_tokens(workload):
        return np.zeros(len(cols["rollout_tp"]))
    kv_dtype = engine_cache(model, workload, 1).kv_dtype
    return drafter_kv_bytes_per_token(model, np.asarray(cols["rollout_tp"]), kv_dtype)


def mtp_training_bytes(model: ModelSpec, workload, cols: Columns, tokens: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray]:
    """(activations one micro-batch leaves for backward, log-prob buffers) of the MTP layers on
    the last stage when verl trains them (``mtp.enable_train``), else zeros.

    Per MTP layer (megatron-core ``MultiTokenPredictionLayer``): one decoder layer of the
    model's kind at the job's recompute setting (:func:`activation_bytes_per_layer`), the
    normed embedding and hidden state concatenated into ``eh_proj`` and their norms' inputs
    (``4h`` bf16 per token, split over SP), and one more full-vocabulary cross entropy: the
    logits, their fp32 copy and gradient as the main loss keeps them (:func:`logits_bytes`).
    The forward-only passes are left as they are: the MTP logits of a pass without gradients
    are freed after its loss, below the main logits' peak."""
    n = len(cols["tp"])
    if not trains_mtp(model, workload):
        return np.zeros(n), np.zeros(n)
    layer = activation_bytes_per_layer(model, cols, tokens, moe=mtp_is_moe(model),
                                       recompute=cols["recompute"])
    sp = np.where(np.asarray(cols["sequence_parallel"]).astype(bool) & (cols["tp"] > 1),
                  _f(cols["tp"]), 1.0)
    inputs = 4 * ACTIVATION_BYTES * model.hidden_size * _f(tokens) / sp
    logits = logits_bytes(model, workload, cols, tokens, "train")
    return model.mtp_layers * (layer + inputs), model.mtp_layers * logits


def engine_cache(model: ModelSpec, workload, rollout_tp: int) -> EngineCache:
    """How one rank of the workload's rollout engine keeps its cache (vLLM): the rollout TP,
    ``kv_cache_dtype`` (fp8 with an FP8 rollout, else the model's bf16) and prefix caching
    (with it, vLLM keeps two state pages per Gated DeltaNet / Mamba layer)."""
    engine = engine_of(workload)
    return EngineCache(tp=int(rollout_tp),
                       kv_dtype="fp8" if engine.precision == "fp8" else "bfloat16",
                       prefix_caching=engine.prefix_caching,
                       speculative_tokens=lookahead_tokens(workload))


def _per_rollout_tp(cols: Columns, value) -> np.ndarray:
    """``value(tp)`` for every row's rollout TP (evaluated once per distinct TP)."""
    tp = np.asarray(cols["rollout_tp"])
    out = np.zeros(tp.shape, dtype=np.float64)
    for degree in sorted_distinct(tp):
        out[tp == degree] = value(int(degree))
    return out


def kv_bytes_per_token(model: ModelSpec, cols: Columns, workload=None) -> np.ndarray:
    """Growing KV cache per token per GPU: the full-attention and MLA layers
    (:func:`planner.cost.layer_kinds.kv_cache_bytes_per_token`).  MLA caches the compressed
    latent (kv_lora + rope dims), the same on every TP rank (vLLM's MLA backend); GQA splits KV
    heads over TP and replicates them when TP exceeds the KV heads.  ``kv_cache_dtype=fp8``
    halves it.  Windowed and recurrent layers add a fixed amount per sequence instead
    (:func:`sequence_state_tokens`)."""
    kv_dtype = engine_cache(model, workload, 1).kv_dtype
    # it depends on the rollout TP alone: computed once per distinct TP (a plan asks for it on
    # every row)
    tp = np.asarray(cols["rollout_tp"])
    if tp.ndim == 1:
        first, inverse = distinct(tp)
        per_token = np.array([_kv_cache_bytes_per_token(model, int(degree), kv_dtype)
                              for degree in tp[first]])[inverse]
    else:
        per_token = _f(kv_cache_bytes_per_token(model, tp, kv_dtype))
    return np.maximum(per_token, 1.0)  # attention-free: the pool counted in bytes


@lru_cache(maxsize=256)
def _kv_cache_bytes_per_token(model: ModelSpec, tp: int, kv_dtype: str) -> float:
    """:func:`planner.cost.layer_kinds.kv_cache_bytes_per_token` at one TP (a loop over the
    model's layers; a plan, and a sizing sweep's many plans, ask for a few TPs many times)."""
    return float(kv_cache_bytes_per_token(model, tp, kv_dtype))


def decode_cache_bytes(model: ModelSpec, cols: Columns, workload, context) -> np.ndarray:
    """Cache bytes one decode step moves per sequence on one rollout GPU: the growing K/V of
    ``context`` tokens, plus what the other layer kinds move whatever the context
    (:func:`planner.cost.layer_kinds.decode_bytes_per_step`: a window's last ``w`` tokens, a
    Gated DeltaNet / Mamba state read and written)."""
    growing = _f(context) * kv_bytes_per_token(model, cols, workload)
    if kv_grows_only(model):
        return growing

    def fixed(tp: int) -> float:
        cache = engine_cache(model, workload, tp)
        moved = decode_bytes_per_step(model, context, tp, cache.kv_dtype, cache.model_dtype)
        return float(sum(np.sum(v) for kind, v in moved.items()
                         if not MixerKind(kind).kv_grows))

    return growing + _per_rollout_tp(cols, fixed)


def sequence_state_tokens(model: ModelSpec, cols: Columns, workload, seq_len) -> np.ndarray:
    """What a sequence of ``seq_len`` tokens keeps beside its growing K/V, in tokens of that
    K/V (so that ``kv_cache_tokens_per_gpu`` stays the pool over the growing bytes per token):
    the window-capped pages of sliding/chunked layers, the conv + recurrent/SSM state pages of
    Gated DeltaNet and Mamba-2 layers, and the page rounding of the growing K/V where vLLM's
    hybrid alignment enlarged the block beyond its 16 tokens (``kv_cache_layout``).  Zero for
    a model of full-attention/MLA layers only (its rounding to 16-token pages, under 0.2% of an
    8K sequence, is left out as before).  A model with no growing K/V (every window shorter
    than the sequence, or attention-free) counts the pool and the state in bytes
    (``kv_pool_in_bytes``); a window that holds the sequence is full attention already
    (:func:`planner.catalog.models.model_at_length`, applied by the request)."""
    if kv_grows_only(model):
        return np.zeros(len(cols["rollout_tp"]))

    def tokens(tp: int) -> float:
        layout = kv_cache_layout(model, engine_cache(model, workload, tp))
        per_token = layout.growing_bytes_per_token
        fixed = float(layout.fixed_bytes_per_sequence(seq_len))
        if per_token <= 0:  # attention-free: every byte is fixed (one token = one byte)
            return fixed
        block = layout.block_tokens
        rounding = (-(-seq_len // block) * block - seq_len) if block > VLLM_BLOCK_SIZE else 0
        return fixed / per_token + rounding

    return _per_rollout_tp(cols, tokens)


def rollout_reserve_bytes(model: ModelSpec, cols: Columns, workload) -> np.ndarray:
    """What the rollout engine keeps inside its budget beside weights and KV cache.

    vLLM profiles one forward of ``max_num_batched_tokens`` tokens (chunked prefill) and keeps
    its activation peak: one layer's hidden states, Q/K/V and MLP (or routed-expert) buffers at
    a time; the sampler's fp32 logits and probabilities for ``max_num_seqs`` sequences; its
    workspace; and, unless ``enforce_eager``, the CUDA-graph pool (vllm/v1/worker/gpu_worker.py
    determine_available_memory)."""
    tp = _f(cols["rollout_tp"])
    h = model.hidden_size
    if model.is_moe:
        ffn = (model.moe_top_k * model.moe_ffn_hidden_size
               + model.shared_expert_ffn_hidden_size)
        routed = model.moe_top_k * h  # tokens gathered for the experts
    else:
        ffn, routed = model.ffn_hidden_size, 0
    qkv = model.query_projection_size + 2 * model.kv_projection_size
    per_token = ACTIVATION_BYTES * (4 * h + routed + (qkv + 3 * ffn) / tp)
    engine = engine_of(workload)
    tokens = float(engine.max_num_batched_tokens)
    sampler = 2 * 4.0 * engine.max_num_seqs * model.vocab_size / tp
    graphs = 0 if engine.enforce_eager else CUDA_GRAPH_POOL_BYTES
    return tokens * per_token + sampler + ROLLOUT_WORKSPACE_BYTES + graphs


def kv_tokens_per_sequence(workload) -> float:
    """KV-cache tokens one sequence of maximum length needs: with prefix caching the ``n``
    samples of a prompt share its blocks (vLLM automatic prefix caching).  A workload without a
    rollout: its longest sequence (the nominal engine's, :data:`NOMINAL_ENGINE`)."""
    if not workload.has_rollout:
        return float(workload.sequence_length)
    return workload.prompt_length / workload.engine.kv_sharing + workload.response_length


# Layout fields the knobs verl applies between phases (offload) and the CPU optimizer's share
# leave alone: what depends only on the rest is computed once per distinct combination.
PHASE_KNOBS = ("param_offload", "optimizer_offload", "ref_param_offload",
               "optimizer_cpu_fraction", "rollout_tp", "rollout_dp", "rollout_ep",
               "gpu_memory_utilization")


def core_fields(cols: Columns) -> tuple[str, ...]:
    return tuple(name for name in cols if name not in PHASE_KNOBS
                 and np.asarray(cols[name]).ndim == 1 and name in LAYOUT_FIELDS)


@dataclass(frozen=True)
class _Knobs:
    """One combination of the knobs :func:`actor_memory` reads, as plain values."""

    param_offload: bool
    optimizer_offload: bool
    ref_param_offload: bool
    on_host: float  # the CPU optimizer's share of the optimizer (cpu_fraction)


def _knob_combinations(cols: Columns) -> tuple[list[_Knobs], np.ndarray]:
    """The distinct knob combinations of the rows (in order of first appearance) and each
    row's index among them."""
    flags = [np.asarray(cols[name]).astype(bool)
             for name in ("param_offload", "optimizer_offload", "ref_param_offload")]
    on_host = cpu_fraction(cols)
    fractions, fraction = distinct(on_host)
    if len(fractions) <= 32 and all(flag.ndim == 1 for flag in flags):
        # the same combinations coded in one byte (equal rows, equal codes: the same first
        # rows and positions), fewer passes over the rows than int64 sums
        bits = [flag.view(np.uint8) for flag in flags]
        code = bits[0] | (bits[1] << 1) | (bits[2] << 2) | (fraction.astype(np.uint8) << 3)
    else:
        code = flags[0] + 2 * flags[1] + 4 * flags[2] + 8 * fraction
    first, which = distinct(code)
    return [_Knobs(bool(flags[0][i]), bool(flags[1][i]), bool(flags[2][i]), float(on_host[i]))
            for i in first], which


def _core_rows(cols: Columns, knob: np.ndarray, combinations: int
               ) -> tuple[Columns, np.ndarray]:
    """The core rows of ``cols`` (:func:`core_fields`) and each row's index among them.  A
    search's cross product lists every knob combination of a core row in a block, one block
    after the other: that is checked (a pass per field) and read off; other rows are hashed
    (:func:`planner.search.layout.unique_rows`)."""
    n = len(knob)
    if combinations and n % combinations == 0 and np.array_equal(
            knob.reshape(-1, combinations), np.broadcast_to(np.arange(combinations),
                                                             (n // combinations, combinations))):
        # a column of one element read n times (stride 0: a search's constant column) holds
        # one value throughout, NaN aside; the others' changes are counted (_constant_in_blocks)
        blocks = [np.asarray(cols[name]) for name in core_fields(cols)
                  if not _one_value(np.asarray(cols[name]))]
        if _constant_in_blocks(blocks, combinations):
            core = np.repeat(np.arange(n // combinations), combinations)
            return {name: np.asarray(values)[::combinations] for name, values in cols.items()}, core
    return unique_rows(cols, core_fields(cols))


def _constant_in_blocks(columns: list, size: int) -> bool:
    """Whether every column (1-D, a multiple of ``size`` long) holds one value (``==``) in each
    block of ``size`` rows: every change between neighbours falls between two blocks.  Counted
    over the whole column in a pass, not compared block by block (a short inner loop each).
    A NaN equals nothing, itself included, so a column holding one is not."""
    if not columns or not len(columns[0]):
        return True
    changes = np.empty(len(columns[0]) - 1, dtype=bool)
    for values in columns:
        if values.dtype.kind in "fc" and np.isnan(values).any():
            return False
        np.not_equal(values[1:], values[:-1], out=changes)
        if np.count_nonzero(changes) != np.count_nonzero(changes[size - 1::size]):
            return False
    return True


def _one_value(values: np.ndarray) -> bool:
    """Whether ``values`` (1-D) is one element read throughout (stride 0), not a NaN: every
    element then equals every other."""
    return (values.ndim == 1 and len(values) > 0 and values.strides[0] == 0
            and not (values.dtype.kind in "fc" and np.isnan(values[0])))


@dataclass(frozen=True, eq=False)
class CellIndex:
    """Which (core row, knob combination) cell each row reads: ``core`` and ``knob`` per row;
    ``offset``: the rows are the cells from this one on, in order (a search's cross product
    read in a range), else None."""

    core: np.ndarray
    knob: np.ndarray
    offset: int | None = None


class ActorParts:
    """The actor's parts per pipeline stage, held per core row (the parts no knob changes:
    weights, grads, the optimizer state, activations, logits) or per (core row, knob
    combination) cell (the host memory), and read per row.  ``core`` and ``knob`` give each
    row its core row and knob combination.  Rows that list every knob combination of each core
    row in order, one core row after the other (a search's cross product), from the cell
    ``offset`` on, read a cell table's flat values in place; other rows gather their cells."""

    def __init__(self, cells: CellIndex, cores: int, knobs: list[_Knobs],
                 needs_reference: bool) -> None:
        # per stage (appended by actor_memory): part -> (core rows,) or (core rows, combinations)
        self.tables: list[dict] = []
        core, knob, offset = cells.core, cells.knob, cells.offset
        self.core, self.knob = core, knob
        self.on_gpu = np.array([1 - k.on_host for k in knobs], dtype=np.float64)
        self.no_ref = np.array([k.ref_param_offload or not needs_reference for k in knobs],
                               dtype=bool)
        self._knobs = len(knobs)
        self._stacked: dict[str, np.ndarray] = {}  # part -> its tables stacked over the stages
        cells = core * self._knobs + knob
        if offset is None and np.array_equal(cells, np.arange(len(core))):
            offset = 0
        self._offset = offset
        self._cells = None if offset is not None else cells

    def cell_positions(self, rows: np.ndarray) -> np.ndarray:
        """The flat (core row, combination) cells of ``rows`` (an index of these rows)."""
        return rows + self._offset if self._offset is not None else self._cells[rows]

    def core_heads(self) -> np.ndarray | None:
        """The first row of each core row these rows read, in order (``core`` is each row's
        position among them), where the rows are the cells in order; else None."""
        if self._offset is None or not self._knobs:
            return None
        start = (self._knobs - self._offset % self._knobs) % self._knobs
        heads = np.arange(start, len(self.core), self._knobs)
        return heads if start == 0 or not len(self.core) else np.concatenate(([0], heads))

    @property
    def cell_period(self) -> int:
        """The knob combinations per core row where the rows are the cells in order (a
        search's cross product read in a range), else 0."""
        return self._knobs if self._offset is not None else 0

    def at(self, rows: np.ndarray | slice) -> "ActorParts":
        """These parts on ``rows`` of these rows (an index or a slice), the tables shared."""
        parts = copy.copy(self)
        parts.core, parts.knob = self.core[rows], self.knob[rows]
        parts._offset = None
        parts._cells = parts.core * self._knobs + parts.knob
        return parts

    def rows(self, table: np.ndarray) -> np.ndarray:
        """A table's value on every row (in order: a view of the table's values)."""
        if table.ndim == 1:
            return table[self.core]
        if self._offset is not None:
            return table.reshape(-1)[self._offset:self._offset + len(self.core)]
        return table.reshape(-1)[self._cells]

    def _derived(self, part: str, values) -> np.ndarray:
        """The knob-dependent parts from the core ones (``values(name)``, per row):
        the optimizer's GPU share and the reference's weights."""
        if part == "optimizer":
            return values("optimizer_state") * self.on_gpu[self.knob]
        if part == "ref_weights":
            # The reference has the actor's parallel sizes: the same shard of the same weights.
            # Without a KL loss or KL reward verl builds no reference model.
            return np.where(self.no_ref[self.knob], 0, values("weights"))
        return values(part)

    def stage(self, index: int, part: str) -> np.ndarray:
        """``part`` of stage ``index`` (of :data:`STAGES`) on every row."""
        return self._derived(part, lambda name: self.rows(self.tables[index][name]))

    def pick(self, part: str, stage: np.ndarray) -> np.ndarray:
        """Per row, ``part`` on the row's stage ``stage`` (an index into :data:`STAGES`)."""

        flat = {}  # per table width: each row's flat position in the stacked tables

        def values(name: str) -> np.ndarray:
            tables = self._stacked.get(name)
            if tables is None:  # stacked once (a plan's chunks and its subsets share it)
                tables = self._stacked[name] = np.stack([part[name] for part in self.tables])
            # ``tables[stage, core]`` or ``tables[stage, core, knob]``, as one flat take
            width = tables[0].size
            at = flat.get(width)
            if at is None:
                cell = self.core if tables.ndim == 2 else self.core * self._knobs + self.knob
                at = flat[width] = np.asarray(stage, dtype=np.int64) * width + cell
            return np.take(tables.reshape(-1), at)

        return self._derived(part, values)

    def largest(self, part: str) -> np.ndarray:
        """Per row, the largest ``part`` over the stages."""
        return self.rows(max_rows([tables[part] for tables in self.tables]))


STAGE_PARTS = ("weights", "grads", "optimizer", "train_activations", "train_logits",
               "ref_weights", "host")


class _StageView(Mapping):
    """One stage's parts on every row, computed when read (:class:`ActorParts`)."""

    def __init__(self, parts: ActorParts, index: int) -> None:
        self._parts, self._index = parts, index

    def __getitem__(self, part: str) -> np.ndarray:
        if part not in STAGE_PARTS:
            raise KeyError(part)
        return self._parts.stage(self._index, part)

    def __iter__(self):
        return iter(STAGE_PARTS)

    def __len__(self) -> int:
        return len(STAGE_PARTS)


class _SpreadStages(Sequence):
    """A phase's bytes per stage on a part of the rows (a plan's chunk of a held evaluation),
    kept as the stages' (pattern, core row) tables (:attr:`tables`) and spread over the rows
    when read: a stage (``[index]``), their largest (:meth:`top`: the gather of the tables'
    elementwise maximum, the same values as :func:`max_rows` of the spread stages), or a
    stage on a few rows (:meth:`at`)."""

    def __init__(self, parts: ActorParts, tables: CombinationTables, family: str) -> None:
        self._parts, self._tables, self._family = parts, tables, family
        self.tables: list[np.ndarray] = []

    def _spread(self, table: np.ndarray) -> np.ndarray:
        return self._parts.rows(self._tables.of(self._family, table))

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[at] for at in range(len(self))[index]]
        return self._spread(self.tables[index])

    def __len__(self) -> int:
        return len(self.tables)

    def top(self) -> np.ndarray:
        return self._spread(max_rows(self.tables))

    def at(self, rows: np.ndarray, count: int) -> list[np.ndarray]:
        """The first ``count`` stages on ``rows`` alone (their cells' positions found once)."""
        at = self._tables.positions_at(self._family, self._parts.cell_positions(rows))
        return [np.take(table.reshape(-1), at) for table in self.tables[:count]]


def stages_max(stages) -> np.ndarray:
    """Per row, the largest of a phase's ``stages`` (:func:`max_rows`)."""
    return stages.top() if isinstance(stages, _SpreadStages) else max_rows(stages)


def _stages_at(stages, rows: np.ndarray, count: int) -> list[np.ndarray]:
    """The first ``count`` stages of ``stages`` on ``rows`` alone."""
    if isinstance(stages, _SpreadStages):
        return stages.at(rows, count)
    return [np.take(stages[index], rows) for index in range(count)]


# Core-row columns a layout's batch choices set (what the micro-batches read) and its recompute
# choices set; the others are its parallel sizes and split, which a search repeats over the
# rows of its batch and recompute choices, one after the other.
BATCH_FIELDS = ("micro_batch", "max_token_len", "log_prob_max_token_len", "log_prob_micro_batch",
                "dynamic_batch")
RECOMPUTE_FIELDS = ("recompute", "recompute_modules", "recompute_num_layers", "recompute_block")


def runs_of_rows(cols: Columns, names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Rows grouped into runs of consecutive rows equal in every column of ``names`` (floats
    by their bits: a -0.0 is not a 0.0, a NaN is the NaN of its bits): the first row of each
    run and each run's length.  A value computed from those columns alone is its run's first
    row's, to the bit."""
    n = len(cols["tp"])
    starts = np.zeros(n, dtype=bool)
    starts[:1] = True
    for name in names:
        values = np.asarray(cols[name])
        if _one_value(values):
            continue
        if values.dtype.kind == "f":
            values = values.view(f"i{values.itemsize}")
        starts[1:] |= values[1:] != values[:-1]
    first = np.flatnonzero(starts)
    return first, np.diff(first, append=n)


def _rows_of(cols: Columns, first: np.ndarray, names: tuple[str, ...]) -> Columns:
    """The columns ``names`` on rows ``first`` (one row of each run, :func:`runs_of_rows`)."""
    # indexed, not np.take: a search's core rows are strided views, which np.take would copy
    # whole first
    return {name: np.asarray(cols[name])[first] for name in names}


def _at(values, lengths: np.ndarray):
    """``values`` (an array per run, or a scalar) on every row of runs of ``lengths`` rows."""
    return np.repeat(values, lengths) if isinstance(values, np.ndarray) and values.ndim == 1 \
        else values


def _ranks_at(ranks: list[RankLayers], lengths: np.ndarray, fields=_FIELDS) -> list[RankLayers]:
    """``ranks`` on every row of runs of ``lengths`` rows; the fields not in ``fields`` left
    None."""
    return [RankLayers(*(_at(getattr(r, f), lengths) if f in fields else None
                         for f in _FIELDS)) for r in ranks]


class _FullRecompute:
    """:func:`kept_activations` on the rows of full recompute alone (``cols``' ``recompute``
    2): on the others it is the layers' kept activations (``kept_per_layer`` on the rank) and
    no recompute working set.  The rows' columns and a layer's activations on them are
    gathered once, for every rank."""

    def __init__(self, cols: Columns, none: LayerActivations,
                 kept_per_layer: LayerActivations) -> None:
        self.rows = np.asarray(cols["recompute"]) == 2
        self.kept_per_layer = kept_per_layer
        self.cols = RowsAt(cols, self.rows) if self.rows.any() else None
        self.none, self.kept = (LayerActivations(self._at(layers.dense), self._at(layers.moe))
                                for layers in (none, kept_per_layer))

    def _at(self, values):
        return None if values is None or self.cols is None else values[self.rows]

    def on(self, ranks: RankLayers) -> tuple[np.ndarray, np.ndarray]:
        """:func:`kept_activations` on rank ``ranks`` (its ``dense`` and ``moe`` read)."""
        kept = self.kept_per_layer.on_rank(ranks)
        working = np.zeros(len(kept))
        if self.cols is not None:
            kept[self.rows], working[self.rows] = kept_activations(
                self.cols, RankLayers(self._at(ranks.dense), self._at(ranks.moe), None, None,
                                      None), self.none, self.kept)
        return kept, working


def _layout_core(request: PlanRequest, cols: Columns) -> list[dict]:
    """Per rank of :data:`STAGES`: what the parallel sizes and split alone set (the rows of
    one layout, :func:`_actor_core`): weights, grads, the optimizer state and the parameters it
    covers, and the ranks' layers and ends (``ranks``)."""
    model, cluster, workload = request.model, request.cluster, request.workload
    state = optimizer_state_bytes(workload)
    grad_bytes = MAIN_GRAD_BYTES if getattr(workload, "grad_reduce_in_fp32", True) else 2
    all_ranks = rank_layers(model, cols)
    owned = optimizer_params_all(model, cluster, cols, all_ranks)
    # the MTP layers on the last stage (mtp.enable) and, trained, their activations and loss
    mtp_dense, mtp_expert = mtp_stage_params(model, workload, cols["tp"], cols["ep"], cols["etp"])
    dense_shards, expert_shards = optimizer_shards(cluster, cols)
    mtp_owned = mtp_dense / dense_shards + mtp_expert / expert_shards
    out = []
    for ranks, (non_expert, expert), params in zip(
            all_ranks, actor_params_per_gpu(model, cols, all_ranks), owned):
        held = non_expert + expert + np.where(ranks.head, mtp_dense + mtp_expert, 0)
        params = params + np.where(ranks.head, mtp_owned, 0)
        out.append({"ranks": ranks, "weights": WEIGHT_BYTES * held, "grads": grad_bytes * held,
                    "optimizer_state": state * params, "optimizer_params": params})
    return out


def _batch_core(request: PlanRequest, cols: Columns, ranks: list[RankLayers]) -> dict:
    """What a layout's batch choices set besides (the rows of one layout and micro-batch,
    :func:`_actor_core`, ``ranks`` on those rows): the passes' tokens, a layer's activations
    without recompute, and per rank of :data:`STAGES` the in-flight micro-batches, the
    embedding's inputs, the forward passes' working set and the log-prob buffers."""
    model, workload = request.model, request.workload
    update = update_batches(workload, cols)
    train_tokens = update.memory_tokens
    forward_tokens = log_prob_batches(workload, cols).memory_tokens
    forward_none = LayerActivations.of(model, cols, forward_tokens)
    stages = []
    for rank in ranks:
        # judged at the maximum length (planner.search.batches.MicroBatches.memory_count)
        in_flight = in_flight_stage_equivalents(cols, update.memory_count, rank.rank)
        is_first, is_last = rank.embedding, rank.head
        stages.append({
            "in_flight": in_flight,
            "embedding_inputs": np.where(is_first, TOKEN_ID_BYTES * train_tokens * in_flight, 0),
            "train_logits": logits_bytes(model, workload, cols, train_tokens, "train"),
            # Forward-only passes keep one layer's working set and the layer input at a time.
            "forward": forward_none.working_set(rank)
            + ACTIVATION_BYTES * model.hidden_size * forward_tokens,
            "actor_logits": np.where(is_last, logits_bytes(model, workload, cols,
                                                           forward_tokens, "actor"), 0),
            "ref_logits": np.where(is_last, logits_bytes(model, workload, cols, forward_tokens,
                                                         "ref"), 0),
        })
    return {"train_tokens": train_tokens, "stages": stages,
            "train_none": LayerActivations.of(model, cols, train_tokens)}


def _actor_core(request: PlanRequest, cols: Columns) -> list[dict]:
    """Per rank of :data:`STAGES`: the bytes that do not depend on offload or the CPU optimizer
    (weights, grads, the whole optimizer state, the parameters it covers, activations and
    log-prob buffers of the update and of the forward passes).

    Each value is computed on the columns it reads alone: what the parallel sizes and split
    set once per run of rows of one layout (:func:`_layout_core`), what the batch choices set
    once per run of one layout and micro-batch (:func:`_batch_core`), each read per row by a
    gather; the activations the recompute choices keep per row."""
    model, workload = request.model, request.workload
    fields = core_fields(cols)
    batch_fields = tuple(name for name in fields if name not in RECOMPUTE_FIELDS)
    layout_fields = tuple(name for name in batch_fields if name not in BATCH_FIELDS)
    # runs of rows of one layout and micro-batch (their lengths), and runs of those of one
    # layout
    batch_first, batch_rows = runs_of_rows(cols, batch_fields)
    batch_cols = _rows_of(cols, batch_first, batch_fields)
    layout_first, layout_batches = runs_of_rows(batch_cols, layout_fields)
    layouts = _layout_core(request, _rows_of(batch_cols, layout_first, layout_fields))
    batch = _batch_core(request, batch_cols,
                        _ranks_at([s["ranks"] for s in layouts], layout_batches))
    layout_rows = np.diff(batch_first[layout_first], append=len(cols["tp"]))
    train_tokens = _at(batch["train_tokens"], batch_rows)
    mtp_kept, mtp_logits = mtp_training_bytes(model, workload, cols, train_tokens)
    train_none = LayerActivations(*(_at(part, batch_rows) for part in
                                    (batch["train_none"].dense, batch["train_none"].moe)))
    full = _FullRecompute(cols, train_none,
                          LayerActivations.of(model, cols, train_tokens, cols["recompute"]))
    out = []
    for layout, per_batch, ranks in zip(
            layouts, batch["stages"],
            _ranks_at([s["ranks"] for s in layouts], layout_rows, ("dense", "moe", "head"))):
        in_flight = _at(per_batch["in_flight"], batch_rows)
        kept, recompute_working = full.on(ranks)
        is_last = ranks.head
        out.append({
            **{part: _at(layout[part], layout_rows) for part in
               ("weights", "grads", "optimizer_state", "optimizer_params")},
            "train_activations": kept * in_flight + recompute_working
            + _at(per_batch["embedding_inputs"], batch_rows)
            + np.where(is_last, mtp_kept * in_flight, 0),
            "train_logits": np.where(is_last, _at(per_batch["train_logits"], batch_rows)
                                     + mtp_logits, 0),
            **{part: _at(per_batch[part], batch_rows) for part in
               ("forward", "actor_logits", "ref_logits")},
        })
    return out


def actor_memory(request: PlanRequest, cols: Columns, reduced: bool = False,
                 held: bool = False) -> dict:
    """Per-phase bytes of everything but the rollout engine's own budget, per pipeline stage.

    Returns ``{"phases": {phase: [one array per STAGES entry]}, "allocated": {phase: array},
    "stages": [...], "parts": ActorParts}``, where a stage mapping holds its weights, grads,
    optimizer, activation, logits and host bytes (:data:`STAGE_PARTS`, computed when read), and
    ``allocated`` is each phase's allocated working set on its largest stage (only that is
    read: what :func:`estimate_memory` adds to it is the same on every stage, and a rounded sum
    is monotone in each term, so the largest stage stays the largest, to the bit).

    Evaluated once per core row (the layout without the offload and CPU-optimizer knobs,
    :func:`core_fields`) and knob combination present: a search crosses some 137,000 core rows
    of DeepSeek-V3 on 1,024 GPUs with 12 combinations, as (core row, combination) tables: a
    term a knob zeroes is an exact 0 in its combinations' cells (adding it changes no bit), and
    the terms no knob touches are computed once per core row (:class:`ActorCells`).

    ``reduced``: a plan's actor evaluation, kept for its plans under other policies, with
    each phase the rollout engine does not join (:func:`engine_phases`) kept as what
    :func:`estimate_memory` reads of it, its largest stage per row (under ``largest_<phase>``
    of ``reduced``: the index as int8, at most four stages, and the bytes; read-only,
    :func:`actor_reduction`), and no per-stage arrays.  ``held`` (with ``reduced``): returned
    as ``{"cells": ActorCells, "reduced": {}}``, the per-core-row parts alone held and the
    arrays computed for the rows a plan asks (:func:`actor_rows`, a chunk of rows at a time;
    :func:`over_rows`): memory for CPU, each plan computing them again.  The largest
    stage is found on the (combination, core row) tables, a stage at a time as they are
    computed, and only the result is spread over the rows: a row's value is its cell's
    (:meth:`ActorParts.rows`, a gather), so its largest stage is its cell's, to the bit.  A
    workload without a rollout keeps every phase's stages (a plan's rollout choice reads its
    training phases).  Every value is its cell's alone, so those of a chunk are those of every
    row at once, to the bit.
    """
    knobs, knob = _knob_combinations(cols)
    core_rows, core = _core_rows(cols, knob, len(knobs))
    cells = ActorCells(request, core_rows, CellIndex(core, knob), knobs, reduced)
    if reduced and held:
        return {"cells": cells, "reduced": {}}
    return cells.rows(slice(None))


class ActorCells:
    """The actor's memory of a set of rows held per core row (:func:`_actor_core`'s parts,
    which no knob changes) and knob combination, each row's per-phase and per-stage bytes
    computed for the rows asked (:meth:`rows`): the knob sums of the core rows those rows
    read, once per distinct knob pattern (:mod:`planner.cost.knob_sums`), spread over the
    rows.  Rows that list every knob combination of each core row in order (a search's cross
    product, :attr:`in_order`) keep no row indices: a range of them reads a range of core
    rows."""

    def __init__(self, request: PlanRequest, core_rows: Columns, cells: CellIndex,
                 knobs: list[_Knobs], reduced: bool) -> None:
        core, knob = cells.core, cells.knob
        workload = request.workload
        self.knobs, self.reduced = knobs, reduced
        self.needs_ref = workload.needs_reference
        self.host_state = (CPU_OPTIMIZER_COPY_BYTES + optimizer_state_bytes(workload)
                           - MASTER_WEIGHT_BYTES)
        self.joined = engine_phases(workload) if reduced and workload.has_rollout else PHASES
        self.core_parts = _actor_core(request, core_rows)
        self.n = len(core)
        in_order = np.array_equal(core * len(knobs) + knob, np.arange(self.n))
        self._index = None if in_order else (core, knob)
        self._positions: tuple = (None, {})  # CombinationTables' positions of the last width

    def __len__(self) -> int:
        return self.n

    @property
    def in_order(self) -> bool:
        """Whether the rows list every knob combination of each core row in order, one core
        row after the other (a search's cross product): row ``i`` holds core row ``i //
        len(knobs)``'s core fields (:func:`core_fields`) and combination ``i % len(knobs)``."""
        return self._index is None

    def rows(self, rows: np.ndarray | slice, only: tuple[str, ...] | None = None) -> dict:
        """:func:`actor_memory`'s arrays on ``rows`` (a slice or an index of these rows);
        ``only``: the per-stage arrays of these phases alone (no working sets, largest
        stages nor parts: a caller that reads no more, the rollout choice)."""
        k = max(len(self.knobs), 1)  # no rows: no combination
        offset = None
        if self._index is None and isinstance(rows, slice) and rows.indices(self.n)[2] == 1:
            start, stop, _ = rows.indices(self.n)
            stop = max(start, stop)
            first, last = start // k, -(-stop // k)  # the core rows the range covers
            cores, width, offset = slice(first, last), last - first, start - first * k
            # (at // k - first, at % k) of the rows at = start..stop-1, without dividing
            core = np.repeat(np.arange(width), k)[offset:offset + stop - start]
            knob = np.tile(np.arange(k), width)[offset:offset + stop - start]
        else:
            at = (rows if isinstance(rows, np.ndarray) and rows.dtype.kind in "iu"
                  and (len(rows) == 0 or rows.min() >= 0) else np.arange(self.n)[rows])
            core, knob = (at // k, at % k) if self._index is None else (
                self._index[0][at], self._index[1][at])
            first, local = distinct(core)
            cores, core, width = core[first], local, len(first)
        return self._spread(cores, width, CellIndex(core, knob, offset), only)

    def _spread(self, cores: slice | np.ndarray, width: int, index: CellIndex,
                only: tuple[str, ...] | None) -> dict:
        """The arrays of the rows ``index`` reads (their ``core`` an index into ``cores``, the
        ``width`` core rows read); ``only``: :meth:`rows`'.  Summed once per distinct knob
        pattern (:mod:`planner.cost.knob_sums`), or with no combination on the cell tables."""
        if not self.knobs or not width:
            return self._spread_tables(cores, width, index, only)
        c = [{name: values[cores] if np.ndim(values) else values
              for name, values in whole.items()} for whole in self.core_parts]
        # the optimizer's share is an exact 0 where it is 0.0 of a finite, non-negative state
        zeroes = all(bool(np.all(np.isfinite(s["optimizer_state"]) & (s["optimizer_state"] >= 0)))
                     for s in c)
        patterns = KnobPatterns(self.knobs, self.needs_ref, zeroes)
        key = (width, zeroes)  # the positions of a chunk's width, kept for the next chunk
        if self._positions[0] != key:
            self._positions = (key, {})
        tables = CombinationTables(patterns, width, self._positions[1])
        parts = ActorParts(index, width, self.knobs, self.needs_ref)
        # every row (an evaluation kept whole) spreads what it keeps at once; a part of the
        # rows (a plan's chunk of a held evaluation) when read
        every_row = len(index.core) == self.n
        phase_rows = {phase: [] if every_row or only is not None
                      else _SpreadStages(parts, tables, PHASE_SUMS[phase][0]) for phase in PHASES
                      if phase in (self.joined if only is None else only)}
        wanted = PHASES if only is None else [phase for phase in PHASES if phase in only]
        needed = frozenset([PHASE_SUMS[phase][1] for phase in wanted]
                           + ([] if only is not None else ["host"]))
        largest = {phase: None for phase in PHASES if phase not in self.joined and only is None}
        allocated, host = {}, None
        consts = SumConstants(CUDA_CONTEXT_BYTES + NCCL_BUFFER_BYTES,
                              1 + FRAGMENTATION_FRACTION, WEIGHT_SYNC_BUCKET_BYTES,
                              HOST_WORKER_BYTES, self.host_state)
        for stage, s in enumerate(c):
            vectors = {"W": np.asarray(s["weights"]), "G": np.asarray(s["grads"]),
                       "optimizer_state": np.asarray(s["optimizer_state"]),
                       "optimizer_params": np.asarray(s["optimizer_params"])}
            states = stage_states(patterns, vectors, consts, needed)
            transients = {"update": s["train_activations"] + s["train_logits"],
                          "log_prob": s["forward"] + s["actor_logits"],
                          "reference": s["forward"] + s["ref_logits"],
                          "sync": WEIGHT_SYNC_BUCKET_BYTES}
            for phase in wanted:
                family, name, part = PHASE_SUMS[phase]
                state, transient = states[name], transients.get(part)
                term = (None if transient is None else transient if part == "sync"
                        else consts.fragmentation * transient)
                values = state + term if term is not None else state + consts.fixed
                if term is not None:
                    values += consts.fixed
                if isinstance(phase_rows.get(phase), _SpreadStages):
                    phase_rows[phase].tables.append(values)
                elif phase in phase_rows:
                    phase_rows[phase].append(parts.rows(tables.of(family, values)))
                if only is not None:
                    continue
                _keep_largest(allocated, phase,
                              state if transient is None else state + transient)
                if phase in largest:
                    kept = largest[phase]
                    if kept is None:
                        largest[phase] = (np.zeros(values.shape, dtype=np.int8), values)
                    else:
                        larger = values > kept[1]
                        np.copyto(kept[0], stage, where=larger)
                        np.copyto(kept[1], values, where=larger)
            if only is not None:
                continue
            table = DeferredColumns()  # a part of the rows: the host memory spread when read
            for name in ("weights", "grads", "optimizer_state", "train_activations",
                         "train_logits"):
                table[name] = s[name]
            table.defer("host", partial(tables.of, "host", states["host"]))
            if every_row:
                table["host"]  # spread now: the pattern tables freed (a plan's peak follows)
            parts.tables.append(table)
            # the busiest stage's host memory, per pattern (max_rows' maxima in its order)
            host = (states["host"] if host is None else np.maximum(host, states["host"]))
        if only is not None:
            return {"phases": phase_rows, "reduced": {}}

        def spread(phase: str, table: np.ndarray) -> np.ndarray:
            return parts.rows(tables.of(PHASE_SUMS[phase][0], table))

        spread_allocated = DeferredColumns()  # spread when read (a plan's chunk reads none)
        for phase, table in allocated.items():
            spread_allocated.defer(phase, partial(spread, phase, table))
            if every_row:
                spread_allocated[phase]  # the whole evaluation: kept, its tables freed now
        out = {"phases": phase_rows, "allocated": spread_allocated,
               "stages": [_StageView(parts, index) for index in range(len(parts.tables))],
               "parts": parts}
        if self.reduced:
            # actor_host_bytes' reduction: a row's largest is its cell's (a gather commutes
            # with the elementwise maximum)
            out["reduced"] = {"host": parts.rows(tables.of("host", host))}
            out["reduced"]["host"].flags.writeable = False
            for phase, (index, values) in largest.items():
                kept = (spread(phase, index), spread(phase, values))
                for array in kept:
                    array.flags.writeable = False
                out["reduced"][f"largest_{phase}"] = kept
        return out

    def _spread_tables(self, cores: slice | np.ndarray, width: int, index: CellIndex,
                       only: tuple[str, ...] | None) -> dict:
        """:meth:`_spread` on (core row, combination) tables, every term in every cell."""
        knobs, needs_ref = self.knobs, self.needs_ref
        fixed = CUDA_CONTEXT_BYTES + NCCL_BUFFER_BYTES
        frag = 1 + FRAGMENTATION_FRACTION

        # the knobs of each combination (a column of the (core row, combination) tables)
        param_off = np.array([k.param_offload for k in knobs], dtype=bool)
        optimizer_off = np.array([k.optimizer_offload for k in knobs], dtype=bool)
        ref_off = np.array([k.ref_param_offload for k in knobs], dtype=bool)
        on_host = np.array([k.on_host for k in knobs], dtype=np.float64)
        on_gpu = 1 - on_host  # the optimizer's share on the GPU
        no_ref = ref_off | (not needs_ref)  # verl builds no reference, or offloads it

        def cells(values, where: np.ndarray) -> np.ndarray:
            """A per-core-row term on the combinations ``where`` is set, else an exact 0:
            adding it changes no bit where it is 0 (``x + 0.0 == x``, the bytes are never
            -0.0), so each sum is the one of the terms a combination keeps, in order.
            (``np.where(where, values[:, None], 0.0)``, its columns written in place.)"""
            return _masked_columns(np.asarray(values)[:, None], where)

        parts = ActorParts(index, width, knobs, needs_ref)
        wanted = PHASES if only is None else [phase for phase in PHASES if phase in only]
        phase_rows = {phase: [] for phase in PHASES
                      if phase in (self.joined if only is None else only)}
        # per phase not joined: its largest stage so far per cell, and that stage's index (the
        # first on ties, a NaN never larger: argmax_rows, a stage at a time)
        largest = {phase: None for phase in PHASES if phase not in self.joined and only is None}
        allocated = {}  # per phase, on the largest stage
        for stage, whole in enumerate(self.core_parts):
            c = {name: values[cores] if np.ndim(values) else values
                 for name, values in whole.items()}
            weights, grads = c["weights"], c["grads"]
            update_transient = c["train_activations"] + c["train_logits"]
            log_prob_transient = c["forward"] + c["actor_logits"]
            ref_transient = c["forward"] + c["ref_logits"]
            # what nvidia-smi shows adds the allocator's fragmentation on the transients
            spread = {"update_actor": frag * update_transient,
                      "old_log_prob": frag * log_prob_transient, "ref": frag * ref_transient}
            spread = {phase: values[:, None] for phase, values in spread.items()}
            # per (core row, combination); a term a knob zeroes is an exact 0 (cells)
            optimizer = np.asarray(c["optimizer_state"])[:, None] * on_gpu  # x * 1.0 == x
            kept_grads = cells(grads, ~param_off)
            kept_optimizer = _masked_columns(optimizer, ~optimizer_off)
            terms = {"weights": np.asarray(weights)[:, None], "grads": np.asarray(grads)[:, None],
                     "optimizer": optimizer, "ref_weights": cells(weights, ~no_ref),
                     "update": update_transient[:, None], "log_prob": log_prob_transient[:, None],
                     "reference": ref_transient[:, None]}
            resident = (cells(weights, ~param_off) + kept_grads + kept_optimizer
                        + terms["ref_weights"] + fixed)
            terms["resident_state"] = resident - fixed
            # what the log-prob pass and the weight sync hold: offloaded state stays on the host
            terms["loaded"] = terms["weights"] + kept_grads + kept_optimizer + terms["ref_weights"]
            # Host memory of this GPU's worker: verl's offloaded copies (parameters into a
            # pinned buffer, grads freed not copied -- utils/megatron_utils.py
            # offload_megatron_model_to_cpu; the optimizer's GPU state; the reference), and
            # Megatron's CPU optimizer's share of the optimizer.
            host = None if only is not None else (
                cells(weights, param_off) + _masked_columns(optimizer, optimizer_off)
                + cells(weights, ref_off & needs_ref)
                + _masked_columns(on_host * np.asarray(c["optimizer_params"])[:, None]
                                  * self.host_state, on_host != 0) + HOST_WORKER_BYTES)
            phases = {}
            for phase in wanted:
                state, transient = _held(phase, terms)
                term = spread.get(phase, transient)
                phases[phase] = (state if term is None else state + term) + fixed
                if only is not None:
                    continue
                _keep_largest(allocated, phase,
                              state if transient is None else state + transient)
            for phase in phase_rows:
                phase_rows[phase].append(parts.rows(phases[phase]))
            for phase, kept in largest.items():
                if kept is None:
                    largest[phase] = (np.zeros(phases[phase].shape, dtype=np.int8),
                                      phases[phase])
                else:
                    larger = phases[phase] > kept[1]
                    np.copyto(kept[0], stage, where=larger)
                    np.copyto(kept[1], phases[phase], where=larger)
            if only is not None:
                continue
            parts.tables.append({"weights": weights, "grads": grads,
                                 "optimizer_state": c["optimizer_state"],
                                 "train_activations": c["train_activations"],
                                 "train_logits": c["train_logits"], "host": host})
        if only is not None:
            return {"phases": phase_rows, "reduced": {}}
        out = {"phases": phase_rows,
               "allocated": {phase: parts.rows(t) for phase, t in allocated.items()},
               "stages": [_StageView(parts, index) for index in range(len(parts.tables))],
               "parts": parts}
        if self.reduced:
            out["reduced"] = {}
            for phase, (index, values) in largest.items():
                kept = (parts.rows(index), parts.rows(values))
                for array in kept:
                    array.flags.writeable = False
                out["reduced"][f"largest_{phase}"] = kept
        return out


def _keep_largest(allocated: dict, phase: str, tensors: np.ndarray) -> None:
    """``allocated[phase]``: the largest ``tensors`` over the stages so far (a copy of the
    first stage's, then the elementwise maximum in place)."""
    if phase in allocated:
        np.maximum(allocated[phase], tensors, out=allocated[phase])
    else:
        allocated[phase] = np.array(tensors, dtype=np.float64)


def _masked_columns(values: np.ndarray, where: np.ndarray) -> np.ndarray:
    """``np.where(where, values, 0.0)`` of a (core row, combination) table ``values`` (or one
    column, ``(rows, 1)``, broadcast) and a mask of its combinations: a table of zeros whose
    columns ``where`` sets are copied in (a plain strided copy, not a broadcast select)."""
    out = np.zeros((len(values), len(where)))
    if where.all():
        out[...] = values
    elif where.any():
        out[:, where] = values if values.shape[1] == 1 else values[:, where]
    return out


def _held(phase: str, terms: dict) -> tuple:
    """(state held, transient tensors) of ``phase`` on a stage, from its per-cell ``terms``
    (:meth:`ActorCells._spread`); the allocated working set is the tensors alone.  verl loads
    offloaded params and optimizer state back before the update; actor weights are on the GPU
    while they are copied into the rollout."""
    if phase == "update_actor":
        return (terms["weights"] + terms["grads"] + terms["optimizer"] + terms["ref_weights"],
                terms["update"])
    if phase == "old_log_prob":
        return terms["loaded"], terms["log_prob"]
    if phase == "ref":
        return (terms["resident_state"] - terms["ref_weights"] + terms["weights"],
                terms["reference"])
    if phase == "weight_sync":
        return terms["loaded"], WEIGHT_SYNC_BUCKET_BYTES
    return terms["resident_state"], None  # generate


def over_rows(actor: dict, compute, chunk: int,
              only: tuple[str, ...] | None = None) -> tuple[np.ndarray, ...]:
    """``compute(rows)`` (a tuple of per-row arrays) of every row of ``actor``: at once for
    an evaluated :func:`actor_memory`, ``chunk`` rows at a time (:meth:`ActorCells.rows`, the
    parts concatenated) for one held per cell (``reduced``), of the phases ``only`` alone when
    given (``rows["phases"]``, and ``actor_resident_bytes(rows)`` with ``generate``)."""
    if "cells" not in actor:
        return compute(actor)
    n, cells = len(actor["cells"]), actor["cells"]
    pieces = [compute(cells.rows(slice(start, start + chunk), only))
              for start in range(0, max(n, 1), max(chunk, 1))]
    return tuple(np.concatenate(part) for part in zip(*pieces))


def engine_phases(workload) -> tuple[str, ...]:
    """The phases whose stages the rollout engine's memory joins (:func:`estimate_memory`):
    generation, and the weight sync (a sleeping engine wakes its weights for it) or, for an
    engine that keeps its whole budget, every training phase."""
    if engine_of(workload).free_cache_engine:
        return ("generate", "weight_sync")
    return ("generate", *TRAINING_PHASES)


def actor_resident_bytes(actor: dict) -> np.ndarray:
    """Per row, the actor's bytes resident beside the rollout engine: its generate phase's
    largest stage (kept: :func:`actor_reduction`)."""
    return actor_reduction(actor, "resident", lambda: stages_max(actor["phases"]["generate"]))


def actor_host_bytes(actor: dict) -> np.ndarray:
    """Per row, the host memory of the busiest stage's worker (kept: :func:`actor_reduction`)."""
    return actor_reduction(actor, "host", lambda: actor["parts"].largest("host"))


def actor_rows(actor: dict, rows: np.ndarray | slice) -> dict:
    """:func:`actor_memory`'s result on ``rows`` of its rows (an index or a slice): what
    :func:`estimate_memory` reads, the same values as the whole one's at those rows (each of
    its per-row arrays taken at ``rows``; the per-stage tables shared).  The per-row
    reductions are found on the whole evaluation first, so the plans that share it find them
    once."""
    if "cells" in actor:  # held per cell: computed for these rows
        return actor["cells"].rows(rows)
    parts = actor["parts"].at(rows)
    out = {"phases": {phase: [stage[rows] for stage in stages]
                      for phase, stages in actor["phases"].items()},
           "allocated": {phase: values[rows] for phase, values in actor["allocated"].items()},
           "stages": [_StageView(parts, index) for index in range(len(parts.tables))],
           "parts": parts}
    if "reduced" in actor:
        if "generate" in actor["phases"]:
            actor_resident_bytes(actor)
        actor_host_bytes(actor)
        out["reduced"] = {name: tuple(part[rows] for part in value)
                          if isinstance(value, tuple) else value[rows]
                          for name, value in actor["reduced"].items()
                          if name in ("resident", "host") or name.startswith("largest_")}
    return out


def _largest_stage(actor: dict, phase: str) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the index of ``phase``'s largest stage (the first on ties) and its bytes, of
    the actor alone (:func:`argmax_rows`, kept: :func:`actor_reduction`)."""
    return actor_reduction(actor, f"largest_{phase}",
                           lambda: argmax_rows(actor["phases"][phase]))


def actor_reduction(actor: dict, name: str, compute) -> tuple | np.ndarray:
    """``compute()``, a reduction of ``actor``'s own per-stage bytes (no rollout column read),
    kept in ``actor["reduced"]`` under ``name`` and computed once: the plans that share an
    actor evaluation (``actor_memory(reduced=True)``: the text table's filled-GPU plan, a
    sizing sweep's GPU types) reduce the same arrays.  The kept arrays are read-only, so no
    caller can change them for another.  An actor memory without ``reduced``
    (:func:`actor_memory`'s own) keeps nothing."""
    reduced = actor.get("reduced")
    if reduced is None:
        return compute()
    if name not in reduced:
        value = compute()
        for array in value if isinstance(value, tuple) else (value,):
            array.flags.writeable = False
        reduced[name] = value
    return reduced[name]


def pick_utilization(wanted_fraction, resident_bytes, capacity: float,
                     ceiling: float) -> np.ndarray:
    """``gpu_memory_utilization`` for a pool of ``wanted_fraction`` of the GPU beside
    ``resident_bytes``: rounded up to 0.05, at least 0.30, never more than keeps the resident
    state plus the pool below ``ceiling`` of the GPU (the memory band's top) nor beyond the
    5% left free beside the pool, nor above 0.90."""
    wanted = np.ceil(_f(wanted_fraction) / UTILIZATION_STEP - 1e-9) * UTILIZATION_STEP
    free = min(ceiling, 1 - ROLLOUT_HEADROOM_FRACTION) - resident_bytes / capacity
    room = np.floor(free / UTILIZATION_STEP + 1e-9) * UTILIZATION_STEP
    return np.clip(np.minimum(np.maximum(wanted, UTILIZATION_MIN), room),
                   UTILIZATION_STEP, UTILIZATION_MAX)


def rollout_memory(request: PlanRequest, cols: Columns, resident_bytes: np.ndarray,
                   utilization: np.ndarray | None = None) -> Columns:
    """The rollout engine beside ``resident_bytes`` of actor and reference state.

    vLLM claims ``gpu_memory_utilization * capacity`` (its v1 engine refuses to start when that
    much is not free) and fills what its weights and profiled activations leave with KV cache.
    With ``utilization=None`` it is picked (:func:`pick_utilization`): enough KV for the
    replica's whole batch (at most ``max_num_seqs`` running), kept with the resident state
    below the request's memory policy's band top; where that leaves no room for one sequence,
    as much as fits beside the resident state.  (:func:`rollout_memory_of_terms` of the rollout
    layouts' own terms, :func:`rollout_layout_terms`.)
    """
    return rollout_memory_of_terms(request, rollout_layout_terms(request, cols), resident_bytes,
                                   utilization)


def rollout_layout_terms(request: PlanRequest, cols: Columns) -> dict:
    """What :func:`rollout_memory` reads of the rollout layouts ``cols`` alone (their rollout
    TP/DP/EP; no resident bytes nor utilization): the weights, the reserve, the K/V bytes per
    token, the tokens of each sequence, the sequences each attention rank holds, and the
    fractions of the GPU a whole batch's pool and one sequence's take.  Per layout: a caller
    that prices a few layouts beside many resident sizes finds them once per layout."""
    model, cluster, workload = request.model, request.cluster, request.workload
    engine = engine_of(workload)
    capacity = float(cluster.gpu.memory_bytes)
    seq = workload.sequence_length
    weights = rollout_weight_bytes(model, cols, workload) + drafter_rollout_bytes(model, cols,
                                                                                   workload)
    reserve = rollout_reserve_bytes(model, cols, workload)
    kv_per_token = kv_bytes_per_token(model, cols, workload)
    state_tokens = sequence_state_tokens(model, cols, workload, seq)
    if lookahead_tokens(workload):
        # speculative decoding: the drafter's K/V joins the pool (tokens now count both), and
        # each sequence reserves its drafted tokens' slots (speculative.py)
        target_per_token = kv_per_token
        kv_per_token = target_per_token + drafter_kv_per_token(model, cols, workload)
        state_tokens = (state_tokens * target_per_token / kv_per_token
                        + lookahead_tokens(workload))
    kv_per_seq = kv_tokens_per_sequence(workload) + state_tokens
    replicas = np.maximum(cluster.num_gpus // (cols["rollout_tp"] * cols["rollout_dp"]), 1)
    seqs_per_replica = -(-workload.sequences_per_step // replicas)
    # Attention-DP ranks of one replica each hold the KV cache of their own sequences.
    seqs_per_attention_rank = -(-seqs_per_replica // cols["rollout_dp"])
    wanted_kv = (np.minimum(seqs_per_attention_rank, engine.max_num_seqs) * kv_per_seq
                 * kv_per_token)
    return {"weights": weights, "reserve": reserve, "kv_per_token": kv_per_token,
            "state_tokens": state_tokens, "kv_per_seq": kv_per_seq,
            "seqs_per_attention_rank": seqs_per_attention_rank,
            "wanted": (weights + reserve + wanted_kv) / capacity,
            "one_seq": (weights + reserve + kv_per_seq * kv_per_token) / capacity}


def rollout_memory_of_terms(request: PlanRequest, terms: Mapping, resident_bytes: np.ndarray,
                            utilization: np.ndarray | None = None) -> Columns:
    """:func:`rollout_memory` from the rollout layouts' ``terms`` (:func:`rollout_layout_terms`)
    beside ``resident_bytes``.  Element by element, so terms of shape ``(layouts, 1)`` beside
    resident bytes of shape ``(1, sizes)`` give every layout beside every size, ``(layouts,
    sizes)``, the same values as the repeated rows (a column no size changes keeps its
    ``(layouts, 1)`` shape)."""
    model, workload = request.model, request.workload
    ceiling = request.policy.high
    engine = engine_of(workload)
    capacity = float(request.cluster.gpu.memory_bytes)
    seq = workload.sequence_length
    weights, reserve = terms["weights"], terms["reserve"]
    kv_per_token, state_tokens = terms["kv_per_token"], terms["state_tokens"]
    kv_per_seq = terms["kv_per_seq"]
    seqs_per_attention_rank = terms["seqs_per_attention_rank"]
    if utilization is None:
        wanted = terms["wanted"]
        utilization = pick_utilization(wanted, resident_bytes, capacity, ceiling)
        # Below the band's top there may be no room for one sequence: then the pool takes what
        # fits (the layout is over the band, and ranked after those inside it).
        starved = np.round(utilization, 2) < terms["one_seq"] - 1e-9
        if ceiling < 1 - ROLLOUT_HEADROOM_FRACTION and starved.any():
            filled = pick_utilization(wanted, resident_bytes, capacity,
                                      1 - ROLLOUT_HEADROOM_FRACTION)
            utilization = np.where(starved, filled, utilization)
    utilization = np.round(_f(utilization), 2)
    budget = utilization * capacity
    kv_cache = np.maximum(budget - weights - reserve, 0)
    kv_tokens = np.floor(kv_cache / kv_per_token)
    concurrent = np.minimum(np.floor(kv_tokens / kv_per_seq), engine.max_num_seqs)
    # The KV blocks of the sequences that run at once (a rank never runs more than it has).
    kv_in_use = np.minimum(concurrent, seqs_per_attention_rank) * kv_per_seq * kv_per_token
    return {
        "gpu_memory_utilization": utilization,
        "rollout_budget_bytes": budget,
        # vLLM loads its weights and profiles its forward before it sizes the KV cache from the
        # budget (vllm/v1/worker/gpu_worker.py, determine_available_memory); a budget below
        # them stops it ("No available memory for the cache blocks") with them already on the
        # GPU, so the generate phase holds at least the weights and the reserve.
        "mem_generate_bytes": resident_bytes + np.maximum(budget, weights + reserve),
        "rollout_weights_bytes": weights,
        "rollout_working_bytes": weights + reserve + np.minimum(kv_in_use, kv_cache),
        "kv_cache_bytes": kv_cache,
        "kv_cache_tokens_per_gpu": kv_tokens,
        # no K/V grows per token (every window shorter than the sequence, or attention-free):
        # the pool above, and every sequence's state, count bytes (sequence_state_tokens)
        "kv_pool_in_bytes": np.zeros(np.shape(kv_tokens), dtype=bool) | (model.kv_layers == 0),
        "rollout_concurrent_seqs": concurrent,
        "rollout_seqs_per_rank": _f(seqs_per_attention_rank),
        # Rounds of generation a rank needs when its sequences exceed what runs at once.
        "rollout_waves": np.where(concurrent > 0,
                                  np.ceil(seqs_per_attention_rank / np.maximum(concurrent, 1)),
                                  np.inf),
        "kv_state_tokens_per_seq": state_tokens,
        "rollout_fits": (kv_tokens >= seq + state_tokens) & (resident_bytes + budget <= capacity),
    }


def _rollout_memory_once(request: PlanRequest, cols: Columns, resident_bytes: np.ndarray,
                         utilization: np.ndarray | None, period: int = 0) -> Columns:
    """:func:`rollout_memory` evaluated once per distinct (rollout TP, DP, EP, utilization,
    resident bytes) and spread over the rows: it reads nothing else of a row, and a plan's
    rows hold few such combinations (DeepSeek-V3 on 1,024 GPUs: about 6,000 in 1.6 million
    rows).  The same values, row by row.  ``period`` (> 0): the rows are (core row, knob
    combination) cells in order, ``period`` combinations wide, so a row likely repeats the
    one ``period`` before (the same knobs of the core row before: its layout's next batch or
    recompute choice, which the resident bytes and the rollout do not read); only the
    others are hashed (:func:`planner.search.layout.distinct_pair`'s ``period``, the same
    distinct pairs in the same order)."""
    if np.isnan(resident_bytes).any() or (utilization is not None
                                          and np.isnan(_f(utilization)).any()):
        return rollout_memory(request, cols, resident_bytes, utilization)  # NaN: no hashing
    tp, dp, ep = (np.asarray(cols[name], dtype=np.int64)
                  for name in ("rollout_tp", "rollout_dp", "rollout_ep"))
    fraction, fractions = None, 1
    if utilization is not None:
        _, fraction = distinct(_f(utilization))
        fractions = int(fraction.max(initial=0)) + 1
    # distinct_pair reads only which rows are equal: any code one-to-one with the row's
    # (TP, DP, EP, utilization) serves, here their mixed-radix number (exact as a float
    # below 2**53), else their coding by first appearance
    sizes = [int(values.max(initial=0)) + 1 for values in (dp, ep)]
    if (min(tp.min(initial=0), dp.min(initial=0), ep.min(initial=0)) >= 0
            and (int(tp.max(initial=0)) + 1) * sizes[0] * sizes[1] * fractions < 1 << 53):
        layout = (tp * sizes[0] + dp) * sizes[1] + ep
    else:
        _, layout = distinct((tp << 42) + (dp << 21) + ep)  # each below 2**21 GPUs
    code = layout if fraction is None else layout * fractions + fraction
    first, inverse = distinct_pair(resident_bytes, code, period)
    few = {name: tp_dp_ep[first] for name, tp_dp_ep in
           zip(("rollout_tp", "rollout_dp", "rollout_ep"), (tp, dp, ep))}
    out = rollout_memory(request, few, _f(resident_bytes)[first],
                         None if utilization is None else _f(utilization)[first])
    spread = DeferredColumns()  # each column spread when read (a plan's chunk reads few)
    for name, values in out.items():
        spread.defer(name, partial(np.take, values, inverse, axis=0))
    return spread


def argmax_rows(arrays) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the index of the largest of ``arrays`` (the first on ties) and its value:
    ``np.argmax(np.stack(arrays), axis=0)`` without the strided pass over the stack (a NaN is
    never larger, as there)."""
    best = np.array(arrays[0], dtype=np.result_type(*arrays))
    index = np.zeros(best.shape, dtype=np.int64)
    for i, values in enumerate(arrays[1:], start=1):
        larger = values > best
        np.copyto(index, i, where=larger)
        np.copyto(best, values, where=larger)
    return index, best


def max_rows(arrays) -> np.ndarray:
    """Per row, the largest of ``arrays``: ``np.max(arrays, axis=0)`` (NaN propagating, as
    there) without stacking the arrays into one first."""
    return reduce(np.maximum, arrays[1:], np.asarray(arrays[0]))


def _term_at(term, at):
    """``term`` at the rows ``at`` (a number: itself)."""
    return term if np.ndim(term) == 0 else term[at]


def _lifted(stage: np.ndarray, lift: tuple, at) -> np.ndarray:
    """``stage + lift[0] - lift[1] ...`` (each of ``lift`` taken at ``at``, a row index or
    ``slice(None)``), left to right."""
    out = stage + _term_at(lift[0], at)
    for subtracted in lift[1:]:
        out = out - _term_at(subtracted, at)
    return out


def _joined_largest(stages: list, lift: tuple, top: np.ndarray | None) -> tuple:
    """(stage index, bytes) of a joined phase's largest stage per row, the engine's ``lift``
    applied to each stage (:func:`_lifted`: its bytes added, and for the generate phase the
    actor's resident bytes, ``top``, subtracted): :func:`argmax_rows` of the lifted stages.
    The index is a function of the rows read (:func:`_peak_stage` reads it on the rows whose
    peak is this phase alone).  ``top``: ``max_rows(stages)`` when already found.

    The bytes are the lifted largest stage where that is exact: adding a finite number and
    subtracting the finite largest stage are monotone in a float, so the largest lifted stage
    is the lifted largest; the added bytes never -0.0, no lifted value is -0.0 (``x + a`` is
    -0.0 only if both are, ``y - t`` only if ``y`` is -0.0), so equal lifted values have
    equal bits.  A NaN or an infinity in the largest stage or the added bytes, a -0.0 or a
    negative added byte count, or a subtracted term other than ``top``: every stage lifted
    (``argmax_rows``' NaN rule)."""
    top = stages_max(stages) if top is None else top
    exact = (all(term is top for term in lift[1:]) and bool(np.isfinite(top).all())
             and bool(np.isfinite(lift[0]).all()) and not bool(np.signbit(lift[0]).any()))
    if not exact:
        index, value = argmax_rows([_lifted(stage, lift, slice(None)) for stage in stages])
        return partial(np.take, index), value
    largest = _lifted(top, lift, slice(None))
    return partial(_lifted_argmax, stages, lift, largest), largest


def _lifted_argmax(stages: list, lift: tuple, largest: np.ndarray, rows: np.ndarray
                   ) -> np.ndarray:
    """:func:`argmax_rows`' index of the lifted ``stages`` on ``rows`` alone, ``largest``
    their largest (:func:`_joined_largest`'s exact bytes, no NaN): the first stage that
    equals it (the last one left uncomputed: one does).  Each element the same operations
    on the same values as on every row."""
    lift = tuple(_term_at(term, rows) for term in lift)  # gathered once for every stage
    largest = np.take(largest, rows)
    index = np.full(len(rows), len(stages) - 1, dtype=np.int64)
    at = _stages_at(stages, rows, len(stages) - 1)
    for stage in reversed(range(len(stages) - 1)):
        np.copyto(index, stage, where=_lifted(at[stage], lift, slice(None)) == largest)
    return index


def _peak_stage(peak_phase: np.ndarray, indices: list) -> np.ndarray:
    """Per row, ``indices[peak_phase]``'s stage index at that row (``np.choose`` of the
    phases' indices; each index a function of the rows read: a phase's read on its peak rows
    alone)."""
    out = np.zeros(len(peak_phase), dtype=np.int64)
    for phase, index in enumerate(indices):
        rows = np.flatnonzero(peak_phase == phase)
        if len(rows):
            out[rows] = index(rows)
    return out


def estimate_memory(request: PlanRequest, cols: Columns, pick_utilization: bool = False,
                    actor: dict | None = None, deferred: bool = False) -> Columns:
    """Memory columns for every layout in ``cols`` (bytes unless named otherwise).

    Per phase two quantities (:mod:`planner.policy`): ``mem_<phase>_bytes``, what nvidia-smi
    shows (reserved pool with fragmentation, CUDA context, NCCL buffers, vLLM's whole pool),
    and ``alloc_<phase>_bytes``, the allocated working set (the tensors alone; in generate the
    KV blocks of the sequences running at once).  ``peak_bytes`` is the largest of the first.

    ``pick_utilization``: choose ``gpu_memory_utilization`` per layout (see
    :func:`rollout_memory`, below the memory policy's band top) instead of reading it from
    ``cols``.  ``deferred``: returned as a :class:`planner.cost.deferred.DeferredColumns`
    whose columns no fit or peak reads (the working sets, the peak stage and its parts, most
    of the rollout engine's) are computed when first read (a plan's scoring chunk reads few);
    else a dict of every column.  The same values either way.
    """
    cluster, workload = request.cluster, request.workload
    capacity = float(cluster.gpu.memory_bytes)
    # ``actor``: a result of actor_memory for these rows (it ignores the rollout columns), as the
    # search space computed it while choosing the rollout.
    actor = actor or actor_memory(request, cols)
    if "cells" in actor:  # held per cell (a plan's shared evaluation): its arrays for cols
        actor = actor_rows(actor, slice(None))
    phase_stages = dict(actor["phases"])
    resident = actor_resident_bytes(actor)
    # (the deferred columns' functions read these mappings, never ``out``: no reference cycle
    # keeps a chunk's columns alive after its last read)
    rollout = _rollout_memory_once(request, cols, resident,
                                   None if pick_utilization else cols["gpu_memory_utilization"],
                                   actor["parts"].cell_period)
    out = DeferredColumns()
    out.update_from(rollout)
    # per joined phase, what the engine adds to each of its stages: ``stage + a[0] - a[1]...``
    # (the generate phase: the engine's pool beside the actor's resident bytes)
    lifts = {"generate": (out["mem_generate_bytes"], resident)}
    # per phase, the rollout column its working set adds to the actor's (on its largest stage)
    added = {"generate": "rollout_working_bytes"}
    if engine_of(workload).free_cache_engine:
        # vLLM wakes its weights for the sync (sleep level 2 drops them otherwise).
        lifts["weight_sync"] = (out["rollout_weights_bytes"],)
        added["weight_sync"] = "rollout_weights_bytes"
    else:
        # Without sleep mode the engine keeps its whole budget through training.
        for phase in TRAINING_PHASES:
            lifts[phase] = (out["rollout_budget_bytes"],)
            added[phase] = "rollout_budget_bytes"
    joined = engine_phases(workload)
    # the other phases' largest stage is the actor's own: reduced once per actor evaluation
    worst = {phase: _joined_largest(phase_stages[phase], lifts[phase],
                                    resident if phase == "generate" else None)
             if phase in joined else _largest_stage(actor, phase) for phase in PHASES}
    phases = {phase: worst[phase][1] for phase in PHASES}
    # The phases the workload runs set the peak (a pretraining step has only the update).
    zero = np.zeros_like(phases["update_actor"])
    out["peak_phase"], out["peak_bytes"] = argmax_rows(
        [phases[p] if p in workload.phases else zero for p in PHASES])
    peak = DeferredColumns()
    peak.defer("peak_stage", partial(_peak_stage, out["peak_phase"], [
        worst[p][0] if p in joined else partial(np.take, worst[p][0]) for p in PHASES]))
    out.update_from(peak)
    if "generate" not in workload.phases:
        out["rollout_fits"] = np.ones_like(out["rollout_fits"])
    for phase in PHASES:
        out[memory_column(phase)] = phases[phase]
        out.defer(working_set_column(phase),
                  partial(_working_set, actor["allocated"], rollout, (phase, added.get(phase))))
    for part in ("weights", "grads", "optimizer", "train_activations", "train_logits",
                 "ref_weights"):
        out.defer(part_column(part), partial(_peak_part, actor["parts"], peak, part))
    # Host memory: every GPU of a node runs one worker; the busiest stage sets the node.
    host_per_gpu = actor_host_bytes(actor)
    gpus_per_node = min(cluster.gpus_per_node, cluster.num_gpus)
    out["host_bytes_per_gpu"] = host_per_gpu
    out["host_bytes_per_node"] = host_per_gpu * gpus_per_node + HOST_NODE_BYTES
    out["host_fits"] = out["host_bytes_per_node"] <= cluster.host_memory_per_node_bytes
    out["memory_utilization"] = out["peak_bytes"] / capacity
    out["fits"] = (out["peak_bytes"] <= capacity) & out["rollout_fits"] & out["host_fits"]
    return out if deferred else dict(out)


def _working_set(allocated: Mapping, rollout: Mapping, phase_added: tuple) -> np.ndarray:
    """``phase``'s allocated working set: the actor's on its largest stage (``allocated``)
    plus the rollout engine's column ``added`` (None: nothing added)."""
    phase, added = phase_added
    return allocated[phase] if added is None else allocated[phase] + rollout[added]


def _peak_part(parts: ActorParts, peak: Mapping, part: str) -> np.ndarray:
    """Per row, ``part`` on the row's peak stage (``peak["peak_stage"]``)."""
    return parts.pick(part, peak["peak_stage"])
