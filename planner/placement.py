"""Separate GPU pools for rollout and training: the machinery every asynchronous training mode
shares.

verl's asynchronous trainers give rollout and training separate GPU pools (verl asserts
``hybrid_engine`` off, ``one_step_off_policy/ray_trainer.py``).  This module decides the split
of the cluster into a trainer pool and a rollout pool -- whole nodes when the cluster spans nodes
(verl's ``trainer.nnodes``/``rollout.nnodes`` resource pools) -- then, per split, the actor's
Megatron layout on the trainer pool (the same search space and cost model as a plan) and the
rollout engine's TP/DP/EP on the rollout pool, each checked for memory on its own pool, and
predicts the steady-state step.  How the pools overlap -- the steady state, the streaming of the
rollout pool, the staleness, the ``async_training`` settings -- is the mode's
(:class:`SplitSchedule`, implemented by the modes of :mod:`planner.modes`); nothing here names a
mode.  :func:`plan_splits` plans every split, :func:`estimate_on_splits` scores one given actor
layout the same way (``estimate --mode``): both go through :func:`trainer_times` (an actor layout
on a trainer pool) and :func:`score_splits` (the splits, each pool's choice, the steady state).

Separate pools have no colocation pressure: the trainer keeps its parameters and optimizer state
resident (no parameter/optimizer offload is searched) and vLLM takes what the GPU leaves after
its context (``gpu_memory_utilization`` up to the memory model's maximum).  verl's asynchronous
recipes use the rollout's log-probs (``algorithm.rollout_correction.bypass_mode``), so the
trainer skips the old-log-prob pass.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Protocol

import numpy as np

from planner.catalog.hardware import ClusterSpec
from planner.catalog.workload import GrpoWorkload
from planner.cost.columns import time_column
from planner.cost.memory import (
    CUDA_CONTEXT_BYTES,
    NCCL_BUFFER_BYTES,
    ROLLOUT_HEADROOM_FRACTION,
    UTILIZATION_MAX,
    UTILIZATION_STEP,
    actor_memory,
    estimate_memory,
    rollout_memory,
)
from planner.cost.pool_time import StreamingLimits, pool_sync_s, streaming_generate_s
from planner.cost.request import OfRequest, PlanRequest
from planner.cost.timing import (
    StepGroups,
    generate_s,
    grpo_step,
    log_prob_phase_s,
    update_phase_s,
    weight_sync_s,
)
from planner.cost.trajectory import (
    END_COLUMN,
    START_COLUMN,
    columns_over_run,
    seconds_over_run,
    steady_state_over_run,
)
from planner.errors import InvalidLayoutError, NoFitError, PlanInputError
from planner.plan import ROLLOUT_FIELDS, Plan
from planner.ranking import best_first, prediction_order
from planner.results import (
    AsyncTraining,
    Candidate,
    IdleFractions,
    Placement,
    RolloutPoolUsage,
    SplitCandidate,
    SplitTimes,
    Staleness,
    SyncParts,
    TrainerPoolUsage,
)
from planner.search.batches import mean_response_length
from planner.search.layout import Columns, Layout
from planner.search.rules import RULES, violations
from planner.search.rules import explain as broken_rules
from planner.search.space import ROLLOUT_RULES, SearchOptions, build_space, rollout_options

TRAINING_PHASES_ASYNC = ("old_log_prob", "ref", "update_actor")


@dataclass(frozen=True)
class AsyncOptions:
    """verl's ``async_training`` settings (fully-async) and the splits to try."""

    staleness_threshold: float = 0.1  # async_training.staleness_threshold (verl's default)
    # async_training.trigger_parameter_sync_step; 0: one sync per train batch
    # (train_batch_size / ppo_mini_batch_size local steps, as often as sync mode updates)
    trigger_parameter_sync_step: int = 0
    partial_rollout: bool = True  # async_training.partial_rollout
    trainer_gpus: tuple[int, ...] = ()  # the trainer pool sizes to try; (): every legal split

    def trigger_for(self, workload: GrpoWorkload) -> int:
        return self.trigger_parameter_sync_step or mini_batches_per_step(workload)


def mini_batches_per_step(workload: GrpoWorkload) -> int:
    return max(workload.train_batch_size // workload.mini_batch_size, 1)


class SplitSchedule(Protocol):
    """How a mode runs its two pools, what the split evaluation asks of it.

    Implemented by the asynchronous modes of :mod:`planner.modes`; called once per split
    evaluated, with the workload as the asynchronous recipes run it (:func:`async_workload`).
    """

    name: str  # the mode's name, recorded in each candidate
    settings: AsyncOptions

    def streaming(self, workload: GrpoWorkload) -> StreamingLimits | None:
        """The rollout pool streams (partial rollout, no long tail) within these in-flight
        bounds; None: each batch waits for its longest response."""

    def steady_state(self, generate: float, train: float, sync: float,
                     workload: GrpoWorkload) -> Columns:
        """Seconds per step from the pools' times of one step (:mod:`planner.cost.pool_time`'s
        steady-state columns); ``step_time_s`` must not decrease as ``train`` or ``sync``
        grows (:func:`first_splits` bounds a split's step from below by it)."""

    def staleness(self) -> Staleness:
        """What the mode does to the algorithm."""

    def async_training(self, workload: GrpoWorkload) -> AsyncTraining | None:
        """The ``async_training`` settings its candidates run with (None: not used)."""


def pool_splits(cluster: ClusterSpec) -> list[int]:
    """Trainer pool sizes (GPUs) of every legal split: whole nodes across nodes, any size in
    one node; each pool keeps at least one node (one GPU)."""
    if cluster.num_gpus > cluster.gpus_per_node:
        return [k * cluster.gpus_per_node for k in range(1, cluster.num_nodes)]
    return list(range(1, cluster.num_gpus))


def split_problems(cluster: ClusterSpec, trainer_gpus: int, rollout_gpus: int) -> list[str]:
    """Pool arithmetic verl's resource pools need, as messages (empty: a legal split)."""
    problems = []
    if trainer_gpus < 1 or rollout_gpus < 1:
        problems.append(f"pools of {trainer_gpus} trainer and {rollout_gpus} rollout GPUs: "
                        f"each pool needs at least one GPU")
    if trainer_gpus + rollout_gpus != cluster.num_gpus:
        problems.append(f"trainer {trainer_gpus} + rollout {rollout_gpus} GPUs = "
                        f"{trainer_gpus + rollout_gpus}, not the cluster's {cluster.num_gpus}")
    if cluster.num_gpus > cluster.gpus_per_node:
        for name, gpus in (("trainer", trainer_gpus), ("rollout", rollout_gpus)):
            if gpus % cluster.gpus_per_node:
                problems.append(f"{name} pool of {gpus} GPUs is not whole nodes of "
                                f"{cluster.gpus_per_node}")
    return problems


def pool_cluster(cluster: ClusterSpec, gpus: int) -> ClusterSpec:
    return replace(cluster, num_gpus=gpus, gpus_per_node=min(cluster.gpus_per_node, gpus))


def async_workload(workload: GrpoWorkload) -> GrpoWorkload:
    """verl's asynchronous recipes train on the rollout's log-probs (bypass mode) and keep the
    rollout engine awake (``free_cache_engine: False``)."""
    return replace(workload, bypass_old_log_prob=True, free_cache_engine=False)


# --- the trainer pool -------------------------------------------------------------------------


def trainer_rows(cols: Columns) -> Columns:
    """Actor layouts ``cols`` as the cost model's rows on a trainer pool: the rollout fields
    (which the rollout pool chooses) at 1 and ``gpu_memory_utilization`` at 0.5, read by
    nothing the trainer pool runs."""
    n = len(cols["tp"])
    return {**cols, **{name: np.ones(n, dtype=np.int64) for name in ROLLOUT_FIELDS},
            "gpu_memory_utilization": np.full(n, 0.5)}


def trainer_memory(request: PlanRequest, cols: Columns) -> Columns:
    """Per-GPU memory of the trainer pool: the training phases the step runs and the weight
    gather of the sync -- the actor's state and transients alone (:func:`actor_memory`): no
    rollout engine, KV pool or rollout weights live on these GPUs.  ``phase_bytes`` holds each
    phase's nvidia-smi peak; ``memory`` the full memory columns the time model reads."""
    cluster, workload = request.cluster, request.workload
    rows = trainer_rows(cols)
    actor = actor_memory(request, rows)
    ran = [phase for phase in TRAINING_PHASES_ASYNC if phase in workload.phases]
    # the gather for the sync holds the actor state and a transfer bucket
    phases = {phase: np.max(actor["phases"][phase], axis=0) for phase in (*ran, "weight_sync")}
    names = list(phases)
    stacked = np.stack([phases[name] for name in names])
    peak = stacked.max(axis=0)
    capacity = float(cluster.gpu.memory_bytes)
    memory = estimate_memory(request, rows, actor=actor)
    return {"trainer_peak_bytes": peak,
            "trainer_peak_phase": np.array(names)[stacked.argmax(axis=0)],
            "trainer_fits": (peak <= capacity) & memory["host_fits"].astype(bool),
            "phase_bytes": phases, "memory": memory}


def trainer_search_options(options: SearchOptions) -> SearchOptions:
    """The trainer pool's search: state stays resident (no parameter, optimizer or CPU-optimizer
    offload), rollout fields left out (the rollout pool chooses them)."""
    fixed = tuple((name, value) for name, value in options.fixed
                  if name not in ROLLOUT_FIELDS and name != "gpu_memory_utilization")
    fixed += tuple((name, 1) for name in ROLLOUT_FIELDS)
    return replace(options, offload=(False,), optimizer_cpu_fraction=(0.0,), fixed=fixed)


def trainer_times(request: PlanRequest, cols: Columns, memory: Columns) -> Columns:
    """The actor layouts ``cols`` on the trainer pool, one row each: the training phases'
    seconds (:data:`TRAINING_PHASES_ASYNC` plus the step's fixed costs) and the trainer's share
    of the parameter sync (the model-parallel gather), with the layouts' trainer memory
    (``memory``: :func:`trainer_memory` of the same rows).  The one evaluation of an actor
    layout on a trainer pool: :func:`best_trainer` runs it on the layouts that fit, ``estimate
    --mode`` (:func:`estimate_on_splits`) on the one given."""
    eff = request.efficiency
    rows = trainer_rows(cols)
    # the training phases' expected seconds over the run and at its nodes
    # (planner.cost.trajectory), each phase timed once per distinct row of what it reads,
    # shared by the run's points
    groups = StepGroups.of(rows, memory["memory"])
    times, at_nodes = columns_over_run(
        request, lambda at: grpo_step(at, rows, memory["memory"], groups))

    def train_s(columns: Columns) -> np.ndarray:
        return sum(columns[time_column(phase)] for phase in TRAINING_PHASES_ASYNC) \
            + eff.step_fixed_s

    return {"rows": rows, "train_s": train_s(times),
            "train_at_nodes_s": np.stack([train_s(node) for node in at_nodes]),
            "gather_s": weight_sync_s(request, rows)["comm_s"],
            "phase_s": {phase: times[time_column(phase)] for phase in TRAINING_PHASES_ASYNC},
            "fixed_s": float(eff.step_fixed_s), "peak_bytes": memory["trainer_peak_bytes"],
            "peak_phase": memory["trainer_peak_phase"], "fits": memory["trainer_fits"]}


def trainer_floor_s(request: PlanRequest) -> np.ndarray | None:
    """A lower bound on the training seconds of every actor layout of the trainer pool's search
    (``request``: on the trainer pool) at each of the run's nodes
    (:data:`planner.cost.trajectory.NODES`): what :func:`trainer_times` gives any of them at
    least, whether it fits or not; None when the search has no layout.

    :func:`trainer_times` sums per layout the log-prob passes the step runs (old log-prob,
    reference: each :func:`log_prob_phase_s` plus an offload trip), the update
    (:func:`update_phase_s` plus offload trips) and the step's fixed costs; a trip is at least
    0, so the sum is at least each pass's smallest time over the layouts plus the fixed costs.
    Each pass is timed once per distinct row of what it reads, as the step times it."""
    model, cluster, workload = request.model, request.cluster, request.workload
    cols = build_space(model, cluster, workload, trainer_search_options(request.options)).columns
    if not len(cols["tp"]):
        return None
    passes = sum(phase in workload.phases for phase in ("old_log_prob", "ref"))
    # (no memory columns: generation, which reads them, is not timed)
    groups = StepGroups.of(trainer_rows(cols), {})

    def floor_s(at: PlanRequest) -> float:
        reading = np.min(log_prob_phase_s(at, groups.log_prob.rows)["total_s"]) if passes else 0
        return (passes * reading + np.min(update_phase_s(at, groups.update.rows)["total_s"])
                + at.efficiency.step_fixed_s)

    return seconds_over_run(request, floor_s)[1]


def sync_floor_s(request: PlanRequest, trainer: ClusterSpec, rollout: RolloutChoice) -> float:
    """A lower bound on one parameter sync (:func:`pool_sync_s`) from any actor layout on the
    ``trainer`` pool to the rollout pool's ``rollout`` choice: the sync of an actor without
    model parallelism, whose gather is 0.  The gather is the only part that reads the actor's
    layout, and the total does not decrease as it grows (a sum, or a pipeline's slowest stage
    plus the rest)."""
    cols = {**{name: np.ones(1, dtype=np.int64) for name in ("tp", "pp", "cp", "ep")},
            **{name: np.array([rollout.layout[name]]) for name in ROLLOUT_FIELDS}}
    return float(pool_sync_s(request, trainer, cols)["total_s"][0])


def _take(cols: Columns, keep: np.ndarray) -> Columns:
    return {name: values[keep] for name, values in cols.items()}


def trainer_choice(request: PlanRequest, scored: Columns, i: int) -> "TrainerChoice":
    """Row ``i`` of :func:`trainer_times` (``request``: on the trainer pool) as the trainer
    pool's part of a split."""
    return TrainerChoice(
        layout={name: values[i] for name, values in scored["rows"].items()
                if name not in ROLLOUT_FIELDS},
        train_s=float(scored["train_s"][i]),
        train_at_nodes_s=tuple(float(value) for value in scored["train_at_nodes_s"][:, i]),
        usage=TrainerPoolUsage(
            gpus=request.cluster.num_gpus, peak_bytes=float(scored["peak_bytes"][i]),
            capacity_bytes=request.cluster.gpu.memory_bytes, fits=bool(scored["fits"][i]),
            peak_phase=str(scored["peak_phase"][i]),
            phase_s={phase: float(values[i]) for phase, values in scored["phase_s"].items()},
            step_fixed_s=scored["fixed_s"]))


@dataclass(frozen=True)
class TrainerChoice:
    """The actor layout a trainer pool runs (its layout fields, no rollout fields), its
    training seconds per step and the pool's usage."""

    layout: Mapping[str, Any]
    train_s: float  # expected over the run
    # at the run's first, middle and last step (planner.cost.trajectory.NODES)
    train_at_nodes_s: tuple[float, ...]
    usage: TrainerPoolUsage


@dataclass(frozen=True)
class RolloutChoice:
    """The engine layout a rollout pool runs: its rollout fields and
    ``gpu_memory_utilization``, its generation seconds per step (inf: cannot generate), and its
    memory."""

    layout: Mapping[str, Any]
    generate_s: float  # expected over the run
    # at the run's first, middle and last step (planner.cost.trajectory.NODES)
    generate_at_nodes_s: tuple[float, ...]
    peak_bytes: float
    kv_cache_tokens_per_gpu: int  # bytes where kv_in_bytes
    kv_cache_bytes: float
    concurrent_seqs: int
    fits: bool
    kv_in_bytes: bool = False  # no K/V grows per token: the pool counts bytes


def best_trainer(request: PlanRequest) -> TrainerChoice | None:
    """The actor layout on the trainer pool that fits and trains fastest (training phases plus
    its share of the sync: the model-parallel gather), or None when none fits, by
    :mod:`planner.ranking`'s rule (peak inside the memory band first, then the time, then the
    peak).  ``request``: on the trainer pool."""
    model, cluster, workload = request.model, request.cluster, request.workload
    space = build_space(model, cluster, workload, trainer_search_options(request.options))
    cols = space.columns
    if not len(cols["tp"]):
        return None
    mem = trainer_memory(request, cols)
    fits = mem["trainer_fits"]
    if not fits.any():
        return None
    nested = ("memory", "phase_bytes")
    fitting = {**_take({name: values for name, values in mem.items() if name not in nested},
                       fits),
               **{name: _take(mem[name], fits) for name in nested}}  # of the fitting rows
    scored = trainer_times(request, _take(cols, fits), fitting)
    peak = scored["peak_bytes"]
    tight = peak / cluster.gpu.memory_bytes > request.policy.high
    order = prediction_order(np.ones(len(peak), dtype=bool),
                             scored["train_s"] + scored["gather_s"], peak, tight)
    return trainer_choice(request, scored, int(order[0]))


# --- the rollout pool -------------------------------------------------------------------------

ROLLOUT_RESIDENT_BYTES = CUDA_CONTEXT_BYTES + NCCL_BUFFER_BYTES  # no actor state beside vLLM


def standalone_utilization(cluster: ClusterSpec) -> float:
    """``gpu_memory_utilization`` of a GPU that runs only vLLM: all the memory model leaves
    beside the CUDA context, NCCL buffers and its headroom, at most its maximum."""
    free = 1 - ROLLOUT_HEADROOM_FRACTION - ROLLOUT_RESIDENT_BYTES / cluster.gpu.memory_bytes
    return float(min(np.floor(free / UTILIZATION_STEP + 1e-9) * UTILIZATION_STEP,
                     UTILIZATION_MAX))


def rollout_pool_options(request: PlanRequest) -> Columns:
    """The rollout options the rules allow on the request's cluster (a rollout pool)."""
    model, cluster, workload = request.model, request.cluster, request.workload
    cols = rollout_options(model, cluster, request.options)
    probe = {**cols, "tp": np.ones_like(cols["rollout_tp"])}
    rules = tuple(rule for rule in RULES if rule.name in ROLLOUT_RULES)
    broken = violations(model, cluster, workload, probe, rules)
    ok = ~np.any([values for values in broken.values()], axis=0) if broken else \
        np.ones(len(cols["rollout_tp"]), dtype=bool)
    return {name: values[ok] for name, values in cols.items()}


def rollout_pool(request: PlanRequest, streaming: StreamingLimits | None) -> Columns:
    """Every legal rollout option on a standalone rollout pool (``request``: on that pool),
    with its memory -- the KV pool sized for sequences of the maximum length -- and its
    generation time for one step's sequences (``streaming``: partial rollout, no tail, with the
    mode's in-flight bounds; None: the batch waits for its longest): ``generate_s`` expected
    over the run, ``generate_at_nodes_s`` at its first, middle and last step."""
    options = request.options
    cols = rollout_pool_options(request)
    n = len(cols["rollout_tp"])
    utilization = (options.gpu_memory_utilization if options.gpu_memory_utilization is not None
                   else standalone_utilization(request.cluster))
    memory = rollout_memory(request, cols, np.full(n, ROLLOUT_RESIDENT_BYTES),
                            np.full(n, utilization))
    expected, at_nodes = seconds_over_run(request, lambda at: (
        streaming_generate_s(at, cols, memory, streaming) if streaming is not None
        else generate_s(at, cols, memory))["total_s"])
    fits = memory["rollout_fits"].astype(bool)
    return {**cols, **memory, "generate_s": np.where(fits, expected, np.inf),
            "generate_at_nodes_s": np.where(fits, at_nodes, np.inf),
            "rollout_peak_bytes": memory["mem_generate_bytes"], "fits": fits}


def rollout_choice(pool: Columns, i: int) -> RolloutChoice:
    """Row ``i`` of :func:`rollout_pool` as the rollout pool's part of a split."""
    def scalar(name: str):
        value = pool[name][i]
        return value.item() if hasattr(value, "item") else value

    return RolloutChoice(
        layout={name: scalar(name) for name in (*ROLLOUT_FIELDS, "gpu_memory_utilization")},
        generate_s=float(scalar("generate_s")),
        generate_at_nodes_s=tuple(float(value) for value in pool["generate_at_nodes_s"][:, i]),
        peak_bytes=float(scalar("rollout_peak_bytes")),
        kv_cache_tokens_per_gpu=int(scalar("kv_cache_tokens_per_gpu")),
        kv_cache_bytes=float(scalar("kv_cache_bytes")),
        concurrent_seqs=int(scalar("rollout_concurrent_seqs")), fits=bool(scalar("fits")),
        kv_in_bytes=bool(scalar("kv_pool_in_bytes")))


def best_rollout(pool: Columns) -> RolloutChoice | None:
    """The rollout option of :func:`rollout_pool` that can generate and does so fastest, the
    smaller replica on a tie (:mod:`planner.ranking`'s rule); None when none can."""
    runs = np.isfinite(pool["generate_s"])
    if not len(pool["rollout_tp"]) or not runs.any():
        return None
    replica = pool["rollout_tp"] * pool["rollout_dp"]
    return rollout_choice(pool, int(prediction_order(runs, pool["generate_s"], replica)[0]))


# --- one split ------------------------------------------------------------------------------


def split_candidate(schedule: SplitSchedule, request: PlanRequest, pools: tuple[ClusterSpec,
                    ClusterSpec], trainer: TrainerChoice, rollout: RolloutChoice
                    ) -> SplitCandidate:
    """One split's prediction: ``request`` on the whole cluster (the workload as the
    asynchronous recipes run it), ``pools`` the trainer and rollout pools, ``trainer`` and
    ``rollout`` what each runs."""
    cluster, workload = request.cluster, request.workload
    trainer_cluster, rollout_cluster = pools
    layout = Layout.from_row({**trainer.layout, **rollout.layout})
    cols = layout.to_columns()
    sync = pool_sync_s(request, trainer_cluster, cols)
    # the steady state at the run's first, middle and last step; step_time_s expected over it
    state = steady_state_over_run(
        lambda g, t, s: schedule.steady_state(g, t, s, workload),
        rollout.generate_at_nodes_s, trainer.train_at_nodes_s, float(sync["total_s"][0]))
    step = float(state["step_time_s"])
    feasible = bool(np.isfinite(step))  # a pool that cannot run has no step, idle or rate
    tokens = workload.sequences_per_step * workload.mean_sequence_length
    generated = workload.sequences_per_step * mean_response_length(workload)
    generating = bool(np.isfinite(rollout.generate_s))
    return SplitCandidate(
        mode=schedule.name, placement=Placement.pools(trainer_cluster, rollout_cluster),
        layout=layout, fits=trainer.usage.fits and rollout.fits, step_time_s=step,
        tokens_per_s_per_gpu=tokens / (step * cluster.num_gpus) if feasible else None,
        staleness=schedule.staleness(),
        step_time_start_s=float(state[START_COLUMN]), step_time_end_s=float(state[END_COLUMN]),
        times=SplitTimes(generate=rollout.generate_s, train=trainer.train_s,
                         param_sync=float(state["sync_per_step_s"]),
                         boundary_wait=float(state["boundary_s"])),
        param_sync=SyncParts(*(float(sync[f"{part}_s"][0]) for part in
                               ("gather", "broadcast", "load", "latency", "total"))),
        bottleneck="rollout" if bool(state["rollout_bound"]) else "trainer",
        idle=IdleFractions(trainer=float(state["trainer_idle"]),
                           rollout=float(state["rollout_idle"])),
        trainer_pool=trainer.usage,
        rollout_pool=RolloutPoolUsage(
            gpus=rollout_cluster.num_gpus, peak_bytes=rollout.peak_bytes,
            capacity_bytes=cluster.gpu.memory_bytes, fits=rollout.fits,
            gpu_memory_utilization=float(rollout.layout["gpu_memory_utilization"]),
            kv_cache_tokens_per_gpu=rollout.kv_cache_tokens_per_gpu,
            kv_cache_bytes=rollout.kv_cache_bytes, concurrent_seqs=rollout.concurrent_seqs,
            kv_in_bytes=rollout.kv_in_bytes,
            generated_tokens_per_s=generated / rollout.generate_s if generating else None),
        async_training=schedule.async_training(workload))


def split_clusters(cluster: ClusterSpec, trainer_gpus: int) -> tuple[ClusterSpec, ClusterSpec]:
    """The trainer and rollout pools of a split; an illegal split is an input error."""
    rollout_gpus = cluster.num_gpus - trainer_gpus
    problems = split_problems(cluster, trainer_gpus, rollout_gpus)
    if problems:
        raise PlanInputError("; ".join(problems))
    return pool_cluster(cluster, trainer_gpus), pool_cluster(cluster, rollout_gpus)


def score_splits(schedule: SplitSchedule, request: PlanRequest, splits: list[int],
                 choose: tuple[Callable[[ClusterSpec], TrainerChoice | None],
                               Callable[[ClusterSpec], RolloutChoice | None]]
                 ) -> tuple[list[SplitCandidate], list[str]]:
    """Every split's candidate (:func:`split_candidate`) in the order of ``splits``, and a note
    per split where ``choose`` -- the trainer pool's choice, the rollout pool's -- found nothing
    that fits."""
    trainer_for, rollout_for = choose
    candidates, notes = [], []
    for trainer_gpus in splits:
        t_cluster, r_cluster = split_clusters(request.cluster, trainer_gpus)
        trainer, rollout = trainer_for(t_cluster), rollout_for(r_cluster)
        if trainer is None or rollout is None:
            notes.append(no_fit_note(trainer_gpus, r_cluster.num_gpus, trainer is None,
                                     rollout is None))
            continue
        candidates.append(split_candidate(schedule, request, (t_cluster, r_cluster), trainer,
                                          rollout))
    return candidates, notes


def no_fit_note(trainer_gpus: int, rollout_gpus: int, no_trainer: bool, no_rollout: bool) -> str:
    """The note of a split whose trainer pool (``no_trainer``) or rollout pool has no layout
    that fits."""
    return (f"{trainer_gpus} trainer + {rollout_gpus} rollout GPUs: "
            f"{'the actor fits no layout' if no_trainer else ''}"
            f"{' and ' if no_trainer and no_rollout else ''}"
            f"{'no rollout layout fits' if no_rollout else ''}")


# a floor's relative allowance for rounding: the floor and a split's step sum the same terms in
# another order
FLOOR_ROUNDING = 1e-9


def first_splits(schedule: SplitSchedule, request: PlanRequest, splits: list[int],
                 choose: tuple[Callable[[ClusterSpec], TrainerChoice | None],
                               Callable[[ClusterSpec], RolloutChoice | None],
                               Callable[[ClusterSpec], np.ndarray | None]], first: int
                 ) -> tuple[list[SplitCandidate], list[str]]:
    """The candidates of the first ``first`` splits of :func:`ranked`'s ranking among
    ``splits`` (every split's when fewer fit), searching a trainer pool only when its split
    can rank among them; a note per split found to have no layout that fits (of the others,
    none).  ``choose``: :func:`score_splits`'s two, and the trainer pool's floor
    (:func:`trainer_floor_s`; None: the pool has no layout).

    Every split's rollout pool is chosen first (a few rows each).  A split's step is the mode's
    steady state of the pools' seconds at the run's nodes, non-decreasing in the training and
    the sync seconds (:class:`SplitSchedule`), so the steady state of the rollout pool's
    seconds with no training and the sync's floor (:func:`sync_floor_s`) bounds it from
    below, and with the trainer pool's floor (:func:`trainer_floor_s`) more tightly.  The
    splits are taken smallest bound first (the smaller trainer pool on equal bounds, as the
    ranking breaks ties): a split is refined (its floor, then its trainer pool searched and
    its step known) and put back under the tighter bound, until ``first`` splits come out
    known -- each then ranks before every split left, whose step is at least its bound.  A
    split whose known step does not fit or is not finite (the ranking's tail: never, as the
    pools' choices fit and run) ends the pruning: the splits left are all scored."""
    trainer_for, rollout_for, floor_for = choose
    workload = request.workload

    def floor(rollout: RolloutChoice, train_at_nodes, sync_s: float) -> float:
        state = steady_state_over_run(lambda g, t, s: schedule.steady_state(g, t, s, workload),
                                      rollout.generate_at_nodes_s, train_at_nodes, sync_s)
        value = float(state["step_time_s"])
        return value / (1 + FLOOR_ROUNDING) if not np.isnan(value) else -np.inf

    pending, found, notes = [], [], []
    for trainer_gpus in splits:
        pools = split_clusters(request.cluster, trainer_gpus)
        rollout = rollout_for(pools[1])
        if rollout is None:
            notes.append(no_fit_note(trainer_gpus, pools[1].num_gpus, False, True))
            continue
        sync_s = sync_floor_s(request, pools[0], rollout)
        # (bound, trainer GPUs, what is known: 0 the rollout pool, 1 the trainer's floor too,
        # 2 the step; the pools; the rollout choice and the sync's floor or, known, the
        # candidate)
        pending.append((floor(rollout, np.zeros(len(rollout.generate_at_nodes_s)), sync_s),
                        trainer_gpus, 0, pools, (rollout, sync_s)))
    heapq.heapify(pending)
    while pending and len(found) < first:
        _, trainer_gpus, known, pools, payload = heapq.heappop(pending)
        if known == 2:  # ranks before every split left
            if not payload.fits or not np.isfinite(payload.step_time_s):
                rest, more = score_splits(schedule, request, [entry[1] for entry in pending],
                                          choose[:2])
                return found + [payload] + rest, notes + more
            found.append(payload)
            continue
        rollout, sync_s = payload
        if known == 0:
            train_at_nodes = floor_for(pools[0])
            if train_at_nodes is not None:
                heapq.heappush(pending, (floor(rollout, train_at_nodes, sync_s), trainer_gpus,
                                         1, pools, payload))
                continue
        else:
            trainer = trainer_for(pools[0])
            if trainer is not None:
                candidate = split_candidate(schedule, request, pools, trainer, rollout)
                step = candidate.step_time_s
                heapq.heappush(pending, (np.inf if np.isnan(step) else step, trainer_gpus, 2,
                                         pools, candidate))
                continue
        notes.append(no_fit_note(trainer_gpus, pools[1].num_gpus, True, False))
    return found, notes


def ranked(candidates: list[Candidate]) -> list[Candidate]:
    """Candidates in a mode plan's order with their rank: those that fit first, then the
    fastest, the larger rollout pool on a tie (:mod:`planner.ranking`'s rule)."""
    order = prediction_order([c.fits for c in candidates],
                             [c.step_time_s for c in candidates],
                             [-c.placement.rollout_gpus for c in candidates])
    return [replace(candidates[i], rank=rank) for rank, i in enumerate(order, start=1)]


def split_request(request: PlanRequest) -> PlanRequest:
    """The request as a split mode plans it: the workload as verl's asynchronous recipes run
    it (an input error for a workload without a rollout: nothing to generate)."""
    if not request.workload.has_rollout:
        raise PlanInputError("plans GRPO; --workload pretrain has no rollout")
    return replace(request, workload=async_workload(request.workload))


# --- a mode's plan --------------------------------------------------------------------------


@dataclass
class ModePlan(OfRequest):
    """One training mode's plan: its candidates, best first."""

    mode: str
    request: PlanRequest  # as the mode runs it (the asynchronous recipes' workload)
    candidates: list[Candidate]  # best first
    async_options: AsyncOptions = AsyncOptions()
    sync_plan: Plan | None = None  # a colocated mode: its plan of layouts
    splits_tried: int = 0
    notes: list[str] = field(default_factory=list)
    # a split mode's plan of its first splits alone (plan_splits' ``first``); None: every split
    first: int | None = None

    @property
    def best(self) -> Candidate | None:
        return next((c for c in self.candidates if c.fits), None)

    @property
    def fitting(self) -> list[Candidate]:
        return [c for c in self.candidates if c.fits]


def plan_splits(schedule: SplitSchedule, request: PlanRequest,
                cache: dict | None = None, first: int | None = None) -> ModePlan:
    """The best layouts of every legal split (``settings.trainer_gpus``, or every one), the
    fastest split first.  ``cache``: pool searches shared with other modes' plans of the same
    request (keyed by pool and streaming bounds).  ``first``: list the first ``first`` splits
    alone, the trainer pools of the others searched only as far as it takes to show that they
    rank after them (:func:`first_splits`; with the search option ``exhaustive``, every split
    is listed)."""
    work = split_request(request)
    settings = schedule.settings
    splits = list(settings.trainer_gpus) or pool_splits(request.cluster)
    cache = {} if cache is None else cache
    streaming = schedule.streaming(work.workload)

    def trainer_for(pool: ClusterSpec) -> TrainerChoice | None:
        key = ("trainer", pool.num_gpus)
        if key not in cache:
            cache[key] = best_trainer(work.on(pool))
        return cache[key]

    def rollout_for(pool: ClusterSpec) -> RolloutChoice | None:
        key = ("rollout", pool.num_gpus, streaming)
        if key not in cache:
            cache[key] = best_rollout(rollout_pool(work.on(pool), streaming))
        return cache[key]

    def floor_for(pool: ClusterSpec) -> np.ndarray | None:
        if ("trainer", pool.num_gpus) in cache:  # searched: its choice's seconds are a floor
            trainer = cache["trainer", pool.num_gpus]
            return None if trainer is None else np.asarray(trainer.train_at_nodes_s)
        key = ("trainer floor", pool.num_gpus)
        if key not in cache:
            cache[key] = trainer_floor_s(work.on(pool))
        return cache[key]

    first = None if work.options.exhaustive else first
    if first is None:
        candidates, notes = score_splits(schedule, work, splits, (trainer_for, rollout_for))
    else:
        candidates, notes = first_splits(schedule, work, splits,
                                         (trainer_for, rollout_for, floor_for), first)
    return ModePlan(mode=schedule.name, request=work, candidates=ranked(candidates)[:first],
                    async_options=settings, splits_tried=len(splits), notes=notes, first=first)


# --- one actor layout on the splits (estimate --mode) ---------------------------------------


@dataclass(frozen=True)
class SplitEstimate(OfRequest):
    """``estimate --mode`` of a split mode: one actor layout on the splits tried."""

    mode: str
    request: PlanRequest  # the workload as the asynchronous recipes run it (async_workload)
    candidate: SplitCandidate  # the split reported
    splits: tuple[SplitCandidate, ...]  # every split scored, the reported one first
    rollout_chosen: bool  # the rollout pool's layout was chosen (no rollout flag given)
    async_options: AsyncOptions
    notes: tuple[str, ...] = ()


def pool_layout(layout: Layout, gpus: int) -> Layout:
    """The actor layout on a pool of ``gpus``: data parallelism takes what TP*PP*CP leave (as
    ``estimate`` sizes it on the whole cluster; a layout that does not divide the pool breaks
    the ``world_size`` rule)."""
    return replace(layout, dp=max(gpus // (layout.tp * layout.pp * layout.cp), 1))


def split_layout_problems(request: PlanRequest, trainer: ClusterSpec, rollout: ClusterSpec,
                          layout: Layout, pin_rollout: bool) -> list[tuple[str, str]]:
    """The rules (:mod:`planner.search.rules`) ``layout`` breaks on a split: the actor's on the
    trainer pool, the rollout's (when pinned) on the rollout pool, as (rule, message)."""
    model, workload = request.model, request.workload
    actor = {**pool_layout(layout, trainer.num_gpus).to_dict(),
             **{name: 1 for name in ROLLOUT_FIELDS}}
    found = [(name, f"trainer pool of {trainer.num_gpus} GPUs: {message}")
             for name, message in broken_rules(model, trainer, workload, actor)
             if name not in ROLLOUT_RULES]
    if pin_rollout:
        found += [(name, f"rollout pool of {rollout.num_gpus} GPUs: {message}")
                  for name, message in broken_rules(model, rollout, workload, layout.to_dict())
                  if name in ROLLOUT_RULES]
    return found


def estimate_on_splits(schedule: SplitSchedule, request: PlanRequest, layout: Layout,
                       pin_rollout: bool) -> SplitEstimate:
    """Score one actor layout on separate pools: on each split tried (``trainer_gpus``, or
    every legal split) the actor on the trainer pool (memory and time as :func:`best_trainer`
    scores a layout) and the rollout on the rollout pool (``layout``'s rollout TP/DP/EP when
    ``pin_rollout``, else the fastest that fits, as a plan picks it; ``gpu_memory_utilization``
    from the request's options or the standalone pool's).  Reports the fastest split that fits
    (else the fastest); splits where the layout breaks a rule are skipped with a note, and when
    it breaks one on every split, :class:`InvalidLayoutError` lists them all."""
    work, cluster = split_request(request), request.cluster
    settings = schedule.settings
    streaming = schedule.streaming(work.workload)
    legal, broken, notes = [], [], []
    for trainer_gpus in list(settings.trainer_gpus) or pool_splits(cluster):
        t_cluster, r_cluster = split_clusters(cluster, trainer_gpus)
        problems = split_layout_problems(work, t_cluster, r_cluster, layout, pin_rollout)
        broken += problems
        if problems:
            notes.append(f"{trainer_gpus} trainer + {r_cluster.num_gpus} rollout GPUs: the "
                         f"layout breaks {', '.join(dict.fromkeys(n for n, _ in problems))}")
        else:
            legal.append(trainer_gpus)
    if not legal:
        raise InvalidLayoutError(broken)
    if pin_rollout:
        options = work.options
        work = replace(work, options=replace(options, fixed=options.fixed + tuple(
            (name, getattr(layout, name)) for name in ROLLOUT_FIELDS)))

    def trainer_for(pool: ClusterSpec) -> TrainerChoice:
        actor = pool_layout(layout, pool.num_gpus).to_columns()
        memory = trainer_memory(work.on(pool), actor)
        return trainer_choice(work.on(pool), trainer_times(work.on(pool), actor, memory), 0)

    def rollout_for(pool: ClusterSpec) -> RolloutChoice | None:
        rows = rollout_pool(work.on(pool), streaming)
        if not pin_rollout:
            return best_rollout(rows)
        return rollout_choice(rows, 0) if len(rows["rollout_tp"]) else None

    candidates, more = score_splits(schedule, work, legal, (trainer_for, rollout_for))
    if not candidates:
        raise NoFitError(f"{layout.actor_text(request.model.is_moe)}: {'; '.join(more)}")
    finite = [bool(np.isfinite(c.step_time_s)) for c in candidates]
    order = best_first(np.array([not c.fits for c in candidates]), ~np.array(finite),
                       np.where(finite, [c.step_time_s for c in candidates], 0.0),
                       np.array([-c.placement.rollout_gpus for c in candidates]))
    candidates = [candidates[i] for i in order]
    return SplitEstimate(mode=schedule.name, request=work, candidate=candidates[0],
                         splits=tuple(candidates), rollout_chosen=not pin_rollout,
                         async_options=settings, notes=tuple(notes + more))
