"""Handler of ``plan --mode M|best``: a training mode's plan (:mod:`planner.modes`) printed, as
JSON, or written as a job."""

from __future__ import annotations

import sys
from pathlib import Path

from planner.catalog.models import resolve_model
from planner.cli import inputs
from planner.cli.args import UsageError
from planner.cli.codes import ExitCode
from planner.modes import BEST, Launch, get_mode, off_policy_note, plan_all
from planner.output import best_json, mode_plan_json, reported_step
from planner.placement import AsyncOptions
from planner.report.mode_tables import best_table, mode_table
from planner.report.text import to_json


def async_options(args) -> AsyncOptions:
    return AsyncOptions(staleness_threshold=args.staleness_threshold,
                        trigger_parameter_sync_step=args.trigger_parameter_sync_step,
                        partial_rollout=args.partial_rollout,
                        trainer_gpus=tuple(args.trainer_gpus))


def cmd_plan_mode(args) -> int:
    model = resolve_model(args.model)
    cluster = inputs.resolve_cluster(args)
    workload = inputs.workload(args, model)
    if not workload.has_rollout:
        raise UsageError(f"--mode {args.mode} plans GRPO; --workload pretrain has no rollout")
    if args.format == "csv":
        raise UsageError(f"--mode {args.mode} prints table or json, not csv")
    request = inputs.request(args, model, cluster, workload)
    settings = async_options(args)
    cache: dict = {}  # pool searches shared by --mode best's plans
    if args.mode == BEST:
        plans = plan_all(request, settings, cache)
        chosen = min((p for p in plans if p.best), default=None,
                     key=lambda p: reported_step(p.best))
    else:
        plans = [get_mode(args.mode, settings).plan(request)]
        chosen = plans[0] if plans[0].best else None
    inputs.note_versions(args, request.cost, request.workload)
    if args.write:
        if chosen is None:
            raise UsageError("no plan fits in GPU memory; nothing to write")
        from planner.verl.files import write_job  # with --write alone (verl's export)

        mode = get_mode(chosen.mode, settings)
        if chosen.first is not None and args.rank > chosen.first:  # beyond the splits listed
            chosen = mode.plan(request, cache=cache)
        job = mode.job(chosen, args.rank, Launch(
            model_path=inputs.job_model_path(args), train_files=args.train_files,
            val_files=args.val_files,
            extra_overrides=args.override))
        for path in write_job(job, Path(args.write), args.force):
            print(f"wrote {path}", file=sys.stderr)
    if args.mode == BEST:
        print(to_json(best_json(plans, off_policy_note())) if args.format == "json"
              else best_table(plans))
    else:
        print(to_json(mode_plan_json(plans[0], args.top)) if args.format == "json"
              else mode_table(plans[0], args.top))
    return ExitCode.OK if chosen is not None else ExitCode.NO
