"""``plan-parallel report``: a self-contained HTML report (and PNGs) of a plan or a sweep.

    plan-parallel report SWEEP_DIR [--html OUT]       # a `plan-parallel tune --write` folder
    plan-parallel report --model M --gpus N [...]      # a plan alone

Contents: the candidate table, a memory-vs-throughput Pareto plot of candidates (and measured
trials), the per-phase memory breakdown and phase times of the top layouts, and for a sweep the
trial history, trials by outcome and predicted vs measured throughput.  Images are embedded as
base64 PNGs so the file can be mailed around; ``--png-dir`` also writes them as files.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

from planner.errors import PlanInputError

TOP = 10
# trials.csv (written by `plan-parallel tune`, trials/report.py) column -> the report's name
TRIAL_COLUMNS = {"trial": "number", "tokens_per_s_per_gpu": "measured_tokens_per_s_per_gpu"}


def load_trials(path: Path):
    """trials.csv of a sweep as a DataFrame with the report's column names."""
    import pandas as pd

    try:
        trials = pd.read_csv(path)
    except (OSError, ValueError) as error:
        raise PlanInputError(f"cannot read {str(path)!r}: {error}") from None
    trials = trials.rename(columns={k: v for k, v in TRIAL_COLUMNS.items()
                                    if k in trials.columns and v not in trials.columns})
    missing = [c for c in ("number", "category") if c not in trials.columns]
    if missing:
        raise PlanInputError(f"{str(path)!r} lacks columns {missing}; not a plan-parallel "
                             f"trials.csv")
    for column in ("measured_tokens_per_s_per_gpu", "predicted_tokens_per_s_per_gpu",
                   "peak_memory_gib"):
        if column not in trials.columns:
            trials[column] = float("nan")
    return trials


def _img(name: str, png: bytes, png_dir: Path | None) -> str:
    if png_dir is not None:
        png_dir.mkdir(parents=True, exist_ok=True)
        (png_dir / f"{name}.png").write_bytes(png)
    data = base64.b64encode(png).decode()
    return f'<figure><img alt="{name}" src="data:image/png;base64,{data}"/></figure>'


def candidate_table(candidates, top: int = TOP) -> str:
    from planner.hardware import GIB

    columns = ["rank", "tp", "pp", "vpp", "cp", "ep", "etp", "dp", "micro_batch", "recompute",
               "param_offload", "optimizer_offload", "rollout_tp", "rollout_dp", "rollout_ep",
               "gpu_memory_utilization", "step_time_s", "tokens_per_s_per_gpu", "peak_phase",
               "dominant_phase"]
    shown = candidates[candidates["fits"]].head(top).copy()
    shown["peak GiB"] = (shown["peak_bytes"] / GIB).round(1)
    shown["step_time_s"] = shown["step_time_s"].round(1)
    shown["tokens_per_s_per_gpu"] = shown["tokens_per_s_per_gpu"].round(0)
    return shown[[c for c in columns if c in shown] + ["peak GiB"]].to_html(index=False,
                                                                            border=0)


def render(plan, trials=None, png_dir: Path | None = None, title: str = "") -> str:
    from planner import plots
    from planner.report import describe_workload

    candidates = plan.candidates
    top = candidates[candidates["fits"]].head(TOP)
    sections = [f"<h1>{html.escape(title or 'plan-parallel report')}</h1>",
                f"<p>{html.escape(plan.model.name)} on {plan.cluster.num_gpus} x "
                f"{html.escape(plan.cluster.gpu.name)}; {html.escape(describe_workload(plan.workload))}."
                f" {plan.enumerated:,} layouts searched, {plan.valid:,} valid, "
                f"{int(candidates['fits'].sum()):,} actor layouts fit.</p>",
                "<h2>Best layouts (predicted)</h2>", candidate_table(candidates),
                "<h2>Memory vs throughput</h2>",
                _img("pareto", plots.to_png(plots.pareto_figure(
                    candidates, trials, plan.cluster.gpu.memory_gib)), png_dir)]
    if len(top):
        sections += ["<h2>Memory of the top layouts</h2>",
                     _img("memory_breakdown", plots.to_png(plots.memory_breakdown_figure(
                         top.head(6))), png_dir),
                     "<h2>Phase times of the top layouts</h2>",
                     _img("phase_times", plots.to_png(plots.phase_time_figure(top.head(6))),
                          png_dir)]
    if trials is not None and len(trials):
        sections += ["<h2>Trials</h2>",
                     _img("trial_history", plots.to_png(plots.trial_history_figure(trials)),
                          png_dir),
                     _img("outcomes", plots.to_png(plots.failure_figure(trials)), png_dir),
                     _img("predicted_vs_measured",
                          plots.to_png(plots.predicted_vs_measured_figure(trials)), png_dir),
                     trials.to_html(index=False, border=0, na_rep="-")]
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
             "table{border-collapse:collapse;font-size:12px}td,th{padding:3px 6px;"
             "border-bottom:1px solid #ddd;text-align:right}img{max-width:100%}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>"
            f"{html.escape(title or 'plan-parallel report')}</title><style>{style}</style>"
            f"</head><body>{''.join(sections)}</body></html>")


FIGURES = ("pareto", "memory_breakdown", "phase_times", "trial_history", "outcomes",
           "predicted_vs_measured")


def plan_from_sweep(sweep: Path, calibration: dict | None = None):
    """Re-plan a sweep's model, cluster and workload: from ``plan.json`` (a ``--write``
    folder) or from the study that ``sweep.json`` names (a ``--sweep-dir``)."""
    from planner.hardware import ClusterSpec, get_gpu
    from planner.models import resolve_model
    from planner.plan import make_plan
    from planner.workload import GrpoWorkload

    if not (sweep / "plan.json").exists() and (sweep / "sweep.json").exists():
        from argparse import Namespace

        from trials import study_state
        from trials.calibrate import study_setting
        from trials.cli_calibrate import open_study

        study, _ = open_study(Namespace(storage=None, sweep_dir=str(sweep), study_name=None))
        return make_plan(*study_setting(study.user_attrs[study_state.STUDY]),
                         calibration=calibration)
    path = sweep / "plan.json"
    try:
        data = json.loads(path.read_text())
        cluster = data["cluster"]
        workload = {k: v for k, v in data["workload"].items() if k != "kind"}
        model = data["model"]["name"] if isinstance(data["model"], dict) else data["model"]
        return make_plan(resolve_model(model),
                         ClusterSpec(get_gpu(cluster["gpu_type"]), cluster["num_gpus"],
                                     cluster["gpus_per_node"]),
                         GrpoWorkload(**workload), calibration=calibration)
    except (OSError, KeyError, TypeError, ValueError) as error:
        raise PlanInputError(f"{str(path)!r} does not describe a plan ({error})") from None


def add_arguments(parser) -> None:
    from planner.cli import _workload_args

    parser.add_argument("sweep", nargs="?", help="a sweep folder (plan-parallel tune --write)")
    parser.add_argument("--html", default=None, help="output HTML (default: report.html in the "
                                                     "sweep folder, or ./report.html)")
    parser.add_argument("--png-dir", default=None, help="also write the figures as PNG files")
    parser.add_argument("--force", action="store_true", help="overwrite an existing report")
    group = parser.add_argument_group("a plan without a sweep")
    group.add_argument("--model")
    group.add_argument("--gpus", type=int)
    group.add_argument("--gpu-type")
    group.add_argument("--gpus-per-node", type=int)
    _workload_args(parser)


def run(args) -> int:
    from planner.cli import ExitCode, UsageError, _calibration, _resolve_cluster, _workload
    from planner.models import resolve_model
    from planner.plan import make_plan

    trials = None
    calibration = _calibration(args)
    if args.sweep:
        sweep = Path(args.sweep)
        if not sweep.is_dir():
            raise PlanInputError(f"sweep folder {args.sweep!r} does not exist")
        plan = plan_from_sweep(sweep, calibration)
        if (sweep / "trials.csv").exists():
            trials = load_trials(sweep / "trials.csv")
        output = Path(args.html) if args.html else sweep / "report.html"
    elif args.model:
        plan = make_plan(resolve_model(args.model), _resolve_cluster(args), _workload(args),
                         calibration=calibration)
        output = Path(args.html or "report.html")
    else:
        raise UsageError("give a sweep folder, or --model and --gpus for a plan report")
    if output.exists() and not args.force:
        raise UsageError(f"{output} exists; pass --force to overwrite it")
    if args.png_dir and not args.force and Path(args.png_dir).is_dir() and any(
            (Path(args.png_dir) / f"{name}.png").exists() for name in FIGURES):
        raise UsageError(f"{args.png_dir} already holds report figures; pass --force to "
                         f"overwrite them")
    page = render(plan, trials, Path(args.png_dir) if args.png_dir else None,
                  title=f"plan-parallel: {plan.model.name} on {plan.cluster.num_gpus} x "
                        f"{plan.cluster.gpu.name}")
    output.write_text(page)
    print(f"wrote {output}")
    return ExitCode.OK
