"""Fit the time model's efficiency constants to a study's measured trials.

Each successful trial is a :class:`planner.calibration.Measurement` (model, cluster and workload
from the study's attributes, the layout from the trial's); :func:`planner.calibration.fit`
does the fitting and writes the format of ``planner/data/calibration.json``, which
``plan-parallel --calibration FILE`` reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from planner.errors import PlanInputError
from trials import study_state as attrs

if TYPE_CHECKING:
    from optuna import Study

    from planner.calibration import Measurement

# Trials measure throughput on the user's own cluster to a few percent (median of steps).
TRIAL_MEASUREMENT_SIGMA = 0.05


def study_setting(info: dict):
    """(model, cluster, workload) a study was created for."""
    from planner.hardware import ClusterSpec, get_gpu
    from planner.models import ModelSpec
    from planner.workload import GrpoWorkload

    model = ModelSpec(**info["model"])
    cluster_info = info["cluster"]
    cluster = ClusterSpec(get_gpu(cluster_info["gpu_type"]), int(cluster_info["num_gpus"]),
                          int(cluster_info["gpus_per_node"]))
    names = {f.name for f in fields(GrpoWorkload)}
    workload = GrpoWorkload(**{k: v for k, v in info["workload"].items() if k in names})
    return model, cluster, workload


def study_measurements(study: "Study") -> list["Measurement"]:
    from planner.calibration import Measurement
    from planner.layout import LAYOUT_FIELDS, Layout

    info = study.user_attrs.get(attrs.STUDY)
    if not info:
        raise PlanInputError(f"study {study.study_name!r} was not made by plan-parallel tune")
    model, cluster, workload = study_setting(info)
    out = []
    for trial in study.get_trials(deepcopy=False):
        value = attrs.measured_value(trial)
        layout = trial.user_attrs.get(attrs.LAYOUT)
        if value is None or not layout:
            continue
        out.append(Measurement(model, cluster, workload,
                               Layout(**{name: layout[name] for name in LAYOUT_FIELDS}), value))
    return out


def shipped_calibration() -> dict:
    from planner.timing import CALIBRATION_FILE

    return json.loads((resources.files("planner") / "data" / CALIBRATION_FILE).read_text())


@dataclass(frozen=True)
class CalibrationResult:
    measurements: int
    mape_before: float
    mape_after: float
    calibration: dict


def calibrate_study(study: "Study", initial: dict | None, source: str) -> CalibrationResult:
    from planner.calibration import fit, mape, predict

    measurements = study_measurements(study)
    if not measurements:
        raise PlanInputError(f"study {study.study_name!r} has no successful trial to fit")
    measured = [m.tokens_per_s_per_gpu for m in measurements]
    start = initial if initial is not None else shipped_calibration()
    before = mape(predict(measurements, start), measured)
    fitted = fit(measurements, initial=start, source=source,
                 measurement_sigma=TRIAL_MEASUREMENT_SIGMA)
    after = mape(predict(measurements, fitted), measured)
    return CalibrationResult(len(measurements), before, after, fitted)


def write_calibration(calibration: dict, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(calibration, indent=2, sort_keys=True) + "\n")
    return path
