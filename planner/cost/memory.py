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

from dataclasses import dataclass

import numpy as np

from planner.catalog.hardware import ClusterSpec
from planner.catalog.models import ModelSpec
from planner.catalog.workload import GrpoWorkload
from planner.cost.columns import memory_column, part_column
from planner.phases import PHASES
from planner.search.layout import Columns
from planner.search.rules import micro_batches_per_mini_batch, pipeline_split
from planner.units import GIB, MIB

# --- bytes per element ----------------------------------------------------------------------
WEIGHT_BYTES = 2  # bf16 parameters (Megatron mixed precision)
MAIN_GRAD_BYTES = 4  # fp32 main gradients (Megatron formula's 6 = 2 + 4)
OPTIMIZER_BYTES = 12  # fp32 master weight + Adam exp_avg + exp_avg_sq
ACTIVATION_BYTES = 2  # bf16 activations
ROUTER_LOGIT_BYTES = 4  # fp32 router (moe_router_dtype=fp32; megatron-core's default is bf16)
TOKEN_ID_BYTES = 8  # int64 input ids (Megatron formula's "8 * s * b")
# verl's vocab-parallel log-prob (verl/utils/megatron/tensor_parallel.py): bf16 logits (2) upcast
# to fp32 for log-softmax (4); the actor's old-log-prob pass also computes entropy (+4, fp32
# softmax); training keeps the fp32 copy for backward and adds its fp32 gradient (+4).
LOGITS_TRAIN_BYTES = 2 + 4 + 4
LOGITS_ACTOR_FORWARD_BYTES = 2 + 4 + 4
LOGITS_REF_FORWARD_BYTES = 2 + 4
KV_CACHE_BYTES = 2  # bf16 KV cache in the rollout engine

# --- fixed overheads ----------------------------------------------------------------------------
CUDA_CONTEXT_BYTES = 600 * MIB  # CUDA context + cuBLAS/cuDNN workspaces, outside PyTorch's pool
NCCL_BUFFER_BYTES = 1 * GIB  # NCCL channel buffers over the TP/PP/DP/CP/EP communicators
FRAGMENTATION_FRACTION = 0.10  # caching-allocator fragmentation on top of transient tensors
ROLLOUT_RESERVE_BYTES = 3 * GIB  # vLLM's profiled activation peak + CUDA graphs inside its budget
WEIGHT_SYNC_BUCKET_BYTES = 512 * MIB  # verl's bucketed actor->rollout weight transfer
# gpu_memory_utilization the planner picks: enough KV cache for the replica's whole batch,
# rounded up to this step, between these bounds.
UTILIZATION_STEP = 0.05
UTILIZATION_MIN = 0.30
UTILIZATION_MAX = 0.90
# Left free beside the rollout budget for what neither PyTorch's pool nor vLLM's budget counts
# (vLLM's NCCL communicators and CUDA-graph pools, the Ray worker's own context).
ROLLOUT_HEADROOM_FRACTION = 0.05


def _f(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


# Pipeline ranks the model evaluates: the ends hold the embedding or the output layer and the
# log-prob buffers; the ranks next to them hold the most in-flight activations of a middle
# stage (rank 1) or the most MoE layers (rank pp-2, past any leading dense layers).  The worst
# rank of a pipeline is always one of these four.
STAGES = ("first", "last", "second", "second-to-last")


@dataclass(frozen=True)
class RankLayers:
    """What one pipeline rank holds, per layout: layer counts and which ends it carries."""

    dense: np.ndarray
    moe: np.ndarray
    rank: np.ndarray  # pipeline rank, for the in-flight micro-batch count
    embedding: np.ndarray  # bool: holds the input embedding
    head: np.ndarray  # bool: holds the output layer, final norm and the loss


def rank_layers(model: ModelSpec, cols: Columns) -> list[RankLayers]:
    """The four representative ranks of :data:`STAGES` (ranks 1 and pp-2 repeat the ends when
    PP <= 2)."""
    pp = cols["pp"]
    first, middle, last, _ = pipeline_split(model.num_layers, pp, cols.get("first_stage_layers"),
                                            cols.get("last_stage_layers"))
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
                                  for f in ("dense", "moe", "rank", "embedding", "head"))))
    return ranks


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
    out = []
    for r in ranks or rank_layers(model, cols):
        split = (r.dense * (p.dense_layer - p.dense_layer_replicated)
                 + r.moe * (p.moe_layer_non_expert - p.moe_layer_replicated)
                 + np.where(r.embedding, p.embedding, 0) + np.where(r.head, head_params, 0))
        replicated = (r.dense * p.dense_layer_replicated + r.moe * p.moe_layer_replicated
                      + np.where(r.head, p.final_norm, 0))
        out.append((split / tp + replicated, r.moe * p.experts_per_layer / expert_shards))
    return out


def static_bytes_all(model: ModelSpec, cluster: ClusterSpec, cols: Columns,
                     ranks: list[RankLayers] | None = None):
    """Weights, main grads and optimizer state on a rank of each of :data:`STAGES`."""
    dense_shards = np.where(cols["distributed_optimizer"], cols["dp"] * cols["cp"], 1)
    # megatron-core treats expert weights as expert-parallel (sharded over the expert DP group
    # world/(ETP*EP*PP)) only when EP > 1; with EP = 1 they are dense and follow DP*CP.
    expert_dp = np.where(cols["ep"] > 1,
                         cluster.num_gpus // (cols["etp"] * cols["ep"] * cols["pp"]),
                         cols["dp"] * cols["cp"])
    expert_shards = np.where(cols["distributed_optimizer"], np.maximum(expert_dp, 1), 1)
    out = []
    for non_expert, expert in actor_params_per_gpu(model, cols, ranks):
        params = non_expert + expert
        optimizer = OPTIMIZER_BYTES * (non_expert / dense_shards + expert / expert_shards)
        out.append((WEIGHT_BYTES * params, MAIN_GRAD_BYTES * params, optimizer))
    return out


def activation_bytes_per_layer(model: ModelSpec, cols: Columns, tokens: np.ndarray,
                               moe: bool, recompute: np.ndarray | int = 0,
                               hidden_dropout: bool = False) -> np.ndarray:
    """Bytes one layer keeps for backward for ``tokens`` tokens (per CP rank) on one GPU.

    Korthikanti et al. 2022 §4.1, term by term (bf16 = 2 bytes per element):
    replicated over TP unless sequence parallel: LN1 input 2h, QKV input 2h, LN2 input 2h,
    MLP input 2h (+ dropout masks h each when dropout is on);
    split over TP: Q, K, V 2(hq+hk+hv), attention output 2*ho, MLP activation input
    2*ffn (x2 gated), second linear input 2*ffn.  MHA + 4h GeLU MLP + dropout: 34*s*b*h.
    ``recompute``: 0 none, 1 selective (layernorm and expert activation recomputed), 2 full
    (only the layer input is kept; the recomputed layer's working set is added by the caller).
    """
    h = model.hidden_size
    tp = _f(cols["tp"])
    sp_shards = np.where(cols["sequence_parallel"].astype(bool) & (cols["tp"] > 1), tp, 1.0)
    recompute = np.asarray(recompute)
    selective = recompute == 1
    tokens = _f(tokens)
    if model.is_mla:
        qk_head = model.qk_nope_head_dim + model.qk_rope_head_dim
        hq = hk = model.num_attention_heads * qk_head
        hv = ho = model.num_attention_heads * model.v_head_dim
        # compressed q and kv latents are computed before the TP split
        latents = ACTIVATION_BYTES * (model.q_lora_rank + model.kv_lora_rank
                                      + model.qk_rope_head_dim)
    else:
        hq = ho = model.num_attention_heads * model.head_dim
        hk = hv = model.num_query_groups * model.head_dim
        latents = 0
    gated = 2 if model.gated_mlp else 1
    dropout_masks = 2 * h if hidden_dropout else 0  # 1 byte per element, two masks
    ln_outputs = np.where(selective, 0, 2 * ACTIVATION_BYTES * h)  # QKV and MLP inputs
    replicated = 2 * ACTIVATION_BYTES * h + ln_outputs + dropout_masks  # LN inputs + LN outputs
    attention_split = ACTIVATION_BYTES * (hq + hk + hv + ho)
    per_token = replicated / sp_shards + latents + attention_split / tp
    if moe:
        k, f = model.moe_top_k, model.moe_ffn_hidden_size
        # Router on the sequence-parallel shard: fp32 logits over all experts.
        per_token = per_token + ROUTER_LOGIT_BYTES * model.num_experts / sp_shards
        # Balanced routing: each rank processes k expert slots per local token; with ETP the
        # tokens are gathered over ETP and the expert FFN is split, so FFN terms are unchanged.
        etp = _f(cols["etp"])
        act_output = np.where(selective, 0, ACTIVATION_BYTES * f)  # moe_act recompute
        routed = k * (ACTIVATION_BYTES * h * etp + ACTIVATION_BYTES * gated * f + act_output
                      + ACTIVATION_BYTES * h) / sp_shards
        fs = model.shared_expert_ffn_hidden_size
        shared = ACTIVATION_BYTES * (gated * fs + fs) / tp
        per_token = per_token + routed + shared
    else:
        f = model.ffn_hidden_size
        per_token = per_token + ACTIVATION_BYTES * (gated * f + f) / tp
    full = recompute == 2
    layer_input = ACTIVATION_BYTES * h / sp_shards
    return tokens * np.where(full, layer_input, per_token)


def _layer_activations(model, cols, tokens, dense_layers, moe_layers, recompute):
    per_dense = activation_bytes_per_layer(model, cols, tokens, moe=False, recompute=recompute)
    total = dense_layers * per_dense
    if model.is_moe:
        per_moe = activation_bytes_per_layer(model, cols, tokens, moe=True, recompute=recompute)
        total = total + moe_layers * per_moe
    return total


def _working_set(model, cols, tokens, dense_layers, moe_layers):
    """One layer's full activations: what recompute or a forward-only pass holds at a time."""
    dense = np.where(dense_layers > 0, activation_bytes_per_layer(model, cols, tokens, False), 0)
    if not model.is_moe:
        return dense
    moe = np.where(moe_layers > 0, activation_bytes_per_layer(model, cols, tokens, True), 0)
    return np.maximum(dense, moe)


def in_flight_stage_equivalents(cols: Columns, m: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Micro-batches' worth of a stage's layers held by pipeline rank ``rank`` (megatron-core
    1F1B and interleaved warm-up, ``pipeline_parallel/schedules.py``)."""
    pp, vpp = cols["pp"], cols["vpp"]
    plain = np.minimum(pp - rank, m)
    chunks = np.minimum(2 * (pp - rank - 1) + (vpp - 1) * pp + 1, m * vpp)
    return _f(np.where(vpp > 1, chunks / vpp, plain))


def rollout_weight_bytes(model: ModelSpec, cols: Columns) -> np.ndarray:
    """Rollout weights per GPU: attention and dense parts split by TP, experts by EP (if on)."""
    p = model.params
    non_expert = p.total - p.experts
    expert_shards = np.where(cols["rollout_ep"] > 1, cols["rollout_ep"], cols["rollout_tp"])
    return WEIGHT_BYTES * (non_expert / _f(cols["rollout_tp"]) + p.experts / _f(expert_shards))


def kv_bytes_per_token(model: ModelSpec, cols: Columns) -> np.ndarray:
    """KV cache per token per GPU.  MLA caches the compressed latent (kv_lora + rope dims),
    the same on every TP rank (vLLM's MLA backend); GQA splits KV heads over TP and replicates
    them when TP exceeds the KV heads."""
    if model.is_mla:
        per_layer = KV_CACHE_BYTES * (model.kv_lora_rank + model.qk_rope_head_dim)
        return np.full(len(cols["rollout_tp"]), float(model.num_layers * per_layer))
    heads_per_gpu = np.maximum(model.num_query_groups // cols["rollout_tp"], 1)
    return _f(model.num_layers * 2 * heads_per_gpu * model.head_dim * KV_CACHE_BYTES)


def actor_memory(model: ModelSpec, cluster: ClusterSpec, workload: GrpoWorkload,
                 cols: Columns) -> dict:
    """Per-phase bytes of everything but the rollout engine's own budget, per pipeline stage.

    Returns ``{"phases": {phase: [one array per STAGES entry]}, "stages": [...]}``, where a
    stage dict holds its weights, grads, optimizer, activation and logits bytes.
    """
    seq = workload.sequence_length
    m = micro_batches_per_mini_batch(workload, cols)
    fixed = CUDA_CONTEXT_BYTES + NCCL_BUFFER_BYTES
    recompute = cols["recompute"]
    train_tokens = _f(cols["micro_batch"] * seq) / cols["cp"]
    vocab_split = _f(model.vocab_size) / cols["tp"]
    param_off = cols["param_offload"].astype(bool)
    optim_off = cols["optimizer_offload"].astype(bool)
    ref_off = cols["ref_param_offload"].astype(bool)
    frag = 1 + FRAGMENTATION_FRACTION
    stages, phases = [], {phase: [] for phase in PHASES}
    all_ranks = rank_layers(model, cols)
    static = static_bytes_all(model, cluster, cols, all_ranks)
    for ranks, (weights, grads, optimizer) in zip(all_ranks, static):
        dense_layers, moe_layers = ranks.dense, ranks.moe
        in_flight = in_flight_stage_equivalents(cols, m, ranks.rank)
        kept = _layer_activations(model, cols, train_tokens, dense_layers, moe_layers, recompute)
        working = _working_set(model, cols, train_tokens, dense_layers, moe_layers)
        is_first, is_last = ranks.embedding, ranks.head
        embedding_inputs = np.where(is_first, TOKEN_ID_BYTES * train_tokens * in_flight, 0)
        s = dict(weights=weights, grads=grads, optimizer=optimizer)
        s["train_activations"] = (kept * in_flight + np.where(recompute == 2, working, 0)
                                  + embedding_inputs)
        s["train_logits"] = np.where(is_last, train_tokens * vocab_split * LOGITS_TRAIN_BYTES, 0)
        # Forward-only passes keep one layer's working set and the layer input at a time.
        forward = working + ACTIVATION_BYTES * model.hidden_size * train_tokens
        actor_logits = np.where(is_last, train_tokens * vocab_split * LOGITS_ACTOR_FORWARD_BYTES, 0)
        ref_logits = np.where(is_last, train_tokens * vocab_split * LOGITS_REF_FORWARD_BYTES, 0)
        # The reference has the actor's parallel sizes: the same shard of the same weights.
        # Without a KL loss verl builds no reference model.
        s["ref_weights"] = np.where(ref_off | (not workload.use_kl_loss), 0, weights)
        kept_grads = np.where(param_off, 0, grads)
        kept_optimizer = np.where(optim_off, 0, optimizer)
        s["resident_in_rollout"] = (np.where(param_off, 0, weights) + kept_grads
                                    + kept_optimizer + s["ref_weights"] + fixed)
        # verl loads offloaded params and optimizer state back before the update.
        phases["update_actor"].append(weights + grads + optimizer + s["ref_weights"]
                                      + frag * (s["train_activations"] + s["train_logits"])
                                      + fixed)
        phases["old_log_prob"].append(weights + kept_grads + kept_optimizer + s["ref_weights"]
                                      + frag * (forward + actor_logits) + fixed)
        phases["ref"].append(s["resident_in_rollout"] - s["ref_weights"] + weights
                             + frag * (forward + ref_logits))
        # Actor weights are on the GPU while they are copied into the rollout engine.
        phases["weight_sync"].append(weights + kept_grads + kept_optimizer + s["ref_weights"]
                                     + WEIGHT_SYNC_BUCKET_BYTES + fixed)
        phases["generate"].append(s["resident_in_rollout"])
        stages.append(s)
    return {"phases": phases, "stages": stages}


def rollout_memory(model: ModelSpec, cluster: ClusterSpec, workload: GrpoWorkload,
                   cols: Columns, resident_bytes: np.ndarray,
                   utilization: np.ndarray | None = None) -> Columns:
    """The rollout engine beside ``resident_bytes`` of actor and reference state.

    vLLM claims ``gpu_memory_utilization * capacity`` (its v1 engine refuses to start when that
    much is not free) and fills what its weights and profiled activations leave with KV cache.
    With ``utilization=None`` it is picked: enough KV for the replica's whole batch (at most
    ``max_num_seqs`` running), rounded up to 0.05, never more than fits beside the resident state.
    """
    capacity = float(cluster.gpu.memory_bytes)
    seq = workload.sequence_length
    weights = rollout_weight_bytes(model, cols)
    kv_per_token = kv_bytes_per_token(model, cols)
    replicas = np.maximum(cluster.num_gpus // (cols["rollout_tp"] * cols["rollout_dp"]), 1)
    seqs_per_replica = -(-workload.sequences_per_step // replicas)
    # Attention-DP ranks of one replica each hold the KV cache of their own sequences.
    seqs_per_attention_rank = -(-seqs_per_replica // cols["rollout_dp"])
    if utilization is None:
        wanted_kv = np.minimum(seqs_per_attention_rank, workload.max_num_seqs) * seq * kv_per_token
        wanted = (weights + ROLLOUT_RESERVE_BYTES + wanted_kv) / capacity
        wanted = np.ceil(wanted / UTILIZATION_STEP - 1e-9) * UTILIZATION_STEP
        free = (1 - ROLLOUT_HEADROOM_FRACTION) - resident_bytes / capacity
        room = np.floor(free / UTILIZATION_STEP + 1e-9) * UTILIZATION_STEP
        utilization = np.clip(np.minimum(np.maximum(wanted, UTILIZATION_MIN), room),
                              UTILIZATION_STEP, UTILIZATION_MAX)
    utilization = np.round(_f(utilization), 2)
    budget = utilization * capacity
    kv_cache = np.maximum(budget - weights - ROLLOUT_RESERVE_BYTES, 0)
    kv_tokens = np.floor(kv_cache / kv_per_token)
    concurrent = np.minimum(np.floor(kv_tokens / seq), workload.max_num_seqs)
    return {
        "gpu_memory_utilization": utilization,
        "mem_generate_bytes": resident_bytes + budget,
        "rollout_weights_bytes": weights,
        "kv_cache_bytes": kv_cache,
        "kv_cache_tokens_per_gpu": kv_tokens,
        "rollout_concurrent_seqs": concurrent,
        "rollout_seqs_per_rank": _f(seqs_per_attention_rank),
        # Rounds of generation a rank needs when its sequences exceed what runs at once.
        "rollout_waves": np.where(concurrent > 0,
                                  np.ceil(seqs_per_attention_rank / np.maximum(concurrent, 1)),
                                  np.inf),
        "rollout_fits": (kv_tokens >= seq) & (resident_bytes + budget <= capacity),
    }


def estimate_memory(model: ModelSpec, cluster: ClusterSpec, workload: GrpoWorkload,
                    cols: Columns, pick_utilization: bool = False,
                    actor: dict | None = None) -> Columns:
    """Memory columns for every layout in ``cols`` (bytes unless named otherwise).

    ``pick_utilization``: choose ``gpu_memory_utilization`` per layout (see
    :func:`rollout_memory`) instead of reading it from ``cols``.
    """
    capacity = float(cluster.gpu.memory_bytes)
    # ``actor``: a result of actor_memory for these rows (it ignores the rollout columns), as the
    # search space computed it while choosing the rollout.
    actor = actor or actor_memory(model, cluster, workload, cols)
    phase_stages = {phase: list(values) for phase, values in actor["phases"].items()}
    resident = np.max(phase_stages["generate"], axis=0)
    out = rollout_memory(model, cluster, workload, cols, resident,
                         None if pick_utilization else cols["gpu_memory_utilization"])
    phase_stages["generate"] = [stage + out["mem_generate_bytes"] - resident
                                for stage in phase_stages["generate"]]
    phase_stages["weight_sync"] = [stage + out["rollout_weights_bytes"]
                                   for stage in phase_stages["weight_sync"]]
    phases = {phase: np.max(phase_stages[phase], axis=0) for phase in PHASES}
    # The phases the workload runs set the peak (a pretraining step has only the update).
    ran = np.array([phase in workload.phases for phase in PHASES])
    peak_stack = np.stack([np.where(ran[i], phases[p], 0.0) for i, p in enumerate(PHASES)])
    out["peak_phase"] = peak_stack.argmax(axis=0)
    out["peak_bytes"] = peak_stack.max(axis=0)
    worst_stage = np.stack([np.argmax(phase_stages[p], axis=0) for p in PHASES])
    out["peak_stage"] = np.take_along_axis(worst_stage, out["peak_phase"][None], 0)[0]
    if "generate" not in workload.phases:
        out["rollout_fits"] = np.ones_like(out["rollout_fits"])
    for phase in PHASES:
        out[memory_column(phase)] = phases[phase]
    stages = actor["stages"]
    for part in ("weights", "grads", "optimizer", "train_activations", "train_logits",
                 "ref_weights"):
        out[part_column(part)] = np.choose(out["peak_stage"], [stage[part] for stage in stages])
    out["memory_utilization"] = out["peak_bytes"] / capacity
    out["fits"] = (out["peak_bytes"] <= capacity) & out["rollout_fits"]
    return out
