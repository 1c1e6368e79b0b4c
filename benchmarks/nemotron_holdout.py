"""Nemotron-3 (hybrid Mamba-2 + attention + MoE) pretraining rows of the calibration CSV, which the
fit leaves out, scored as a held-out check with the layer kinds wired.

    python benchmarks/nemotron_holdout.py

Prints each row's measured and predicted tokens/s/GPU (the committed
``planner/cost/calibration.json`` constants) and the mean absolute percentage error, next to the
fit's own error on the rows it was fitted on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibrate import OUTPUT, predict  # noqa: E402
from calibration_data import load_cases  # noqa: E402


def main() -> int:
    fitted = json.loads(OUTPUT.read_text())
    cases, skipped = load_cases(held_out=True)
    skipped.pop("not a held-out row", None)
    predicted = predict(cases, fitted)
    errors = []
    print("| row | model | GPU x n | precision | TP/PP/EP | measured tok/s/GPU | predicted | "
          "error |")
    print("|---|---|---|---|---|---|---|---|")
    for case, ours in zip(cases, predicted):
        error = ours / case.tokens_per_s_per_gpu - 1
        errors.append(abs(error))
        lay = case.layout
        print(f"| {case.row_id} | {case.model.name} | {case.cluster.gpu.name} x "
              f"{case.cluster.num_gpus} | {case.precision_recipe or case.precision_family} | "
              f"{lay.tp}/{lay.pp}/{lay.ep} | {case.tokens_per_s_per_gpu:,.0f} | {ours:,.0f} | "
              f"{100 * error:+.0f}% |")
    if errors:
        print(f"\nheld-out MAPE {100 * float(np.mean(errors)):.1f}% over {len(errors)} rows")
    if skipped:
        print("held-out rows not scored: " + "; ".join(f"{n} {reason}"
                                                       for reason, n in skipped.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
