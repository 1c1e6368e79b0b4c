"""Fit the step-time model's efficiency constants to published Megatron measurements.

    python benchmarks/calibrate.py [--write planner/data/calibration.json] [--exclude-source S]

The fit is kept physical: one GEMM efficiency per GPU type and precision family (the fraction
of dense tensor-core peak large GEMMs reach), and a handful of constants shared by every GPU
(GEMM size sensitivity, flash-attention efficiency, link efficiencies, overlap of DP and EP
communication).  It minimises the squared log error of predicted tokens/s/GPU over
``../shared/reference/calibration_layouts.csv`` (FP4 rows excluded: the planner has no FP4).
GPU types without measurements take the constants of the closest measured part (same
architecture), recorded as ``"donor"`` in the file.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibration_data import CalibrationCase, load_cases  # noqa: E402

from planner.hardware import GPU_CATALOG  # noqa: E402
from planner.timing import Efficiency, pretrain_step  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
OUTPUT = REPO / "planner" / "data" / "calibration.json"

# Priors keep the fit physical where the data cannot tell constants apart (large GEMM
# efficiency vs per-layer overheads, say): a weak pull in log space towards typical values
# (NCCL bus bandwidth ~75% of NVLink, ~70% of the NIC; cuBLAS GEMMs ~65% of dense peak;
# flash attention ~45%; tens of microseconds of launches per layer).  (value, sigma in log).
PRIORS = {"gemm": (0.65, 0.3), "gemm_half_rows": (128.0, 1.0), "attention": (0.45, 0.3),
          "nvlink": (0.75, 0.2), "network": (0.70, 0.3), "dp_overlap": (0.6, 0.5),
          "ep_overlap": (0.3, 1.0), "elementwise_passes": (3.0, 0.5),
          "layer_overhead_s": (30e-6, 0.7), "expert_gemm": (0.7, 0.5)}
SHARED = ("gemm_half_rows", "attention", "nvlink", "network", "dp_overlap", "ep_overlap",
          "elementwise_passes", "layer_overhead_s", "expert_gemm")
BOUNDS = {"gemm": (0.2, 0.95), "gemm_half_rows": (8.0, 4096.0), "attention": (0.2, 0.9),
          "nvlink": (0.3, 0.95), "network": (0.2, 0.95), "dp_overlap": (0.01, 0.98),
          "ep_overlap": (0.01, 0.9), "elementwise_passes": (0.1, 12.0),
          "layer_overhead_s": (1e-6, 500e-6), "expert_gemm": (0.1, 1.0)}
# Parts with no measurements borrow a measured part of the same architecture.
DONORS = {"H800": "H100-80GB", "H20-96GB": "H100-80GB", "H200": "H100-80GB",
          "L40S": "A100-80GB", "B300": "B200"}


def gpu_key(case: CalibrationCase) -> str:
    family = "fp8" if case.workload.precision == "fp8" else "bf16"
    return f"{case.cluster.gpu.name}/{family}"


class Problem:
    """Cases grouped by (model, cluster, workload) so each group is one vectorised call."""

    def __init__(self, cases: list[CalibrationCase]):
        self.cases = cases
        groups = defaultdict(list)
        for index, case in enumerate(cases):
            groups[(case.model, case.cluster, case.workload)].append(index)
        self.groups = []
        for (model, cluster, workload), indices in groups.items():
            layouts = [cases[i].layout.to_columns() for i in indices]
            cols = {name: np.concatenate([c[name] for c in layouts]) for name in layouts[0]}
            self.groups.append((model, cluster, workload, cols, np.array(indices)))
        self.keys = sorted({gpu_key(case) for case in cases})
        self.names = [f"gemm:{key}" for key in self.keys] + list(SHARED)
        self.measured = np.array([case.tokens_per_s_per_gpu for case in cases])

    def efficiency(self, x: np.ndarray, key: str) -> Efficiency:
        shared = dict(zip(SHARED, x[len(self.keys):]))
        return replace(Efficiency(), gemm=x[self.keys.index(key)], **shared)

    def predict(self, x: np.ndarray) -> np.ndarray:
        out = np.empty(len(self.cases))
        for model, cluster, workload, cols, indices in self.groups:
            key = gpu_key(self.cases[indices[0]])
            result = pretrain_step(model, cluster, workload, cols, self.efficiency(x, key))
            out[indices] = result["tokens_per_s_per_gpu"]
        return out

    def residuals(self, x: np.ndarray) -> np.ndarray:
        data = np.log(self.predict(x)) - np.log(self.measured)
        return np.concatenate([data, self.prior_residuals(x)])

    def prior_residuals(self, x: np.ndarray) -> np.ndarray:
        names = ["gemm"] * len(self.keys) + list(SHARED)
        centres = np.array([PRIORS[name][0] for name in names])
        sigmas = np.array([PRIORS[name][1] for name in names])
        return (np.log(np.maximum(x, 1e-12)) - np.log(centres)) / sigmas

    def start(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x0 = [PRIORS["gemm"][0]] * len(self.keys) + [PRIORS[name][0] for name in SHARED]
        lower = [BOUNDS["gemm"][0]] * len(self.keys) + [BOUNDS[n][0] for n in SHARED]
        upper = [BOUNDS["gemm"][1]] * len(self.keys) + [BOUNDS[n][1] for n in SHARED]
        return np.array(x0), np.array(lower), np.array(upper)


def predict(cases: list[CalibrationCase], calibration: dict) -> np.ndarray:
    """Predicted tokens/s/GPU of each case with a calibration dict (as the planner loads it)."""
    from planner.timing import load_efficiency

    problem = Problem(cases)
    out = np.empty(len(cases))
    for model, cluster, workload, cols, indices in problem.groups:
        efficiency = load_efficiency(cluster.gpu, workload.precision, calibration)
        out[indices] = pretrain_step(model, cluster, workload, cols,
                                     efficiency)["tokens_per_s_per_gpu"]
    return out


def fit(cases: list[CalibrationCase]) -> dict:
    """Least squares in log space; returns the calibration dict the planner loads."""
    from scipy.optimize import least_squares

    problem = Problem(cases)
    x0, lower, upper = problem.start()
    result = least_squares(problem.residuals, x0, bounds=(lower, upper), x_scale="jac",
                           diff_step=1e-3, max_nfev=400)
    x = result.x
    shared = {name: float(f"{value:.4g}") for name, value in zip(SHARED, x[len(problem.keys):])}
    by_gpu = {key: {"gemm": float(f"{x[i]:.4g}"), "cases": int(sum(gpu_key(c) == key
                                                                       for c in cases))}
              for i, key in enumerate(problem.keys)}
    for gpu in GPU_CATALOG:
        for family in ("bf16", "fp8"):
            key = f"{gpu.name}/{family}"
            donor = DONORS.get(gpu.name)
            donor_key = f"{donor}/{family}" if donor else None
            if key not in by_gpu and donor_key in by_gpu:
                by_gpu[key] = {"gemm": by_gpu[donor_key]["gemm"], "donor": donor_key}
    # parts without a donor for FP8 (A100 has no FP8): their BF16 figure
    for gpu in GPU_CATALOG:
        bf16, fp8 = f"{gpu.name}/bf16", f"{gpu.name}/fp8"
        if fp8 not in by_gpu and bf16 in by_gpu:
            by_gpu[fp8] = {"gemm": by_gpu[bf16]["gemm"], "donor": bf16}
    # any other part: the median of the measured parts of that precision family
    for family in ("bf16", "fp8"):
        fitted = [v["gemm"] for k, v in by_gpu.items() if k.endswith(family) and "cases" in v]
        if fitted:
            by_gpu[f"*/{family}"] = {"gemm": float(np.median(fitted)), "donor": "median"}
    errors = np.abs(problem.predict(x) / problem.measured - 1)
    return {"shared": shared, "by_gpu": dict(sorted(by_gpu.items())),
            "fit": {"cases": len(cases), "mape": round(float(errors.mean()), 4),
                    "source": "benchmarks/calibrate.py on shared/reference/"
                              "calibration_layouts.csv"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", type=Path, default=None,
                        help=f"write the calibration file (default: print; the planner's file "
                             f"is {OUTPUT.relative_to(REPO)})")
    parser.add_argument("--exclude-source", action="append", default=[])
    args = parser.parse_args()
    cases, skipped = load_cases()
    cases = [case for case in cases if case.source not in args.exclude_source]
    calibration = fit(cases)
    text = json.dumps(calibration, indent=2) + "\n"
    if args.write:
        args.write.write_text(text)
        print(f"wrote {args.write} ({len(cases)} cases, MAPE {calibration['fit']['mape']:.1%})")
    else:
        print(text)


if __name__ == "__main__":
    main()
