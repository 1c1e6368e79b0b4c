"""Plans and estimates as JSON-ready dicts, CSV and terminal tables.

The JSON shape is a contract later tools rely on::

    {"model": {...}, "cluster": {...}, "workload": {...},
     "enumerated": N, "valid": N, "fitting": N, "rejected": {rule: count},
     "candidates": [{"rank", "layout": {...}, "fits", "peak_memory_gib", "peak_phase",
                     "memory_utilization", "memory_gib": {phase: gib},
                     "breakdown_gib": {...}, "rollout": {...}, "flags": [...],
                     "within_error_of_best"}],
     "ranking": {"tie_tolerance", "source", "ties", "tie_order"}}
"""

from __future__ import annotations

import io
import json

from planner.cost.columns import flag_column, memory_column, time_column, working_set_column
from planner.phases import PHASES
from planner.plan import candidate_dict
from planner.policy import (
    FILL_POLICY,
    PEAK_MEANING,
    PEAK_NAME,
    WORKING_SET_MEANING,
    WORKING_SET_NAME,
)
from planner.search.layout import LAYOUT_FIELDS, Layout
from planner.search.rules import UNWISE_FLAGS
from planner.units import GIB

TIE_ORDER = ("no unwise flags", "peak inside the memory band", "no offload",
             "fewer parallel dimensions", "smaller TP x PP x CP", "predicted step time")


def ranking_dict(plan) -> dict:
    """How the plan ranks: the tolerance within which layouts are ties and its source."""
    ties = (int(plan.candidates["within_error_of_best"].sum())
            if "within_error_of_best" in plan.candidates else 0)
    return {"tie_tolerance": round(float(plan.tie_tolerance), 4), "source": plan.tie_source,
            "ties": ties, "tie_order": list(TIE_ORDER)}


def ranking_line(plan) -> str | None:
    if plan.tie_tolerance <= 0 or "step_time_s" not in plan.candidates:
        return None
    ties = ranking_dict(plan)["ties"]
    band = plan.policy.band_text
    return (f"ranking  {ties:,} layout(s) within {100 * plan.tie_tolerance:.0f}% of the best "
            f"predicted step time are ties (= in the table; the model's ranking uncertainty, "
            f"benchmarks/accuracy.py), listed simplest first: no unwise flags, memory inside "
            f"{band}, no offload, fewer parallel dimensions, smaller TP x PP x CP")


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
        "ranking": ranking_dict(plan),
        "memory_band": band_dict(plan.policy),
        "candidates": [_with_placement({**candidate_dict(row),
                                        "band_position": plan.policy.position(
                                            float(row["memory_utilization"]))},
                                       plan.cluster.num_gpus)
                       for row in shown.to_dict("records")],
    }


def band_dict(policy) -> dict:
    """The memory policy as the JSON outputs carry it: the band and the quantity it judges."""
    return {"low": policy.low, "high": policy.high, "judges": PEAK_NAME}


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
        shown[f"working_set_{phase}_gib"] = shown[working_set_column(phase)] / GIB
    columns = ["rank", *LAYOUT_FIELDS, "fits", "within_error_of_best", "peak_memory_gib",
               "peak_phase", "memory_utilization", *[f"mem_{phase}_gib" for phase in PHASES],
               *[f"working_set_{phase}_gib" for phase in PHASES], "unwise_count"]
    if "step_time_s" in shown:
        columns += ["step_time_s", "tokens_per_s_per_gpu", "mfu"]
    buffer = io.StringIO()
    shown[columns].to_csv(buffer, index=False, float_format="%.4g")
    return buffer.getvalue()


def _offload(row) -> str:
    text = Layout.from_row(row).offload_text
    if float(row.get("optimizer_cpu_fraction", 0) or 0) > 0:  # Megatron's CPU optimizer
        text = "cpu-optim" if text == "-" else text + "+cpu-optim"
    return text


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


def peak_cell(row, capacity_bytes: float) -> str:
    """``64.6 GiB 81%``: the nvidia-smi peak and its share of the GPU."""
    return f"{row['peak_bytes'] / GIB:.1f} GiB {100 * row['peak_bytes'] / capacity_bytes:.0f}%"


def working_set_bytes(row) -> float:
    """The allocated working set of the phase that sets the nvidia-smi peak."""
    phase = row["peak_phase"] if isinstance(row["peak_phase"], str) \
        else PHASES[int(row["peak_phase"])]
    return float(row[working_set_column(phase)])


def legend_lines(policy) -> list[str]:
    """What the two memory quantities are, and the band the first is judged against."""
    return [f"{PEAK_NAME}: {PEAK_MEANING} ({policy.band_text}: --memory-band "
            f"{policy.option_text}; {FILL_POLICY.option_text} fills the GPU)",
            f"{WORKING_SET_NAME}: {WORKING_SET_MEANING} (the peak's phase)"]


def _seconds_change(new: float, old: float) -> str:
    return f"{new - old:+.1f} s, {100 * (new - old) / old:+.1f}%"


def headroom_lines(plan, fill_plan=None) -> list[str]:
    """What the band's headroom costs the best layout: its rollout pool and KV cache against
    the same layout's pool filling the GPU, and the best layout were the GPU filled."""
    if not len(plan.fitting) or "generate" not in plan.workload.phases:
        return []
    best = candidate_dict(plan.fitting.iloc[0])
    policy = plan.policy
    capacity = plan.cluster.gpu.memory_bytes
    head = (f"memory band {policy.band_text} of {plan.cluster.gpu.memory_gib:.1f} GiB, judged "
            f"on the {PEAK_NAME}: #1 peaks at {best['peak_memory_gib']:.1f} GiB "
            f"({100 * best['memory_utilization']:.0f}%, "
            f"{policy.position(best['memory_utilization'])} the band) in {best['peak_phase']}")
    lines = [head]
    filled = best.get("fill_gpu")
    util = best["layout"]["gpu_memory_utilization"]
    kv = best["rollout"]["kv_cache_tokens_per_gpu"]
    if filled and not policy.fills_gpu:
        if filled["gpu_memory_utilization"] > util:
            lines.append(
                f"cost of the headroom, same layout: rollout gpu_memory_utilization {util:.2f} "
                f"holds {kv:,} KV tokens/GPU; filling the GPU, "
                f"{filled['gpu_memory_utilization']:.2f} would hold "
                f"{filled['kv_cache_tokens_per_gpu']:,} ({PEAK_NAME} "
                f"{filled['peak_memory_gib']:.1f} GiB): generate "
                f"{best['time_s']['generate']:.1f} s -> {filled['generate_s']:.1f} s, step "
                f"{_seconds_change(filled['step_time_s'], best['step_time_s'])}")
        else:
            lines.append(
                f"cost of the headroom, same layout: none in generation -- rollout "
                f"gpu_memory_utilization {util:.2f} already holds the KV cache of every "
                f"sequence a rank runs at once ({kv:,} tokens/GPU, "
                f"{best['rollout']['concurrent_seqs']} sequences); filling the GPU would not "
                f"speed it up")
    if fill_plan is not None and len(fill_plan.fitting):
        other = candidate_dict(fill_plan.fitting.iloc[0])
        layout = Layout.from_row(fill_plan.fitting.iloc[0].to_dict())
        text = layout.actor_text(moe=plan.model.is_moe)
        lines.append(
            f"filling the GPU (--memory-band {FILL_POLICY.option_text}), the best layout would "
            f"be {text}; {layout.rollout_text()}: {other['step_time_s']:.1f} s per step "
            f"({_seconds_change(other['step_time_s'], best['step_time_s'])} vs #1) at "
            f"{other['peak_memory_gib']:.1f} GiB "
            f"({100 * other['peak_memory_gib'] * GIB / capacity:.0f}%) in {other['peak_phase']}")
    return lines


def plan_table(plan, top: int, fill_plan=None) -> str:
    """The ranked table; ``fill_plan``, the same search under the fill-the-GPU band, prices
    the memory band's headroom."""
    fitting = plan.fitting.head(top)
    model, cluster = plan.model, plan.cluster
    capacity = cluster.gpu.memory_bytes
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
           if plan.workload.has_rollout else "")
        + f", {int(plan.candidates['fits'].sum()):,} fit in memory, "
        + f"{int((plan.fitting['memory_utilization'] <= plan.policy.high + 1e-9).sum()):,} "
        + f"with the {PEAK_NAME} at most {100 * plan.policy.high:.0f}%",
    ]
    line = ranking_line(plan)
    if line:
        head.append(line)
    rows = []
    has_time = "step_time_s" in fitting
    for record in fitting.to_dict("records"):
        rows.append({
            **record,
            "vpp": record["vpp"] if record["pp"] > 1 else "-",
            "rollout": f"{record['rollout_tp']}/{record['rollout_dp']}/{record['rollout_ep']}",
            "util": f"{record['gpu_memory_utilization']:.2f}",
            "offload": _offload(record),
            "peak": peak_cell(record, capacity),
            "working": f"{working_set_bytes(record) / GIB:.1f} GiB",
            "step": f"{record.get('step_time_s', 0):.1f}",
            "tps": f"{record.get('tokens_per_s_per_gpu', 0):.0f}",
            "flags": ",".join(name for name in UNWISE_FLAGS if record[flag_column(name)]) or "-",
            "tie": "=" if record.get("within_error_of_best") else "",
        })
    columns = [("#", "rank")] + ([("", "tie")] if any(row["tie"] for row in rows) else []) + [
        ("TP", "tp"), ("PP", "pp"), ("VPP", "vpp"), ("CP", "cp")]
    if model.is_moe:
        columns += [("EP", "ep"), ("ETP", "etp")]
    columns += [("DP", "dp"), ("mbs", "micro_batch"), ("recompute", "recompute")]
    if plan.workload.has_rollout:
        columns += [("offload", "offload"), ("rollout TP/DP/EP", "rollout"), ("util", "util")]
    if has_time:
        columns += [("step s", "step"), ("tok/s/GPU", "tps")]
    columns += [(PEAK_NAME, "peak"), ("in phase", "peak_phase"),
                (WORKING_SET_NAME, "working"), ("flags", "flags")]
    body = format_table(rows, columns) if rows else "no layout fits in GPU memory"
    rejected = ", ".join(f"{name} {count:,}" for name, count in
                         sorted(plan.rejected.items(), key=lambda item: -item[1]))
    tail = phase_lines(fitting, 3)
    if tail:
        tail = ["phase times of the best layouts:"] + tail + [""]
    if rows:
        tail += headroom_lines(plan, fill_plan) + legend_lines(plan.policy) + [""]
    tail.append(f"rejected: {rejected}" if rejected else "rejected: none")
    if not rows:
        smallest = plan.candidates.nsmallest(1, "peak_bytes")
        best = smallest.to_dict("records")
        if best:
            tail.append(f"closest: {best[0]['peak_bytes'] / GIB:.1f} GiB {PEAK_NAME} in "
                        f"{best[0]['peak_phase']} vs {cluster.gpu.memory_gib:.1f} GiB per GPU; "
                        f"add GPUs or use a larger GPU")
    return "\n".join(head) + "\n\n" + body + "\n\n" + "\n".join(tail)


def estimate_dict(estimate) -> dict:
    return {"model": estimate.model.name, "cluster": estimate.cluster.to_dict(),
            "workload": estimate.workload.to_dict(), "memory_band": band_dict(estimate.policy),
            **candidate_dict(estimate.row),
            "band_position": estimate.policy.position(float(estimate.row["memory_utilization"]))}


def estimate_text(estimate) -> str:
    data = estimate_dict(estimate)
    policy = estimate.policy
    lines = [
        f"{estimate.model.name} on {estimate.cluster.num_gpus} x {estimate.cluster.gpu.name}: "
        f"{estimate.layout.actor_text()}"
        + (f"; {estimate.layout.rollout_text()}"
           if "generate" in estimate.workload.phases else ""),
        f"fits: {'yes' if data['fits'] else 'NO'} - {PEAK_NAME} {data['peak_memory_gib']:.2f} "
        f"GiB ({100 * data['memory_utilization']:.0f}% of "
        f"{estimate.cluster.gpu.memory_gib:.1f} GiB, {data['band_position']} the "
        f"{policy.band_text} band) in {data['peak_phase']} ({data['peak_stage']} pipeline stage)",
        "",
    ]
    phases = estimate.workload.phases
    rollout_parts = ("ref_weights", "rollout_weights", "kv_cache")
    lines += [
        f"{PEAK_NAME} per phase (GiB):       " + "  ".join(
            f"{phase} {gib:.2f}" for phase, gib in data["memory_gib"].items() if phase in phases),
        f"{WORKING_SET_NAME} per phase (GiB): " + "  ".join(
            f"{phase} {gib:.2f}" for phase, gib in data["working_set_gib"].items()
            if phase in phases),
        "breakdown (GiB):    " + "  ".join(f"{part} {gib:.2f}"
                                           for part, gib in data["breakdown_gib"].items()
                                           if "generate" in phases or part not in rollout_parts),
    ]
    if "generate" in phases:
        lines.append(f"rollout:            {data['rollout']['kv_cache_tokens_per_gpu']:,} KV "
                     f"tokens per GPU, {data['rollout']['concurrent_seqs']} sequences at once, "
                     f"{data['rollout']['seqs_per_rank']} per rank")
        filled = data.get("fill_gpu")
        if filled and filled["gpu_memory_utilization"] > estimate.layout.gpu_memory_utilization:
            lines.append(f"filling the GPU:    gpu_memory_utilization "
                         f"{filled['gpu_memory_utilization']:.2f}, "
                         f"{filled['kv_cache_tokens_per_gpu']:,} KV tokens per GPU, {PEAK_NAME} "
                         f"{filled['peak_memory_gib']:.2f} GiB: generate "
                         f"{data['time_s']['generate']:.2f} -> {filled['generate_s']:.2f} s, "
                         f"step {data['step_time_s']:.2f} -> {filled['step_time_s']:.2f} s")
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
