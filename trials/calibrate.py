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
from typing import TYPE_CHECKING

from planner.cost.calibration import Measurement, fit, mape, predict
from planner.cost.efficiency import CostModel, shipped_calibration
from planner.errors import PlanInputError
from planner.search.layout import Layout
from trials import study_state as attrs
from trials.sweep import study_setting

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
    return CalibrationResult(len(measurements), before, after, fitted)


def write_calibration(calibration: dict, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(calibration, indent=2, sort_keys=True) + "\n")
    return path
