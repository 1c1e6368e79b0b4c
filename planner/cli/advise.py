"""Handler of ``advise RUN_DIR_OR_LOG [--job SCRIPT]`` (:mod:`planner.diagnose.advice`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from planner.cli import inputs
from planner.cli.codes import ExitCode
from planner.diagnose.advice import (
    RunWindows,
    advise,
    advise_text,
    check_run,
    job_setting,
)
from planner.diagnose.validate import JobInput
from planner.errors import PlanInputError
from planner.verl.keys import SCRIPT_FILE
from trials.calibration_fit import write_calibration
from trials.runs import read_run


def job_path(args) -> str:
    """``--job``, else plan-parallel's exported job in the run folder."""
    if args.job:
        return args.job
    folder = Path(args.run)
    if folder.is_dir() and (folder / SCRIPT_FILE).is_file() and (folder / "plan.json").is_file():
        return str(folder / SCRIPT_FILE)
    raise PlanInputError(f"advise needs the job the run ran: pass --job SCRIPT (its launch "
                         f"script or Hydra YAML); {args.run!r} holds no {SCRIPT_FILE} and "
                         f"plan.json written by plan-parallel")


def cmd_advise(args) -> int:
    output = Path(args.write_calibration) if args.write_calibration else None
    if output is not None and output.exists() and not args.force:
        raise PlanInputError(f"{output} exists; pass --force to overwrite it")
    run = read_run(args.run)
    check_run(run)
    setting = job_setting(JobInput(inputs=(job_path(args),), sets=tuple(args.set),
                                   model=args.model, gpu_type=args.gpu_type,
                                   policy=inputs.policy(args), gpus=args.gpus))
    advice = advise(run, setting, inputs.cost_model(args), inputs.policy(args),
                    RunWindows(warmup_steps=args.warmup_steps))
    if output is not None:
        write_calibration(advice.fit.calibration, output)
        print(f"wrote {output}; use it with: plan-parallel ... --calibration {output}",
              file=sys.stderr)
    if args.format == "json":
        print(json.dumps(advice.to_dict(), indent=2, default=str))
    else:
        print(advise_text(advice))
    return ExitCode.OK
