"""Handler of ``report``: an HTML report of a sweep folder or of a plan."""

from __future__ import annotations

from pathlib import Path

from planner.bounds import check_output_file, check_output_folder
from planner.catalog.models import resolve_model
from planner.cli import inputs
from planner.cli.args import UsageError
from planner.cli.codes import ExitCode
from planner.cli.sizing import sizing_from_args, sizing_requested
from planner.cost.request import PlanRequest
from planner.errors import NoFitError, PlanInputError
from planner.no_fit import remedy
from planner.plan import make_plan
from planner.report.html import (
    ReportFiles,
    load_trials,
    plan_from_sweep,
    write_report,
    write_sizing_report,
)
from planner.search.space import SearchOptions
from trials.sweep_folder import confidence_statement


def check_report_outputs(args) -> None:
    """``--html`` and ``--png-dir`` checked before anything is read or drawn: a folder given
    for the file, a file for the folder, or a missing or read-only folder is one input error
    and nothing is written (the figures go to ``--png-dir`` before the page is written)."""
    if args.png_dir:
        check_output_folder(Path(args.png_dir), "--png-dir")
    if args.html:
        check_output_file(Path(args.html), "--html")
    elif args.sweep and Path(args.sweep).is_dir():
        check_output_file(Path(args.sweep) / "report.html", "--html (default)")
    elif not args.sweep:
        check_output_file(Path("report.html"), "--html (default)")


def _files(args, page: Path) -> ReportFiles:
    return ReportFiles(page, Path(args.png_dir) if args.png_dir else None, args.force)


def cmd_report(args) -> int:
    trials = confidence = None
    check_report_outputs(args)
    cost = inputs.cost_model(args)
    policy = inputs.policy(args)
    if args.sweep:
        sweep = Path(args.sweep)
        if sweep.exists() and not sweep.is_dir():
            raise PlanInputError(f"{args.sweep!r} is a file, not a sweep folder; valid: the "
                                 f"folder `plan-parallel tune` wrote (--write or --sweep-dir), "
                                 f"or --model and --gpus for a plan report")
        if not sweep.is_dir():
            raise PlanInputError(f"sweep folder {args.sweep!r} does not exist")
        if (sweep / "trials.csv").exists():  # checked before the (slower) plan
            trials = load_trials(sweep / "trials.csv")
        confidence = confidence_statement(sweep)
        plan = plan_from_sweep(sweep, cost, policy)
        output = Path(args.html) if args.html else sweep / "report.html"
    elif args.model and sizing_requested(args):
        sizing = sizing_from_args(args, SearchOptions())
        written = write_sizing_report(sizing, _files(args, Path(args.html or "report.html")))
        print(f"wrote {written}")
        return ExitCode.OK if any(row.fits for row in sizing.rows) else ExitCode.NO
    elif args.model:
        model = resolve_model(args.model)
        plan = make_plan(PlanRequest(model, inputs.resolve_cluster(args),
                                     inputs.workload(args, model), cost=cost, policy=policy))
        if not plan.candidates["fits"].any():  # "no layout fits": exit 1, as every command
            raise NoFitError(f"no layout of {plan.model.name} fits on "
                             f"{plan.cluster.num_gpus} x {plan.cluster.gpu.name}; no report "
                             f"written ({remedy(plan)})")
        output = Path(args.html or "report.html")
    else:
        raise UsageError("give a sweep folder, or --model and --gpus for a plan report")
    written = write_report(plan, _files(args, output), trials, confidence)
    if confidence:
        print(f"confidence: {confidence}")
    print(f"wrote {written}")
    return ExitCode.OK
