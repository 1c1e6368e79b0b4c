"""A sizing sweep (:mod:`planner.sizing`) as a terminal table and CSV.  The JSON is
:func:`planner.output.sizing_json`'s, one row per GPU type x count::

    {"model", "workload", "gpus_per_node", "run": {"steps", "text"}, "prices": {...} | null,
     "min_scaling", "layouts_scored",
     "rows": [{"gpu", "num_gpus", "num_nodes", "valid", "fits", "step_time_s",
               "tokens_per_s_per_gpu", "run_time_s", "run_hours", "gpu_hours",
               "price_per_gpu_hour", "cost", "layout": {...} | null, "peak_memory_gib",
               "peak_phase", "dominant_phase", "blocked": {...} | null, "marks": [...]}],
     "types": [{"gpu", "capacity_gib", "smallest_fit", "blocked_below", "knee", "knee_gain",
                "fastest", "cheapest"}],
     "fastest": {"gpu", "num_gpus"} | null, "cheapest": {"gpu", "num_gpus"} | null,
     "unpriced": [...]}

Numbers are not rounded in JSON (``cost == gpu_hours * price_per_gpu_hour`` holds exactly).
"""

from __future__ import annotations

import csv
import io

from planner.output import sizing_row_json
from planner.report.text import answer_lines, format_table
from planner.search.layout import Layout
from planner.sizing.sweep import SECONDS_PER_HOUR, Sizing


def layout_text(layout: Layout, moe: bool) -> str:
    """A compact layout: ``TP1 PP2 EP8 DP8 mb2 off:optim+ref roll:1/8/8``."""
    parts = [f"TP{layout.tp}", f"PP{layout.pp}"]
    if layout.pp > 1 and layout.vpp > 1:
        parts.append(f"VPP{layout.vpp}")
    if layout.cp > 1:
        parts.append(f"CP{layout.cp}")
    if moe:
        parts.append(f"EP{layout.ep}")
        if layout.etp > 1:
            parts.append(f"ETP{layout.etp}")
    parts += [f"DP{layout.dp}", f"mb{layout.micro_batch}"]
    if layout.recompute != "none":
        parts.append(layout.recompute)
    if layout.offload_text != "-":
        parts.append(f"off:{layout.offload_text}")
    if layout.optimizer_cpu_fraction:
        parts.append("cpu-adam")
    parts.append(f"roll:{layout.rollout_tp}/{layout.rollout_dp}/{layout.rollout_ep}")
    return " ".join(parts)


CSV_COLUMNS = ("gpu", "num_gpus", "num_nodes", "valid", "fits", "step_time_s",
               "tokens_per_s_per_gpu", "run_hours", "gpu_hours", "price_per_gpu_hour", "cost",
               "peak_memory_gib", "peak_phase", "marks", "layout", "blocked")


def sizing_csv(sizing: Sizing) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in sizing.rows:
        data = sizing_row_json(row)
        data["marks"] = " ".join(row.marks)
        data["layout"] = "" if row.layout is None else layout_text(row.layout,
                                                                   sizing.model.is_moe)
        data["blocked"] = "" if row.blocked is None else row.blocked.reason
        writer.writerow(["" if data[name] is None else data[name] for name in CSV_COLUMNS])
    return buffer.getvalue()


def _hours(seconds: float) -> str:
    hours = seconds / SECONDS_PER_HOUR
    return f"{hours:.1f}" if hours < 100 else f"{hours:,.0f}"


def _money(value: float | None, currency: str) -> str:
    return "-" if value is None else f"{currency}{value:,.0f}" if value >= 100 else \
        f"{currency}{value:,.2f}"


def summary_lines(sizing: Sizing) -> list[str]:
    currency = sizing.prices.currency if sizing.prices else "$"
    lines = []
    if sizing.fastest is not None:
        row = sizing.fastest
        lines.append(f"fastest:  {row.num_gpus} x {row.gpu}, {row.step_time_s:.1f} s/step, run "
                     f"{_hours(row.run_time_s)} h"
                     + (f", {_money(row.cost, currency)}" if row.cost is not None else ""))
    if sizing.cheapest is not None:
        row = sizing.cheapest
        lines.append(f"cheapest: {row.num_gpus} x {row.gpu}, {_money(row.cost, currency)} "
                     f"({row.gpu_hours:,.0f} GPU-h at {_money(row.price_per_gpu_hour, currency)}"
                     f"/GPU-h), run {_hours(row.run_time_s)} h")
    if sizing.unpriced:
        lines.append(f"no price for {', '.join(sizing.unpriced)}: cost left out (--price "
                     f"GPU=PRICE or --prices FILE)")
    for summary in sizing.types:
        if summary.knee is not None:
            lines.append(f"knee:     {summary.gpu} at {summary.knee} GPUs: doubling to "
                         f"{2 * summary.knee} speeds the step up {summary.knee_gain:.2f}x < "
                         f"{sizing.min_scaling:g}x")
        elif summary.smallest_fit is not None:
            lines.append(f"knee:     {summary.gpu}: every doubling swept gains at least "
                         f"{sizing.min_scaling:g}x")
    for summary in sizing.types:
        blocked = summary.blocked_below
        if summary.smallest_fit is None:
            largest = max((row for row in sizing.rows if row.gpu == summary.gpu),
                          key=lambda row: row.num_gpus, default=None)
            reason = (largest.blocked.reason if largest and largest.blocked else "")
            lines.append(f"no fit:   {summary.gpu} does not fit on any count swept"
                         + (f" (at {largest.num_gpus} GPUs: {reason})" if largest else ""))
        elif blocked is not None:
            lines.append(f"will not fit below {summary.smallest_fit} GPUs of {summary.gpu}: at "
                         f"{blocked.num_gpus} GPUs {blocked.blocked.reason}")
        else:
            lines.append(f"smallest: {summary.gpu} fits from the smallest count swept, "
                         f"{summary.smallest_fit} GPUs")
    return lines


def sizing_table(sizing: Sizing) -> str:
    currency = sizing.prices.currency if sizing.prices else "$"
    priced = sizing.prices is not None
    head = [
        f"model    {sizing.model.name}",
        f"workload {sizing.workload.describe()}",
        f"run      {sizing.run.text}",
        "prices   " + (", ".join(f"{name} {_money(value, currency)}"
                                 for name, value in sizing.prices.per_gpu_hour)
                       + f" per GPU-hour ({sizing.prices.source})" if priced
                       else "none given (--price h100=2.5,... or --prices FILE): no cost"),
    ]
    rows = []
    for row in sizing.rows:
        if not row.fits:
            rows.append({"gpu": row.gpu, "n": row.num_gpus, "nodes": row.num_nodes, "step": "-",
                         "tps": "-", "run": "-", "gpuh": "-", "cost": "-",
                         "layout": ("does not fit: " if row.valid else "")
                         + (row.blocked.reason if row.blocked else ""), "marks": ""})
            continue
        rows.append({"gpu": row.gpu, "n": row.num_gpus, "nodes": row.num_nodes,
                     "step": f"{row.step_time_s:.1f}", "tps": f"{row.tokens_per_s_per_gpu:.0f}",
                     "run": _hours(row.run_time_s), "gpuh": f"{row.gpu_hours:,.0f}",
                     "cost": _money(row.cost, currency),
                     "layout": layout_text(row.layout, sizing.model.is_moe),
                     "marks": ",".join(row.marks)})
    columns = [("GPU", "gpu"), ("GPUs", "n"), ("nodes", "nodes"), ("step s", "step"),
               ("tok/s/GPU", "tps"), ("run h", "run"), ("GPU-h", "gpuh")]
    if priced:
        columns.append(("cost", "cost"))
    columns += [("marks", "marks"), ("best layout", "layout")]
    body = format_table(rows, columns)
    tail = summary_lines(sizing)
    if sizing.workload.moving_lengths:
        tail.append("step s: the run's expected step time; run h, GPU-h and cost integrate it "
                    "over the run as the mean response length moves")
    tail += answer_lines(sizing.workload, sizing.cost)
    return "\n".join(head) + "\n\n" + body + "\n\n" + "\n".join(tail)
