"""Plans and estimates as JSON-ready dicts, CSV and terminal tables.

The JSON shape is a contract later tools rely on::

    {"model": {...}, "cluster": {...}, "workload": {...},
     "enumerated": N, "valid": N, "fitting": N, "rejected": {rule: count},
     "candidates": [{"rank", "layout": {...}, "fits", "peak_memory_gib", "peak_phase",
                     "memory_utilization", "memory_gib": {phase: gib},
                     "breakdown_gib": {...}, "rollout": {...}, "flags": [...]}]}
"""

from __future__ import annotations

import io
import json

from planner.cost.columns import flag_column, memory_column, time_column
from planner.phases import PHASES
from planner.plan import candidate_dict
from planner.search.layout import LAYOUT_FIELDS, Layout
from planner.search.rules import UNWISE_FLAGS
from planner.units import GIB


def plan_dict(plan, top: int | None) -> dict:
    shown = plan.candidates if top is None else plan.candidates.head(top)
    return {
        "model": {**plan.model.to_dict(), "params": plan.model.params.to_dict()},
        "cluster": plan.cluster.to_dict(),
        "workload": plan.workload.to_dict(),
        "enumerated": int(plan.enumerated),
        "valid": int(plan.valid),
        "candidates_scored": int(plan.scored or len(plan.candidates)),
        "fitting": int(plan.candidates["fits"].sum()),
        "rejected": dict(sorted(plan.rejected.items(), key=lambda item: -item[1])),
        "candidates": [_with_placement(candidate_dict(row), plan.cluster.num_gpus)
                       for row in shown.to_dict("records")],
    }


def _with_placement(candidate: dict, gpus: int) -> dict:
    """A colocated candidate's mode and placement (``--mode`` plans, planner/placement.py):
    both pools are the whole cluster."""
    head = {"rank": candidate.pop("rank")} if "rank" in candidate else {}
    return {**head, "mode": "sync",
            "placement": {"trainer_gpus": gpus, "rollout_gpus": gpus, "colocated": True},
            **candidate}


def to_json(data: dict) -> str:
    return json.dumps(data, indent=2)


def plan_csv(plan, top: int | None) -> str:
    shown = (plan.candidates if top is None else plan.candidates.head(top)).copy()
    for phase in PHASES:  # the CSV shows GiB: people read it in a spreadsheet
        shown[f"mem_{phase}_gib"] = shown[memory_column(phase)] / GIB
    columns = ["rank", *LAYOUT_FIELDS, "fits", "peak_memory_gib", "peak_phase",
               "memory_utilization", *[f"mem_{phase}_gib" for phase in PHASES], "unwise_count"]
    if "step_time_s" in shown:
        columns += ["step_time_s", "tokens_per_s_per_gpu", "mfu"]
    buffer = io.StringIO()
    shown[columns].to_csv(buffer, index=False, float_format="%.4g")
    return buffer.getvalue()


def _offload(row) -> str:
    return Layout.from_row(row).offload_text


def format_table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """Right-aligned text table; ``columns`` are (header, key) pairs."""
    cells = [[header for header, _ in columns]]
    cells += [[str(row[key]) for _, key in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(line, widths)) for line in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def phase_lines(fitting, count: int) -> list[str]:
    """Per-phase times of the best layouts and the phase that dominates each."""
    lines = []
    for record in fitting.head(count).to_dict("records"):
        if "time_generate_s" not in record:
            break
        times = "  ".join(f"{phase} {record[time_column(phase)]:.1f}" for phase in PHASES)
        lines.append(f"#{record['rank']}: {times} s  (dominant: {record['dominant_phase']}, "
                     f"update bubble {record['update_bubble_s']:.1f} s, exposed comm "
                     f"{record['update_comm_s']:.1f} s, MFU {100 * record['mfu']:.0f}%)")
    return lines


def plan_table(plan, top: int) -> str:
    fitting = plan.fitting.head(top)
    model, cluster = plan.model, plan.cluster
    p = model.params
    head = [
        f"model    {model.name}: {p.total / 1e9:.2f}B params ({p.active / 1e9:.2f}B active), "
        f"{model.num_layers} layers, hidden {model.hidden_size}"
        + (f", {model.num_experts} experts top-{model.moe_top_k}" if model.is_moe else ""),
        f"cluster  {cluster.num_gpus} x {cluster.gpu.name} ({cluster.gpu.memory_gib:.1f} GiB), "
        f"{cluster.gpus_per_node} per node",
        f"workload {plan.workload.describe()}",
        f"searched {plan.enumerated:,} layouts: {plan.valid:,} valid"
        + (f" ({plan.scored or len(plan.candidates):,} actor layouts, rollout chosen per "
           f"layout)"
           if plan.workload.kind == "grpo" else "")
        + f", {int(plan.candidates['fits'].sum()):,} fit in memory",
    ]
    rows = []
    has_time = "step_time_s" in fitting
    for record in fitting.to_dict("records"):
        rows.append({
            **record,
            "vpp": record["vpp"] if record["pp"] > 1 else "-",
            "rollout": f"{record['rollout_tp']}/{record['rollout_dp']}/{record['rollout_ep']}",
            "util": f"{record['gpu_memory_utilization']:.2f}",
            "offload": _offload(record),
            "peak": f"{record['peak_bytes'] / GIB:.1f}",
            "mem": f"{100 * record['memory_utilization']:.0f}%",
            "step": f"{record.get('step_time_s', 0):.1f}",
            "tps": f"{record.get('tokens_per_s_per_gpu', 0):.0f}",
            "flags": ",".join(name for name in UNWISE_FLAGS if record[flag_column(name)]) or "-",
        })
    columns = [("#", "rank"), ("TP", "tp"), ("PP", "pp"), ("VPP", "vpp"), ("CP", "cp")]
    if model.is_moe:
        columns += [("EP", "ep"), ("ETP", "etp")]
    columns += [("DP", "dp"), ("mbs", "micro_batch"), ("recompute", "recompute")]
    if plan.workload.kind == "grpo":
        columns += [("offload", "offload"), ("rollout TP/DP/EP", "rollout"), ("util", "util")]
    if has_time:
        columns += [("step s", "step"), ("tok/s/GPU", "tps")]
    columns += [("peak GiB", "peak"), ("mem", "mem"), ("peak phase", "peak_phase"),
                ("flags", "flags")]
    body = format_table(rows, columns) if rows else "no layout fits in GPU memory"
    rejected = ", ".join(f"{name} {count:,}" for name, count in
                         sorted(plan.rejected.items(), key=lambda item: -item[1]))
    tail = phase_lines(fitting, 3)
    if tail:
        tail = ["phase times of the best layouts:"] + tail + [""]
    tail.append(f"rejected: {rejected}" if rejected else "rejected: none")
    if not rows:
        smallest = plan.candidates.nsmallest(1, "peak_bytes")
        best = smallest.to_dict("records")
        if best:
            tail.append(f"closest: {best[0]['peak_bytes'] / GIB:.1f} GiB peak in "
                        f"{best[0]['peak_phase']} vs {cluster.gpu.memory_gib:.1f} GiB per GPU; "
                        f"add GPUs or use a larger GPU")
    return "\n".join(head) + "\n\n" + body + "\n\n" + "\n".join(tail)


def estimate_dict(estimate) -> dict:
    return {"model": estimate.model.name, "cluster": estimate.cluster.to_dict(),
            "workload": estimate.workload.to_dict(), **candidate_dict(estimate.row)}


def estimate_text(estimate) -> str:
    data = estimate_dict(estimate)
    lines = [
        f"{estimate.model.name} on {estimate.cluster.num_gpus} x {estimate.cluster.gpu.name}: "
        f"{estimate.layout.actor_text()}"
        + (f"; {estimate.layout.rollout_text()}"
           if "generate" in estimate.workload.phases else ""),
        f"fits: {'yes' if data['fits'] else 'NO'} - peak {data['peak_memory_gib']:.2f} GiB "
        f"({100 * data['memory_utilization']:.0f}% of "
        f"{estimate.cluster.gpu.memory_gib:.1f} GiB) in {data['peak_phase']} "
        f"({data['peak_stage']} pipeline stage)",
        "",
    ]
    phases = estimate.workload.phases
    rollout_parts = ("ref_weights", "rollout_weights", "kv_cache")
    lines += [
        "phase peaks (GiB):  " + "  ".join(f"{phase} {gib:.2f}"
                                           for phase, gib in data["memory_gib"].items()
                                           if phase in phases),
        "breakdown (GiB):    " + "  ".join(f"{part} {gib:.2f}"
                                           for part, gib in data["breakdown_gib"].items()
                                           if "generate" in phases or part not in rollout_parts),
    ]
    if "generate" in phases:
        lines.append(f"rollout:            {data['rollout']['kv_cache_tokens_per_gpu']:,} KV "
                     f"tokens per GPU, {data['rollout']['concurrent_seqs']} sequences at once, "
                     f"{data['rollout']['seqs_per_rank']} per rank")
    if "time_s" in data:
        lines.append("time (s):           " + "  ".join(
            f"{phase} {sec:.2f} ({100 * data['time_share'][phase]:.0f}%)"
            for phase, sec in data["time_s"].items())
            + f"  -> step {data['step_time_s']:.2f} s, "
              f"{data['tokens_per_s_per_gpu']:.0f} tokens/s/GPU, actor MFU "
              f"{100 * data['mfu']:.1f}%")
    elif "step_time_s" in data:
        lines.append(f"time:               step {data['step_time_s']:.3f} s, "
                     f"{data['tokens_per_s_per_gpu']:.0f} tokens/s/GPU, "
                     f"{data['tflops_per_gpu']:.0f} TFLOP/s/GPU, MFU {100 * data['mfu']:.1f}%")
    for phase, parts in data.get("time_breakdown_s", {}).items():
        shown = [f"{part} {sec:.2f}" for part, sec in parts.items() if sec >= 0.005]
        if shown:
            lines.append(f"  {phase + ':':18}" + "  ".join(shown))
    if data["flags"]:
        lines.append("unwise:             " + ", ".join(data["flags"]))
    return "\n".join(lines)
