"""Export of the asynchronous modes: a planned split as a runnable verl job.

The job runs verl's experimental entry point (``keys.MODE_ENTRY``) on top of the exported
overrides of the trainer pool's layout (``export.job_overrides`` with the trainer pool as the
cluster, so ``trainer.nnodes``/``trainer.n_gpus_per_node`` are the trainer pool), plus:

* ``rollout.nnodes`` / ``rollout.n_gpus_per_node``: the rollout pool (both entry points copy
  them to ``actor_rollout_ref.rollout``);
* ``actor_rollout_ref.hybrid_engine=False`` (``one_step_off_policy/ray_trainer.py`` asserts it),
  ``rollout.free_cache_engine=False`` and ``calculate_log_probs=True``, and
  ``algorithm.rollout_correction.bypass_mode=True`` -- what both recipes' configs set;
* fully-async: ``data.train_batch_size=0`` and ``data.gen_batch_size=1`` (the rollouter asserts
  both), ``async_training.staleness_threshold``, ``trigger_parameter_sync_step``,
  ``require_batches``, ``partial_rollout``, and ``rollout.total_rollout_steps=null`` (the
  dataset's length; the recipe config's 100 would stop after 100 prompts).
"""

from __future__ import annotations

from typing import Sequence

from planner.catalog.hardware import ClusterSpec
from planner.errors import PlanInputError
from planner.search.layout import Layout
from planner.verl.export import ExportedJob, check_overrides, settings
from planner.verl.keymap import Source, mode_keys


def pool_nodes(cluster: ClusterSpec, gpus: int) -> tuple[int, int]:
    """``(nnodes, n_gpus_per_node)`` of a pool of ``gpus`` GPUs."""
    per_node = min(cluster.gpus_per_node, gpus)
    return max(gpus // per_node, 1), per_node


def mode_overrides(mode: str, cluster: ClusterSpec, candidate: dict) -> list[str]:
    """The overrides an asynchronous mode adds to the trainer pool's job: the key map's rows
    for the mode (:func:`planner.verl.keymap.mode_keys`)."""
    rollout_nodes, rollout_per_node = pool_nodes(cluster, candidate["placement"]["rollout_gpus"])
    pool = {"rollout_nodes": rollout_nodes, "rollout_gpus_per_node": rollout_per_node}
    source = Source(pool=pool, async_training=candidate.get("async_training"))
    return [setting.override() for setting in settings(mode_keys(mode), source)]


def job_from_mode_plan(plan, rank: int = 1, *, model_path: str | None = None,
                       train_files: str | None = None, val_files: str | None = None,
                       extra_overrides: Sequence[str] = ()) -> ExportedJob:
    """The split ranked ``rank`` of an asynchronous mode's plan
    (:class:`planner.placement.ModePlan`) as an exported job."""
    fitting = [c for c in plan.candidates if c["fits"]]
    if not 1 <= rank <= len(fitting):
        raise PlanInputError(f"--rank {rank} is outside the {len(fitting)} splits that fit "
                             f"(valid: 1..{len(fitting)})" if fitting else
                             "no split fits in GPU memory; nothing to export")
    candidate = fitting[rank - 1]
    trainer_gpus = candidate["placement"]["trainer_gpus"]
    trainer = ClusterSpec(plan.cluster.gpu, trainer_gpus,
                          min(plan.cluster.gpus_per_node, trainer_gpus),
                          plan.cluster.host_memory_gib)
    trainer_pool = candidate["pools"]["trainer"]
    prediction = {**candidate, "peak_memory_gib": trainer_pool["peak_memory_gib"],
                  "memory_utilization": trainer_pool["memory_utilization"],
                  "peak_phase": trainer_pool["peak_phase"]}
    prediction.pop("layout", None)
    return ExportedJob(model=plan.model, cluster=trainer, workload=plan.workload,
                       layout=Layout(**candidate["layout"]), prediction=prediction, rank=rank,
                       model_path=model_path, train_files=train_files, val_files=val_files,
                       extra=tuple(check_overrides(extra_overrides)), mode=plan.mode,
                       mode_overrides=tuple(mode_overrides(plan.mode, plan.cluster, candidate)))
