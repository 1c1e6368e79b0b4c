"""Fit the step-time model's efficiency constants to measurements (data in, no trial code).

Used by ``benchmarks/calibrate.py`` (published Megatron pretraining measurements, which ship as
``planner/cost/calibration.json``) and by ``plan-parallel calibrate`` (a cluster's own GRPO
trials).  The fit is kept physical: one GEMM efficiency per GPU type and precision family, and
a handful of constants shared by every GPU (GEMM size sensitivity, flash-attention efficiency,
link efficiencies, DP and EP overlap, elementwise passes, per-layer launch overhead, grouped
expert GEMMs).  It minimises the squared log error of predicted tokens/s/GPU plus weak priors
(:data:`PRIORS`) that keep constants the data cannot tell apart at typical values.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Mapping, Sequence, Union

import numpy as np

from planner.catalog.hardware import GPU_CATALOG, ClusterSpec
from planner.catalog.models import ModelSpec
from planner.catalog.workload import GrpoWorkload, PretrainWorkload
from planner.cost.efficiency import (
    BOUNDS,
    DONORS,
    PER_GPU,
    PRIORS,
    RL_BY_GPU,
    RL_SHARED,
    SHARED,
    CostModel,
    Efficiency,
    carry_rl_record,
    prior,
)
from planner.cost.memory import estimate_memory
from planner.cost.request import PlanRequest
from planner.cost.timing import step_columns
from planner.search.layout import Columns, Layout


@dataclass(frozen=True)
class Measurement:
    """One measured layout: what ran, and the tokens/s/GPU it reached."""

    model: ModelSpec
    cluster: ClusterSpec
    workload: Union[GrpoWorkload, PretrainWorkload]
    layout: Layout
    tokens_per_s_per_gpu: float


def gpu_key(measurement: Union[Measurement, "PhaseMeasurement"]) -> str:
    family = "fp8" if measurement.workload.precision == "fp8" else "bf16"
    return f"{measurement.cluster.gpu.name}/{family}"


def _predict_group(request: PlanRequest, cols: Columns) -> np.ndarray:
    return step_columns(request, cols)["tokens_per_s_per_gpu"]


class Problem:
    """Measurements grouped by (model, cluster, workload): one vectorised call per group.

    ``base``: the cost model each trial point starts from (the calibration a fit starts from):
    a point sets the GEMM efficiency and :data:`SHARED` on that GPU and precision's constants
    and keeps the rest (the RL constants among them); None: the built-in :class:`Efficiency`.
    """

    def __init__(self, measurements: Sequence[Measurement], base: CostModel | None = None):
        self.measurements = list(measurements)
        self.base = base
        groups = defaultdict(list)
        for index, item in enumerate(self.measurements):
            groups[(item.model, item.cluster, item.workload)].append(index)
        self.groups = []
        for (model, cluster, workload), indices in groups.items():
            layouts = [self.measurements[i].layout.to_columns() for i in indices]
            cols = {name: np.concatenate([c[name] for c in layouts]) for name in layouts[0]}
            self.groups.append((PlanRequest(model, cluster, workload), cols,
                                np.array(indices)))
        self.keys = sorted({gpu_key(item) for item in self.measurements})
        self.measured = np.array([item.tokens_per_s_per_gpu for item in self.measurements])

    def efficiency(self, x: np.ndarray, measurement: Measurement) -> Efficiency:
        """The trial point ``x``'s constants for a measurement's GPU and precision."""
        start = Efficiency() if self.base is None else self.base.efficiency(
            measurement.cluster.gpu, measurement.workload.precision)
        shared = dict(zip(SHARED, x[len(self.keys):]))
        return replace(start, gemm=x[self.keys.index(gpu_key(measurement))], **shared)

    def predict(self, x: np.ndarray) -> np.ndarray:
        out = np.empty(len(self.measurements))
        for request, cols, indices in self.groups:
            cost = CostModel.fixed(self.efficiency(x, self.measurements[indices[0]]), "fit")
            out[indices] = _predict_group(replace(request, cost=cost), cols)
        return out

    def names(self) -> list[str]:
        return ["gemm"] * len(self.keys) + list(SHARED)

    measurement_sigma: float = 1.0

    def residuals(self, x: np.ndarray) -> np.ndarray:
        data = (np.log(self.predict(x)) - np.log(self.measured)) / self.measurement_sigma
        centres = np.array([PRIORS[name][0] for name in self.names()])
        sigmas = np.array([PRIORS[name][1] for name in self.names()])
        prior = (np.log(np.maximum(x, 1e-12)) - np.log(centres)) / sigmas
        return np.concatenate([data, prior])

    def start(self, initial: dict | None = None):
        names = self.names()
        x0 = [PRIORS[name][0] for name in names]
        if initial:  # start from an existing calibration (e.g. the shipped one)
            for i, key in enumerate(self.keys):
                gemm = initial.get("by_gpu", {}).get(key, {}).get("gemm")
                x0[i] = gemm if gemm is not None else x0[i]
            for j, name in enumerate(SHARED):
                x0[len(self.keys) + j] = initial.get("shared", {}).get(name, x0[len(self.keys) + j])
        lower = np.array([BOUNDS[name][0] for name in names])
        upper = np.array([BOUNDS[name][1] for name in names])
        return np.clip(np.array(x0, dtype=float), lower, upper), lower, upper


def predict(measurements: Sequence[Measurement], cost: CostModel) -> np.ndarray:
    """Predicted tokens/s/GPU of each measurement with a cost model (a calibration, loaded:
    :meth:`CostModel.load`)."""
    problem = Problem(measurements)
    out = np.empty(len(problem.measurements))
    for request, cols, indices in problem.groups:
        out[indices] = _predict_group(replace(request, cost=cost), cols)
    return out


def fit(measurements: Sequence[Measurement], initial: dict | None = None,
        source: str = "", measurement_sigma: float = 1.0) -> dict:
    """Least squares in log space; returns a calibration dict :func:`load_efficiency` reads.

    ``measurement_sigma`` is the expected log error of one measurement against the priors'
    sigmas: 1.0 for the published tables (software versions and unstated settings make rows
    disagree by tens of percent, so the priors keep the constants physical); a cluster's own
    trials are precise and few, so ``plan-parallel calibrate`` passes a small value and lets
    them move the constants they constrain.

    With ``initial``, every constant the fit does not move (the RL constants, :data:`RL_SHARED`
    and :data:`RL_BY_GPU`, among them) is the initial calibration's for that GPU and precision,
    in the fit and in the result: the RL constants, the ``rl_fit`` record and the RL provenance
    are carried into the result unchanged.  Without it (the published pretraining tables of
    ``benchmarks/calibrate.py``) they are the built-in :class:`Efficiency` values and the
    result holds the training constants alone.
    """
    from scipy.optimize import least_squares  # lazy: only calibration needs scipy

    base = CostModel.load(initial) if initial else None
    problem = Problem(measurements, base)
    problem.measurement_sigma = measurement_sigma
    x0, lower, upper = problem.start(initial)
    result = least_squares(problem.residuals, x0, bounds=(lower, upper), x_scale="jac",
                           diff_step=1e-3, max_nfev=400)
    x = result.x
    shared = {name: float(f"{value:.4g}") for name, value in zip(SHARED, x[len(problem.keys):])}
    by_gpu = _initial_own_entries(initial)  # the parts this study did not measure keep theirs
    by_gpu.update({key: {"gemm": float(f"{x[i]:.4g}"),
                         "measurements": int(sum(gpu_key(m) == key
                                                 for m in problem.measurements))}
                   for i, key in enumerate(problem.keys)})
    for gpu in GPU_CATALOG:
        for family in ("bf16", "fp8"):
            key, donor = f"{gpu.name}/{family}", DONORS.get(gpu.name)
            if key not in by_gpu and donor and f"{donor}/{family}" in by_gpu:
                by_gpu[key] = {"gemm": by_gpu[f"{donor}/{family}"]["gemm"],
                               "donor": f"{donor}/{family}"}
    for gpu in GPU_CATALOG:  # no FP8 measurements (A100 has no FP8): the BF16 figure
        bf16, fp8 = f"{gpu.name}/bf16", f"{gpu.name}/fp8"
        if fp8 not in by_gpu and bf16 in by_gpu:
            by_gpu[fp8] = {"gemm": by_gpu[bf16]["gemm"], "donor": bf16}
    for family in ("bf16", "fp8"):  # any other part: the median of that family
        fitted = [v["gemm"] for k, v in by_gpu.items()
                  if k.endswith(family) and "measurements" in v]
        if fitted:
            by_gpu[f"*/{family}"] = {"gemm": float(np.median(fitted)), "donor": "median"}
    for key, entry in ((initial or {}).get("by_gpu") or {}).items():
        by_gpu.setdefault(key, copy.deepcopy(entry))  # a donor entry with no donor fitted here
    errors = np.abs(problem.predict(x) / problem.measured - 1)
    out = {"shared": shared, "by_gpu": dict(sorted(by_gpu.items())),
           "fit": {"measurements": len(problem.measurements),
                   "mape": round(float(errors.mean()), 4), "source": source}}
    return out if base is None else _with_rl_constants(out, initial, base)


def _initial_own_entries(initial: Mapping | None) -> dict:
    """The initial calibration's per-GPU entries that hold their own figure (measured, or written
    by hand): a study of one GPU type leaves every other part as the initial calibration has it.
    Entries borrowed from a donor (``"donor"``) are derived again from the result, so a part
    that borrows from a refitted one follows it."""
    return {key: copy.deepcopy(entry)
            for key, entry in ((initial or {}).get("by_gpu") or {}).items()
            if "donor" not in entry}


def _with_rl_constants(fitted: dict, initial: Mapping, base: CostModel) -> dict:
    """``fitted`` with the initial calibration's RL constants, unchanged: :data:`RL_SHARED`
    as ``initial`` states them, :data:`RL_BY_GPU` of each entry the initial calibration's figure
    for that key (:meth:`CostModel.efficiency_of`) with its ``rl_donor``, and the ``rl_fit``
    record and RL provenance that say where they came from."""
    initial_shared = initial.get("shared") or {}
    fitted["shared"].update({name: initial_shared[name] for name in RL_SHARED
                             if name in initial_shared})
    initial_by_gpu = initial.get("by_gpu") or {}
    for key, entry in fitted["by_gpu"].items():
        own = initial_by_gpu.get(key) or {}
        entry.update({name: own.get(name, getattr(base.efficiency_of(key), name))
                      for name in RL_BY_GPU})
        if "rl_donor" in own:
            entry["rl_donor"] = own["rl_donor"]
    carry_rl_record(fitted, initial)
    return fitted


def mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    return float(np.mean(np.abs(np.asarray(predicted) / np.asarray(measured) - 1)))


# --- phase by phase: the RL constants from published steps, a cluster's constants from a run ---

# Seconds a measurement may give, each the sum of the time model's phase columns it spans.
# ``log_prob`` is old + reference (as published sources report it); ``step`` the whole step.
PHASE_COLUMNS = {"step": ("step_time_s",), "generate": ("time_generate_s",),
                 "old_log_prob": ("time_old_log_prob_s",), "ref": ("time_ref_s",),
                 "log_prob": ("time_old_log_prob_s", "time_ref_s"),
                 "update_actor": ("time_update_actor_s",),
                 "weight_sync": ("time_weight_sync_s",)}
MAX_LOG_ERROR = float(np.log(10.0))  # an infeasible (infinite) prediction counts as 10x off


@dataclass(frozen=True)
class PhaseMeasurement:
    """One measured GRPO step (or a run's median step), phase by phase: seconds per key of
    :data:`PHASE_COLUMNS`, in the order the fit weighs them.  ``sync_in_generate``: the source
    times the weight sync inside generation (verl before 0.6 timed the reshard inside
    ``timing_s/gen``), so the predicted sync is added to the predicted generation."""

    model: ModelSpec
    cluster: ClusterSpec
    workload: GrpoWorkload
    layout: Layout
    seconds: Mapping[str, float]
    sync_in_generate: bool = False

    def __post_init__(self) -> None:
        unknown = sorted(set(self.seconds) - set(PHASE_COLUMNS))
        if unknown:
            raise ValueError(f"phases {unknown} are not among {sorted(PHASE_COLUMNS)}")


def predicted_seconds(measurement: PhaseMeasurement, columns: Mapping[str, np.ndarray]
                      ) -> dict[str, float]:
    """The time model's seconds for each phase the measurement gives, as its source counts
    them (:data:`PHASE_COLUMNS`, ``sync_in_generate``)."""
    out = {}
    for phase in measurement.seconds:
        value = sum(float(np.asarray(columns[name])[0]) for name in PHASE_COLUMNS[phase])
        if phase == "generate" and measurement.sync_in_generate:
            value += float(np.asarray(columns["time_weight_sync_s"])[0])
        out[phase] = value
    return out


def _request(measurement: PhaseMeasurement, cost: CostModel | None = None) -> PlanRequest:
    return PlanRequest(measurement.model, measurement.cluster, measurement.workload,
                       **({} if cost is None else {"cost": cost}))


def phase_memory(measurements: Sequence[PhaseMeasurement]) -> list[Columns]:
    """Each measurement's memory columns: what the time model reads of memory (KV-cache room,
    offloaded bytes) does not depend on the efficiencies, so a fit computes it once."""
    return [estimate_memory(_request(item), item.layout.to_columns()) for item in measurements]


def predict_phases(measurements: Sequence[PhaseMeasurement], cost: CostModel,
                   memory: Sequence[Columns] | None = None) -> list[dict[str, float]]:
    """Predicted seconds of every measured phase with a cost model (a calibration, loaded:
    :meth:`CostModel.load`), the layouts scored as a plan scores them (the rollout's
    ``gpu_memory_utilization`` taken from the layout); ``memory``: :func:`phase_memory` of the
    measurements, when known."""
    out = []
    for index, item in enumerate(measurements):
        columns = step_columns(_request(item, cost), item.layout.to_columns(),
                               None if memory is None else memory[index])
        out.append(predicted_seconds(item, columns))
    return out


def phase_log_errors(measurements: Sequence[PhaseMeasurement],
                     predicted: Sequence[Mapping[str, float]]) -> np.ndarray:
    """log(predicted / measured) of every measured phase, cut at +-log(10) (an impossible
    prediction counts as ten times off)."""
    errors = []
    for item, guess in zip(measurements, predicted):
        for phase, measured in item.seconds.items():
            ratio = guess[phase] / measured
            errors.append(np.clip(np.log(ratio) if np.isfinite(ratio) and ratio > 0
                                  else MAX_LOG_ERROR, -MAX_LOG_ERROR, MAX_LOG_ERROR))
    return np.array(errors)


def with_constants(calibration: dict, names: Sequence[tuple[str, str]], values) -> dict:
    """A copy of ``calibration`` with ``(where, name)`` set (``where``: ``"shared"`` or a
    ``by_gpu`` key); ``calibration`` itself is not changed."""
    out = {"shared": dict(calibration.get("shared", {})),
           "by_gpu": {k: dict(v) for k, v in calibration.get("by_gpu", {}).items()},
           **{k: v for k, v in calibration.items() if k not in ("shared", "by_gpu")}}
    for (where, name), value in zip(names, values):
        target = out["shared"] if where == "shared" else out["by_gpu"].setdefault(where, {})
        target[name] = float(value)
    return out


def phase_constants(measurements: Sequence[PhaseMeasurement], constants: Sequence[str]
                    ) -> list[tuple[str, str]]:
    """``(where, name)`` of each constant a phase fit moves: per GPU type and precision family
    for :data:`PER_GPU` (one per measured GPU), shared otherwise."""
    gpus = sorted({gpu_key(item) for item in measurements})
    shared = [("shared", name) for name in constants if name not in PER_GPU]
    return shared + [(gpu, name) for gpu in gpus for name in constants if name in PER_GPU]


def _current(calibration: dict, where: str, name: str) -> float | None:
    table = calibration.get("shared", {}) if where == "shared" else \
        calibration.get("by_gpu", {}).get(where) or calibration.get("by_gpu", {}).get(
            f"*/{where.split('/')[-1]}", {})
    value = table.get(name)
    return getattr(Efficiency(), name) if value is None else float(value)


@dataclass(frozen=True)
class PhaseFit:
    """How :func:`fit_phases` weighs and starts: each phase's residual is divided by
    ``measurement_sigma``, each prior's multiplied by ``prior_weight``; the priors centre on
    their typical values or (``centre_on_calibration``) on the calibration's; the search starts
    from the priors' centres (``start_from_prior``) or from the calibration's values, and stops
    after ``max_evaluations``."""

    measurement_sigma: float = 1.0
    prior_weight: float = 1.0
    start_from_prior: bool = True
    centre_on_calibration: bool = False
    max_evaluations: int = 60


def fit_phases(measurements: Sequence[PhaseMeasurement], calibration: Mapping,
               constants: Sequence[str], how: PhaseFit = PhaseFit()) -> dict:
    """Least squares in log space of the measured phases, over ``constants`` (the rest of
    ``calibration`` held), with the weak priors of :func:`planner.cost.efficiency.prior`.

    Residuals: each phase's ``log(predicted / measured) / measurement_sigma`` and each
    constant's ``(log value - log centre) / sigma * prior_weight`` (:class:`PhaseFit`).  The
    centre is the prior's typical value, or with ``centre_on_calibration`` the value
    ``calibration`` holds (an update of what is known: a constant the measurements cannot see
    stays where it was).  Starts from the priors' centres (``start_from_prior``) or from
    ``calibration``'s values.  Returns a new calibration dict (unrounded); ``calibration`` is
    not changed.
    """
    from scipy.optimize import least_squares  # lazy: only calibration needs scipy

    names = phase_constants(measurements, constants)
    centres = np.log([prior(name)[0] for _, name in names])
    sigmas = np.array([prior(name)[1] for _, name in names])
    lower = np.log([prior(name)[2][0] for _, name in names])
    upper = np.log([prior(name)[2][1] for _, name in names])
    held = np.clip(np.log([_current(calibration, where, name) for where, name in names]),
                   lower, upper)
    centres = held if how.centre_on_calibration else centres
    x0 = centres if how.start_from_prior else held

    memory = phase_memory(measurements)

    def residuals(x):
        trial = with_constants(calibration, names, np.exp(x))
        errors = phase_log_errors(measurements, predict_phases(
            measurements, CostModel.load(trial, "fit"), memory))
        return np.concatenate([errors / how.measurement_sigma,
                               (x - centres) / sigmas * how.prior_weight])

    result = least_squares(residuals, x0, bounds=(lower, upper), x_scale=1.0, diff_step=0.05,
                           max_nfev=how.max_evaluations)
    return with_constants(calibration, names, np.exp(result.x))
