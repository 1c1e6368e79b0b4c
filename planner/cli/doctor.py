"""Handler of ``doctor``: can this machine run ``tune``'s verl trials?  One line per check
(ok, the fix, or why it does not apply); exit 0 when nothing failed, 1 otherwise.  ``tune``
runs the same checks before its first trial (:func:`report_checks`)."""

from __future__ import annotations

import os
import sys

from planner.cli.codes import ExitCode
from planner.errors import PlanInputError


def doctor_inputs(args, cluster, workload, command: tuple[str, ...],
                  paths: tuple[str | None, str | None, str | None], modes: tuple[str, ...] = ()):
    """``modes``: the training modes a ``tune --mode`` study runs (their entry modules must
    import too)."""
    from planner.verl.keys import MODE_ENTRY, VERL_VERSION
    from trials.preflight import DoctorInputs

    model_path, train_files, val_files = paths
    address = getattr(args, "ray_address", None) or os.environ.get("RAY_ADDRESS")
    return DoctorInputs(
        trainer_command=tuple(command), launcher=args.launcher,
        rollout_engine=workload.rollout_engine, gpu_name=cluster.gpu.name,
        nvml_names=tuple(cluster.gpu.nvml_names) or (cluster.gpu.name,),
        gpus_needed=min(cluster.gpus_per_node, cluster.num_gpus), model_path=model_path,
        data_files=(("--train-files", train_files), ("--val-files", val_files)),
        ray_address=address, verl_version=VERL_VERSION,
        entry_modules=tuple(MODE_ENTRY[mode] for mode in modes if mode != "sync"))


def report_checks(inputs, *, before: str | None = None) -> list:
    """Run the checks and print one line each; before ``tune``, print only the failed ones
    (on stderr) and stop with the first failure's fix."""
    from trials.preflight import run_checks

    checks = run_checks(inputs)
    failed = [check for check in checks if check.status == "fail"]
    for check in (failed if before else checks):
        print(check.line(), file=sys.stderr if before else sys.stdout, flush=True)
    if before and failed:
        raise PlanInputError(f"{len(failed)} check(s) failed before the first trial; "
                             f"{failed[0].name}: {failed[0].detail} (or pass --skip-checks)")
    return checks


def cmd_doctor(args) -> int:
    from planner.cli import inputs as cli_inputs
    from trials.trial_job import DEFAULT_TRAINER_COMMAND, split_command

    cluster = cli_inputs.resolve_cluster(args)
    workload = cli_inputs.workload(args)
    command = split_command(args.trainer_command or DEFAULT_TRAINER_COMMAND)
    paths = (args.model_path or os.environ.get("MODEL_PATH"),
             args.train_files or os.environ.get("TRAIN_FILES"),
             args.val_files or os.environ.get("VAL_FILES"))
    checks = report_checks(doctor_inputs(args, cluster, workload, command, paths))
    failed = [check for check in checks if check.status == "fail"]
    if failed:
        print(f"{len(failed)} of {len(checks)} checks failed; fix them, then run "
              f"`plan-parallel tune`", file=sys.stderr)
        return ExitCode.NO
    print("ready for `plan-parallel tune`", file=sys.stderr)
    return ExitCode.OK
