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
from dataclasses import dataclass
from pathlib import Path

from planner.bounds import CLUSTER_LIMITS, check_fields
from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.models import resolve_model
from planner.catalog.workload import GRPO_LIMITS, GrpoWorkload
from planner.cost.columns import working_set_column
from planner.cost.efficiency import CostModel, shipped_cost_model
from planner.cost.request import PlanRequest
from planner.errors import PlanInputError
from planner.plan import make_plan
from planner.policy import DEFAULT_POLICY, PEAK_NAME, WORKING_SET_NAME, MemoryPolicy
from planner.report import plots
from planner.report.text import legend_lines, peak_cell
from planner.search.layout import Layout
from planner.units import GIB
from planner.verl.keys import PLAN_FILE
from trials.sweep_folder import SWEEP_FILE, open_study, read_json, study_setting

TOP = 10
# trials.csv (written by `plan-parallel tune`, trials/study_outputs.py) column -> the report's name
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
    for column, (low, high) in TRIAL_NUMBERS.items():
        if column in trials.columns:
            trials[column] = _numbers(trials[column], column, path, low, high)
    return trials


# trials.csv columns the report draws or ranks by: (low, high); blank cells are "not measured"
TRIAL_NUMBERS = {"number": (0, 1e9), "measured_tokens_per_s_per_gpu": (0, 1e9),
                 "predicted_tokens_per_s_per_gpu": (0, 1e9), "peak_memory_gib": (0, 1e6),
                 "step_time_s": (0, 1e9), "duration_s": (0, 1e9), "mfu": (0, 10)}


def _numbers(values, column: str, path: Path, low: float, high: float):
    """A trials.csv column as numbers: every cell blank or a finite number in ``low..high``
    (``inf`` or text in a numeric column is an input error naming the row, not a traceback
    from the plots)."""
    import numpy as np
    import pandas as pd

    numbers = pd.to_numeric(values, errors="coerce")
    bad = (values.notna() & numbers.isna()) | ~np.isfinite(numbers.fillna(low)) \
        | (numbers < low) | (numbers > high)
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        cell = values.iloc[row]
        cell = repr(cell)[:40] if isinstance(cell, str) else f"{float(cell):g}"
        raise PlanInputError(f"{str(path)!r} row {row + 2}: {column} = {cell} is not a finite "
                             f"number in {low:g}..{high:g} (or blank)")
    return numbers


def _img(name: str, png: bytes, png_dir: Path | None) -> str:
    if png_dir is not None:
        png_dir.mkdir(parents=True, exist_ok=True)
        (png_dir / f"{name}.png").write_bytes(png)
    data = base64.b64encode(png).decode()
    return f'<figure><img alt="{name}" src="data:image/png;base64,{data}"/></figure>'


def candidate_table(candidates, capacity_bytes: float, top: int = TOP) -> str:
    """The best fitting layouts in columns that fit the page: the actor layout in one cell, the
    rollout in another, the two memory quantities by their names."""
    shown = candidates[candidates["fits"]].head(top)
    rows = []
    for row in shown.to_dict("records"):
        layout = Layout.from_row(row)
        rows.append({
            "#": row["rank"],
            "actor layout": plots.layout_label(row),
            "recompute": row["recompute"],
            "offload": layout.offload_text,
            "rollout (vLLM)": f"TP{layout.rollout_tp} DP{layout.rollout_dp} "
                              f"EP{layout.rollout_ep} @ {layout.gpu_memory_utilization:.2f}",
            "step s": f"{row['step_time_s']:.1f}",
            "tok/s/GPU": f"{row['tokens_per_s_per_gpu']:.0f}",
            PEAK_NAME: peak_cell(row["peak_bytes"], capacity_bytes),
            "in phase": row["peak_phase"],
            WORKING_SET_NAME:
                f"{row[working_set_column(str(row['peak_phase']))] / GIB:.1f} GiB",
        })
    if not rows:
        return "<p>no layout fits in GPU memory</p>"
    head = "".join(f"<th>{html.escape(name)}</th>" for name in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(value))}</td>"
                                    for value in row.values()) + "</tr>" for row in rows)
    return f'<table class="candidates"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def render(plan, trials=None, png_dir: Path | None = None, title: str = "",
           confidence: str | None = None) -> str:
    """The report page; ``confidence``: what the study says about its untried layouts."""
    candidates = plan.candidates
    top = candidates[candidates["fits"]].head(TOP)
    sections = [f"<h1>{html.escape(title or 'plan-parallel report')}</h1>",
                f"<p>{html.escape(plan.model.name)} on {plan.cluster.num_gpus} x "
                f"{html.escape(plan.cluster.gpu.name)}; {html.escape(plan.workload.describe())}."
                f" {plan.enumerated:,} layouts searched, {plan.valid:,} valid, "
                f"{int(candidates['fits'].sum()):,} actor layouts fit.</p>",
                "<h2>Best layouts (predicted)</h2>",
                candidate_table(candidates, plan.cluster.gpu.memory_bytes),
                "<p class='legend'>" + "<br/>".join(
                    html.escape(line) for line in legend_lines(plan.policy)) + "</p>",
                "<h2>Memory vs throughput</h2>",
                _img("pareto", plots.to_png(plots.pareto_figure(
                    candidates, trials, plan.cluster.gpu.memory_gib,
                    band=(plan.policy.low, plan.policy.high))), png_dir)]
    if len(top):
        sections += ["<h2>Memory of the top layouts</h2>",
                     _img("memory_breakdown", plots.to_png(plots.memory_breakdown_figure(
                         top.head(6))), png_dir),
                     "<h2>Phase times of the top layouts</h2>",
                     _img("phase_times", plots.to_png(plots.phase_time_figure(top.head(6))),
                          png_dir)]
    if trials is not None and len(trials):
        sections += ["<h2>Trials</h2>"]
        if confidence:
            sections.append(f"<p class='confidence'>Confidence: {html.escape(confidence)}.</p>")
        sections += [
                     _img("trial_history", plots.to_png(plots.trial_history_figure(trials)),
                          png_dir),
                     _img("outcomes", plots.to_png(plots.failure_figure(trials)), png_dir),
                     _img("predicted_vs_measured",
                          plots.to_png(plots.predicted_vs_measured_figure(trials)), png_dir),
                     trials.to_html(index=False, border=0, na_rep="-")]
    # tables fit the page: fixed width, cells wrap instead of widening the page
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
             "table{border-collapse:collapse;font-size:12px;width:100%;table-layout:fixed;"
             "overflow-wrap:anywhere}td,th{padding:3px 6px;border-bottom:1px solid #ddd;"
             "text-align:right;vertical-align:top}table.candidates th:nth-child(2),"
             "table.candidates td:nth-child(2){width:22%;text-align:left}"
             ".legend{font-size:11px;color:#555}img{max-width:100%}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>"
            f"{html.escape(title or 'plan-parallel report')}</title><style>{style}</style>"
            f"</head><body>{''.join(sections)}</body></html>")


FIGURES = ("pareto", "memory_breakdown", "phase_times", "trial_history", "outcomes",
           "predicted_vs_measured", "sizing")


def render_sizing(sizing, png_dir: Path | None = None, title: str = "") -> str:
    """A sizing sweep (:mod:`planner.sizing`): the marked points in words, step time and cost
    against GPU count, and the table of every GPU type and count."""
    import pandas as pd

    from planner.report.sizing_table import layout_text, summary_lines
    from planner.sizing.sweep import SECONDS_PER_HOUR

    currency = sizing.prices.currency if sizing.prices else "$"
    table = pd.DataFrame([{
        "GPU": row.gpu, "GPUs": row.num_gpus, "nodes": row.num_nodes,
        "step s": None if row.step_time_s is None else round(row.step_time_s, 1),
        "tokens/s/GPU": None if row.tokens_per_s_per_gpu is None
        else round(row.tokens_per_s_per_gpu),
        "run h": None if row.run_time_s is None else round(row.run_time_s / SECONDS_PER_HOUR, 2),
        "GPU-hours": None if row.gpu_hours is None else round(row.gpu_hours, 1),
        f"cost ({currency})": None if row.cost is None else round(row.cost, 2),
        "marks": ", ".join(row.marks),
        "best layout / why none fits": layout_text(row.layout, sizing.model.is_moe)
        if row.layout is not None else (row.blocked.reason if row.blocked else ""),
    } for row in sizing.rows])
    sections = [f"<h1>{html.escape(title or 'plan-parallel: sizing')}</h1>",
                f"<p>{html.escape(sizing.model.name)}; "
                f"{html.escape(sizing.workload.describe())}; run: {html.escape(sizing.run.text)}"
                f".</p>",
                "<ul>" + "".join(f"<li>{html.escape(line)}</li>"
                                 for line in summary_lines(sizing)) + "</ul>",
                "<h2>Step time and cost against GPU count</h2>",
                _img("sizing", plots.to_png(plots.sizing_figure(sizing.rows, currency)),
                     png_dir),
                "<h2>Every GPU type and count</h2>",
                table.to_html(index=False, border=0, na_rep="-")]
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
             "table{border-collapse:collapse;font-size:12px}td,th{padding:3px 6px;"
             "border-bottom:1px solid #ddd;text-align:right}img{max-width:100%}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>"
            f"{html.escape(title or 'plan-parallel: sizing')}</title><style>{style}</style>"
            f"</head><body>{''.join(sections)}</body></html>")


def plan_from_sweep(sweep: Path, cost: CostModel | None = None,
                    policy: MemoryPolicy = DEFAULT_POLICY):
    """Re-plan a sweep's model, cluster and workload: from ``plan.json`` (a ``--write``
    folder) or from the study that ``sweep.json`` names (a ``--sweep-dir``), read only; with
    ``cost`` (None: the shipped cost model) and ``policy``."""
    cost = cost or shipped_cost_model()
    if not (sweep / PLAN_FILE).exists() and (sweep / SWEEP_FILE).exists():
        study, _ = open_study(sweep_dir=sweep)
        return make_plan(PlanRequest(*study_setting(study), cost=cost, policy=policy))
    path = sweep / PLAN_FILE
    if not path.is_file():
        raise PlanInputError(f"{str(sweep)!r} is not a sweep folder: no {PLAN_FILE} (a `tune "
                             f"--write` folder) nor {SWEEP_FILE} (a `tune --sweep-dir` folder)")
    data = read_json(path)
    try:
        cluster = data["cluster"]
        workload = {k: v for k, v in data["workload"].items() if k != "kind"}
        model = data["model"]["name"] if isinstance(data["model"], dict) else data["model"]
        check_fields(f"{PLAN_FILE} cluster", cluster, CLUSTER_LIMITS)
        check_fields(f"{PLAN_FILE} workload", workload, GRPO_LIMITS)
        setting = (resolve_model(str(model)),
                   ClusterSpec(get_gpu(str(cluster["gpu_type"])), int(cluster["num_gpus"]),
                               int(cluster["gpus_per_node"])),
                   GrpoWorkload(**workload))
    except PlanInputError as error:
        raise PlanInputError(f"{str(path)!r}: {error}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise PlanInputError(f"{str(path)!r} does not describe a plan "
                             f"({str(error)[:200]})") from None
    return make_plan(PlanRequest(*setting, cost=cost, policy=policy))


@dataclass(frozen=True)
class ReportFiles:
    """Where a report goes: the page, and (when given) a folder for its figures as PNG files;
    existing ones are overwritten only with ``force``."""

    page: Path
    png_dir: Path | None = None
    force: bool = False

    def check(self) -> None:
        """Refuse to overwrite the page or figures without ``force``."""
        if self.page.exists() and not self.force:
            raise PlanInputError(f"{self.page} exists; pass --force to overwrite it")
        png_dir = self.png_dir
        if png_dir is not None and not self.force and png_dir.is_dir() and any(
                (png_dir / f"{name}.png").exists() for name in FIGURES):
            raise PlanInputError(f"{png_dir} already holds report figures; pass --force to "
                                 f"overwrite them")


def write_report(plan, files: ReportFiles, trials=None, confidence: str | None = None) -> Path:
    """Render and write the report (``confidence``: what the study says about its untried
    layouts); never overwrite without ``files.force``."""
    files.check()
    page = render(plan, trials, files.png_dir,
                  title=f"plan-parallel: {plan.model.name} on {plan.cluster.num_gpus} x "
                        f"{plan.cluster.gpu.name}", confidence=confidence)
    files.page.write_text(page)
    return files.page


def write_sizing_report(sizing, files: ReportFiles) -> Path:
    """Render and write a sizing report; never overwrite without ``files.force``."""
    files.check()
    types = ", ".join(summary.gpu for summary in sizing.types)
    files.page.write_text(render_sizing(sizing, files.png_dir,
                                        title=f"plan-parallel: sizing {sizing.model.name} on "
                                              f"{types}"))
    return files.page
