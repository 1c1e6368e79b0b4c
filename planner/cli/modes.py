"""Handler of ``plan --mode one-step-off|fully-async|best``: the split of the cluster into a
trainer and a rollout pool (planner/placement.py), printed, as JSON, or written as a job."""

from __future__ import annotations

import sys
from pathlib import Path

from planner.catalog.models import resolve_model
from planner.cli import inputs
from planner.cli.args import UsageError
from planner.cli.codes import ExitCode
from planner.placement import AsyncOptions, plan_best, plan_mode
from planner.report.modes import best_dict, best_table, mode_dict, mode_table
from planner.report.text import to_json
from planner.verl.files import write_job, write_plan_job
from planner.verl.modes import job_from_mode_plan


def async_options(args) -> AsyncOptions:
    return AsyncOptions(staleness_threshold=args.staleness_threshold,
                        trigger_parameter_sync_step=args.trigger_parameter_sync_step,
                        partial_rollout=args.partial_rollout,
                        trainer_gpus=tuple(args.trainer_gpus))


def cmd_plan_mode(args) -> int:
    model = resolve_model(args.model)
    cluster = inputs.resolve_cluster(args)
    workload = inputs.workload(args)
    if not workload.has_rollout:
        raise UsageError(f"--mode {args.mode} plans GRPO; --workload pretrain has no rollout")
    if args.format == "csv":
        raise UsageError(f"--mode {args.mode} prints table or json, not csv")
    request = inputs.request(args, model, cluster, workload)
    settings = async_options(args)
    if args.mode == "best":
        plans = plan_best(request, settings)
        chosen = min((p for p in plans if p.best), default=None,
                     key=lambda p: p.best["step_time_s"])
    else:
        plans = [plan_mode(request, args.mode, settings)]
        chosen = plans[0] if plans[0].best else None
    if args.write:
        if chosen is None:
            raise UsageError("no plan fits in GPU memory; nothing to write")
        directory = Path(args.write)
        common = dict(model_path=args.model_path, train_files=args.train_files,
                      val_files=args.val_files)
        if chosen.mode == "sync":
            written = write_plan_job(chosen.sync_plan, rank=args.rank, directory=directory,
                                     force=args.force, extra_overrides=args.override, **common)
        else:
            job = job_from_mode_plan(chosen, args.rank, extra_overrides=args.override, **common)
            written = write_job(job, directory, args.force)
        for path in written:
            print(f"wrote {path}", file=sys.stderr)
    if args.mode == "best":
        print(to_json(best_dict(plans)) if args.format == "json" else best_table(plans))
    else:
        print(to_json(mode_dict(plans[0], args.top)) if args.format == "json"
              else mode_table(plans[0], args.top))
    return ExitCode.OK if chosen is not None else ExitCode.NO

