"""Handler of ``calibrate SWEEP_DIR | --storage URL``: fit the time model to measured trials.

Prints the prediction error (mean absolute percentage error of tokens/s/GPU over the study's
successful trials) before and after the fit, and writes a calibration file that
``plan-parallel ... --calibration FILE`` reads.  The study is read, never changed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from planner.cli.codes import ExitCode
from planner.cli.inputs import note_filled
from planner.cost.efficiency import SHARED, read_calibration, with_shipped_rl_constants
from planner.errors import PlanInputError
from trials.calibration_fit import calibrate_study, write_calibration
from trials.sweep_folder import open_study


def cmd_calibrate(args) -> int:
    output = Path(args.output) if args.output else (
        Path(args.sweep_dir) / "calibration.json" if args.sweep_dir else Path("calibration.json"))
    if output.exists() and not args.force:
        raise PlanInputError(f"{output} exists; pass --force to overwrite it (or --output FILE)")
    initial = None
    if args.calibration:  # an RL constant the file lacks: the shipped one, carried to the output
        initial, filled = with_shipped_rl_constants(read_calibration(Path(args.calibration)))
        note_filled(args.calibration, filled)
    study, spec = open_study(args.storage, args.sweep_dir, args.study_name)
    name = study.study_name
    result = calibrate_study(study, initial, source=f"plan-parallel calibrate: study {name} "
                                                    f"({spec.display})")
    write_calibration(result.calibration, output)
    start = args.calibration or "the shipped calibration"
    print(f"study {name}: {result.measurements} successful trials")
    print(f"prediction error (MAPE of tokens/s/GPU): {result.mape_before:.1%} with {start} -> "
          f"{result.mape_after:.1%} fitted")
    # the study's fit moves the training constants alone (planner.cost.calibration.fit): a
    # step's tokens/s cannot tell generation from weight sync, so those keep their values
    print(f"fitted: the training constants (GEMM efficiency of {', '.join(result.parts)}, and the "
          f"shared ones: {', '.join(SHARED)}); the generation and weight-sync constants are "
          f"{start}'s, unchanged (`plan-parallel advise` on a run's phase times refits them)",
          file=sys.stderr)
    print(f"wrote {output}; use it with: plan-parallel ... --calibration {output}",
          file=sys.stderr)
    return ExitCode.OK
