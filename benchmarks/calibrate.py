"""Fit the step-time model's efficiency constants to published Megatron measurements.

    python benchmarks/calibrate.py [--write planner/cost/calibration.json] [--exclude-source S]

Reads ``benchmarks/data/calibration_layouts.csv`` (the in-repo copy of the shared reference data;
``$PLAN_PARALLEL_REFERENCE_DIR`` points elsewhere) through ``calibration_data.py`` (FP4 rows
excluded: the planner has no FP4) and fits with :func:`planner.cost.calibration.fit`: one GEMM
efficiency per GPU type and precision family plus a few shared constants, least squares in log
space with weak physical priors.  GPU types without measurements take the constants of the
closest measured part (same architecture), recorded as ``"donor"`` in the file.  The file also
records the fit's ranking uncertainty (``benchmarks/accuracy.py``), which plans use to tell ties.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibration_data import CalibrationCase, load_cases  # noqa: E402

from planner.cost import calibration  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
OUTPUT = REPO / "planner" / "cost" / "calibration.json"
SOURCE = "benchmarks/calibrate.py on shared/reference/calibration_layouts.csv"


def measurements(cases: list[CalibrationCase]) -> list[calibration.Measurement]:
    return [calibration.Measurement(case.model, case.cluster, case.workload, case.layout,
                                    case.tokens_per_s_per_gpu) for case in cases]


def fit(cases: list[CalibrationCase]) -> dict:
    return calibration.fit(measurements(cases), source=SOURCE)


def predict(cases: list[CalibrationCase], fitted: dict) -> np.ndarray:
    return calibration.predict(measurements(cases), fitted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", type=Path, default=None,
                        help=f"write the calibration file (default: print; the planner's file "
                             f"is {OUTPUT.relative_to(REPO)})")
    parser.add_argument("--exclude-source", action="append", default=[])
    args = parser.parse_args()
    cases, _ = load_cases()
    cases = [case for case in cases if case.source not in args.exclude_source]
    fitted = fit(cases)
    from accuracy import ranking_uncertainty  # noqa: PLC0415 - accuracy imports this module

    fitted["ranking_uncertainty"] = ranking_uncertainty(cases, predict(cases, fitted))
    text = json.dumps(fitted, indent=2) + "\n"
    if args.write:
        args.write.write_text(text)
        print(f"wrote {args.write} ({len(cases)} cases, MAPE {fitted['fit']['mape']:.1%})")
    else:
        print(text)


if __name__ == "__main__":
    main()
