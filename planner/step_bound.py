"""A lower bound on a layout's expected step time under one memory policy from its exact one
under another: what lets a plan read at its head under a second policy (the text table's
filled-GPU plan) score only the layouts that can lead it (issue 24).

A memory policy changes a GRPO plan in one place: the rollout option each actor layout gets
(:func:`planner.plan.rollout_choice`, made once per distinct (resident, beside) pair of the
actor's memory, the same pairs under every policy) and the pool it picks.  A row's expected
step time over the run (Simpson's rule over the step times at the run's points,
:func:`planner.cost.trajectory.expected_over_run`: a weighted sum, weights summing to 1) is the
sum of the phases' times (:func:`planner.cost.timing.grpo_step_time_s`), and of those

- the generation (:func:`planner.cost.timing.generate_s`: the rollout layout and the KV pool
  of :func:`planner.cost.memory.rollout_memory`, on the pair's resident bytes) and the weight
  sync's load into the engine (``compute_s`` of :func:`planner.cost.timing.weight_sync_s`: the
  rollout layout's weight bytes) read the pair's choice: ``P(pair)``, expected over the run;
- the offload trips (:func:`planner.cost.timing.offload_trips_s`) read the weights and
  optimizer bytes of the stage that sets the peak, which the policy may move: ``T(row) >= 0``;
- everything else (the log-prob and update passes, the weight sync's gather and latencies, the
  step's fixed costs) reads the actor layout alone: ``Q(row)``, the same under every policy.

So, in exact arithmetic, ``E_new = Q + P_new + T_new >= E_old - T_old - P_old + P_new``.  No
step time is assumed monotone in anything (the response length included): the bound compares
the same sums at the same points.  The computed values carry rounding errors of a few units
in the last place of sums of a few dozen non-negative terms; :data:`BOUND_MARGIN` (relative,
on ``E_old``, ``P_old`` and ``P_new``) is some ten million times that.

A row that fits under the new policy also fits apart from the rollout: the peak of the phases
the engine does not join (the actor's alone) and its host memory (:func:`actor_fits_alone`), and its
pair's engine fits (:func:`pair_seconds`' second value: the KV pool holds a sequence, the
generate phase and the phase the engine joins stay within the GPU).  Rows the old plan did not
time (they did not fit under its policy) have no bound: a caller scores them exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from planner.cost.columns import memory_column
from planner.cost.memory import engine_of, engine_phases, rollout_memory
from planner.cost.request import PlanRequest
from planner.cost.timing import generate_s, offload_trips_s, weight_sync_s
from planner.cost.trajectory import expected_over_run, node_lengths, request_at
from planner.phases import PHASES
from planner.search.layout import Columns

BOUND_MARGIN = 1e-9  # relative slack for rounding (module docstring)


@dataclass(frozen=True)
class StepRecord:
    """What a plan read at its head found that bounds the rows' step times under another
    memory policy (module docstring): the request it was made for, the rollout option it
    chose per pair (:attr:`planner.plan.RolloutChoice.chosen`) and per row ``E - T``, lowered
    by the margin (``rest_s``; NaN: a row it did not time) and whether the row fits apart
    from the rollout (``actor_fits``)."""

    request: PlanRequest
    chosen: Columns
    rest_s: np.ndarray
    actor_fits: np.ndarray


def step_rest_s(request: PlanRequest, rows: Mapping, expected: np.ndarray) -> np.ndarray:
    """``E - T`` of ``rows`` (layout and memory columns, their expected step times
    ``expected``), lowered by the margin on ``E``."""
    trips = offload_trips_s(request, rows, rows)
    return expected - trips - BOUND_MARGIN * np.abs(expected)


def actor_fits_alone(request: PlanRequest, rows: Mapping) -> np.ndarray:
    """Whether ``rows`` (memory columns) fit apart from the rollout: the nvidia-smi peak of
    each phase the workload runs and the engine does not join, and the host memory."""
    workload = request.workload
    capacity = float(request.cluster.gpu.memory_bytes)
    fits = np.asarray(rows["host_fits"]).astype(bool)
    for phase in PHASES:
        if phase in workload.phases and phase not in engine_phases(workload):
            fits = fits & (np.asarray(rows[memory_column(phase)]) <= capacity)
    return fits


def pair_seconds(request: PlanRequest, chosen: Columns, resident: np.ndarray,
                 beside: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per pair (``resident``, ``beside`` bytes; its ``chosen`` rollout option): ``P``, the
    generation and the weight sync's load expected over the run (module docstring), and
    whether the engine can fit (its KV pool holds a sequence, the generate phase and the phase
    it joins within the GPU, with a relative margin for their rounding)."""
    workload = request.workload
    capacity = float(request.cluster.gpu.memory_bytes) * (1 + BOUND_MARGIN)
    pick = request.options.gpu_memory_utilization is None
    pool = rollout_memory(request, chosen, resident,
                          None if pick else chosen["gpu_memory_utilization"])
    ones = np.ones(len(resident), dtype=np.int64)
    actor = {**chosen, "tp": ones, "pp": ones, "ep": ones, "cp": ones}

    def at(point: PlanRequest) -> np.ndarray:
        return (generate_s(point, chosen, pool)["total_s"]
                + weight_sync_s(point, actor)["compute_s"])

    seconds = (expected_over_run([at(request_at(request, length))
                                  for length in node_lengths(workload.lengths)])
               if request.workload.moving_lengths else at(request))
    fits = np.asarray(pool["rollout_fits"]).astype(bool)
    if "generate" in workload.phases:
        joins = pool["rollout_weights_bytes" if engine_of(workload).free_cache_engine
                     else "rollout_budget_bytes"]
        fits = fits & (pool["mem_generate_bytes"] <= capacity) & (beside + joins <= capacity)
    return np.asarray(seconds, dtype=float), fits


def row_bounds(record: StepRecord, request: PlanRequest, choice) -> tuple[np.ndarray,
                                                                            np.ndarray]:
    """Per row of ``choice`` (:class:`planner.plan.RolloutChoice` under ``request``'s policy,
    on the pairs of the record's actor evaluation): the lower bound on its expected step time
    (NaN: the record did not time it) and whether it can fit (module docstring)."""
    old, _ = pair_seconds(record.request, record.chosen, choice.resident, choice.beside)
    new, fits = pair_seconds(request, choice.chosen, choice.resident, choice.beside)
    with np.errstate(invalid="ignore"):
        change = new - old - BOUND_MARGIN * (np.abs(new) + np.abs(old))
    return record.rest_s + change[choice.inverse], record.actor_fits & fits[choice.inverse]
