"""What every mode on separate pools shares: plan and estimate on the splits
(:mod:`planner.placement`), the export of a split as a verl job on the trainer pool, reading
such a job's pools back, and the explanation of the chosen split.

The job runs the mode's verl entry point (``keys.MODE_ENTRY``) on top of the exported overrides
of the trainer pool's layout (``export.job_overrides`` with the trainer pool as the cluster, so
``trainer.nnodes``/``trainer.n_gpus_per_node`` are the trainer pool), plus:

* ``rollout.nnodes`` / ``rollout.n_gpus_per_node``: the rollout pool (the asynchronous entry
  points copy them to ``actor_rollout_ref.rollout``);
* ``actor_rollout_ref.hybrid_engine=False`` (``one_step_off_policy/ray_trainer.py`` asserts it),
  ``rollout.free_cache_engine=False`` and ``calculate_log_probs=True``, and
  ``algorithm.rollout_correction.bypass_mode=True`` -- what the asynchronous recipes' configs
  set;
* what the mode itself adds (one-step-off's Hydra search path, fully-async's streaming and
  ``async_training`` keys).

These are the key map's rows for the mode (:func:`planner.verl.keymap.mode_keys`), each key
spelled once there.

The explanation (``explain --mode``): the split the plan chooses, which pool is the bottleneck
and by how much (its busy time over the other pool's), each pool's idle fraction, the
neighbouring splits -- one node more and one node less for the trainer (one GPU in a single
node) -- with their predicted step and the pool that makes them slower, the parameter sync's
share of the step, and the staleness the mode brings.
"""

from __future__ import annotations

import abc
from dataclasses import replace
from typing import TYPE_CHECKING

from planner.catalog.hardware import ClusterSpec
from planner.catalog.workload import GrpoWorkload
from planner.cost.request import PlanRequest
from planner.errors import NoFitError, PlanInputError
from planner.modes.base import Launch, TrainingMode
from planner.modes.registry import off_policy_note
from planner.output import finite, fraction, prediction_json, seconds, split_json
from planner.placement import (
    ModePlan,
    SplitEstimate,
    estimate_on_splits,
    plan_splits,
    pool_splits,
    split_problems,
)
from planner.results import AsyncTraining, Candidate, SplitCandidate
from planner.search.layout import Columns, Layout
from planner.search.space import SearchOptions
from planner.verl.findings import Finding
from planner.verl.keys import ROLLOUT, get
from planner.verl.pools import Pools

if TYPE_CHECKING:  # a job is exported on --write only: its modules wait until then
    from planner.verl.export import ExportedJob

TIE = 1e-9  # step ratios within this are ties (the plan then prefers the larger rollout pool)


class SplitMode(TrainingMode):
    """Trainer and rollout on separate pools (verl.experimental's asynchronous trainers).

    A subclass states how the pools overlap: :meth:`steady_state` (and :meth:`streaming` when
    the rollout pool streams), :meth:`staleness`, :meth:`async_training`, and what its job adds
    (its rows in :mod:`planner.verl.keymap`, :meth:`mode_findings`, :meth:`reads_config`)."""

    colocated = False
    off_policy = True
    study_fields = ("trainer_gpus",)
    settings_used = ("trainer_gpus",)

    # --- how the pools overlap (planner.placement.SplitSchedule) -----------------------------

    def streaming(self, workload: GrpoWorkload):
        """The rollout pool's in-flight bounds when it streams; None: each batch waits for its
        longest response."""
        return None

    @abc.abstractmethod
    def steady_state(self, generate: float, train: float, sync: float,
                     workload: GrpoWorkload) -> Columns:
        """Seconds per step from the pools' times of one step (planner.cost.pool_time)."""

    def async_training(self, workload: GrpoWorkload) -> AsyncTraining | None:
        return None

    # --- planning -------------------------------------------------------------------------

    def _checked(self, request: PlanRequest) -> PlanRequest:
        if not request.workload.has_rollout:
            raise PlanInputError(f"--mode {self.name} plans GRPO; --workload pretrain has no "
                                 f"rollout")
        return request

    def plan(self, request: PlanRequest, top: int | None = None,
             cache: dict | None = None) -> ModePlan:
        """Every split's best layouts, one candidate per split; ``top``: the first ``top``
        splits alone, the trainer pools of the others searched only as far as it takes to show
        that they rank after them (:func:`planner.placement.first_splits`)."""
        return plan_splits(self, self._checked(request), cache, first=top)

    def estimate(self, request: PlanRequest, layout: Layout,
                 pin_rollout: bool) -> SplitEstimate:
        return estimate_on_splits(self, self._checked(request), layout, pin_rollout)

    def study_values(self, candidate: Candidate) -> dict:
        return {"trainer_gpus": candidate.placement.trainer_gpus, "staleness_threshold": 0.0}

    # --- export ---------------------------------------------------------------------------

    def job_overrides(self, cluster: ClusterSpec, candidate: SplitCandidate) -> list[str]:
        """The overrides the mode adds to the trainer pool's job: the key map's rows for the
        mode (:func:`planner.verl.keymap.mode_keys`; see the module docstring)."""
        from planner.verl.export import settings
        from planner.verl.keymap import Source, mode_keys

        rollout_nodes, rollout_per_node = pool_nodes(cluster, candidate.placement.rollout_gpus)
        pool = {"rollout_nodes": rollout_nodes, "rollout_gpus_per_node": rollout_per_node}
        source = Source(pool=pool, async_training=candidate.async_training)
        return [setting.override() for setting in settings(mode_keys(self.name), source)]

    def job(self, plan: ModePlan, rank: int, launch: Launch) -> ExportedJob:
        """The split ranked ``rank`` among those that fit, as a job on the trainer pool."""
        from planner.verl.export import ExportedJob, check_overrides

        fitting = plan.fitting
        if not 1 <= rank <= len(fitting):
            raise PlanInputError(f"--rank {rank} is outside the {len(fitting)} splits that fit "
                                 f"(valid: 1..{len(fitting)})" if fitting else
                                 "no split fits in GPU memory; nothing to export")
        candidate = fitting[rank - 1]
        trainer_gpus = candidate.placement.trainer_gpus
        trainer = ClusterSpec(plan.cluster.gpu, trainer_gpus,
                              min(plan.cluster.gpus_per_node, trainer_gpus),
                              plan.cluster.host_memory_gib)
        return ExportedJob(model=plan.model, cluster=trainer, workload=plan.workload,
                           layout=candidate.layout, prediction=prediction_json(candidate),
                           rank=rank, model_path=launch.model_path,
                           train_files=launch.train_files, val_files=launch.val_files,
                           extra=tuple(check_overrides(launch.extra_overrides)),
                           mode=self.name,
                           mode_overrides=tuple(self.job_overrides(plan.cluster, candidate)))

    # --- reading a job back (validate) -----------------------------------------------------

    def mode_findings(self, config: dict) -> list[Finding]:
        """The keys the mode's trainer requires beyond every split job's; none by default."""
        return []

    def job_findings(self, config: dict, pools: Pools, cluster_gpus: int | None) -> list:
        """The pool arithmetic and the keys the asynchronous trainers require."""
        out = []
        t, r = pools.trainer.num_gpus, pools.rollout.num_gpus
        if get(config, "actor_rollout_ref.hybrid_engine", True):
            out.append(Finding("pools", f"{self.name} needs separate pools: set "
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
            out.append(Finding("pools", f"{self.name} trains on the rollout's log-probs: set "
                               f"{ROLLOUT}.calculate_log_probs=True",
                               (f"{ROLLOUT}.calculate_log_probs",)))
        return out + self.mode_findings(config)

    # --- explain ------------------------------------------------------------------------------

    def explain(self, request: PlanRequest, plan: ModePlan | None = None) -> dict:
        """The chosen split of the mode's plan (the default search), in figures and words
        (``plan``: of every split; one of its first splits alone is planned again)."""
        if plan is None or plan.first is not None:
            plan = self.plan(replace(request, options=SearchOptions()))
        return explain_split(plan)

    def explain_text(self, report: dict) -> str:
        return "\n".join(split_lines(report) + [f"note: {report['caveat']}"])


def pool_nodes(cluster: ClusterSpec, gpus: int) -> tuple[int, int]:
    """``(nnodes, n_gpus_per_node)`` of a pool of ``gpus`` GPUs."""
    per_node = min(cluster.gpus_per_node, gpus)
    return max(gpus // per_node, 1), per_node


# --- explain ------------------------------------------------------------------------------------


def split_step(cluster: ClusterSpec) -> int:
    """GPUs between neighbouring splits: a node across nodes, one GPU in a single node."""
    return cluster.gpus_per_node if cluster.num_gpus > cluster.gpus_per_node else 1


def _busy(candidate: SplitCandidate, pool: str) -> float:
    """A pool's busy seconds per step, as the plan reports them."""
    return finite(candidate.times.train if pool == "trainer" else candidate.times.generate)


def _pool_words(candidate: SplitCandidate, pool: str) -> str:
    gpus = (candidate.placement.trainer_gpus if pool == "trainer"
            else candidate.placement.rollout_gpus)
    verb = "trains" if pool == "trainer" else "generates"
    return f"the {gpus}-GPU {pool} pool {verb} in {_busy(candidate, pool):.1f} s"


def neighbour_reason(chosen: SplitCandidate, other: SplitCandidate) -> str:
    """Words for why the split ``other`` is slower than ``chosen``: its bottleneck pool's busy
    time against the chosen split's same pool, and a parameter sync that changed."""
    other_step, chosen_step = finite(other.step_time_s), finite(chosen.step_time_s)
    ratio = other_step / chosen_step
    if ratio <= 1 + TIE:
        return (f"as fast ({other_step:.1f} s per step); the plan prefers the "
                f"larger rollout pool on a tie")
    pool = other.bottleneck
    text = (f"{other_step:.1f} s per step, {ratio:.2f}x slower: {pool} bound, "
            f"{_pool_words(other, pool)} (the chosen split: {_busy(chosen, pool):.1f} s)")
    sync, chosen_sync = finite(other.times.param_sync), finite(chosen.times.param_sync)
    if abs(sync - chosen_sync) > 0.05 * chosen_step:
        text += f"; its parameter sync takes {sync:.1f} s ({chosen_sync:.1f} s)"
    return text


def _tried(plan: ModePlan) -> list[int]:
    return list(plan.async_options.trainer_gpus) or pool_splits(plan.cluster)


def neighbours(plan: ModePlan, chosen: SplitCandidate) -> list[dict]:
    """The splits one step (:func:`split_step`) less and more for the trainer, each with its
    predicted step and a verdict in words."""
    cluster = plan.cluster
    step = split_step(cluster)
    unit = "node" if step > 1 else "GPU"
    by_trainer = {c.placement.trainer_gpus: c for c in plan.candidates}
    trainer_gpus = chosen.placement.trainer_gpus
    out = []
    for delta, change in ((-step, f"one {unit} less for the trainer"),
                          (step, f"one {unit} more for the trainer")):
        gpus = trainer_gpus + delta
        entry = {"change": change, "trainer_gpus": gpus, "rollout_gpus": cluster.num_gpus - gpus}
        other = by_trainer.get(gpus)
        if not 0 < gpus < cluster.num_gpus:
            entry["verdict"] = f"no such split: each pool needs at least one {unit}"
        elif gpus not in _tried(plan):
            entry["verdict"] = "not tried (--trainer-gpus leaves it out)"
        elif other is None:
            why = [n.split(": ", 1)[1] for n in plan.notes if n.startswith(f"{gpus} trainer ")]
            entry["verdict"] = f"does not fit: {why[0] if why else 'nothing fits'}"
        else:
            reported = split_json(other)
            entry.update({"step_time_s": reported["step_time_s"],
                          "slower_by": round(finite(other.step_time_s)
                                             / finite(chosen.step_time_s), 3),
                          "bottleneck": other.bottleneck, "time_s": reported["time_s"],
                          "verdict": neighbour_reason(chosen, other)})
        out.append(entry)
    return out


def explain_split(plan: ModePlan) -> dict:
    """The chosen split of a split mode's plan, in figures and words (the ``explain --mode``
    report)."""
    chosen = plan.best
    if chosen is None:
        raise NoFitError(f"no split of {plan.cluster.num_gpus} x {plan.cluster.gpu.name} fits "
                         f"{plan.model.name} in --mode {plan.mode}"
                         + (f" ({'; '.join(plan.notes)})" if plan.notes else ""))
    reported = split_json(chosen)
    step = finite(chosen.step_time_s)
    pool = chosen.bottleneck
    other = "rollout" if pool == "trainer" else "trainer"
    busy, spare = _busy(chosen, pool), _busy(chosen, other)
    param_sync = finite(chosen.times.param_sync)
    return {
        "mode": plan.mode, "model": plan.model.name, "gpus": plan.cluster.num_gpus,
        "gpu_type": plan.cluster.gpu.name, "chosen": reported,
        "bottleneck": {"pool": pool, "busy_s": seconds(busy), "other_pool_busy_s":
                       seconds(spare), "longer_by": fraction(busy / spare - 1) if spare
                       else None},
        "idle_fraction": reported["idle_fraction"],
        "param_sync": {"per_step_s": param_sync,
                       "share_of_step": fraction(param_sync / step),
                       "parts_s": reported["param_sync_s"]},
        "boundary_wait_s": reported["time_s"]["boundary_wait"],
        "neighbours": neighbours(plan, chosen),
        "splits_tried": plan.splits_tried, "splits_fit": len(plan.candidates),
        "staleness": reported["staleness"], "caveat": off_policy_note(),
    }


def split_lines(result: dict) -> list[str]:
    """The ``explain --mode`` report of a split as text (no caveat line)."""
    chosen = result["chosen"]
    placement, times, lay = chosen["placement"], chosen["time_s"], chosen["layout"]
    neck, idle, sync = result["bottleneck"], result["idle_fraction"], result["param_sync"]
    other = "rollout" if neck["pool"] == "trainer" else "trainer"
    lines = [
        f"{result['model']} on {result['gpus']} x {result['gpu_type']}, {result['mode']}: the "
        f"plan splits {placement['trainer_gpus']} trainer + {placement['rollout_gpus']} rollout "
        f"GPUs ({result['splits_fit']} of {result['splits_tried']} splits fit)",
        f"  actor TP{lay['tp']} PP{lay['pp']} CP{lay['cp']} EP{lay['ep']} DP{lay['dp']} "
        f"micro-batch {lay['micro_batch']} on the trainer pool; rollout TP{lay['rollout_tp']} "
        f"DP{lay['rollout_dp']} EP{lay['rollout_ep']} at gpu_memory_utilization "
        f"{lay['gpu_memory_utilization']:.2f} on the rollout pool",
        f"  {chosen['step_time_s']:.1f} s per step: generate {times['generate']:.1f} s and "
        f"train {times['train']:.1f} s overlap, then "
        + (f"a boundary wait of {times['boundary_wait']:.1f} s and " if times["boundary_wait"]
           else "")
        + f"the parameter sync, {sync['per_step_s']:.1f} s ({sync['share_of_step']:.0%} of the "
          f"step: " + ", ".join(f"{part} {value:.1f}" for part, value
                               in sync["parts_s"].items() if part != "total") + " s)",
        f"  bottleneck: the {neck['pool']} pool, busy {neck['busy_s']:.1f} s against the "
        f"{other} pool's {neck['other_pool_busy_s']:.1f} s"
        + (f" ({neck['longer_by']:.0%} longer)" if neck["longer_by"] is not None else "")
        + f"; idle: trainer {idle['trainer']:.0%}, rollout {idle['rollout']:.0%} of the step",
    ]
    for entry in result["neighbours"]:
        lines.append(f"- {entry['change']} ({entry['trainer_gpus']} trainer + "
                     f"{entry['rollout_gpus']} rollout GPUs): {entry['verdict']}")
    stale = result["staleness"]
    lines.append(f"  staleness: a sample lags the policy by up to {stale['max_versions_behind']} "
                 f"version(s), {stale['stale_sample_fraction']:.0%} of samples are stale")
    return lines
