"""Fit the step-time model's efficiency constants to published Megatron measurements.

    python benchmarks/calibrate.py [--write planner/cost/calibration.json] [--exclude-source S]

Two fits, one after the other.  First the Megatron training constants (below).  Then the RL
constants (decode HBM efficiency per GPU type; per-layer and per-step decode latencies; the
weight sync's per-tensor and fixed costs; the fixed per-step overhead) on the colocated RL steps
of ``grpo_runs.csv`` (``benchmarks/rl_data.py``), phase by phase where phases are published, with
the training constants held: the RL fit cannot move the pretraining accuracy.

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
from rl_data import fit_rl, load_rl_cases  # noqa: E402

from planner.cost import calibration  # noqa: E402
from planner.cost.efficiency import CostModel  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
OUTPUT = REPO / "planner" / "cost" / "calibration.json"
SOURCE = "benchmarks/calibrate.py on shared/reference/calibration_layouts.csv"


def measurements(cases: list[CalibrationCase]) -> list[calibration.Measurement]:
    return [calibration.Measurement(case.model, case.cluster, case.workload, case.layout,
                                    case.tokens_per_s_per_gpu) for case in cases]


def fit(cases: list[CalibrationCase]) -> dict:
    return calibration.fit(measurements(cases), source=SOURCE)


def predict(cases: list[CalibrationCase], fitted: dict) -> np.ndarray:
    return calibration.predict(measurements(cases), CostModel.load(fitted))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", type=Path, default=None,
                        help=f"write the calibration file (default: print; the planner's file "
                             f"is {OUTPUT.relative_to(REPO)})")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing file other than the planner's own")
    parser.add_argument("--exclude-source", action="append", default=[],
                        help="leave a source out (training or RL source names)")
    args = parser.parse_args()
    cases, _ = load_cases()
    cases = [case for case in cases if case.source not in args.exclude_source]
    fitted = fit(cases)
    from accuracy import ranking_uncertainty  # noqa: PLC0415 - accuracy imports this module

    fitted["ranking_uncertainty"] = ranking_uncertainty(cases, predict(cases, fitted))
    rl_cases, _ = load_rl_cases()
    rl_cases = [case for case in rl_cases if case.source not in args.exclude_source]
    fitted = fit_rl(rl_cases, fitted)
    text = json.dumps(fitted, indent=2) + "\n"
    if args.write:
        if args.write.exists() and args.write.resolve() != OUTPUT.resolve() \
                and not args.force:
            parser.error(f"{args.write} exists; pass --force to replace it")
        args.write.write_text(text)
        print(f"wrote {args.write} ({len(cases)} training cases, MAPE "
              f"{fitted['fit']['mape']:.1%}; {len(rl_cases)} RL steps, "
              f"{fitted['rl_fit']['phases']} phases, MAPE {fitted['rl_fit']['mape']:.1%})")
    else:
        print(text)


if __name__ == "__main__":
    main()
