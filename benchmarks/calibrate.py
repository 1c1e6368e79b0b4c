"""Fit the step-time model's efficiency constants to published Megatron measurements.

    python benchmarks/calibrate.py [--write planner/cost/calibration.json] [--exclude-source S]
                                   [--rl-only]

Two fits, one after the other, and the provenance of both (``"provenance"``: each source's
framework, releases and the fit's error on it, read by :mod:`planner.cost.provenance`).
First the Megatron training constants (below).  Then the RL
constants (decode HBM efficiency per GPU type; per-layer and per-step decode latencies; the
weight sync's per-tensor and fixed costs; the fixed per-step overhead) on the colocated RL steps
of ``grpo_runs.csv`` (``benchmarks/rl_data.py``), phase by phase where phases are published, with
the training constants held: the RL fit cannot move the pretraining accuracy.  ``--rl-only``
keeps the planner file's training fit as it is and refits the RL constants alone (what a change
to the RL time model needs).

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
from rl_data import fit_rl, load_rl_cases, phase_measurement  # noqa: E402

from planner.cost import calibration  # noqa: E402
from planner.cost.efficiency import RL_PRIORS, CostModel  # noqa: E402

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


def _mape_by_source(sources: list[str], errors: list[float]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for source, error in zip(sources, errors):
        entry = out.setdefault(source, {"errors": []})
        entry["errors"].append(error)
    return {source: {"measurements": len(entry["errors"]),
                     "mape": round(float(np.mean(entry["errors"])), 4)}
            for source, entry in sorted(out.items())}


def provenance(cases: list[CalibrationCase], fitted: dict, rl_cases: list) -> dict:
    """What each source of the fit was (framework and releases) and the fit's error on it:
    training rows by publication (tokens/s/GPU), RL steps by source (every published phase)."""
    errors = np.abs(predict(cases, fitted) / np.array([c.tokens_per_s_per_gpu for c in cases]) - 1)
    training = _mape_by_source([case.source for case in cases], list(errors))
    for source, entry in training.items():
        members = [case for case in cases if case.source == source]
        entry["versions"] = sorted({case.version for case in members if case.version})
        entry["trainer"] = "Megatron-Core" if source in ("megatron-bridge", "dgx-cloud") \
            else "Megatron-LM"
    measurements = [phase_measurement(case) for case in rl_cases]
    predicted = calibration.predict_phases(measurements, CostModel.load(fitted))
    phase_errors = [(case.source, abs(float(np.exp(error)) - 1))
                    for case, item, guess in zip(rl_cases, measurements, predicted)
                    for error in calibration.phase_log_errors([item], [guess])]
    rl = _mape_by_source([source for source, _ in phase_errors],
                         [error for _, error in phase_errors])
    for source, entry in rl.items():
        members = [case for case in rl_cases if case.source == source]
        entry["phases"] = entry.pop("measurements")
        entry["steps"] = len(members)
        entry["framework"] = members[0].framework
        entry["versions"] = sorted({case.version for case in members})
        entry["trainers"] = sorted({case.trainer for case in members})
        entry["rollout"] = sorted({case.rollout_engine for case in members})
    return {"training": {"source": SOURCE, "by_source": training},
            "rl": {"source": fitted["rl_fit"]["source"], "by_source": rl}}


def training_part(calibration: dict) -> dict:
    """The Megatron training fit of a calibration as it stands (its shared training constants,
    per-GPU GEMM efficiencies with their bookkeeping, fit error and ranking uncertainty), the
    RL constants and the RL fit left out: what ``--rl-only`` refits the RL constants on."""
    shared = {k: v for k, v in calibration.get("shared", {}).items() if k not in RL_PRIORS}
    by_gpu = {key: {k: v for k, v in entry.items() if k not in RL_PRIORS and k != "rl_donor"}
              for key, entry in calibration.get("by_gpu", {}).items()}
    return {"shared": shared, "by_gpu": by_gpu,
            **{k: calibration[k] for k in ("fit", "ranking_uncertainty") if k in calibration}}


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
    parser.add_argument("--rl-only", action="store_true",
                        help=f"keep the training fit of {OUTPUT.relative_to(REPO)} as it is "
                             f"and refit only the RL constants on it (a new RL term must not "
                             f"move the pretraining fit)")
    args = parser.parse_args()
    cases, _ = load_cases()
    cases = [case for case in cases if case.source not in args.exclude_source]
    if args.rl_only:
        fitted = training_part(json.loads(OUTPUT.read_text()))
    else:
        fitted = fit(cases)
        from accuracy import ranking_uncertainty  # noqa: PLC0415 - accuracy imports this

        fitted["ranking_uncertainty"] = ranking_uncertainty(cases, predict(cases, fitted))
    rl_cases, _ = load_rl_cases()
    rl_cases = [case for case in rl_cases if case.source not in args.exclude_source]
    fitted = fit_rl(rl_cases, fitted)
    fitted["provenance"] = provenance(cases, fitted, rl_cases)
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
