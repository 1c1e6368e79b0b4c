"""Steady-state time of a GRPO step when rollout and training run on separate GPU pools.

verl's asynchronous trainers (``verl.experimental.one_step_off_policy`` and
``verl.experimental.fully_async_policy``; NeMo RL's 1-step-off-policy GRPO) give generation its
own pool of GPUs and the actor its own, so the two phases overlap instead of taking turns on the
same GPUs.  Everything here is built from :mod:`planner.cost.timing`'s phase models (same
formulas, same calibration), evaluated on the pool that runs the phase:

* rollout pool: :func:`~planner.cost.timing.generate_s` on the rollout pool's GPUs (one-step-off
  waits for the batch's longest response, as the colocated engine does).  Fully-async with
  partial rollout streams: sequences interrupted by a parameter sync resume with the new weights,
  so no rank waits for the long tail and the pool runs at its steady concurrency,
  ``S * R_mean / c`` decode steps of :func:`~planner.cost.timing.decode_step_s` at batch ``c``
  (verl fully_async_policy README: "partial rollout ... removes the long-tail");
* trainer pool: the log-prob, reference and update phases of
  :func:`~planner.cost.timing.grpo_step` on the trainer pool's GPUs, plus the per-step fixed
  costs (reward, advantages, data movement);
* parameter sync between pools: the actor's model-parallel all-gather and vLLM's weight load
  (:func:`~planner.cost.timing.weight_sync_s`, its per-tensor or bucketed latency), plus the
  transfer of the full bf16 weights from the trainer pool to the rollout pool: a pipelined NCCL
  broadcast moves every byte once over each receiver's link (``bytes / bandwidth``, independent
  of the receivers; NCCL tests' broadcast bus bandwidth), the network unless both pools share one
  NVLink domain.  verl's per-tensor sync runs the stages one after the other (their sum);
  NeMo RL's bucketed refit double-buffers them (the slowest stage sets the pace).

Steady state (one step = one ``train_batch_size`` of prompts):

* one-step-off: generation of step k+1 overlaps training of step k, then both wait for the
  weights: ``max(G, T) + S``;
* fully-async: the trainer consumes mini-batches as they arrive and syncs every
  ``trigger_parameter_sync_step`` of them; the rollouter may run ``staleness_threshold`` of a
  cycle ahead, which hides the pool that waits at a cycle boundary (the last mini-batch's update,
  or the first mini-batch's generation): ``max(G, T) + min(G, T) / k * max(0, 1 - s * k)`` per
  cycle of ``k`` mini-batches, plus the sync.

The idle fraction of a pool is ``1 - busy / step``; the bottleneck is the busier pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.catalog.hardware import ClusterSpec
from planner.cost.memory import WEIGHT_BYTES
from planner.cost.request import PlanRequest
from planner.cost.speculative import decode_steps
from planner.cost.timing import (
    decode_step_s,
    generate_s,
    link_bandwidth,
    rollout_concurrency,
    synced_params,
    weight_sync_s,
)
from planner.search.batches import mean_prompt_length, mean_response_length
from planner.search.layout import Columns


def _f(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


@dataclass(frozen=True)
class StreamingLimits:
    """How many prompts a streaming rollout pool may run at once: ``max_in_flight_prompts``
    over the pool (None: one step's, NeMo RL's collector semaphore of num_prompts_per_step *
    max_trajectory_age_steps prompt groups, async_utils.py) and ``prompts_per_replica`` per
    engine replica (None: no cap; verl's fully-async rollouter caps it)."""

    max_in_flight_prompts: float | None = None
    prompts_per_replica: float | None = None


def streaming_generate_s(request: PlanRequest, cols: Columns, memory: Columns,
                         limits: StreamingLimits = StreamingLimits()) -> dict[str, np.ndarray]:
    """Generation time of one step's sequences on a pool that streams (partial rollout): the
    prefill of :func:`generate_s` plus ``S * R_mean / c`` decode steps at the full running
    batch ``c`` -- no long-tail wave (interrupted sequences continue after the sync).

    ``c`` is what the KV cache holds (and ``max_num_seqs``), at most the prompts ``limits``
    lets run at once, ``n`` sequences each."""
    cluster, workload = request.cluster, request.workload
    max_in_flight_prompts = limits.max_in_flight_prompts
    prompts_per_replica = limits.prompts_per_replica
    whole = generate_s(request, cols, memory)
    rtp, rdp = _f(cols["rollout_tp"]), _f(cols["rollout_dp"])
    replicas = np.maximum(np.floor(cluster.num_gpus / (rtp * rdp)), 1)
    seqs = workload.sequences_per_step / replicas / rdp  # per attention rank
    prompts = np.full_like(replicas, float(max_in_flight_prompts or workload.train_batch_size))
    if prompts_per_replica is not None:
        prompts = np.minimum(prompts, replicas * prompts_per_replica)
    in_flight = prompts * workload.rollout_n / replicas / rdp  # per attention rank
    concurrency = np.minimum(rollout_concurrency(workload, memory["kv_cache_tokens_per_gpu"],
                                                 memory.get("kv_state_tokens_per_seq", 0.0)),
                             np.maximum(in_flight, 1.0))
    r_mean = mean_response_length(workload)
    steps = decode_steps(seqs * r_mean / concurrency, workload)  # speculation: fewer steps
    step = decode_step_s(request, cols, concurrency, mean_prompt_length(workload) + r_mean / 2)
    decode = np.where(whole["kv_holds_sequence"], steps * step["total_s"], np.inf)
    return {"total_s": whole["prefill_s"] + decode, "prefill_s": whole["prefill_s"],
            "decode_s": decode, "decode_steps": steps, "decode_batch": concurrency}


def pool_sync_s(request: PlanRequest, trainer: ClusterSpec, cols: Columns
                ) -> dict[str, np.ndarray]:
    """Parameter sync from the trainer pool (``trainer``) to the rollout pool of the request's
    cluster, by part (``cols``: the actor's layout with the rollout pool's rollout fields)."""
    model, whole, workload, eff = (request.model, request.cluster, request.workload,
                                   request.efficiency)
    local = weight_sync_s(request.on(trainer), cols)
    total_bytes = float(synced_params(model, workload) * WEIGHT_BYTES)
    span = np.full(len(local["comm_s"]), whole.num_gpus)
    broadcast = total_bytes / link_bandwidth(whole, eff, span)
    gather, load, latency = local["comm_s"], local["compute_s"], local["latency_s"]
    if workload.weight_sync == "bucketed":
        # NeMo RL's packed_broadcast_producer (nemo_rl/utils/packed_tensor.py) packs tensors
        # into buffers on two CUDA streams: the broadcast of buffer N overlaps the gather and
        # packing of buffer N+1, so the slowest of the three stages sets the pace; the fixed
        # once-a-step part of the latency does not pipeline
        total = (np.maximum(np.maximum(gather, broadcast), local["tensor_latency_s"])
                 + local["fixed_s"] + load)
    else:
        # verl's per-tensor sync gathers, broadcasts and loads one tensor after the other
        # (one_step_off_policy / fully_async_policy sync_rollout_weights)
        total = gather + broadcast + load + latency
    return {"gather_s": gather, "broadcast_s": broadcast, "load_s": load,
            "latency_s": latency, "total_s": total}


def pool_state(g: np.ndarray, t: np.ndarray, step: np.ndarray, boundary: np.ndarray,
               sync_per_step: np.ndarray) -> dict[str, np.ndarray]:
    """The steady-state columns of a step of ``step`` seconds in which the rollout pool is busy
    ``g`` and the trainer pool ``t`` seconds: each pool's idle fraction and the bottleneck."""
    with np.errstate(invalid="ignore"):  # an infeasible pool (infinite time): idle NaN
        idle = {"rollout_idle": 1 - g / step, "trainer_idle": 1 - t / step}
    return {"step_time_s": step, "boundary_s": boundary, "sync_per_step_s": sync_per_step,
            **idle, "rollout_bound": g >= t}


def overlapped_steady_state(generate, train, sync) -> dict[str, np.ndarray]:
    """Generation of step k+1 overlaps training of step k, then both wait for the weights
    (one-step-off): ``max(G, T) + S`` per step, from the pool times of one step (generation
    ``G``, training ``T``, one parameter sync ``S``), with the idle fractions of both pools and
    the bottleneck pool."""
    g, t, s = _f(generate), _f(train), _f(sync)
    step = np.maximum(g, t) + s
    return pool_state(g, t, step, np.zeros_like(step), s * np.ones_like(step))


@dataclass(frozen=True)
class SyncCycle:
    """How a streaming trainer syncs: ``mini_batches_per_step`` mini-batches per step, a
    parameter sync every ``trigger_parameter_sync_step`` of them, and the rollouter running up
    to ``staleness_threshold`` of a cycle ahead."""

    mini_batches_per_step: float = 1.0
    trigger_parameter_sync_step: int = 1
    staleness_threshold: float = 0.0


def streamed_steady_state(generate, train, sync, cycle: SyncCycle) -> dict[str, np.ndarray]:
    """The trainer consumes mini-batches as they arrive and syncs every ``k`` of them
    (fully-async): ``max(G, T) + min(G, T) / k * max(0, 1 - s * k)`` per cycle plus the syncs
    (module docstring), with the idle fractions and the bottleneck pool."""
    g, t, s = _f(generate), _f(train), _f(sync)
    k = float(cycle.trigger_parameter_sync_step)
    cycles = cycle.mini_batches_per_step / k  # parameter syncs per step
    hidden = min(1.0, cycle.staleness_threshold * k)
    boundary = np.minimum(g, t) / cycle.mini_batches_per_step * (1 - hidden) * cycles
    step = np.maximum(g, t) + boundary + s * cycles
    return pool_state(g, t, step, boundary, s * np.full_like(g, cycles))
