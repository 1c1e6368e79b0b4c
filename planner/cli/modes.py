"""Handlers of ``plan --mode one-step-off|fully-async|best`` (the split of the cluster into a
trainer and a rollout pool, planner/placement.py, printed, as JSON, or written as a job) and of
``estimate --mode one-step-off|fully-async`` (one layout on such a split)."""

from __future__ import annotations

import sys
from pathlib import Path

from planner.catalog.models import resolve_model
from planner.cli import inputs
from planner.cli.args import UsageError
from planner.cli.codes import ExitCode
from planner.errors import InvalidLayoutError
from planner.placement import AsyncOptions, estimate_split, plan_best, plan_mode, pool_layout
from planner.report.modes import (
    best_dict,
    best_table,
    mode_dict,
    mode_table,
    split_estimate_dict,
    split_estimate_text,
)
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
    if workload.kind != "grpo":
        raise UsageError(f"--mode {args.mode} plans GRPO; --workload pretrain has no rollout")
    if args.format == "csv":
        raise UsageError(f"--mode {args.mode} prints table or json, not csv")
    options = inputs.search_options(args, workload)
    settings = async_options(args)
    if args.mode == "best":
        plans = plan_best(model, cluster, workload, options, inputs.calibration(args),
                          inputs.policy(args), settings)
        chosen = min((p for p in plans if p.best), default=None,
                     key=lambda p: p.best["step_time_s"])
    else:
        plans = [plan_mode(model, cluster, workload, args.mode, options,
                           inputs.calibration(args), inputs.policy(args), settings)]
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


ROLLOUT_FLAGS = ("rollout_tp", "rollout_dp", "rollout_ep")


def cmd_estimate_mode(args) -> int:
    """``estimate --mode one-step-off|fully-async``: the actor layout on the trainer pool, the
    rollout flags (or the best rollout layout, said on stderr) on the rollout pool, on the split
    ``--trainer-gpus`` gives or the fastest legal split.  ``--mode best`` is refused: it
    compares the modes' best plans, which a single layout has not got."""
    from planner.cli.commands import estimate_layout_from_args, print_invalid
    from planner.search.space import SearchOptions

    if args.mode == "best":
        raise UsageError("--mode best compares each mode's best plan: use it with plan or "
                         "explain; estimate takes --mode sync, one-step-off or fully-async")
    model = resolve_model(args.model)
    cluster = inputs.resolve_cluster(args)
    workload = inputs.workload(args)
    if workload.kind != "grpo":
        raise UsageError(f"--mode {args.mode} estimates GRPO; --workload pretrain has no "
                         f"rollout")
    layout = estimate_layout_from_args(args, model, cluster, workload)
    pin = any(getattr(args, name) is not None for name in ROLLOUT_FLAGS)
    settings = async_options(args)
    try:
        estimate = estimate_split(model, cluster, workload, args.mode, layout, pin,
                                  SearchOptions(gpu_memory_utilization=args.gpu_memory_utilization),
                                  inputs.calibration(args), settings)
    except InvalidLayoutError as error:
        shown = pool_layout(layout, settings.trainer_gpus[0]) \
            if len(settings.trainer_gpus) == 1 else layout
        return print_invalid(args, shown, error)
    candidate = estimate.candidate
    placement = candidate["placement"]
    if not settings.trainer_gpus or len(settings.trainer_gpus) > 1:
        print(f"note: {placement['trainer_gpus']} trainer + {placement['rollout_gpus']} rollout "
              f"GPUs is the fastest of the {len(estimate.splits)} split(s) scored for this "
              f"layout{'' if candidate['fits'] else ' (none fits)'} (pin one with "
              f"--trainer-gpus)", file=sys.stderr)
    if estimate.rollout_chosen:
        lay = candidate["layout"]
        print(f"note: rollout TP{lay['rollout_tp']} DP{lay['rollout_dp']} EP{lay['rollout_ep']} "
              f"at gpu_memory_utilization {lay['gpu_memory_utilization']:.2f} chosen as the plan "
              f"would for the {placement['rollout_gpus']}-GPU rollout pool (pin it with "
              f"--rollout-tp/--rollout-dp/--rollout-ep"
              f"{'' if args.gpu_memory_utilization is not None else ', --gpu-memory-utilization'}"
              f")", file=sys.stderr)
    print(to_json(split_estimate_dict(estimate)) if args.format == "json"
          else split_estimate_text(estimate, inputs.policy(args)))
    return ExitCode.OK if candidate["fits"] else ExitCode.NO
