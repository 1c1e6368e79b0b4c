"""What the planner answers, as typed values: the results every command reports.

The cost model works in columns (:mod:`planner.cost.columns`, one numpy array per quantity, one
row per layout); a plan keeps them as a table.  What leaves the planner for one layout, split
or pool is one of the frozen dataclasses here, in bytes and seconds, unrounded.  Only the
output module (:mod:`planner.output`) rounds them, converts units and shapes JSON; text reads
their attributes.

* :class:`Candidate` -- one scored layout of a training mode: where it runs
  (:class:`Placement`), its layout, whether it fits, its step and throughput, the staleness the
  mode brings (:class:`Staleness`).  Two kinds:

  - :class:`ColocatedCandidate` -- the layout on every GPU (verl's hybrid engine): its
    per-GPU memory (:class:`MemoryUsage`), the rollout engine's (:class:`RolloutUsage`), the
    phase times (:class:`PhaseTimes`), the unwise flags, what filling the GPU would buy
    (:class:`FillGpu`);
  - :class:`SplitCandidate` -- trainer and rollout on separate pools: each pool's usage
    (:class:`TrainerPoolUsage`, :class:`RolloutPoolUsage`, both :class:`PoolUsage`), the
    steady-state times (:class:`SplitTimes`), the parameter sync (:class:`SyncParts`) and the
    idle fractions.

Per-phase and per-part values are dataclasses whose fields are the phases
(:data:`planner.phases.PHASES`), the time parts (:data:`planner.cost.columns.TIME_PARTS`) and
the memory breakdown parts (:data:`planner.cost.columns.BREAKDOWN_PARTS`); adding one to those
lists and not here fails at import.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Iterator, Mapping

import numpy as np

from planner.catalog.hardware import ClusterSpec
from planner.cost.columns import (
    BREAKDOWN_PARTS,
    TIME_PARTS,
    breakdown_column,
    flag_column,
    memory_column,
    part_column,
    time_column,
    working_set_column,
)
from planner.cost.memory import STAGES
from planner.phases import PHASES
from planner.search.layout import Layout
from planner.search.rules import UNWISE_FLAGS
from planner.units import gib, kv_pool_text

# The mode a plan of layouts on every GPU reports: verl's hybrid engine (planner.modes.sync
# registers itself under this name, the baseline the other modes are compared with).
COLOCATED_MODE = "sync"


class _Named:
    """Dataclass fields as ``(name, value)`` pairs, in field order."""

    def items(self) -> Iterator[tuple[str, Any]]:
        return ((f.name, getattr(self, f.name)) for f in fields(self))


@dataclass(frozen=True)
class PerPhase(_Named):
    """One number per phase of a GRPO step (:data:`~planner.phases.PHASES`): bytes or
    seconds."""

    generate: float
    old_log_prob: float
    ref: float
    update_actor: float
    weight_sync: float

    @classmethod
    def of(cls, value_of) -> "PerPhase":
        """``value_of(phase)`` for every phase."""
        return cls(**{phase: float(value_of(phase)) for phase in PHASES})

    def of_phase(self, phase: str) -> float:
        return getattr(self, phase)


@dataclass(frozen=True)
class TimeParts(_Named):
    """Seconds of one phase by part (:data:`~planner.cost.columns.TIME_PARTS`)."""

    compute_s: float
    comm_s: float
    bubble_s: float
    host_transfer_s: float
    latency_s: float


@dataclass(frozen=True)
class MemoryBreakdown(_Named):
    """Bytes per GPU of each part of the peak rank's memory
    (:data:`~planner.cost.columns.BREAKDOWN_PARTS`)."""

    weights: float
    grads: float
    optimizer: float
    train_activations: float
    train_logits: float
    ref_weights: float
    rollout_weights: float
    kv_cache: float


# the breakdown's parts only a step with rollout (and its reference) holds: a pretraining
# step's outputs leave them out
ROLLOUT_PARTS = ("ref_weights", "rollout_weights", "kv_cache")

assert tuple(f.name for f in fields(PerPhase)) == PHASES
assert tuple(f.name for f in fields(TimeParts)) == TIME_PARTS
assert tuple(f.name for f in fields(MemoryBreakdown)) == BREAKDOWN_PARTS


@dataclass(frozen=True)
class PhaseTimes:
    """Seconds per step in each phase of a colocated GRPO step, with each phase's parts
    (``parts``: the phases the cost model broke down, every phase of a GRPO step)."""

    seconds: PerPhase
    parts: Mapping[str, TimeParts]
    dominant: str  # the longest phase


@dataclass(frozen=True)
class Placement:
    """Where a candidate runs: the trainer's and the rollout's GPUs -- both the whole cluster
    when colocated; whole nodes each (``*_nodes``) when the pools are separate."""

    trainer_gpus: int
    rollout_gpus: int
    colocated: bool
    trainer_nodes: int | None = None
    rollout_nodes: int | None = None

    @classmethod
    def shared(cls, cluster: ClusterSpec) -> "Placement":
        """Trainer and rollout take turns on every GPU (verl's hybrid engine)."""
        return cls(cluster.num_gpus, cluster.num_gpus, True)

    @classmethod
    def pools(cls, trainer: ClusterSpec, rollout: ClusterSpec) -> "Placement":
        """Trainer and rollout on separate pools."""
        return cls(trainer.num_gpus, rollout.num_gpus, False, trainer.num_nodes,
                   rollout.num_nodes)


@dataclass(frozen=True)
class Staleness:
    """What a mode does to the algorithm: how many parameter versions a sample can lag the
    policy it trains (at most), and the share of samples that lag."""

    max_versions_behind: int
    stale_sample_fraction: float
    off_policy: bool


ON_POLICY = Staleness(max_versions_behind=0, stale_sample_fraction=0.0, off_policy=False)


@dataclass(frozen=True)
class MemoryUsage:
    """Per-GPU memory of a colocated layout: the nvidia-smi peak, where it is set, each phase's
    peak and allocated working set, the peak rank's breakdown, the host memory per node."""

    peak_bytes: float
    utilization: float  # peak / GPU memory
    peak_phase: str
    peak_stage: str  # the pipeline rank that sets it (planner.cost.memory.STAGES)
    phase_bytes: PerPhase  # nvidia-smi peak per phase
    working_set_bytes: PerPhase  # allocated working set per phase
    breakdown: MemoryBreakdown
    host_bytes_per_node: float
    host_fits: bool
    # the phases the step runs (a pretraining step: the update alone; no reference without a
    # KL loss): the outputs list these, the cost model's columns hold every phase
    phases: tuple[str, ...] = PHASES

    @property
    def working_set_at_peak_bytes(self) -> float:
        """The allocated working set of the phase that sets the nvidia-smi peak."""
        return self.working_set_bytes.of_phase(self.peak_phase)


class KvPool:
    """A rollout KV-cache pool (``kv_cache_tokens_per_gpu``) in the unit it counts: tokens of
    the K/V that grows per token, or bytes where the model keeps none (``kv_in_bytes``: every
    window shorter than the sequence, or attention-free)."""

    kv_cache_tokens_per_gpu: int
    kv_in_bytes: bool

    @property
    def kv_tokens_json(self) -> int | None:
        """The pool in tokens for JSON; None where it counts bytes."""
        return None if self.kv_in_bytes else self.kv_cache_tokens_per_gpu

    def kv_gib_json(self) -> dict:
        """``{"kv_cache_gib": ...}`` where the pool counts bytes (what JSON gives instead of
        tokens), else nothing."""
        return {"kv_cache_gib": round(gib(self.kv_cache_tokens_per_gpu), 2)} \
            if self.kv_in_bytes else {}

    def kv_text(self, per: str = " per GPU", tokens: str = " KV tokens") -> str:
        """The pool as printed (:func:`planner.units.kv_pool_text`)."""
        return kv_pool_text(self.kv_cache_tokens_per_gpu, self.kv_in_bytes, per, tokens)


@dataclass(frozen=True)
class RolloutUsage(KvPool):
    """The rollout engine beside the resident actor state (colocated)."""

    kv_cache_tokens_per_gpu: int  # bytes where kv_in_bytes
    concurrent_seqs: int  # sequences a rank runs at once
    seqs_per_rank: int  # sequences each attention rank generates per step
    fits: bool
    kv_in_bytes: bool = False  # no K/V grows per token: the pool counts bytes


@dataclass(frozen=True)
class FillGpu(KvPool):
    """The same layout with the rollout pool grown to fill the GPU (memory band 0.70-0.95):
    what the band's headroom costs."""

    gpu_memory_utilization: float
    kv_cache_tokens_per_gpu: int  # bytes where kv_in_bytes
    peak_bytes: float
    generate_s: float
    step_time_s: float
    kv_in_bytes: bool = False  # no K/V grows per token: the pool counts bytes


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One scored layout of a training mode (the fields every mode's candidate has)."""

    mode: str
    placement: Placement
    layout: Layout
    fits: bool
    rank: int | None = None  # position in its plan, 1 = best (None: not from a ranking)
    step_time_s: float | None = None  # None: not timed; inf: cannot run

    @property
    def timed(self) -> bool:
        """A step time the outputs report (timed, and finite)."""
        return self.step_time_s is not None and bool(np.isfinite(self.step_time_s))
    tokens_per_s_per_gpu: float | None = None
    staleness: Staleness | None = None
    # step time at the run's first and last step (step_time_s: expected over the run,
    # planner.cost.trajectory); None: not timed
    step_time_start_s: float | None = None
    step_time_end_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class ColocatedCandidate(Candidate):
    """A layout with actor, reference and rollout engine on every GPU (verl's hybrid engine),
    or a plain training step."""

    memory: MemoryUsage
    rollout: RolloutUsage
    flags: tuple[str, ...] = ()  # unwise flags (planner.search.rules.UNWISE_FLAGS)
    within_error_of_best: bool | None = None  # None: the plan did not rank for ties
    fill_gpu: FillGpu | None = None
    times: PhaseTimes | None = None  # a GRPO step's phases (None: not timed, or no rollout)
    mfu: float | None = None
    tflops_per_gpu: float | None = None  # a plain training step
    update_comm_s: float | None = None  # the actor update's exposed communication
    update_bubble_s: float | None = None  # ... and pipeline bubble

    @classmethod
    def from_row(cls, row: Mapping[str, Any], placement: Placement, mode: str = COLOCATED_MODE,
                 staleness: Staleness | None = None,
                 phases: tuple[str, ...] = PHASES) -> "ColocatedCandidate":
        """The candidate of one row of cost-model columns (a plan's frame record or an
        estimate's row); ``staleness`` is set only when the row is timed; ``phases``: those
        the workload runs (``workload.phases``)."""
        return _colocated(row, placement, mode, staleness, phases)


def _phase_name(value: Any) -> str:
    return value if isinstance(value, str) else PHASES[int(value)]


def _filled_step_s(row: Mapping[str, Any]) -> float:
    """The step with the filled pool's generation in place of the layout's own.  Where the
    layout's generation cannot run (inf: no KV cache for one sequence) the step is the filled
    generation plus the other phases, not inf - inf."""
    generate_s, fill_s = float(row["time_generate_s"]), float(row["time_generate_s_fill"])
    step_s = float(row["step_time_s"])
    if np.isfinite(step_s) and np.isfinite(generate_s):
        return step_s - generate_s + fill_s
    return fill_s + sum(float(row[time_column(phase)]) for phase in PHASES
                        if phase != "generate")


def _colocated(row: Mapping[str, Any], placement: Placement, mode: str,
               staleness: Staleness | None, phases: tuple[str, ...]) -> ColocatedCandidate:
    memory = MemoryUsage(
        peak_bytes=float(row["peak_bytes"]), utilization=float(row["memory_utilization"]),
        peak_phase=_phase_name(row["peak_phase"]), peak_stage=STAGES[int(row["peak_stage"])],
        phase_bytes=PerPhase.of(lambda phase: row[memory_column(phase)]),
        working_set_bytes=PerPhase.of(lambda phase: row[working_set_column(phase)]),
        breakdown=MemoryBreakdown(**{part: float(row[part_column(part)])
                                     for part in BREAKDOWN_PARTS}),
        host_bytes_per_node=float(row["host_bytes_per_node"]),
        host_fits=bool(row["host_fits"]), phases=tuple(phases))
    in_bytes = bool(row.get("kv_pool_in_bytes", False))
    rollout = RolloutUsage(kv_cache_tokens_per_gpu=int(row["kv_cache_tokens_per_gpu"]),
                           concurrent_seqs=int(row["rollout_concurrent_seqs"]),
                           seqs_per_rank=int(row["rollout_seqs_per_rank"]),
                           fits=bool(row["rollout_fits"]), kv_in_bytes=in_bytes)
    values: dict[str, Any] = {}
    if np.isfinite(float(row.get("time_generate_s_fill", np.nan))):
        values["fill_gpu"] = FillGpu(
            gpu_memory_utilization=float(row["gpu_memory_utilization_fill"]),
            kv_cache_tokens_per_gpu=int(row["kv_cache_tokens_per_gpu_fill"]),
            peak_bytes=float(row["peak_bytes_fill"]),
            generate_s=float(row["time_generate_s_fill"]),
            step_time_s=_filled_step_s(row), kv_in_bytes=in_bytes)
    step = float(row.get("step_time_s", np.nan))
    if not np.isnan(step):  # timed (inf: it cannot run, e.g. no KV cache for a sequence)
        values.update(step_time_s=step,
                      tokens_per_s_per_gpu=float(row["tokens_per_s_per_gpu"]),
                      mfu=float(row["mfu"]),
                      staleness=staleness if np.isfinite(step) else None)
        if "step_time_start_s" in row:
            values.update(step_time_start_s=float(row["step_time_start_s"]),
                          step_time_end_s=float(row["step_time_end_s"]))
        if time_column("generate") in row:
            values["times"] = PhaseTimes(
                seconds=PerPhase.of(lambda phase: row[time_column(phase)]),
                parts={phase: TimeParts(**{part: float(row[breakdown_column(phase, part)])
                                           for part in TIME_PARTS})
                       for phase in PHASES if breakdown_column(phase, TIME_PARTS[0]) in row},
                dominant=_phase_name(row["dominant_phase"]))
            values.update(update_comm_s=float(row["update_comm_s"]),
                          update_bubble_s=float(row["update_bubble_s"]))
        else:
            values["tflops_per_gpu"] = float(row["tflops_per_gpu"])
    return ColocatedCandidate(
        mode=mode, placement=placement, layout=Layout.from_row(row), fits=bool(row["fits"]),
        rank=int(row["rank"]) if "rank" in row else None, memory=memory, rollout=rollout,
        flags=tuple(name for name in UNWISE_FLAGS if bool(row[flag_column(name)])),
        within_error_of_best=(bool(row["within_error_of_best"])
                              if "within_error_of_best" in row else None),
        **values)


@dataclass(frozen=True)
class PoolUsage:
    """One pool of a split: its GPUs and the per-GPU nvidia-smi peak of what runs there."""

    gpus: int
    peak_bytes: float
    capacity_bytes: float  # memory of one of its GPUs
    fits: bool

    @property
    def utilization(self) -> float:
        return self.peak_bytes / self.capacity_bytes


@dataclass(frozen=True)
class TrainerPoolUsage(PoolUsage):
    """The trainer pool: the actor's training phases, with no rollout engine beside them."""

    peak_phase: str = "update_actor"
    phase_s: Mapping[str, float] | None = None  # seconds of each training phase it runs
    step_fixed_s: float = 0.0  # per-step fixed costs (reward, data movement)


@dataclass(frozen=True)
class RolloutPoolUsage(PoolUsage, KvPool):
    """The rollout pool: the engine alone on its GPUs."""

    gpu_memory_utilization: float = 0.0
    kv_cache_tokens_per_gpu: int = 0  # bytes where kv_in_bytes
    kv_cache_bytes: float = 0.0
    concurrent_seqs: int = 0
    generated_tokens_per_s: float | None = None  # None: the pool cannot generate
    kv_in_bytes: bool = False  # no K/V grows per token: the pool counts bytes


@dataclass(frozen=True)
class SplitTimes:
    """Seconds per step of a split in the steady state: each pool's busy time, the parameter
    sync and the wait at a sync boundary (inf where a pool cannot run)."""

    generate: float
    train: float
    param_sync: float  # per step (a sync's total times the syncs per step)
    boundary_wait: float


@dataclass(frozen=True)
class SyncParts(_Named):
    """Seconds of one parameter sync from the trainer pool to the rollout pool, by part."""

    gather: float
    broadcast: float
    load: float
    latency: float
    total: float


@dataclass(frozen=True)
class IdleFractions:
    """Share of the step each pool waits (NaN where the step cannot run)."""

    trainer: float
    rollout: float


@dataclass(frozen=True)
class AsyncTraining:
    """verl's ``async_training`` settings a fully-async candidate runs with."""

    staleness_threshold: float
    trigger_parameter_sync_step: int
    require_batches: int
    partial_rollout: bool


@dataclass(frozen=True, kw_only=True)
class SplitCandidate(Candidate):
    """Trainer and rollout on separate pools: the actor layout on the trainer pool, the engine
    layout (the layout's rollout fields) on the rollout pool."""

    times: SplitTimes
    param_sync: SyncParts
    bottleneck: str  # "trainer" or "rollout": the busier pool
    idle: IdleFractions
    trainer_pool: TrainerPoolUsage
    rollout_pool: RolloutPoolUsage
    async_training: AsyncTraining | None = None

    @property
    def feasible(self) -> bool:
        """Both pools can run (a finite step)."""
        return self.timed
