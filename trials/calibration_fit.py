"""Fit the time model's efficiency constants to a study's measured trials.

Each successful trial is a :class:`planner.cost.calibration.Measurement` (model, cluster and
workload
from the study's attributes, the layout from the trial's); :func:`planner.cost.calibration.fit`
does the fitting and writes the format of ``planner/cost/calibration.json``, which
``plan-parallel --calibration FILE`` reads.  Only colocated (sync) trials are fitted: the
measurement model is the colocated step; a ``tune --mode`` study's asynchronous trials are
left out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from planner.cost.calibration import (
    Measurement,
    PhaseFit,
    PhaseMeasurement,
    fit,
    fit_phases,
    gpu_key,
    mape,
    phase_constants,
    phase_log_errors,
    predict,
    predict_phases,
)
from planner.cost.efficiency import CostModel, shipped_calibration
from planner.errors import PlanInputError
from planner.search.layout import Layout
from trials import study_state as attrs
from trials.sweep_folder import study_setting

if TYPE_CHECKING:
    from optuna import Study

# Trials measure throughput on the user's own cluster to a few percent (median of steps).
TRIAL_MEASUREMENT_SIGMA = 0.05


def study_measurements(study: "Study") -> list["Measurement"]:
    model, cluster, workload = study_setting(study)
    out = []
    for trial in study.get_trials(deepcopy=False):
        value = attrs.measured_value(trial)
        layout = trial.user_attrs.get(attrs.LAYOUT)
        mode = (trial.user_attrs.get(attrs.PLACEMENT) or {}).get("mode", "sync")
        if value is None or not layout or mode != "sync":
            continue
        out.append(Measurement(model, cluster, workload,
                               Layout.from_row(layout), value))
    return out


@dataclass(frozen=True)
class CalibrationResult:
    measurements: int
    mape_before: float
    mape_after: float
    calibration: dict
    parts: tuple[str, ...] = ()  # the GPU type/precision parts measured (a study's fit)


def calibrate_study(study: "Study", initial: dict | None, source: str) -> CalibrationResult:
    measurements = study_measurements(study)
    if not measurements:
        raise PlanInputError(f"study {study.study_name!r} has no successful sync (colocated) "
                             f"trial to fit")
    measured = [m.tokens_per_s_per_gpu for m in measurements]
    start = initial if initial is not None else shipped_calibration()
    before = mape(predict(measurements, CostModel.load(start)), measured)
    fitted = fit(measurements, initial=start, source=source,
                 measurement_sigma=TRIAL_MEASUREMENT_SIGMA)
    after = mape(predict(measurements, CostModel.load(fitted)), measured)
    return CalibrationResult(len(measurements), before, after, fitted,
                             tuple(sorted({gpu_key(m) for m in measurements})))


def write_calibration(calibration: dict, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(calibration, indent=2, sort_keys=True) + "\n")
    return path


# --- one run instead of trials ---------------------------------------------------------------

# The constants one run's phases can tell apart: the training phases' GEMM efficiency (update
# and log-prob), decode's HBM efficiency and per-step latency (generation), and the fixed costs
# of the weight sync and of the rest of the step; every other constant keeps its value.
RUN_CONSTANTS = ("gemm", "decode_hbm", "decode_step_s", "sync_fixed_s", "step_fixed_s")


def phase_mape(measurements: Sequence[PhaseMeasurement], calibration: dict | None) -> float:
    errors = phase_log_errors(measurements,
                              predict_phases(measurements, CostModel.load(calibration)))
    return float(np.mean(np.abs(np.exp(errors) - 1)))


def calibrate_run(measurements: Sequence[PhaseMeasurement], initial: dict | None, source: str,
                  constants: Sequence[str] = RUN_CONSTANTS) -> CalibrationResult:
    """The time model fitted to one run's measured phases (``measurements``: the run's steps
    reduced to a few windows at their own lengths), the way :func:`calibrate_study` fits a
    study's trials: least squares in log space with weak priors, the measurements trusted to
    :data:`TRIAL_MEASUREMENT_SIGMA`, starting from ``initial`` (None: the shipped calibration)
    and with the priors centred on it, so a constant the run cannot see keeps its value.  Only
    :data:`RUN_CONSTANTS` move; ``initial`` and the shipped file are left as they were (the
    result is a new dict)."""
    if not measurements:
        raise PlanInputError("the run has no measured step to fit")
    start = initial if initial is not None else shipped_calibration()
    before = phase_mape(measurements, start)
    fitted = fit_phases(measurements, start, constants,
                        PhaseFit(measurement_sigma=TRIAL_MEASUREMENT_SIGMA,
                                 start_from_prior=False, centre_on_calibration=True))
    names = phase_constants(measurements, constants)
    values = {}
    for where, name in names:
        table = fitted["shared"] if where == "shared" else fitted["by_gpu"][where]
        table[name] = float(f"{table[name]:.4g}")
        values[name if where == "shared" else f"{where}.{name}"] = table[name]
    after = phase_mape(measurements, fitted)
    fitted["run_fit"] = {"source": source, "windows": len(measurements),
                         "phases": int(sum(len(m.seconds) for m in measurements)),
                         "constants": values, "mape_before": round(before, 4),
                         "mape_after": round(after, 4)}
    return CalibrationResult(len(measurements), before, after, fitted,
                             tuple(sorted({gpu_key(m) for m in measurements})))
