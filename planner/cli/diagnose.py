"""Handlers of ``validate``, ``fix``, ``diff``, ``explain`` and ``profile``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from planner.catalog.models import resolve_model
from planner.cli import inputs
from planner.cli.args import UsageError
from planner.cli.codes import ExitCode
from planner.diagnose.diff import compare, diff_text
from planner.diagnose.fix import fix_job, fix_text, write_fix
from planner.diagnose.profile import profile_text, profile_traces
from planner.diagnose.validate import JobInput, dry_run
from planner.diagnose.validate_report import render_text
from planner.modes import BEST, get_mode
from planner.search.space import SearchOptions


def job_input(args, paths: list[str]) -> JobInput:
    return JobInput(inputs=tuple(paths), sets=tuple(args.set), model=args.model,
                    gpu_type=args.gpu_type, policy=inputs.policy(args),
                    gpus=getattr(args, "gpus", None))


def _json(data) -> None:
    print(json.dumps(data, indent=2, default=str))


def cmd_validate(args) -> int:
    report = dry_run(job_input(args, args.inputs)).report
    if args.format == "json":
        _json(report)
    else:
        print(render_text(report))
    return ExitCode.OK if report["would_launch"] else ExitCode.NO


def cmd_fix(args) -> int:
    policy = inputs.policy(args)
    result = fix_job(job_input(args, args.inputs), args.top)
    if args.write and result.has_fix and not result.data["in_band"]:
        result.data["written"] = [str(path) for path in
                                  write_fix(result, Path(args.write), args.force)]
    if args.format == "json":
        _json(result.data)
    else:
        print(fix_text(result, policy))
        for path in result.data.get("written", []):
            print(f"wrote {path}", file=sys.stderr)
    if result.data["in_band"] or result.has_fix:
        return ExitCode.OK
    return ExitCode.NO


def cmd_diff(args) -> int:
    result = compare(args.a, args.b, job_input(args, []))
    if args.format == "json":
        _json(result)
    else:
        print(diff_text(result, gpu_given=bool(getattr(args, "gpu_type", None))))
    return ExitCode.OK


def cmd_explain(args) -> int:
    """``explain [--mode M|best]``: the mode's choice in words (the baseline, ``sync``: the
    layout next to the rules of thumb), or which mode wins."""
    from planner.cli.modes import async_options
    from planner.diagnose.explain_modes import explain_best, explain_best_text

    inputs.check_mode_flags(args)
    model, cluster = resolve_model(args.model), inputs.resolve_cluster(args)
    workload = inputs.workload(args, model)
    if not inputs.baseline_mode(args) and not workload.has_rollout:
        raise UsageError(f"explain --mode {args.mode} compares GRPO plans; --workload pretrain "
                         f"has no rollout")
    request = inputs.request(args, model, cluster, workload, SearchOptions())
    if args.mode == BEST:
        result = explain_best(request, async_options(args))
        text = explain_best_text
    else:
        mode = get_mode(args.mode, async_options(args))
        result, text = mode.explain(request), mode.explain_text
    if args.format == "json":
        _json(result)
    else:
        print(text(result))
    return ExitCode.OK


def cmd_profile(args) -> int:
    data = profile_traces(args.traces)
    if args.format == "json":
        _json(data)
    else:
        print(profile_text(data))
    return ExitCode.OK
