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

from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Sequence, Union

import numpy as np

from planner.catalog.hardware import GPU_CATALOG, ClusterSpec
from planner.catalog.models import ModelSpec
from planner.catalog.workload import GrpoWorkload, PretrainWorkload
from planner.cost.efficiency import BOUNDS, DONORS, PRIORS, SHARED, CostModel, Efficiency
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


def gpu_key(measurement: Measurement) -> str:
    family = "fp8" if measurement.workload.precision == "fp8" else "bf16"
    return f"{measurement.cluster.gpu.name}/{family}"


def _predict_group(request: PlanRequest, cols: Columns) -> np.ndarray:
    return step_columns(request, cols)["tokens_per_s_per_gpu"]


class Problem:
    """Measurements grouped by (model, cluster, workload): one vectorised call per group."""

    def __init__(self, measurements: Sequence[Measurement]):
        self.measurements = list(measurements)
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

    def efficiency(self, x: np.ndarray, key: str) -> Efficiency:
        shared = dict(zip(SHARED, x[len(self.keys):]))
        return replace(Efficiency(), gemm=x[self.keys.index(key)], **shared)

    def predict(self, x: np.ndarray) -> np.ndarray:
        out = np.empty(len(self.measurements))
        for request, cols, indices in self.groups:
            key = gpu_key(self.measurements[indices[0]])
            cost = CostModel.fixed(self.efficiency(x, key), "fit")
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
    """
    from scipy.optimize import least_squares  # lazy: only calibration needs scipy

    problem = Problem(measurements)
    problem.measurement_sigma = measurement_sigma
    x0, lower, upper = problem.start(initial)
    result = least_squares(problem.residuals, x0, bounds=(lower, upper), x_scale="jac",
                           diff_step=1e-3, max_nfev=400)
    x = result.x
    shared = {name: float(f"{value:.4g}") for name, value in zip(SHARED, x[len(problem.keys):])}
    by_gpu = {key: {"gemm": float(f"{x[i]:.4g}"),
                    "measurements": int(sum(gpu_key(m) == key for m in problem.measurements))}
              for i, key in enumerate(problem.keys)}
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
    errors = np.abs(problem.predict(x) / problem.measured - 1)
    return {"shared": shared, "by_gpu": dict(sorted(by_gpu.items())),
            "fit": {"measurements": len(problem.measurements),
                    "mape": round(float(errors.mean()), 4), "source": source}}


def mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    return float(np.mean(np.abs(np.asarray(predicted) / np.asarray(measured) - 1)))
