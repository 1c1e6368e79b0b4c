"""Reading an asynchronous verl job's pools: which mode it runs, the trainer and rollout pools,
the pool arithmetic verl needs, and the memory of each pool (planner/placement.py's model).

verl's ``one_step_off_policy`` and ``fully_async_policy`` run the actor on
``trainer.nnodes x trainer.n_gpus_per_node`` GPUs and the rollout on
``rollout.nnodes x rollout.n_gpus_per_node`` others, with the hybrid engine off.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import numpy as np

from planner.catalog.hardware import ClusterSpec
from planner.cost.memory import rollout_memory
from planner.cost.request import PlanRequest
from planner.placement import (
    ROLLOUT_RESIDENT_BYTES,
    split_problems,
    trainer_memory,
)
from planner.units import GIB
from planner.verl.findings import Finding
from planner.verl.keys import ACTOR, ASYNC_TRAINING, ROLLOUT, get

PACKAGE_SEARCHPATH = "hydra.searchpath=[pkg://verl.trainer.config]"


def job_mode(config: dict) -> str:
    """``fully-async`` when the config has verl's ``async_training`` section, ``one-step-off``
    when it has the rollout pool keys without it, else ``sync``."""
    if isinstance(config.get(ASYNC_TRAINING), dict):
        return "fully-async"
    if get(config, "rollout.nnodes", None) is not None:
        return "one-step-off"
    return "sync"


def step_prompts(config: dict) -> int:
    """Prompts a fully-async trainer trains per parameter version: ``ppo_mini_batch_size x
    require_batches x trigger_parameter_sync_step`` (fully_async_trainer.py)."""
    mini = int(get(config, f"{ACTOR}.ppo_mini_batch_size", 1) or 1)
    require = int(get(config, f"{ASYNC_TRAINING}.require_batches", 1) or 1)
    trigger = int(get(config, f"{ASYNC_TRAINING}.trigger_parameter_sync_step", 1) or 1)
    return mini * require * trigger


def with_step_batch(config: dict) -> dict:
    """The config with ``data.train_batch_size`` = what one step trains (fully-async sets it to
    0 and streams), so the batch checks and the workload read one step."""
    if job_mode(config) != "fully-async":
        return config
    out = copy.deepcopy(config)
    out.setdefault("data", {})["train_batch_size"] = step_prompts(config)
    return out


@dataclass(frozen=True)
class Pools:
    trainer: ClusterSpec
    rollout: ClusterSpec


def pools_of(config: dict, trainer: ClusterSpec) -> Pools:
    nnodes = int(get(config, "rollout.nnodes", 1) or 0)
    per_node = int(get(config, "rollout.n_gpus_per_node", trainer.gpus_per_node) or 0)
    gpus = max(nnodes * per_node, 1)
    return Pools(trainer=trainer,
                 rollout=replace(trainer, num_gpus=gpus, gpus_per_node=max(min(per_node, gpus),
                                                                           1)))


def pool_findings(config: dict, mode: str, pools: Pools, cluster_gpus: int | None) -> list:
    """The pool arithmetic and the keys the asynchronous trainers require."""
    out = []
    t, r = pools.trainer.num_gpus, pools.rollout.num_gpus
    if get(config, "actor_rollout_ref.hybrid_engine", True):
        out.append(Finding("pools", f"{mode} needs separate pools: set "
                           f"actor_rollout_ref.hybrid_engine=False (verl asserts it)",
                           ("actor_rollout_ref.hybrid_engine",)))
    nnodes = int(get(config, "rollout.nnodes", 0) or 0)
    per_node = int(get(config, "rollout.n_gpus_per_node", 0) or 0)
    if nnodes < 1 or per_node < 1:
        out.append(Finding("pools", f"rollout.nnodes={nnodes} x rollout.n_gpus_per_node="
                           f"{per_node}: the rollout pool needs at least one GPU",
                           ("rollout.nnodes", "rollout.n_gpus_per_node")))
    if cluster_gpus is not None:
        gpn = pools.trainer.gpus_per_node
        whole = ClusterSpec(pools.trainer.gpu, cluster_gpus,
                            gpn if cluster_gpus > gpn else cluster_gpus)
        for problem in split_problems(whole, t, r):
            out.append(Finding("pools", problem, ("trainer.nnodes", "rollout.nnodes")))
    tp = int(get(config, f"{ROLLOUT}.tensor_model_parallel_size", 1) or 1)
    dp = int(get(config, f"{ROLLOUT}.data_parallel_size", 1) or 1)
    if r % (tp * dp):
        out.append(Finding("pools", f"rollout TP {tp} x DP {dp} = {tp * dp} GPUs per replica "
                           f"does not divide the rollout pool of {r} GPUs (rollout.nnodes x "
                           f"rollout.n_gpus_per_node)",
                           (f"{ROLLOUT}.tensor_model_parallel_size", "rollout.nnodes")))
    if not get(config, f"{ROLLOUT}.calculate_log_probs", False):
        out.append(Finding("pools", f"{mode} trains on the rollout's log-probs: set "
                           f"{ROLLOUT}.calculate_log_probs=True",
                           (f"{ROLLOUT}.calculate_log_probs",)))
    if mode == "one-step-off" and get(config, f"{ROLLOUT}.free_cache_engine", False):
        out.append(Finding("pools", f"one-step-off syncs parameters into a running engine: set "
                           f"{ROLLOUT}.free_cache_engine=False", (f"{ROLLOUT}.free_cache_engine",)))
    if mode == "fully-async":
        if get(config, "data.train_batch_size", 0) != 0:
            out.append(Finding("pools", f"fully-async streams prompts: data.train_batch_size must "
                               f"be 0 (is {get(config, 'data.train_batch_size', None)}); a step "
                               f"is ppo_mini_batch_size x require_batches x "
                               f"trigger_parameter_sync_step", ("data.train_batch_size",)))
        if get(config, "data.gen_batch_size", 1) != 1:
            out.append(Finding("pools", "fully-async generates one prompt at a time: "
                               "data.gen_batch_size must be 1", ("data.gen_batch_size",)))
        staleness = get(config, f"{ASYNC_TRAINING}.staleness_threshold", 0) or 0
        trigger = get(config, f"{ASYNC_TRAINING}.trigger_parameter_sync_step", 1) or 0
        if staleness < 0:
            out.append(Finding("pools", f"{ASYNC_TRAINING}.staleness_threshold {staleness} must "
                               f"be >= 0", (f"{ASYNC_TRAINING}.staleness_threshold",)))
        if trigger < 1:
            out.append(Finding("pools", f"{ASYNC_TRAINING}.trigger_parameter_sync_step "
                               f"{trigger} must be >= 1",
                               (f"{ASYNC_TRAINING}.trigger_parameter_sync_step",)))
    return out


def pool_memory(request: PlanRequest, pools: Pools, layout) -> tuple[dict, list]:
    """Per-GPU memory of each pool (``request``: the job's model, workload and memory policy):
    the trainer's training phases (no rollout engine beside them), vLLM alone on the rollout
    pool.  Returns ``(report, findings)``."""
    workload, policy = request.workload, request.policy
    cols = layout.to_columns()
    trainer = trainer_memory(request.on(pools.trainer), cols)
    capacity = pools.trainer.gpu.memory_bytes
    peak = float(trainer["trainer_peak_bytes"][0])
    rollout = rollout_memory(request.on(pools.rollout), cols, np.array([ROLLOUT_RESIDENT_BYTES]),
                             np.array([layout.gpu_memory_utilization]))
    rollout_peak = float(rollout["mem_generate_bytes"][0])
    phase = str(trainer["trainer_peak_phase"][0])
    findings = []
    name = pools.trainer.gpu.name
    if peak > capacity:
        findings.append(Finding("memory", f"trainer pool will not fit: predicted peak "
                                f"{peak / GIB:.1f} GiB in {phase} exceeds the "
                                f"{capacity / GIB:.1f} GiB of a {name}"))
    elif peak / capacity > policy.high:
        findings.append(Finding("memory", f"trainer pool: {phase} peaks at {peak / GIB:.1f} GiB, "
                                f"above {100 * policy.high:.0f}% of {capacity / GIB:.1f} GiB",
                                (), "warning"))
    kv = int(rollout["kv_cache_tokens_per_gpu"][0])
    if not bool(rollout["rollout_fits"][0]):
        findings.append(Finding("memory", f"rollout pool will not fit: vLLM at "
                                f"gpu_memory_utilization {layout.gpu_memory_utilization} holds "
                                f"{kv} KV tokens per GPU (one sequence needs "
                                f"{workload.sequence_length}) and peaks at "
                                f"{rollout_peak / GIB:.1f} GiB of {capacity / GIB:.1f}",
                                (f"{ROLLOUT}.gpu_memory_utilization",)))
    report = {
        "fits": not any(f.level == "error" for f in findings),
        "trainer": {"gpus": pools.trainer.num_gpus, "peak_memory_gib": round(peak / GIB, 2),
                    "memory_utilization": round(peak / capacity, 4), "peak_phase": phase,
                    "memory_gib": {p: round(float(values[0]) / GIB, 2)
                                   for p, values in trainer["phase_bytes"].items()}},
        "rollout": {"gpus": pools.rollout.num_gpus, "peak_memory_gib": round(rollout_peak / GIB,
                                                                             2),
                    "memory_utilization": round(rollout_peak / capacity, 4),
                    "gpu_memory_utilization": layout.gpu_memory_utilization,
                    "kv_cache_tokens_per_gpu": kv,
                    "concurrent_seqs": int(rollout["rollout_concurrent_seqs"][0])},
    }
    return report, findings
