"""Step time of every GRPO phase and of a plain Megatron training step, vectorised over layouts.

Each term is a pure function of model, hardware, workload and layout, with its source named.
Efficiencies are few and fitted (:class:`Efficiency`, ``planner/cost/calibration.json``,
``benchmarks/calibrate.py``); nothing is tuned per model.

Training step (actor update, reference and old-log-prob forwards, pretraining):

* compute: FLOPs (:mod:`planner.cost.flops`) per GPU over
  ``peak * gemm * rows / (rows + half_rows)``,
  a saturating GEMM-efficiency curve in the rows (tokens) each GEMM sees — small micro-batches,
  CP, and MoE experts that receive few tokens run below peak (roofline-style, cf. Calculon,
  Isaev et al. 2023);
* backward = 2 x forward; full recompute adds a forward; selective adds a few percent;
* tensor parallelism with sequence parallelism: 2 all-gathers + 2 reduce-scatters of the
  ``T x h`` activation per layer forward, the same backward (Korthikanti et al. 2022 §4.2.2);
  ring time ``(t-1)/t * bytes / bandwidth``;
* context parallelism: ring exchange of K and V, ``(cp-1)`` chunks per layer (Liu et al. 2023,
  Ring Attention; megatron-core ``cp_comm_type=p2p``), mostly hidden behind attention;
* expert parallelism: all-to-all dispatch and combine of ``T * k`` token copies per MoE layer,
  forward and backward (megatron-core ``alltoall`` dispatcher);
* pipeline: ``(m + (pp-1)/vpp) * t_stage`` per optimizer step for 1F1B / interleaved 1F1B
  (Narayanan et al. 2021, §2.2: bubble fraction ``(pp-1)/(m*vpp)``), plus activation P2P;
* data parallelism with the distributed optimizer: reduce-scatter of fp32 gradients and
  all-gather of bf16 parameters per optimizer step over DP*CP (experts over expert-DP), partly
  overlapped with backward; the optimizer step itself is memory-bound (Adam reads and writes
  the fp32 master weight, m, v and the gradient of the local shard);
* RL trainers' passes (actor update, old/ref log-prob): the host waits for the GPU inside every
  micro-batch (verl's packed-sequence ``.tolist()``, the losses' ``.item()``), so it cannot run
  ahead of the GPU: a micro-batch takes at least the host's time to prepare and launch it, a
  fitted ``host_layer_s`` per layer on the stage (half for a forward-only pass,
  :func:`host_layer_s`) -- why many small fixed micro-batches cost more than a few dynamic ones
  of the same tokens;
* links: NVLink when a group fits in one NVLink domain (ranks ordered tp-cp-ep-dp-pp as
  megatron-core does), else the network.

Rollout (vLLM/SGLang, per replica of ``rollout_tp * rollout_dp`` GPUs):

* prefill is compute-bound: forward FLOPs of the prompts;
* decode is a roofline per step: max(weights + KV cache read at HBM bandwidth, FLOPs of the
  running batch), plus per layer TP all-reduces (latency-bound), expert-parallel dispatch and
  combine of the batch's token copies (network-bound once a replica spans nodes) and a fixed
  scheduling cost;
  MoE decode reads only the experts the batch touches, ``E * (1 - (1 - k/E)^b)`` of them;
* continuous batching: ``max(L, S * R_mean / c + (L - R_mean))`` decode steps for ``S``
  sequences at concurrency ``c`` (KV capacity or ``max_num_seqs``): the steady state plus the
  tail that waits for the longest response ``L`` (the expected maximum of ``S`` roughly
  exponential lengths, cut at ``R_max``) -- why rollout time barely falls when GPUs double;
* latency terms per decode step (fitted on published RL steps): kernel launches per layer
  (more for MoE layers; eager mode adds Python dispatch per kernel), the engine's scheduling,
  and with TP > 1 the broadcast of each step to the TP workers; DeepEP-class dispatch/combine
  latency per MoE layer with expert parallelism; a KV cache that cannot hold one longest
  sequence makes generation impossible (infinite time), never concurrency 1.

Weight sync: every rank gathers the full bf16 weights across the actor's model-parallel group,
then vLLM copies its shard in; verl does it tensor by tensor, so a per-tensor latency times the
checkpoint's tensor count (NeMo RL's bucketed refit: a smaller one); plus wake/sleep.
Offload (verl): parameters and optimizer state cross PCIe around the phases that need them;
gradient buffers are freed and re-zeroed, not copied.  verl leaves ``overlap_grad_reduce`` off,
so the actor update's DP traffic is exposed.  Fixed per-step costs (reward, data movement)
are booked with the weight sync.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import lru_cache
from typing import Callable

import numpy as np

from planner.catalog.hardware import ClusterSpec
from planner.catalog.layers import MlpKind
from planner.catalog.models import ModelSpec
from planner.catalog.workload import GrpoWorkload
from planner.cost.columns import TIME_PARTS, breakdown_column, time_column
from planner.cost.efficiency import Efficiency
from planner.cost.flops import (
    active_linear_params_per_token,
    decode_mixing_flops_per_token,
    linear_params_per_token,
    mixer_matmul_per_layer,
    mixing_flops_per_layer,
    mixing_flops_per_sequence,
    training_flops,
    verl_training_flops,
)
from planner.cost.layer_kinds import weight_sync_tensors
from planner.cost.memory import (
    MAIN_GRAD_BYTES,
    WEIGHT_BYTES,
    LayerActivations,
    actor_params_per_gpu,
    cpu_fraction,
    decode_cache_bytes,
    drafter_kv_per_token,
    drafter_rollout_bytes,
    engine_of,
    estimate_memory,
    rank_layers,
    rollout_weight_bytes,
)
from planner.cost.request import PlanRequest
from planner.cost.speculative import (
    decode_steps,
    drafter_step_flops,
    drafter_step_weight_bytes,
    mtp_is_moe,
    mtp_tensor_count,
    trains_mtp,
    verified_tokens,
)
from planner.phases import PHASES
from planner.search.batches import (
    log_prob_batches,
    mean_prompt_length,
    mean_response_length,
    update_batches,
)
from planner.search.layout import (
    Columns,
    distinct,
    rows_column,
    scalar_columns,
    share_rows,
    unique_rows,
)

SELECTIVE_RECOMPUTE_OVERHEAD = 0.03  # layernorm + activation recompute, of a forward pass
ADAM_BYTES_PER_PARAM = 4 * 2 * 3 + MAIN_GRAD_BYTES + WEIGHT_BYTES  # r/w master, m, v; grad; param
ALLREDUCE_LATENCY_NVLINK_S = 8e-6  # small-message NCCL all-reduce inside a node
ALLREDUCE_LATENCY_NETWORK_S = 30e-6  # ... across nodes
# Host Adam throughput of one GPU's worker (bytes of optimizer state streamed per second): a
# 2-socket DDR5 server sustains ~400-600 GB/s STREAM; shared by its 8 workers and at roughly
# half of STREAM for a fused AdamW, ~25 GB/s per worker (ZeRO-Offload, Ren et al. 2021, §4.1
# reports CPU-Adam at a similar order: ~1 B parameters per second per process).
HOST_ADAM_BYTES_PER_S = 25e9


def _f(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def gemm_efficiency(eff: Efficiency, rows) -> np.ndarray:
    rows = _f(rows)
    return eff.gemm * rows / (rows + eff.gemm_half_rows)


def link_bandwidth(cluster: ClusterSpec, eff: Efficiency, group_span) -> np.ndarray:
    """Bus bandwidth (bytes/s) of a collective over ``group_span`` consecutive ranks."""
    gpu = cluster.gpu
    inside = _f(group_span) <= cluster.fast_domain_gpus
    return np.where(inside, gpu.nvlink_bandwidth_bytes_per_s * eff.nvlink,
                    gpu.inter_node_bandwidth_bytes_per_s * eff.network)


def ring_time(bytes_per_gpu, group_size, bandwidth) -> np.ndarray:
    """All-gather / reduce-scatter time of a ring over ``group_size`` ranks."""
    group = _f(group_size)
    return np.where(group > 1, (group - 1) / group * _f(bytes_per_gpu) / bandwidth, 0.0)


# --- training (Megatron) -----------------------------------------------------------------------


@dataclass(frozen=True)
class TrainShape:
    """What a training (or forward-only) pass sees per DP rank."""

    tokens_per_micro_batch: np.ndarray  # tokens of one micro-batch (all sequences, before CP)
    seq_len: np.ndarray  # mean sequence length (for attention's s^2)
    micro_batches: np.ndarray  # per optimizer step per DP rank
    optimizer_steps: float  # per training step
    forward_only: bool = False
    # Megatron's CPU optimizer: host Adam throughput per GPU worker and the bytes it streams
    # per offloaded parameter (reads fp32 param, grad and both moments, writes param and moments)
    cpu_adam_bytes_per_s: float = 0.0
    cpu_adam_streamed_bytes: float = 28.0
    # DDP overlap_grad_reduce: Megatron's training recipes hide the gradient reduce-scatter
    # behind the backward pass; verl's Megatron workers leave it off by default
    # (megatron_workers override_ddp_config), so the whole DP traffic is exposed
    overlap_grad_reduce: bool = True
    # host seconds per layer on the stage to prepare and launch one micro-batch
    # (:func:`host_layer_s`); 0 for a plain Megatron step, whose loop never waits on the GPU
    host_per_layer_s: float = 0.0


# The share of a training micro-batch's host time a forward-only (log-prob) micro-batch takes --
# an assumption, not a fit.  The host's work is the Python module calls of the forward (autograd's
# C++ engine launches the backward); a training micro-batch of verl's recipes, which recompute
# (full recompute in the sweep behind host_layer_s, GRPO_7B/qwen2.5_7b_megatron_vllm_benchmark.sh),
# runs the forward's Python twice (once more in the checkpointed backward), so a forward-only one
# does about half.  The one published fixed-micro-batch log-prob time (row 96 of grpo_runs.csv,
# 130.4 s against an update of 406.9 s, script micro-batches 4 and 2) gives 0.64 per micro-batch
# if it is one log-prob pass and 0.32 if it holds the old and the reference pass: 1/2 lies between.
FORWARD_ONLY_HOST_SHARE = 0.5


def host_layer_s(eff: Efficiency, forward_only: bool) -> float:
    """Host seconds per layer on a stage to prepare and launch one micro-batch of an RL
    trainer's Megatron pass: the fitted ``host_layer_s`` for a forward-and-backward micro-batch,
    :data:`FORWARD_ONLY_HOST_SHARE` of it for a forward-only one."""
    return eff.host_layer_s * (FORWARD_ONLY_HOST_SHARE if forward_only else 1.0)


def _stage_compute_s(request: PlanRequest, cols: Columns, shape: TrainShape):
    """Forward compute seconds of one micro-batch on the slowest pipeline stage."""
    model, cluster, eff = request.model, request.cluster, request.efficiency
    peak_flops = cluster.gpu.peak_flops(request.workload.precision)
    linear = linear_params_per_token(model)
    tp, cp = _f(cols["tp"]), _f(cols["cp"])
    tokens = shape.tokens_per_micro_batch / cp  # per CP rank; SP gathers them for the GEMMs
    dense_rows = tokens
    # Routed tokens per local expert: local tokens x k, gathered over ETP, spread over E/EP.
    expert_rows = (tokens / tp * max(model.moe_top_k, 1) * _f(cols["etp"]) * _f(cols["ep"])
                   / max(model.num_experts, 1))
    dense_eff = gemm_efficiency(eff, dense_rows)
    expert_eff = gemm_efficiency(eff, expert_rows) * eff.expert_gemm
    # the mixer of a mean layer (attention, Gated DeltaNet or Mamba projections by the model's
    # mix of layer kinds; exactly the attention projections for a transformer)
    attention_layer = 2 * tokens * mixer_matmul_per_layer(model) / tp / (peak_flops * dense_eff)
    mlp_layer = 2 * tokens * linear["dense_mlp"] / tp / (peak_flops * dense_eff)
    moe_layer = (2 * tokens * (linear["router"] + linear["shared_experts"]) / tp
                 / (peak_flops * dense_eff)
                 + 2 * tokens / tp * linear["routed_experts"] / (peak_flops * expert_eff))
    sequences = shape.tokens_per_micro_batch / shape.seq_len
    # token mixing of a mean layer: attention cores (capped by windows) and recurrences
    core = (mixing_flops_per_layer(model, sequences, shape.seq_len) / (tp * cp)
            / (cluster.gpu.bf16_flops * eff.attention))
    hbm = cluster.gpu.hbm_bandwidth_bytes_per_s
    # a layer's activation bytes per token: of the layouts alone (the run's points share them)
    per_token = of_layouts(cols, "activations_per_token", model,
                           lambda: LayerActivations.of(model, cols, 1.0))
    elementwise_dense = eff.elementwise_passes / hbm * (tokens * per_token.dense)
    elementwise_moe = (eff.elementwise_passes / hbm * (tokens * per_token.moe)
                       if model.is_moe else elementwise_dense)
    per_dense = attention_layer + mlp_layer + core + elementwise_dense + eff.layer_overhead_s
    per_moe = attention_layer + moe_layer + core + elementwise_moe + eff.layer_overhead_s
    output = 2 * tokens * linear["output_layer"] / tp / (peak_flops * dense_eff)
    head = output + mtp_forward_s(request, tokens / tp, per_moe if mtp_is_moe(model)
                                  else per_dense, output, peak_flops * dense_eff)
    # The slowest of the representative ranks (ends and the ranks next to them) sets the pace.
    ranks = of_layouts(cols, "rank_layers", model, lambda: rank_layers(model, cols))
    stage_times = [r.dense * per_dense + r.moe * per_moe + np.where(r.head, head, 0)
                   for r in ranks]
    layers = of_layouts(cols, "stage_layers", model,
                        lambda: np.max([r.dense + r.moe for r in ranks], axis=0))
    return np.max(stage_times, axis=0), layers


def mtp_forward_s(request: PlanRequest, tokens_per_tp, layer_s, output_s, flops_per_s
                  ) -> np.ndarray:
    """Forward seconds the trained MTP layers add to the last stage (``mtp.enable_train``):
    per MTP layer one decoder layer of the model's kind (``layer_s``), the ``eh_proj`` GEMM
    (``2h x h``, ``2 x 2h^2`` FLOPs per token, split over TP) and one more output layer for its
    loss (``output_s``); zero when they are not trained (megatron-core
    ``MultiTokenPredictionBlock``; verl runs it only with the labels, ``enable_train``)."""
    model = request.model
    if not trains_mtp(model, request.workload):
        return np.zeros_like(_f(output_s))
    h = model.hidden_size
    eh_proj = 2 * _f(tokens_per_tp) * 2 * h * h / flops_per_s
    return model.mtp_layers * (_f(layer_s) + eh_proj + _f(output_s))


def _comm_links(request: PlanRequest, cols: Columns) -> dict:
    """What :func:`_stage_comm_s` reads of the layouts alone (the same at each of the run's
    points): the TP, TP x CP and ETP groups' bandwidths; the EP group's share of remote token
    copies, and across nodes (DeepEP-style dispatch: one copy per destination node) the copies
    per token, the other nodes and the nodes (at least 1) its EP x ETP span covers."""
    model, cluster, eff = request.model, request.cluster, request.efficiency
    tp, cp, ep, etp = (_f(cols[k]) for k in ("tp", "cp", "ep", "etp"))
    nodes = np.ceil(ep * etp / cluster.fast_domain_gpus)
    return {"tp": link_bandwidth(cluster, eff, tp), "cp": link_bandwidth(cluster, eff, tp * cp),
            "etp": link_bandwidth(cluster, eff, etp), "ep_share": (ep - 1) / ep,
            "node_copies": np.minimum(max(model.moe_top_k, 1), nodes),
            "other_nodes": nodes - 1, "nodes_at_least_1": np.maximum(nodes, 1), "ep_on": ep > 1}


def _stage_comm_s(request: PlanRequest, cols: Columns, shape: TrainShape, stage_layers_count):
    """Exposed TP, CP and EP communication of one micro-batch forward on a stage."""
    model, cluster, eff = request.model, request.cluster, request.efficiency
    h = model.hidden_size
    tp, cp, etp = (_f(cols[k]) for k in ("tp", "cp", "etp"))
    links = of_layouts(cols, "comm_links", (model, cluster, eff),
                       lambda: _comm_links(request, cols))
    tokens = shape.tokens_per_micro_batch / cp
    activation_bytes = tokens * h * WEIGHT_BYTES
    tp_layer = 4 * ring_time(activation_bytes, tp, links["tp"]) * (1 - eff.tp_overlap)
    kv_width = (model.kv_lora_rank + model.qk_rope_head_dim if model.is_mla
                else 2 * model.num_query_groups * model.head_dim)
    cp_bytes = (cp - 1) * tokens * kv_width * WEIGHT_BYTES / tp
    cp_layer = cp_bytes / links["cp"] * (1 - eff.cp_overlap)
    k = max(model.moe_top_k, 1)
    dispatched = tokens / tp * k * h * WEIGHT_BYTES
    # Inside one NVLink domain every token copy crosses NVLink.  Across nodes, DeepEP-style
    # dispatch (megatron-core's flex dispatcher) sends a token once per destination node and
    # fans it out over NVLink there, so the network carries min(k, nodes) copies per token
    # (DeepSeek-V3 report, arXiv 2412.19437 §3.2.2), overlapped with the NVLink leg.
    nvlink_bw = cluster.gpu.nvlink_bandwidth_bytes_per_s * eff.nvlink
    network_bw = cluster.gpu.inter_node_bandwidth_bytes_per_s * eff.network
    intra = links["ep_share"] * dispatched / nvlink_bw
    inter = (tokens / tp * links["node_copies"] * h * WEIGHT_BYTES * links["other_nodes"]
             / links["nodes_at_least_1"] / network_bw)
    ep_layer = np.where(links["ep_on"], 2 * np.maximum(intra, inter), 0.0)
    # ETP: the dispatched tokens are all-gathered over the expert-TP group and the expert
    # outputs reduce-scattered back (megatron-core token_dispatcher.py).
    etp_layer = 2 * ring_time(dispatched * etp, etp, links["etp"])
    ep_layer = (ep_layer + etp_layer) * (1 - eff.ep_overlap)
    moe_fraction = model.num_moe_layers / model.num_layers
    return stage_layers_count * (tp_layer + cp_layer + moe_fraction * ep_layer)


def _pipeline_terms(request: PlanRequest, cols: Columns) -> dict:
    """What :func:`train_phase_s` reads of the layouts alone (the same at each of the run's
    points): whether a pipeline has stages to cross, the VPP chunks, the bubble's
    micro-batch slots ``(pp - 1) / vpp`` and the stage-boundary P2P bandwidth."""
    cluster, eff = request.cluster, request.efficiency
    pp, vpp = _f(cols["pp"]), _f(cols["vpp"])
    return {"pipelined": pp > 1, "vpp": vpp, "bubble_slots": (pp - 1) / vpp,
            "p2p_bandwidth": link_bandwidth(cluster, eff, cluster.num_gpus)}


def _training_passes(cols: Columns) -> tuple[np.ndarray, np.ndarray]:
    """A training micro-batch's forward passes (3: the forward and a 2x backward, plus the
    recompute: 1 full, :data:`SELECTIVE_RECOMPUTE_OVERHEAD` selective) and communication passes
    (2, 3 with full recompute), of the layouts alone."""
    recompute = np.select([cols["recompute"] == 2, cols["recompute"] == 1],
                          [1.0, SELECTIVE_RECOMPUTE_OVERHEAD], 0.0)
    return 3 + recompute, 2 + (cols["recompute"] == 2)


def train_phase_s(request: PlanRequest, cols: Columns, shape: TrainShape
                  ) -> dict[str, np.ndarray]:
    """Seconds of one training (or forward-only) pass over a step's data, with a breakdown."""
    model, cluster, eff = request.model, request.cluster, request.efficiency
    # what reads the fields both training passes share is computed on their distinct rows
    # where ``cols`` has them (``shape`` is then theirs) and taken per row of ``cols``: the
    # same numbers (:attr:`LayoutRows.coarse`)
    coarse = getattr(cols, "coarse", None)
    rows = cols if coarse is None else coarse[0]
    stages = of_layouts(rows, "pipeline_terms", (model, cluster, eff),
                        lambda: _pipeline_terms(request, rows))
    forward, layers_on_stage = _stage_compute_s(request, rows, shape)
    comm = _stage_comm_s(request, rows, shape, layers_on_stage)
    # pipeline P2P of the SP-sharded activation at each stage boundary, forward and backward
    p2p_bytes = shape.tokens_per_micro_batch / _f(rows["cp"]) / _f(rows["tp"]) \
        * model.hidden_size * WEIGHT_BYTES
    p2p = np.where(stages["pipelined"], p2p_bytes / stages["p2p_bandwidth"], 0.0)
    # with VPP model chunks a micro-batch crosses vpp times as many stage boundaries
    p2p_per_micro = p2p * stages["vpp"] * (1 if shape.forward_only else 2)
    m, behind = _f(shape.micro_batches), stages["bubble_slots"]
    if coarse is not None:
        forward, comm, layers_on_stage, p2p_per_micro, m, behind = (
            np.take(values, coarse[1])
            for values in (forward, comm, layers_on_stage, p2p_per_micro, m, behind))
    if shape.forward_only:
        compute, exposed_comm = forward, comm
    else:
        compute_passes, comm_passes = of_layouts(cols, "training_passes", model,
                                                 lambda: _training_passes(cols))
        compute = forward * compute_passes
        exposed_comm = comm * comm_passes
    per_micro = compute + exposed_comm
    exposed_comm = exposed_comm + p2p_per_micro  # booked as communication (comm_s, bubble_s)
    per_micro = per_micro + p2p_per_micro
    # The host's floor (module docstring): the RL trainers block the host on the GPU in every
    # micro-batch (verl: ``.tolist()`` in ``verl/models/mcore/util.py::preprocess_packed_seqs``
    # and ``postprocess_packed_seqs``, the loss's ``.item()`` in 0.9.1's
    # ``workers/engine/megatron/transformer_impl.py``; NeMo RL: ``.item()`` in
    # ``nemo_rl/algorithms/loss_functions.py``).  Every stage runs its own loop at once: the
    # floor is per stage, not summed over PP.
    slot = np.maximum(per_micro, shape.host_per_layer_s * layers_on_stage)
    pipeline = (m + behind) * slot
    bubble = behind * per_micro
    out = {"compute_s": m * compute * shape.optimizer_steps,
           "comm_s": m * exposed_comm * shape.optimizer_steps,
           "bubble_s": bubble * shape.optimizer_steps,
           "host_s": (m + behind) * (slot - per_micro) * shape.optimizer_steps}
    total = pipeline * shape.optimizer_steps
    if not shape.forward_only:
        # per optimizer step, of the layouts alone: the same at each of the run's points
        dp_exposed, optimizer, cpu_optimizer = of_layouts(
            cols, "update_terms", (model, cluster, eff, shape.overlap_grad_reduce,
                                   shape.cpu_adam_bytes_per_s, shape.cpu_adam_streamed_bytes),
            lambda: _update_terms(request, cols, shape))
        out["dp_comm_s"] = dp_exposed * shape.optimizer_steps
        out["optimizer_s"] = optimizer * shape.optimizer_steps
        out["cpu_optimizer_s"] = cpu_optimizer * shape.optimizer_steps
        total = total + out["dp_comm_s"] + out["optimizer_s"] + out["cpu_optimizer_s"]
    out["total_s"] = total
    return out


def _update_terms(request: PlanRequest, cols: Columns, shape: TrainShape) -> tuple:
    """Seconds per optimizer step of an update's data-parallel gradient traffic (exposed), its
    optimizer step on the GPU and on the host: of the layouts, the model, the cluster and the
    shape's optimizer settings alone (not of the response length)."""
    model, cluster, eff = request.model, request.cluster, request.efficiency
    # the parameter shards read the fields both training passes share: on their rows where
    # ``cols`` has them (:attr:`LayoutRows.coarse`), taken per row
    coarse = getattr(cols, "coarse", None)
    non_expert, expert = _largest_shards(model, cols if coarse is None else coarse[0])
    if coarse is not None:
        non_expert, expert = np.take(non_expert, coarse[1]), np.take(expert, coarse[1])
    dense_dp = _f(cols["dp"] * cols["cp"])
    expert_dp = np.where(cols["ep"] > 1,
                         _f(cluster.num_gpus // (cols["etp"] * cols["ep"] * cols["pp"])),
                         dense_dp)
    grad_and_param = MAIN_GRAD_BYTES + WEIGHT_BYTES  # RS fp32 grads + AG bf16 params
    dp_span = _f(cols["tp"] * cols["cp"]) * dense_dp / _f(cols["cp"])
    dp = (ring_time(non_expert * grad_and_param, dense_dp,
                    link_bandwidth(cluster, eff, dp_span))
          + ring_time(expert * grad_and_param, expert_dp,
                      link_bandwidth(cluster, eff, _f(cols["ep"] * cols["etp"]) * expert_dp)))
    dp_exposed = dp * (1 - eff.dp_overlap) if shape.overlap_grad_reduce else dp
    shards = np.where(cols["distributed_optimizer"].astype(bool), 1, 0)
    local = (non_expert / np.where(shards, dense_dp, 1)
             + expert / np.where(shards, expert_dp, 1))
    on_host = cpu_fraction(cols)
    optimizer = (1 - on_host) * local * ADAM_BYTES_PER_PARAM / (
        cluster.gpu.hbm_bandwidth_bytes_per_s * eff.hbm)
    return dp_exposed, optimizer, cpu_optimizer_s(cluster, on_host * local, shape)


def _largest_shards(model: ModelSpec, cols: Columns) -> tuple[np.ndarray, np.ndarray]:
    """The most non-expert and expert parameters a rank of the layouts ``cols`` holds (of
    :func:`planner.cost.memory.actor_params_per_gpu`'s ranks, those of the layouts' memo)."""
    shards = of_layouts(cols, "actor_params_per_gpu", model, lambda: actor_params_per_gpu(
        model, cols, of_layouts(cols, "rank_layers", model, lambda: rank_layers(model, cols))))
    return np.max([ne for ne, _ in shards], axis=0), np.max([exp for _, exp in shards], axis=0)


def cpu_optimizer_s(cluster: ClusterSpec, host_params, shape: TrainShape) -> np.ndarray:
    """One step of Megatron's CPU optimizer for ``host_params`` parameters of a GPU
    (``HybridDeviceOptimizer``): their fp32 grads copied to the host, Adam on the host
    (memory-bound: it streams the fp32 param, grad and moments), the updated params copied
    back; with ``overlap_cpu_optimizer_d2h_h2d`` (verl's examples set it) the copies hide
    behind the host Adam of the previous group, so the longer of the two counts."""
    host_params = _f(host_params)
    if not shape.cpu_adam_bytes_per_s:
        return np.zeros_like(host_params)
    adam = host_params * shape.cpu_adam_streamed_bytes / shape.cpu_adam_bytes_per_s
    copies = host_params * (MAIN_GRAD_BYTES + WEIGHT_BYTES) / cluster.gpu.host_bandwidth_bytes_per_s
    return np.maximum(adam, copies)


def pretrain_step(request: PlanRequest, cols: Columns) -> Columns:
    """A plain Megatron training step: time, tokens/s/GPU, model TFLOP/s per GPU, MFU."""
    model, cluster, workload = request.model, request.cluster, request.workload
    micro = _f(cols["micro_batch"])
    m = np.maximum(workload.global_batch // np.maximum(cols["dp"] * cols["micro_batch"], 1), 1)
    shape = TrainShape(tokens_per_micro_batch=micro * workload.seq_len,
                       seq_len=np.full(len(micro), float(workload.seq_len)),
                       micro_batches=m, optimizer_steps=1.0)
    phase = train_phase_s(request, cols, shape)
    step = phase["total_s"]
    tokens = float(workload.tokens_per_step)
    flops = float(training_flops(model, tokens, workload.global_batch * workload.seq_len ** 2))
    tflops = flops / (step * cluster.num_gpus) / 1e12
    return {"step_time_s": step, "tokens_per_s_per_gpu": tokens / (step * cluster.num_gpus),
            "tflops_per_gpu": tflops,
            "mfu": tflops * 1e12 / cluster.gpu.peak_flops(workload.precision),
            **{f"train_{k}": v for k, v in phase.items()}}


# --- GRPO ------------------------------------------------------------------------------------


# Kernels one decoder layer launches in a decode step (vLLM, CUDA-graph replay or eager):
# norm, QKV GEMM, rotary, attention, output GEMM, residual + norm, gate/up GEMM, activation,
# down GEMM, residual; an MoE layer adds the router GEMM, top-k, token permute/align, two
# grouped GEMMs instead of one pair, the weighted unpermute (vllm fused_moe: ~16 in all).
DENSE_LAYER_KERNELS = 10
MOE_LAYER_KERNELS = 16
# Eager mode launches every kernel from Python: ~5 us of CPU dispatch each, which the GPU
# waits for at decode batch sizes (PyTorch CUDA-graphs note; vLLM docs on enforce_eager).
EAGER_LAUNCH_S_PER_KERNEL = 5e-6
# Expert-parallel dispatch + combine of one MoE layer at decode batch sizes, latency-bound:
# DeepEP's low-latency kernels report ~77 us dispatch + ~114 us combine over RDMA (EP8-16,
# 128 tokens; deepseek-ai/DeepEP README); inside an NVLink domain ~20 us each.
EP_DISPATCH_COMBINE_NETWORK_S = 190e-6
EP_DISPATCH_COMBINE_NVLINK_S = 40e-6
EULER_GAMMA = 0.5772156649
# A drafter forward beside its decoder layer: embedding lookup, the two norms, eh_proj, the
# final norm, the output GEMM and the sampler's top-1 (vllm/v1/spec_decode/eagle.py propose)
DRAFT_HEAD_KERNELS = 7


@lru_cache(maxsize=32)
def _sub_blocks(model: ModelSpec) -> int:
    """The mixer and feed-forward blocks of every layer (one norm each), once per model."""
    return sum(layer.norms for layer in model.layers)


def longest_response(mean_tokens, max_tokens, sequences) -> np.ndarray:
    """Expected longest of ``sequences`` responses: lengths roughly exponential with the given
    mean (the order statistic ``mean * H_n ~ mean * (ln n + gamma)``), cut at the maximum.  The
    decode steps a rank runs can never be fewer: the last wave waits for it."""
    n = np.maximum(_f(sequences), 1.0)
    return np.minimum(_f(max_tokens), _f(mean_tokens) * (np.log(n) + EULER_GAMMA + 0.5 / n))


def _decode_terms(request: PlanRequest, cols: Columns) -> dict:
    """What :func:`decode_step_s` reads of the rollout layouts alone (the same at each of the
    run's points): the weights a step reads but the routed experts (all of them with a dense
    model) and the experts' shards, whether TP and EP are on, the latencies of an all-reduce
    and of an EP dispatch + combine (inside an NVLink domain or across nodes), the TP and the
    replica's bandwidths, the share of a token's copies sent both ways (``2 (ep - 1) / ep``)
    and the fixed cost of a step."""
    model, cluster, workload = request.model, request.cluster, request.workload
    eff = request.efficiency
    rtp, rdp = _f(cols["rollout_tp"]), _f(cols["rollout_dp"])
    rollout_ep = _f(cols["rollout_ep"])
    out = {"weights": rollout_weight_bytes(model, cols, workload)}
    if model.is_moe:
        weight_bytes = 1 if workload.rollout_precision == "fp8" else WEIGHT_BYTES
        out["expert_shards"] = np.where(cols["rollout_ep"] > 1, rollout_ep, rtp)
        out["weights"] = out["weights"] - model.params.experts * weight_bytes \
            / out["expert_shards"]
    inside = rtp * rdp <= cluster.fast_domain_gpus
    out.update(
        tp_on=rtp > 1, ep_on=rollout_ep > 1,
        allreduce_latency=np.where(inside, ALLREDUCE_LATENCY_NVLINK_S,
                                   ALLREDUCE_LATENCY_NETWORK_S),
        ep_latency=np.where(inside, EP_DISPATCH_COMBINE_NVLINK_S, EP_DISPATCH_COMBINE_NETWORK_S),
        tp_bandwidth=link_bandwidth(cluster, eff, rtp),
        ep_bandwidth=link_bandwidth(cluster, eff, rtp * rdp),
        ep_both_ways=2 * (rollout_ep - 1) / rollout_ep,
        fixed=eff.decode_step_s + np.where(rtp > 1, eff.decode_tp_step_s, 0.0))
    return out


def decode_step_s(request: PlanRequest, cols: Columns, batch, context
                  ) -> dict[str, np.ndarray]:
    """Seconds of one decode step of a rollout rank running ``batch`` sequences whose mean
    context is ``context`` tokens, by part (a roofline plus latency terms).

    With speculative decoding a step is one verification: the target runs ``k + 1`` query
    tokens per sequence (weights and cached K/V read once; FLOPs, routed experts, TP and EP
    traffic per token), then the drafter's ``k`` forward steps (:func:`draft_forward_s`)."""
    model, cluster, workload = request.model, request.cluster, request.workload
    eff = request.efficiency
    gpu = cluster.gpu
    rtp = _f(cols["rollout_tp"])
    terms = of_layouts(cols, "decode_terms", (model, cluster, eff, engine_of(workload),
                                              workload.rollout_precision),
                       lambda: _decode_terms(request, cols))
    sequences = _f(batch)
    batch = sequences * verified_tokens(workload)  # query tokens of the step
    active_linear = active_linear_params_per_token(model)
    peak = gpu.peak_flops(workload.precision if workload.precision == "fp8" else "bf16")
    weights = terms["weights"]
    if model.is_moe:
        # only the experts the rank's batch routes to are read: E * (1 - (1 - k/E)^b)
        p = model.params
        weight_bytes = 1 if workload.rollout_precision == "fp8" else WEIGHT_BYTES
        per_expert = p.experts_per_layer / model.num_experts * model.num_moe_layers * weight_bytes
        touched = model.num_experts * (1 - (1 - model.moe_top_k / model.num_experts) ** batch)
        weights = weights + touched * per_expert / terms["expert_shards"]
    kv_read = sequences * decode_cache_bytes(model, cols, workload, context)
    memory = (weights + kv_read) / (gpu.hbm_bandwidth_bytes_per_s * eff.decode_hbm)
    compute = (2 * batch * active_linear / rtp
               + batch * decode_mixing_flops_per_token(model, context)
               / rtp) / (peak * gemm_efficiency(eff, batch))
    # one all-reduce after each row-parallel block: the mixer and the feed-forward block of a
    # layer (Nemotron-H's layers hold one of them each)
    tp_allreduce = np.where(terms["tp_on"], _sub_blocks(model)
                            * (terms["allreduce_latency"]
                               + 2 * batch * model.hidden_size * WEIGHT_BYTES
                               / terms["tp_bandwidth"]), 0.0)
    # expert parallel: dispatch + combine of the batch's k token copies per MoE layer
    dispatched = batch * max(model.moe_top_k, 1) * model.hidden_size * WEIGHT_BYTES
    ep_alltoall = np.where(terms["ep_on"], model.num_moe_layers
                           * (terms["ep_latency"] + terms["ep_both_ways"] * dispatched
                              / terms["ep_bandwidth"]), 0.0)
    kernels = ((model.num_layers - model.num_moe_layers) * DENSE_LAYER_KERNELS
               + model.num_moe_layers * MOE_LAYER_KERNELS)
    per_kernel = eff.decode_layer_s / DENSE_LAYER_KERNELS
    launches = kernels * (per_kernel + (EAGER_LAUNCH_S_PER_KERNEL if workload.enforce_eager
                                        else 0.0))
    roofline = np.maximum(memory, compute)
    comm, latency = tp_allreduce + ep_alltoall, launches + terms["fixed"]
    drafts = float(verified_tokens(workload) - 1)
    if drafts:  # the drafter's k forward steps
        draft = draft_forward_s(request, cols, sequences, context)
        roofline = roofline + drafts * draft["roofline_s"]
        comm = comm + drafts * draft["comm_s"]
        latency = latency + drafts * draft["latency_s"]
    return {"roofline_s": roofline, "comm_s": comm, "latency_s": latency,
            "total_s": roofline + comm + latency}


def draft_forward_s(request: PlanRequest, cols: Columns, batch, context
                    ) -> dict[str, np.ndarray]:
    """Seconds of one forward of the MTP drafter for ``batch`` sequences (one token each) of
    mean context ``context`` on a rollout rank, by part: a roofline over its weights
    (:func:`planner.cost.speculative.drafter_step_weight_bytes`: its layers, the experts the
    batch touches, the shared output layer), its own K/V and its FLOPs; per MTP layer two TP
    all-reduces and, with rollout EP, one dispatch + combine; the kernels of one decoder layer
    and the output layer.  Zero without MTP layers."""
    model, cluster, workload = request.model, request.cluster, request.workload
    eff = request.efficiency
    gpu = cluster.gpu
    rtp, rdp, rep = _f(cols["rollout_tp"]), _f(cols["rollout_dp"]), _f(cols["rollout_ep"])
    batch = _f(batch)
    n = model.mtp_layers
    if not n:
        zero = np.zeros_like(rtp)
        return {"roofline_s": zero, "comm_s": zero, "latency_s": zero, "total_s": zero}
    linear_bytes = 1 if workload.rollout_precision == "fp8" else WEIGHT_BYTES
    weights = drafter_step_weight_bytes(model, rtp, rep, batch, linear_bytes)
    kv = batch * _f(context) * drafter_kv_per_token(model, cols, workload)
    memory = (weights + kv) / (gpu.hbm_bandwidth_bytes_per_s * eff.decode_hbm)
    peak = gpu.peak_flops(workload.precision if workload.precision == "fp8" else "bf16")
    flops = (drafter_step_flops(model, batch) / rtp
             + n * batch * decode_mixing_flops_per_token(model, context) / max(model.num_layers, 1)
             / rtp)
    compute = flops / (peak * gemm_efficiency(eff, batch))
    inside = rtp * rdp <= cluster.fast_domain_gpus
    latency = np.where(inside, ALLREDUCE_LATENCY_NVLINK_S, ALLREDUCE_LATENCY_NETWORK_S)
    tp_allreduce = np.where(rtp > 1, 2 * n * (latency + 2 * batch * model.hidden_size
                                               * WEIGHT_BYTES / link_bandwidth(cluster, eff,
                                                                               rtp)), 0.0)
    ep_latency = np.where(inside, EP_DISPATCH_COMBINE_NVLINK_S, EP_DISPATCH_COMBINE_NETWORK_S)
    dispatched = batch * max(model.moe_top_k, 1) * model.hidden_size * WEIGHT_BYTES
    ep_alltoall = np.where((rep > 1) & mtp_is_moe(model),
                           n * (ep_latency + 2 * (rep - 1) / rep * dispatched
                                / link_bandwidth(cluster, eff, rtp * rdp)), 0.0)
    kernels = n * (MOE_LAYER_KERNELS if mtp_is_moe(model) else DENSE_LAYER_KERNELS) \
        + DRAFT_HEAD_KERNELS
    launches = kernels * (eff.decode_layer_s / DENSE_LAYER_KERNELS
                          + (EAGER_LAUNCH_S_PER_KERNEL if workload.enforce_eager else 0.0))
    roofline = np.maximum(memory, compute)
    comm = tp_allreduce + ep_alltoall
    return {"roofline_s": roofline, "comm_s": comm, "latency_s": launches,
            "total_s": roofline + comm + launches}


def rollout_concurrency(workload: GrpoWorkload, kv_tokens, state_tokens=0.0) -> np.ndarray:
    """Sequences a rollout rank runs at once: what its KV cache holds at the mean sequence
    length (plus each sequence's window and state pages, ``state_tokens`` in tokens of the
    growing K/V, :func:`planner.cost.memory.sequence_state_tokens`), capped by
    ``max_num_seqs`` (vLLM's scheduler), at least one."""
    prompt, r_mean = mean_prompt_length(workload), mean_response_length(workload)
    per_sequence = prompt + r_mean + _f(state_tokens)
    return np.clip(np.floor(_f(kv_tokens) / per_sequence), 1, workload.max_num_seqs)


def _prefill(request: PlanRequest, cols: Columns) -> tuple[np.ndarray, np.ndarray]:
    """Sequences per attention rank of a rollout replica (all replicas get equal shares) and
    the seconds of their prefill: a compute-bound forward over the prompts, split over the
    rollout TP group; with prefix caching the n samples of a prompt share one prefill.  Of the
    layouts and the prompts alone (the same at each of the run's points)."""
    model, cluster, workload = request.model, request.cluster, request.workload
    eff = request.efficiency
    rtp, rdp = _f(cols["rollout_tp"]), _f(cols["rollout_dp"])
    prompt = mean_prompt_length(workload)
    replicas = np.maximum(np.floor(cluster.num_gpus / (rtp * rdp)), 1)
    seqs = np.ceil(workload.sequences_per_step / replicas / rdp)  # per attention rank
    active_linear = active_linear_params_per_token(model)
    peak = cluster.gpu.peak_flops(workload.precision if workload.precision == "fp8" else "bf16")
    prompts = seqs / workload.rollout_n if workload.prefix_caching else seqs
    prefill_flops = prompts * (2 * prompt * active_linear
                               + mixing_flops_per_sequence(model, prompt))
    prefill = prefill_flops / (rtp * peak * gemm_efficiency(eff, prompts * prompt))
    for shared in (seqs, prefill):  # every point of the run returns these very arrays
        shared.flags.writeable = False
    return seqs, prefill


def generate_s(request: PlanRequest, cols: Columns, memory: Columns) -> dict[str, np.ndarray]:
    """Rollout generation time of the slowest replica (all replicas get equal shares).

    Continuous batching at concurrency ``c`` (KV capacity or ``max_num_seqs``): ``S * R / c``
    decode steps in the steady state, then the tail that waits for the longest of the rank's
    responses (:func:`longest_response`); the per-step cost at the mean running batch.  A rank
    whose KV cache cannot hold one longest sequence cannot run at all: infinite time (vLLM
    refuses to start), never concurrency 1.
    """
    model, workload = request.model, request.workload
    prompt, r_max = mean_prompt_length(workload), float(workload.response_length)
    r_mean = mean_response_length(workload)
    seqs, prefill = of_layouts(
        cols, "prefill", (model, request.cluster, request.efficiency, prompt,
                          workload.sequences_per_step, workload.rollout_n,
                          workload.prefix_caching, workload.precision),
        lambda: _prefill(request, cols))
    kv_tokens = _f(memory["kv_cache_tokens_per_gpu"])
    state_tokens = _f(memory.get("kv_state_tokens_per_seq", 0.0))
    holds_one = kv_tokens >= workload.sequence_length + state_tokens
    concurrency = np.minimum(rollout_concurrency(workload, kv_tokens, state_tokens),
                             seqs)  # a rank never runs more than it was given
    tail = longest_response(r_mean, r_max, seqs)
    token_steps = np.maximum(tail, seqs * r_mean / concurrency + (tail - r_mean))
    batch = np.maximum(seqs * r_mean / token_steps, 1.0)
    # speculative decoding: a verification step advances acceptance_length tokens
    steps = decode_steps(token_steps, workload)
    step = decode_step_s(request, cols, batch, prompt + r_mean / 2)
    decode = np.where(holds_one, steps * step["total_s"], np.inf)
    return {"total_s": prefill + decode, "prefill_s": prefill, "decode_s": decode,
            "decode_steps": steps, "decode_batch": batch, "kv_holds_sequence": holds_one,
            "compute_s": prefill + steps * step["roofline_s"], "comm_s": steps * step["comm_s"],
            "latency_s": steps * step["latency_s"]}


@lru_cache(maxsize=32)
def tensor_count(model: ModelSpec) -> int:
    """Tensors a Hugging Face checkpoint of the model holds (what verl exports one by one):
    per layer q, k, v, o, two norms (+ q/k norms), gate, up, down; an MoE layer's router and
    three tensors per routed and shared expert; embedding, final norm and output layer.

    A model with layers other than softmax attention + feed-forward (Gated DeltaNet, Mamba-2,
    mixer- or MLP-only layers) is counted layer by layer
    (:func:`planner.cost.layer_kinds.weight_sync_tensors`: each kind's own tensors).  A
    transformer keeps the count the per-tensor latency was calibrated with (it leaves out
    biases and sinks; the layer-by-layer count would add them, e.g. Qwen2's q/k/v biases)."""
    if any(not layer.mixer.is_attention or layer.mlp is MlpKind.NONE for layer in model.layers):
        return sum(weight_sync_tensors(model).values())
    attention = 4 + 2 + (2 if model.qk_norm else 0)
    dense = model.num_layers - model.num_moe_layers
    moe = model.num_moe_layers
    shared = 3 if model.params.shared_experts_per_layer else 0
    return (model.num_layers * attention + dense * 3 + moe * (1 + 3 * model.num_experts + shared)
            + 3)


def synced_params(model: ModelSpec, workload) -> int:
    """Parameters the actor exports per sync: the model's, plus the MTP layers' when verl
    builds them (``mtp.enable``: they stay in the export; without it verl drops them)."""
    return model.params.total + (model.mtp_params if workload.mtp_enabled
                                 else 0)


def synced_tensor_count(model: ModelSpec, workload) -> int:
    """Tensors the actor exports per sync: :func:`tensor_count`, plus the MTP layers' with
    ``mtp.enable`` (:func:`planner.cost.speculative.mtp_tensor_count`)."""
    return tensor_count(model) + (mtp_tensor_count(model)
                                  if workload.mtp_enabled else 0)


def weight_sync_s(request: PlanRequest, cols: Columns) -> dict[str, np.ndarray]:
    """Actor -> rollout weight transfer, by part.

    verl (``per_tensor``): every tensor is all-gathered over the actor's model-parallel group
    and handed to vLLM's ``load_weights`` one at a time, so a per-tensor latency (an NCCL call,
    the conversion to Hugging Face names, the engine's weight loader) adds to the bandwidth
    term; DeepSeek-V3's ~45k expert tensors make it tens of seconds.  NeMo RL (``bucketed``)
    packs tensors into large buffers passed by CUDA IPC: a smaller per-tensor cost.  Plus the
    engine's wake-up and sleep."""
    model, cluster, workload = request.model, request.cluster, request.workload
    eff = request.efficiency
    total = synced_params(model, workload) * WEIGHT_BYTES
    group = _f(cols["tp"] * cols["pp"] * cols["ep"])
    gather = np.where(group > 1, (group - 1) / group * total
                      / link_bandwidth(cluster, eff, np.minimum(group * cols["cp"],
                                                                cluster.num_gpus)), 0.0)
    load = ((rollout_weight_bytes(model, cols, workload)
             + drafter_rollout_bytes(model, cols, workload))
            / (cluster.gpu.hbm_bandwidth_bytes_per_s * eff.hbm))
    per_tensor = (eff.bucketed_tensor_s if workload.weight_sync == "bucketed"
                  else eff.sync_tensor_s)
    tensors = np.full(len(group), synced_tensor_count(model, workload) * per_tensor)
    fixed = np.full(len(group), eff.sync_fixed_s)
    return {"comm_s": gather, "compute_s": load, "latency_s": tensors + fixed,
            "tensor_latency_s": tensors, "fixed_s": fixed,
            "total_s": gather + load + tensors + fixed}


def offload_s(cluster: ClusterSpec, nbytes) -> np.ndarray:
    """One host<->device copy of ``nbytes`` per GPU."""
    return _f(nbytes) / cluster.gpu.host_bandwidth_bytes_per_s


def log_prob_phase_s(request: PlanRequest, cols: Columns) -> dict[str, np.ndarray]:
    """One forward-only log-prob pass over the step's sequences (:func:`train_phase_s` on the
    layouts' log-prob micro-batches, :func:`planner.search.batches.log_prob_batches`)."""
    workload = request.workload
    batches = log_prob_batches(workload, cols)
    shape = TrainShape(tokens_per_micro_batch=batches.mean_tokens * _f(cols["cp"]),
                       seq_len=np.full(len(cols["tp"]), workload.mean_sequence_length),
                       micro_batches=batches.count, optimizer_steps=1.0, forward_only=True,
                       host_per_layer_s=host_layer_s(request.efficiency, True))
    return train_phase_s(request, cols, shape)


def update_phase_s(request: PlanRequest, cols: Columns) -> dict[str, np.ndarray]:
    """The actor update over the step's mini-batches (:func:`train_phase_s` on the layouts'
    update micro-batches, :func:`planner.search.batches.update_batches`)."""
    workload = request.workload
    # the batches read the fields both passes share: on their rows where ``cols`` has them
    # (:attr:`LayoutRows.coarse`; :func:`train_phase_s` reads the shape there too)
    rows = cols if getattr(cols, "coarse", None) is None else cols.coarse[0]
    batches = update_batches(workload, rows)
    shape = TrainShape(tokens_per_micro_batch=batches.mean_tokens * _f(rows["cp"]),
                       seq_len=np.full(len(rows["tp"]), workload.mean_sequence_length),
                       micro_batches=batches.count,
                       optimizer_steps=workload.ppo_epochs
                       * np.ceil(workload.train_batch_size / workload.mini_batch_size),
                       cpu_adam_bytes_per_s=HOST_ADAM_BYTES_PER_S,
                       cpu_adam_streamed_bytes=(4 + 4 + 2 * workload.adam_moment_bytes)
                       + (4 + 2 * workload.adam_moment_bytes),
                       overlap_grad_reduce=workload.overlap_grad_reduce,
                       host_per_layer_s=host_layer_s(request.efficiency, False))
    return train_phase_s(request, cols, shape)


# The columns each phase's time reads (a test records what the functions read and checks these
# cover it).  A plan's rows cross every parallel layout with knobs most phases ignore -- offload
# touches neither pass, recompute and the CPU optimizer not the log-prob pass, no actor knob the
# rollout -- so :class:`StepGroups` times each phase once per distinct row of its fields.
SPLIT_FIELDS = ("first_stage_layers", "last_stage_layers", "account_embedding", "account_loss",
                "pipeline_layout")
LOG_PROB_FIELDS = ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "sequence_parallel",
                   "recompute_modules", *SPLIT_FIELDS, "micro_batch", "log_prob_micro_batch",
                   "dynamic_batch", "max_token_len", "log_prob_max_token_len")
UPDATE_FIELDS = ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "sequence_parallel", "recompute",
                 "recompute_modules", "distributed_optimizer", "optimizer_cpu_fraction",
                 *SPLIT_FIELDS, "micro_batch", "dynamic_batch", "max_token_len")
GENERATE_FIELDS = ("rollout_tp", "rollout_dp", "rollout_ep", "kv_cache_tokens_per_gpu",
                   "kv_state_tokens_per_seq")  # layout and memory columns
DISTINCT_MIN_ROWS = 256  # below this many rows every row is timed as it is
# the fields the weight sync reads (:func:`weight_sync_s`): of the log-prob and generate groups'
WEIGHT_SYNC_FIELDS = ("tp", "pp", "ep", "cp", "rollout_tp", "rollout_dp", "rollout_ep")
# the fields both training passes read (coded once for both, :meth:`StepGroups.of`)
SHARED_FIELDS = tuple(name for name in LOG_PROB_FIELDS if name in UPDATE_FIELDS)


class LayoutRows(dict):
    """Columns of layouts (a dict) with a memo of what depends on the layouts and the model
    alone: :class:`DistinctRows` are timed at each of the run's three points
    (:mod:`planner.cost.trajectory`), and their pipeline stages' layers and parameter shards
    do not move with the response length.  Treat as read-only (the memo follows the columns
    it was made from)."""

    __slots__ = ("memo", "coarse")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.memo: dict = {}
        # (the update pass's rows) the rows over the fields both training passes read and,
        # per row, its row among them (:meth:`StepGroups.of`, :func:`update_phase_s`)
        self.coarse: tuple[LayoutRows, np.ndarray] | None = None


def of_layouts(cols: Columns, name: str, model, compute: Callable):
    """``compute()``, a function of ``model`` and the layouts ``cols`` alone, computed once per
    :class:`LayoutRows` (every call for other columns)."""
    memo = getattr(cols, "memo", None)
    if memo is None:
        return compute()
    key = (name, model)
    if key not in memo:
        memo[key] = compute()
    return memo[key]


@dataclass(frozen=True)
class DistinctRows:
    """The distinct rows of some columns over a few fields (``rows``), and per row the index of
    its distinct row (``inverse``): what depends only on those fields is computed on ``rows``
    and spread back with :meth:`spread` -- the same numbers, computed once per distinct row."""

    rows: Columns
    inverse: np.ndarray | None  # None: every row is distinct (``rows`` are the columns)

    @classmethod
    def of(cls, cols: Columns, names: tuple[str, ...],
           codes_of: dict | None = None) -> "DistinctRows":
        """``codes_of``: the fields' codes kept across calls on the same columns
        (:func:`planner.search.layout.unique_rows`)."""
        if len(cols["tp"]) < DISTINCT_MIN_ROWS:
            return cls(LayoutRows(cols), None)
        # the distinct rows carry the fields ``names`` alone (and ``tp``, which counts rows):
        # what the phase reads (tests/cost/test_step_groups.py), not every column of a plan;
        # their 0-d values too, no other column read (a scoring chunk's deferred memory
        # columns, :class:`planner.cost.deferred.DeferredColumns`, stay deferred)
        scalars = scalar_columns(cols, frozenset(("tp", *names)))
        few, inverse = unique_rows(_row_fields(cols, ("tp", *names)), names, codes_of)
        return cls(LayoutRows({**scalars, **few}), inverse)

    def spread(self, out: dict) -> dict:
        if self.inverse is None:
            return out
        return {name: np.take(values, self.inverse) if np.ndim(values) == 1 else values
                for name, values in out.items()}

    def spread_one(self, values):
        """One column of :attr:`rows` over every row (:meth:`spread`'s)."""
        return self.spread({"values": values})["values"]


@dataclass(frozen=True)
class StepGroups:
    """The distinct rows each GRPO phase's time reads (:data:`LOG_PROB_FIELDS`,
    :data:`UPDATE_FIELDS`, :data:`GENERATE_FIELDS`), found once for a batch of layouts and
    shared by its evaluations at every point of the run's trajectory (the fields do not move
    with the response length)."""

    log_prob: DistinctRows
    update: DistinctRows
    generate: DistinctRows
    # what the layouts' step reads that does not move with the response length (the weight
    # sync, the offload trips): computed once for the run's points (:meth:`point_free`)
    memo: dict = field(default_factory=dict, compare=False, repr=False)

    def point_free(self, request: PlanRequest, inputs: tuple, name: str, compute: Callable):
        """``compute()``, a function of ``request`` and the columns ``inputs`` that reads
        nothing of the workload's mean response length (the one thing the run's points change,
        :func:`planner.cost.trajectory.request_at`): computed once per request apart from
        that length, for these very columns (the same objects).  Only sums read the values
        (:func:`grpo_step_time_s`): no point's result holds them."""
        key = (name, _apart_from_mean_length(request))
        kept = self.memo.get(key)
        if kept is None or len(kept[0]) != len(inputs) or any(
                mine is not theirs for mine, theirs in zip(kept[0], inputs)):
            kept = self.memo[key] = (inputs, compute())
        return kept[1]

    @classmethod
    def of(cls, cols: Columns, memory: Columns, runs: "Runs | None" = None) -> "StepGroups":
        """``runs``: the rows come in :class:`Runs` (coded per run, the same groups)."""
        # (``tp`` only counts the rows: generate_s does not read it)
        rollout = {"tp": cols["tp"], **{name: cols[name] for name in GENERATE_FIELDS[:3]},
                   **{name: memory[name] for name in GENERATE_FIELDS[3:] if name in memory}}
        # the two training passes share most fields: each field coded once for both, and
        # the rows over their shared fields coded once (each pass then codes its own few)
        codes_of: dict = {}
        coded = len(cols["tp"]) >= DISTINCT_MIN_ROWS
        runs = runs if coded else None
        shared = (share_rows(_row_fields(cols if runs is None else runs.first,
                                         ("tp", *SHARED_FIELDS)), SHARED_FIELDS, codes_of)
                  if coded else 0)
        if runs is not None:
            log_prob, update = (runs.distinct(cols, names, codes_of)
                                for names in (LOG_PROB_FIELDS, UPDATE_FIELDS))
        else:
            log_prob = DistinctRows.of(cols, LOG_PROB_FIELDS, codes_of)
            update = DistinctRows.of(cols, UPDATE_FIELDS, codes_of)
        if update.inverse is not None and len(log_prob.rows["tp"]) == shared:
            # the log-prob rows are the rows over the shared fields (its own fields hold one
            # value each): the update times what reads those alone on them
            # (:func:`update_phase_s`); each update row's log-prob row, by scatter
            at = np.empty(len(update.rows["tp"]), dtype=np.int64)
            at[update.inverse] = log_prob.inverse
            update.rows.coarse = (log_prob.rows, at)
        return cls(log_prob, update, DistinctRows.of(rollout, GENERATE_FIELDS))


KNOB_FIELD = "optimizer_cpu_fraction"  # the one knob the training passes read


@dataclass(frozen=True)
class Runs:
    """Rows in runs of one core row each: a search's knob combinations of a core row, of an
    actor evaluation whose rows list every combination of each core row in order
    (:attr:`planner.cost.memory.ActorCells.in_order`), so every field the training passes
    read but :data:`KNOB_FIELD` holds one value in a run.  ``first``: the columns at each
    run's first row; ``lengths``: the runs' rows.  A run's first row is the first appearance
    of its fields, so the rows coded per run (:meth:`distinct`) are the rows' distinct rows,
    in the same order, with the same codes."""

    first: Columns
    lengths: np.ndarray

    def distinct(self, cols: Columns, names: tuple[str, ...], codes_of: dict) -> DistinctRows:
        """:meth:`DistinctRows.of` of ``cols`` (these runs' rows) over ``names``
        (``codes_of``: the runs' codes, kept across calls)."""
        core = tuple(name for name in names if name != KNOB_FIELD)
        few, inverse = unique_rows(_row_fields(self.first, ("tp", *core)), core, codes_of)
        inverse = np.repeat(inverse, self.lengths)
        knob = _row_fields(cols, (KNOB_FIELD,)).get(KNOB_FIELD) if KNOB_FIELD in names else None
        if knob is not None:  # (each row) its run's group with its own knob value
            values, code = distinct(knob)
            rows, inverse = distinct(inverse * len(values) + code)
            run = np.take(np.repeat(np.arange(len(self.lengths)), self.lengths), rows)
            few = {name: np.take(knob, rows) if name == KNOB_FIELD else np.take(column, run)
                   for name, column in _row_fields(self.first, ("tp", *names)).items()}
        scalars = scalar_columns(cols, frozenset(("tp", *names)))
        return DistinctRows(LayoutRows({**scalars, **few}), inverse)


def _row_fields(cols: Columns, names: tuple[str, ...]) -> dict:
    """The 1-D columns ``names`` of ``cols`` (those it has; a constant column of a
    :class:`planner.search.layout.RowsAt` not gathered, :func:`rows_column`)."""
    return {name: column for name in names if name in cols
            for column in (rows_column(cols, name),) if np.ndim(column) == 1}


def _apart_from_mean_length(request: PlanRequest) -> tuple:
    """``request`` as a key that the run's points share: every field its equality compares
    (a field added later is in it too), the workload's but its mean response length."""
    workload = request.workload
    apart = (type(workload), tuple((item.name, getattr(workload, item.name))
                                   for item in fields(workload)
                                   if item.name != "mean_response_length"))
    return tuple(apart if item.name == "workload" else getattr(request, item.name)
                 for item in fields(request) if item.compare)


def _booked(phase: dict) -> dict:
    """A training pass's parts as the step books them: compute with the optimizer's step (on
    the GPU and on the host), exposed communication with the gradients' data-parallel traffic,
    the bubble, the host's latency and the total.  Summed on a group's distinct rows before
    they are spread over every row (the same element-wise sums)."""
    return {"compute_s": phase["compute_s"] + phase.get("optimizer_s", 0.0)
            + phase.get("cpu_optimizer_s", 0.0),
            "comm_s": phase["comm_s"] + phase.get("dp_comm_s", 0.0),
            "bubble_s": phase["bubble_s"], "host_s": phase["host_s"], "total_s": phase["total_s"]}


def _offload_trips(request: PlanRequest, cols: Columns,
                   memory: Columns) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """verl's offload (offload_megatron_model_to_cpu / load_megatron_model_to_gpu): parameters
    go to the host and back around old-log-prob, the update and the weight sync; gradient
    buffers are freed and re-zeroed, not copied; the optimizer state moves once around the
    update (offload_megatron_optimizer).  Seconds per step of the parameters' trip, the
    optimizer's and the reference model's."""
    cluster = request.cluster
    weights = _f(memory["weights_bytes"])
    param_trip = np.where(cols["param_offload"].astype(bool), 2 * offload_s(cluster, weights),
                          0.0)
    optim_trip = np.where(cols["optimizer_offload"].astype(bool),
                          2 * offload_s(cluster, memory["optimizer_bytes"]), 0.0)
    ref_trip = np.where(cols["ref_param_offload"].astype(bool), 2 * offload_s(cluster, weights),
                        0.0)
    return param_trip, optim_trip, ref_trip


def offload_trips_s(request: PlanRequest, cols: Columns, memory: Columns) -> np.ndarray:
    """Seconds per step the offload trips (:func:`_offload_trips`) add to the step, as
    :func:`_phase_times` books them: the parameters' around old-log-prob (when it runs), the
    update and the weight sync, the optimizer's around the update, the reference's around its
    pass (when it runs)."""
    param_trip, optim_trip, ref_trip = _offload_trips(request, cols, memory)
    ran = request.workload.phases
    return (param_trip * (2 + ("old_log_prob" in ran)) + optim_trip
            + (ref_trip if "ref" in ran else 0.0))


def _phase_times(request: PlanRequest, totals: dict, trips: tuple, n: int) -> dict:
    """Seconds of each GRPO phase (:data:`PHASES`) from the passes' totals (``totals``: the
    generation, one log-prob pass, the update, and the weight-sync phase,
    :func:`_sync_phase_s`) and the offload ``trips`` (:func:`_offload_trips`); a phase the
    workload does not run takes 0."""
    param_trip, optim_trip, ref_trip = trips
    ran = request.workload.phases
    zero = np.zeros(n)
    return {
        "generate": totals["generate"],
        "old_log_prob": (totals["log_prob"] + param_trip) if "old_log_prob" in ran else zero,
        "ref": (totals["log_prob"] + ref_trip) if "ref" in ran else zero,
        "update_actor": totals["update"] + param_trip + optim_trip,
        "weight_sync": totals["weight_sync"],
    }


def _sync_phase_s(request: PlanRequest, sync_s, param_trip) -> np.ndarray:
    """The weight-sync phase: the sync (``sync_s``), the parameters' trip back to the GPU
    (``param_trip``) and the step's fixed costs, booked there (:func:`grpo_step`)."""
    return sync_s + param_trip + request.efficiency.step_fixed_s


def _summed(times: dict):
    """``sum(times.values())`` -- from 0, left to right -- with the sum kept in one array: the
    same additions, so the same numbers."""
    values = iter(times.values())
    total = 0 + next(values)
    for value in values:
        total += value
    return total


def grpo_step_time_s(request: PlanRequest, cols: Columns, memory: Columns,
                     groups: StepGroups) -> np.ndarray:
    """:func:`grpo_step`'s ``step_time_s`` alone: each pass's total computed on its group's
    distinct rows and spread, none of the breakdown columns -- the same operations on the
    same values, so the same numbers to the bit (tests/cost/test_step_groups.py)."""
    few = groups.generate.rows
    totals = {
        "log_prob": groups.log_prob.spread_one(
            log_prob_phase_s(request, groups.log_prob.rows)["total_s"]),
        "update": groups.update.spread_one(update_phase_s(request, groups.update.rows)["total_s"]),
        "generate": groups.generate.spread_one(_generate_total_s(request, few))}
    n = len(cols["tp"])
    trips = groups.point_free(request, (cols, memory), "trips",
                              lambda: _offload_trips(request, cols, memory))
    totals["weight_sync"] = groups.point_free(
        request, (cols, memory), "weight_sync_phase",
        lambda: _sync_phase_s(request, _sync_total_s(request, cols, groups), trips[0]))
    return _summed(_phase_times(request, totals, trips, n))


def _generate_total_s(request: PlanRequest, rows: Columns) -> np.ndarray:
    """:func:`generate_s`' total of the rows ``rows`` (its layout and memory columns alike):
    of a few rows (a plan's pieces share their rollouts' few distinct rows), kept per request
    and values (:func:`_generate_total_of`); else computed."""
    columns = {name: np.asarray(rows[name]) for name in GENERATE_FIELDS if name in rows}
    if any(values.ndim != 1 or len(values) > GENERATE_KEPT_ROWS for values in columns.values()):
        return generate_s(request, rows, rows)["total_s"]
    return _generate_total_of(request, tuple(
        (name, values.dtype.str, values.tobytes()) for name, values in columns.items()))


GENERATE_KEPT_ROWS = 64  # at most this many rows' generation totals are kept


@lru_cache(maxsize=64)
def _generate_total_of(request: PlanRequest, columns: tuple) -> np.ndarray:
    """:func:`generate_s`' total of the rows whose :data:`GENERATE_FIELDS` (what it reads)
    are ``columns`` (``(name, dtype, bytes)``), read-only: the same function of the same
    values, so the same numbers."""
    rows = LayoutRows({name: np.frombuffer(data, dtype=np.dtype(kind))
                       for name, kind, data in columns})
    total = np.array(generate_s(request, rows, rows)["total_s"], dtype=np.float64)
    total.flags.writeable = False
    return total


def _sync_total_s(request: PlanRequest, cols: Columns, groups: StepGroups) -> np.ndarray:
    """:func:`weight_sync_s`' total of the rows ``cols``, timed once per distinct row of the
    fields it reads (:data:`WEIGHT_SYNC_FIELDS`: the log-prob and generate groups' rows
    together hold them equal) and spread: the same numbers."""
    log_prob, generate = groups.log_prob.inverse, groups.generate.inverse
    if log_prob is None or generate is None:
        return weight_sync_s(request, cols)["total_s"]
    first, inverse = distinct(log_prob * len(groups.generate.rows["tp"]) + generate)
    few = {name: np.take(cols[name], first) for name in WEIGHT_SYNC_FIELDS}
    return np.take(weight_sync_s(request, few)["total_s"], inverse)


def grpo_step(request: PlanRequest, cols: Columns, memory: Columns,
              groups: StepGroups | None = None) -> Columns:
    """Seconds per GRPO phase and per step, tokens/s/GPU (verl's definition) and actor MFU,
    with each phase's time split into compute, exposed communication, pipeline bubble, host
    transfer and latency terms (``breakdown_<phase>_<part>_s``).  ``groups``: the layouts'
    :class:`StepGroups` when already found (found here otherwise)."""
    model, cluster, workload = request.model, request.cluster, request.workload
    eff = request.efficiency
    seq = workload.mean_sequence_length
    n = len(cols["tp"])
    sequences = workload.sequences_per_step
    groups = StepGroups.of(cols, memory) if groups is None else groups
    log_prob = groups.log_prob.spread(_booked(log_prob_phase_s(request, groups.log_prob.rows)))
    update = groups.update.spread(_booked(update_phase_s(request, groups.update.rows)))
    few = groups.generate.rows
    gen = groups.generate.spread(generate_s(request, few, few))
    sync = weight_sync_s(request, cols)
    trips = _offload_trips(request, cols, memory)
    param_trip, optim_trip, ref_trip = trips
    ran = workload.phases
    zero = np.zeros(n)

    def training(phase: dict, host) -> dict:
        return {"compute_s": phase["compute_s"], "comm_s": phase["comm_s"],
                "bubble_s": phase["bubble_s"], "host_transfer_s": host,
                "latency_s": phase["host_s"] + zero}

    parts = {
        "generate": {"compute_s": gen["compute_s"], "comm_s": gen["comm_s"], "bubble_s": zero,
                     "host_transfer_s": zero, "latency_s": gen["latency_s"]},
        "old_log_prob": training(log_prob, param_trip) if "old_log_prob" in ran else None,
        "ref": training(log_prob, ref_trip) if "ref" in ran else None,
        "update_actor": training(update, param_trip + optim_trip),
        # the per-step fixed costs (reward, advantages, moving the batch between workers) are
        # booked with the weight sync, the phase verl runs between the update and generation
        "weight_sync": {"compute_s": sync["compute_s"], "comm_s": sync["comm_s"],
                        "bubble_s": zero, "host_transfer_s": param_trip,
                        "latency_s": sync["latency_s"] + eff.step_fixed_s},
    }
    times = _phase_times(request, {"generate": gen["total_s"], "log_prob": log_prob["total_s"],
                                   "update": update["total_s"],
                                   "weight_sync": _sync_phase_s(request, sync["total_s"],
                                                                param_trip)}, trips, n)
    step = sum(times.values())
    tokens = sequences * seq
    out = {time_column(phase): times[phase] for phase in PHASES}
    for phase, split in parts.items():
        for part in TIME_PARTS:
            out[breakdown_column(phase, part)] = zero if split is None else _f(split[part])
    out["step_time_s"] = step
    out["tokens_per_s_per_gpu"] = tokens / (step * cluster.num_gpus)
    flops = workload.ppo_epochs * verl_training_flops(model, tokens, sequences * seq ** 2)
    out["mfu"] = flops / (times["update_actor"] * cluster.num_gpus
                          * cluster.gpu.peak_flops(workload.precision))
    out["decode_steps"] = gen["decode_steps"]
    out["kv_holds_sequence"] = gen["kv_holds_sequence"]
    out["update_bubble_s"] = update["bubble_s"]
    out["update_comm_s"] = update["comm_s"]
    stack = np.stack([times[p] for p in PHASES])
    out["dominant_phase"] = stack.argmax(axis=0)
    return out


def step_columns(request: PlanRequest, cols: Columns, memory: Columns | None = None,
                 groups: StepGroups | None = None) -> Columns:
    """The time columns of the request's training step: a GRPO step's phases
    (:func:`grpo_step`, with the layouts' ``memory`` columns, estimated when not given, and
    their ``groups``) or, for a workload without a rollout, a plain Megatron step
    (:func:`pretrain_step`)."""
    if not request.workload.has_rollout:
        return pretrain_step(request, cols)
    return grpo_step(request, cols, estimate_memory(request, cols) if memory is None else memory,
                     groups)


def step_time_s(request: PlanRequest, cols: Columns, memory: Columns,
                groups: StepGroups | None) -> np.ndarray:
    """:func:`step_columns`' ``step_time_s`` alone (a GRPO step's without its other columns,
    :func:`grpo_step_time_s`; ``groups``: the layouts' :class:`StepGroups`, found here when
    None)."""
    if not request.workload.has_rollout:
        return pretrain_step(request, cols)["step_time_s"]
    return grpo_step_time_s(request, cols, memory,
                            StepGroups.of(cols, memory) if groups is None else groups)
