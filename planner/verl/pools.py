"""Reading an asynchronous verl job's pools: the trainer and rollout pools and the memory of
each pool (planner/placement.py's model).  Which mode a job runs and the keys each mode
requires are the modes' (:mod:`planner.modes`).

verl's ``one_step_off_policy`` and ``fully_async_policy`` run the actor on
``trainer.nnodes x trainer.n_gpus_per_node`` GPUs and the rollout on
``rollout.nnodes x rollout.n_gpus_per_node`` others, with the hybrid engine off.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from planner.catalog.hardware import ClusterSpec
from planner.cost.memory import rollout_memory
from planner.cost.request import PlanRequest
from planner.output import fraction, gib
from planner.placement import (
    ROLLOUT_RESIDENT_BYTES,
    trainer_memory,
)
from planner.units import GIB, kv_pool_text
from planner.verl.findings import Finding
from planner.verl.keys import ROLLOUT, get

PACKAGE_SEARCHPATH = "hydra.searchpath=[pkg://verl.trainer.config]"


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
    in_bytes = bool(rollout["kv_pool_in_bytes"][0])  # no growing K/V: the pool counts bytes
    one_sequence = (f"{float(rollout['kv_state_tokens_per_seq'][0]) / GIB:.2f} GiB of pages"
                    if in_bytes else workload.sequence_length)
    if not bool(rollout["rollout_fits"][0]):
        findings.append(Finding("memory", f"rollout pool will not fit: vLLM at "
                                f"gpu_memory_utilization {layout.gpu_memory_utilization} holds "
                                f"{kv_pool_text(kv, in_bytes, ' per GPU')} (one sequence "
                                f"needs {one_sequence}) and peaks at "
                                f"{rollout_peak / GIB:.1f} GiB of {capacity / GIB:.1f}",
                                (f"{ROLLOUT}.gpu_memory_utilization",)))
    report = {
        "fits": not any(f.level == "error" for f in findings),
        "trainer": {"gpus": pools.trainer.num_gpus, "peak_memory_gib": gib(peak),
                    "memory_utilization": fraction(peak / capacity), "peak_phase": phase,
                    "memory_gib": {p: gib(values[0])
                                   for p, values in trainer["phase_bytes"].items()}},
        "rollout": {"gpus": pools.rollout.num_gpus, "peak_memory_gib": gib(rollout_peak),
                    "memory_utilization": fraction(rollout_peak / capacity),
                    "gpu_memory_utilization": layout.gpu_memory_utilization,
                    "kv_cache_tokens_per_gpu": None if in_bytes else kv,
                    **({"kv_cache_gib": gib(kv)} if in_bytes else {}),
                    "concurrent_seqs": int(rollout["rollout_concurrent_seqs"][0])},
    }
    return report, findings
