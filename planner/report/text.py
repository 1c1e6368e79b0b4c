"""Plans and estimates as terminal tables and CSV.

The JSON of the same is :mod:`planner.output`'s (the contract ``docs/plan.schema.json``
states); figures the JSON reports are printed here as it rounds them (its unit helpers).
"""

from __future__ import annotations

import io
import json
from collections import Counter

from planner.catalog.layers import MixerKind
from planner.cost.columns import memory_column, working_set_column
from planner.cost.flops import verl_reports_mfu
from planner.no_fit import closest_miss, short_of_host_memory
from planner.output import fraction, gib, setting
from planner.policy import (
    FILL_POLICY,
    PEAK_MEANING,
    PEAK_NAME,
    WORKING_SET_MEANING,
    WORKING_SET_NAME,
)
from planner.results import ROLLOUT_PARTS, ColocatedCandidate
from planner.search.layout import LAYOUT_FIELDS, Layout
from planner.units import GIB


def ranking_line(plan) -> str | None:
    if plan.tie_tolerance <= 0 or "step_time_s" not in plan.columns:
        return None
    ties = plan.ties
    band = plan.policy.band_text
    return (f"ranking  {ties:,} layout(s) within {100 * plan.tie_tolerance:.0f}% of the best "
            f"predicted step time are ties (= in the table; the model's ranking uncertainty, "
            f"benchmarks/accuracy.py), listed simplest first: no unwise flags, memory inside "
            f"{band}, no offload, fewer parallel dimensions, smaller TP x PP x CP")


def answer_lines(workload, cost) -> list[str]:
    """The lines under every plan, estimate and sizing answer: the response lengths its time
    rests on (:meth:`planner.catalog.lengths.ResponseLengths.sentence`) and the calibration it
    used (:func:`planner.cost.provenance.cost_model_summary`)."""
    from planner.cost.provenance import cost_model_summary

    lengths = getattr(workload, "lengths", None)
    return ([] if lengths is None else [lengths.sentence()]) + [cost_model_summary(cost)]


def band_text(c) -> str:
    """A timed candidate's step time over the run: ``232.3 s (191.9 -> 275.2 s, start -> end
    of the run)``, or its one step time when the lengths do not move."""
    if c.step_time_start_s is None or c.step_time_start_s == c.step_time_end_s:
        return f"{float(c.step_time_s):.1f} s"
    return (f"{float(c.step_time_s):.1f} s expected over the run "
            f"({float(c.step_time_start_s):.1f} -> {float(c.step_time_end_s):.1f} s, "
            f"first -> last step)")


def fastest_line(plan) -> str | None:
    """The line above the table (issue 26): the predicted-fastest layout inside the memory band
    and its step time, and how #1 relates to it."""
    fastest = plan.fastest_in_band
    shown = plan.top(1, fitting=True)
    if fastest is None or not shown or not fastest.timed:
        return None
    first = shown[0]
    band = plan.policy.band_text
    inside = plan.policy.low <= fastest.memory.utilization <= plan.policy.high
    where = f"inside the {band} band" if inside else "that fits (none inside the band)"
    text = (f"fastest  #{fastest.rank} is the predicted fastest {where}: "
            f"{fastest.layout.actor_text()}, {band_text(fastest)}")
    if first.rank == fastest.rank:
        return text + "; it is #1"
    if first.within_error_of_best:
        return (text + f"; #1 ({float(first.step_time_s):.1f} s) is the simplest of the "
                f"{plan.ties:,} within the model's error ({100 * plan.tie_tolerance:.0f}%) "
                f"of the best")
    return text


def to_json(data: dict) -> str:
    return json.dumps(data, indent=2)


def plan_csv(plan, top: int | None) -> str:
    shown = (plan.candidates if top is None else plan.candidates.head(top)).copy()
    phases = plan.workload.phases  # the phases the step runs (pretraining: the update)
    for phase in phases:  # the CSV shows GiB: people read it in a spreadsheet
        shown[f"mem_{phase}_gib"] = shown[memory_column(phase)] / GIB
        shown[f"working_set_{phase}_gib"] = shown[working_set_column(phase)] / GIB
    columns = ["rank", *LAYOUT_FIELDS, "fits", "within_error_of_best", "peak_memory_gib",
               "peak_phase", "memory_utilization", *[f"mem_{phase}_gib" for phase in phases],
               *[f"working_set_{phase}_gib" for phase in phases], "unwise_count"]
    if "step_time_s" in shown:
        columns += ["step_time_s", "tokens_per_s_per_gpu", "mfu"]
    buffer = io.StringIO()
    shown[columns].to_csv(buffer, index=False, float_format="%.4g")
    return buffer.getvalue()


def _offload(layout: Layout) -> str:
    text = layout.offload_text
    if layout.optimizer_cpu_fraction > 0:  # Megatron's CPU optimizer
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


def phase_lines(best: list[ColocatedCandidate]) -> list[str]:
    """Per-phase times of the best layouts and the phase that dominates each."""
    lines = []
    for c in best:
        if c.times is None:
            break
        times = "  ".join(f"{phase} {value:.1f}" for phase, value in c.times.seconds.items())
        lines.append(f"#{c.rank}: {times} s  (dominant: {c.times.dominant}, "
                     f"update bubble {c.update_bubble_s:.1f} s, exposed comm "
                     f"{c.update_comm_s:.1f} s, MFU {100 * c.mfu:.0f}%)")
    return lines


def peak_cell(peak_bytes: float, capacity_bytes: float) -> str:
    """``64.6 GiB 81%``: the nvidia-smi peak and its share of the GPU."""
    return f"{peak_bytes / GIB:.1f} GiB {100 * peak_bytes / capacity_bytes:.0f}%"


def legend_lines(policy) -> list[str]:
    """What the two memory quantities are, and the band the first is judged against."""
    return [f"{PEAK_NAME}: {PEAK_MEANING} ({policy.band_text}: --memory-band "
            f"{policy.option_text}; {FILL_POLICY.option_text} fills the GPU)",
            f"{WORKING_SET_NAME}: {WORKING_SET_MEANING} (the peak's phase)"]


def _seconds_change(new: float, old: float) -> str:
    """The change in seconds and percent, each rounded once; a change that rounds to zero is
    "+0.0", never "-0.0"."""
    return (f"{round(new - old, 1) + 0.0:+.1f} s, "
            f"{round(100 * (new - old) / old, 1) + 0.0:+.1f}%")


def headroom_lines(plan, fill_plan=None) -> list[str]:
    """What the band's headroom costs the best layout: its rollout pool and KV cache against
    the same layout's pool filling the GPU, and the best layout were the GPU filled."""
    if not plan.fitting_count or not plan.workload.has_rollout:
        return []
    best = plan.candidate(0, fitting=True)
    policy = plan.policy
    capacity = plan.cluster.gpu.memory_bytes
    share = fraction(best.memory.utilization)
    head = (f"memory band {policy.band_text} of {plan.cluster.gpu.memory_gib:.1f} GiB, judged "
            f"on the {PEAK_NAME}: #1 peaks at {best.memory.peak_bytes / GIB:.1f} GiB "
            f"({100 * share:.0f}%, {policy.position(share)} the band) in "
            f"{best.memory.peak_phase}")
    lines = [head]
    filled = best.fill_gpu
    util = best.layout.gpu_memory_utilization
    if filled and not policy.fills_gpu:
        if setting(filled.gpu_memory_utilization) > util:
            lines.append(
                f"cost of the headroom, same layout: rollout gpu_memory_utilization {util:.2f} "
                f"holds {best.rollout.kv_text('/GPU')}; filling the GPU, "
                f"{setting(filled.gpu_memory_utilization):.2f} would hold "
                f"{filled.kv_text('', '')} ({PEAK_NAME} "
                f"{filled.peak_bytes / GIB:.1f} GiB): generate "
                f"{float(best.times.seconds.generate):.1f} s -> "
                f"{float(filled.generate_s):.1f} s, step "
                f"{_seconds_change(float(filled.step_time_s), float(best.step_time_s))}")
        else:
            lines.append(
                f"cost of the headroom, same layout: none in generation -- rollout "
                f"gpu_memory_utilization {util:.2f} already holds the KV cache of every "
                f"sequence a rank runs at once ({best.rollout.kv_text('/GPU', ' tokens')}, "
                f"{best.rollout.concurrent_seqs} sequences); filling the GPU would not "
                f"speed it up")
    if fill_plan is not None and len(fill_plan.fitting_rows()):
        other = fill_plan.candidate(0, fitting=True)
        layout = other.layout
        text = layout.actor_text(moe=plan.model.is_moe)
        other_step, other_peak = float(other.step_time_s), other.memory.peak_bytes / GIB
        lines.append(
            f"filling the GPU (--memory-band {FILL_POLICY.option_text}), the best layout would "
            f"be {text}; {layout.rollout_text()}: {other_step:.1f} s per step "
            f"({_seconds_change(other_step, float(best.step_time_s))} vs #1) at "
            f"{other_peak:.1f} GiB "
            f"({100 * other_peak * GIB / capacity:.0f}%) in {other.memory.peak_phase}")
    return lines


def verl_mfu_note(model) -> str:
    """Where verl's FlopsCounter has no function for the model type it logs ``perf/mfu/actor``
    0: say so next to the predicted MFU (in verl's convention) rather than invite a comparison."""
    if verl_reports_mfu(model):
        return ""
    return f" (verl logs MFU 0 for model_type {model.model_type}: no FlopsCounter function)"


def layer_kinds_text(model) -> str:
    """`` (30 linear_attention + 10 full_attention)`` for a model whose layers are not all
    full attention / MLA; empty for a transformer (its model line as before).  The plan passes
    the model as named: windows that hold every sequence, costed as full attention, keep their
    names here (a note says how they were costed).  Layers without
    a mixer (Nemotron-H's MLP / MoE blocks) are named by their feed-forward kind, so the
    counts add up to the model's layers: ``(23 mamba2 + 6 full_attention + 23 moe-only)``."""
    if all(layer.mixer.kv_grows for layer in model.layers):
        return ""
    mixers = model.layer_summary.split(";")[0].strip()
    without_mixer = Counter(layer.mlp.value for layer in model.layers
                            if layer.mixer is MixerKind.NONE)
    return " (" + " + ".join([mixers, *(f"{n} {kind}-only"
                                        for kind, n in without_mixer.items())]) + ")"


def merged_text(merged: int, before: str = "", after: str = "") -> str:
    """How many valid layouts were merged into an equivalent one (the same stages, the same
    prediction: :func:`planner.search.space.equivalent_splits`), or nothing."""
    if not merged:
        return ""
    return f"{before}{merged:,} equivalent layouts merged{after}"


def plan_table(plan, top: int, fill_plan=None) -> str:
    """The ranked table; ``fill_plan``, the same search under the fill-the-GPU band, prices
    the memory band's headroom."""
    model, cluster = plan.model, plan.cluster
    capacity = cluster.gpu.memory_bytes
    p = model.params
    head = [
        f"model    {model.name}: {p.total / 1e9:.2f}B params ({p.active / 1e9:.2f}B active), "
        f"{model.num_layers} layers{layer_kinds_text(plan.request.given_model or model)}, "
        f"hidden {model.hidden_size}"
        + (f", {model.num_experts} experts top-{model.moe_top_k}" if model.is_moe else ""),
        f"cluster  {cluster.num_gpus} x {cluster.gpu.name} ({cluster.gpu.memory_gib:.1f} GiB), "
        f"{cluster.gpus_per_node} per node",
        f"workload {plan.workload.describe()}",
        f"searched {plan.enumerated:,} layouts: {plan.valid:,} valid"
        + (f" ({plan.scored or plan.rows:,} actor layouts, rollout chosen per "
           f"layout{merged_text(plan.merged, '; ')})"
           if plan.workload.has_rollout else merged_text(plan.merged, ' (', ')'))
        + f", {plan.fitting_count:,} fit in memory, "
        + f"{plan.fitting_below_top:,} "
        + f"with the {PEAK_NAME} at most {100 * plan.policy.high:.0f}%",
    ]
    for line in (ranking_line(plan), fastest_line(plan)):
        if line:
            head.append(line)
    rows = []
    shown = plan.top(top, fitting=True)
    has_time = any(c.timed for c in shown)
    for c in shown:
        lay = c.layout
        rows.append({
            "rank": c.rank, "tp": lay.tp, "pp": lay.pp, "vpp": lay.vpp if lay.pp > 1 else "-",
            "cp": lay.cp, "ep": lay.ep, "etp": lay.etp, "dp": lay.dp,
            "micro_batch": lay.micro_batch, "recompute": lay.recompute,
            "rollout": f"{lay.rollout_tp}/{lay.rollout_dp}/{lay.rollout_ep}",
            "util": f"{lay.gpu_memory_utilization:.2f}",
            "offload": _offload(lay),
            "peak": peak_cell(c.memory.peak_bytes, capacity),
            "peak_phase": c.memory.peak_phase,
            "working": f"{c.memory.working_set_at_peak_bytes / GIB:.1f} GiB",
            "step": f"{c.step_time_s or 0:.1f}",
            "start": f"{c.step_time_start_s or 0:.1f}", "end": f"{c.step_time_end_s or 0:.1f}",
            "tps": f"{c.tokens_per_s_per_gpu or 0:.0f}",
            "flags": ",".join(c.flags) or "-",
            "tie": "=" if c.within_error_of_best else "",
        })
    columns = [("#", "rank")] + ([("", "tie")] if any(row["tie"] for row in rows) else []) + [
        ("TP", "tp"), ("PP", "pp"), ("VPP", "vpp"), ("CP", "cp")]
    if model.is_moe:
        columns += [("EP", "ep"), ("ETP", "etp")]
    columns += [("DP", "dp"), ("mbs", "micro_batch"), ("recompute", "recompute")]
    if plan.workload.has_rollout:
        columns += [("offload", "offload"), ("rollout TP/DP/EP", "rollout"), ("util", "util")]
    if has_time and plan.workload.moving_lengths:
        # the run's expected step time (what ranks), and the first and last step's
        columns += [("step s", "step"), ("start", "start"), ("end", "end"),
                    ("tok/s/GPU", "tps")]
    elif has_time:
        columns += [("step s", "step"), ("tok/s/GPU", "tps")]
    columns += [(PEAK_NAME, "peak"), ("in phase", "peak_phase"),
                (WORKING_SET_NAME, "working"), ("flags", "flags")]
    closest = None if rows else closest_miss(plan)
    body = format_table(rows, columns) if rows else (
        "no layout fits in host memory" if short_of_host_memory(plan, closest)
        else "no layout fits in GPU memory")
    rejected = ", ".join(f"{name} {count:,}" for name, count in
                         sorted(plan.rejected.items(), key=lambda item: -item[1]))
    tail = phase_lines(shown[:3])
    if tail:
        tail = ["phase times of the best layouts:"] + tail + [""]
    if rows:
        tail += headroom_lines(plan, fill_plan) + legend_lines(plan.policy) + [""]
    tail.append(f"rejected: {rejected}" if rejected else "rejected: none")
    if has_time and plan.workload.moving_lengths:
        tail.append("step s: the run's expected step time (ranked by); start, end: at its first "
                    "and last step, as the mean response length moves")
    tail += answer_lines(plan.workload, plan.request.cost)
    if closest:
        best = closest
        line = (f"closest: {best['peak_bytes'] / GIB:.1f} GiB {PEAK_NAME} in "
                f"{best['peak_phase']} vs {cluster.gpu.memory_gib:.1f} GiB per GPU")
        if short_of_host_memory(plan, best):
            line += (f", but {best['host_bytes_per_node'] / GIB:.1f} GiB of host memory per "
                     f"node, over the {cluster.host_memory_per_node_bytes / GIB:.1f} GiB per "
                     f"node (--host-memory-gib)")
        else:
            line += "; add GPUs or use a larger GPU"
        tail.append(line)
    return "\n".join(head) + "\n\n" + body + "\n\n" + "\n".join(tail)


def unfit_reasons(estimate) -> list[str]:
    """Why a layout whose peak is within the GPU does not fit: a rollout pool without room for
    one sequence, or offloaded state beyond the host's memory (the peak says the rest); and,
    whatever the peak, a picked ``gpu_memory_utilization`` that leaves no room at all."""
    c, cluster = estimate.candidate, estimate.cluster
    if c.fits:
        return []
    if estimate.rollout_without_room:
        return ["no gpu_memory_utilization leaves the rollout room for its weights and "
                "workspace beside the trainer's state (see rollout:)"]
    if c.memory.peak_bytes > cluster.gpu.memory_bytes:
        return []
    reasons = []
    if "generate" in estimate.workload.phases and not c.rollout.fits:
        reasons.append(f"but the rollout pool at gpu_memory_utilization "
                       f"{setting(estimate.layout.gpu_memory_utilization):.2f} holds "
                       f"{c.rollout.kv_text()}, not one "
                       f"{estimate.workload.sequence_length:,}-token sequence (raise "
                       f"--gpu-memory-utilization)")
    if not c.memory.host_fits:
        reasons.append(f"but the offloaded state needs {gib(c.memory.host_bytes_per_node):.1f} "
                       f"GiB of host memory per node, over the "
                       f"{cluster.host_memory_per_node_bytes / GIB:.1f} GiB per node "
                       f"(--host-memory-gib)")
    return reasons


def empty_pool_text(estimate) -> str:
    """Why a rollout pool holds no KV cache at all: its budget is below vLLM's weights and
    workspace, which it loads before it sizes the cache and then stops; a picked
    ``gpu_memory_utilization`` says no setting leaves room beside the trainer's state."""
    if estimate.candidate.rollout.kv_cache_tokens_per_gpu > 0:
        return ""
    util = estimate.layout.gpu_memory_utilization
    capacity = estimate.cluster.gpu.memory_gib
    text = (f" (the pool, gpu_memory_utilization {util:.2f} = {util * capacity:.1f} GiB, is "
            f"below the rollout's weights and workspace: vLLM stops with 'No available memory "
            f"for the cache blocks'")
    if estimate.rollout_without_room:
        text += ("; no gpu_memory_utilization leaves room for them beside the trainer's "
                 "state: fewer bytes per GPU (TP, PP, EP, offload) or more GPUs")
    return text + ")"


def pipeline_starvation_lines(estimate) -> list[str]:
    """The ``pipeline_starved`` warning with its numbers and what would feed the pipeline."""
    starved = estimate.pipeline_starvation
    if starved is None:
        return []
    return [f"warning: the pipeline is starved: {starved.micro_batches} micro-batch(es) per "
            f"optimizer step on each DP rank ({starved.sequences_per_rank:g} sequences) for "
            f"{starved.stages} pipeline stages, so about "
            f"{100 * starved.bubble_fraction:.0f}% of the update is pipeline bubble; feed it "
            f"with " + ", or ".join(starved.fixes(estimate.workload.has_rollout))]


def estimate_text(estimate) -> str:
    c = estimate.candidate
    policy = estimate.policy
    memory, rollout = c.memory, c.rollout
    share = float(memory.utilization)  # every figure below rounded once, from its exact value
    lines = [
        f"{estimate.model.name} on {estimate.cluster.num_gpus} x {estimate.cluster.gpu.name}: "
        f"{estimate.layout.actor_text()}"
        + (f"; {estimate.rollout_text()}" if estimate.workload.has_rollout else ""),
        f"fits: {'yes' if c.fits else 'NO'} - {PEAK_NAME} {gib(memory.peak_bytes):.2f} "
        f"GiB ({100 * share:.0f}% of "
        f"{estimate.cluster.gpu.memory_gib:.1f} GiB, {policy.position(memory.utilization)} the "
        f"{policy.band_text} band) in {memory.peak_phase} ({memory.peak_stage} pipeline stage)"
        + "".join(f"; {reason}" for reason in unfit_reasons(estimate)),
        "",
    ]
    phases = estimate.workload.phases
    lines += [
        f"{PEAK_NAME} per phase (GiB):       " + "  ".join(
            f"{phase} {gib(value):.2f}" for phase, value in memory.phase_bytes.items()
            if phase in phases),
        f"{WORKING_SET_NAME} per phase (GiB): " + "  ".join(
            f"{phase} {gib(value):.2f}" for phase, value in memory.working_set_bytes.items()
            if phase in phases),
        "breakdown (GiB):    " + "  ".join(f"{part} {gib(value):.2f}"
                                           for part, value in memory.breakdown.items()
                                           if "generate" in phases or part not in ROLLOUT_PARTS),
    ]
    if "generate" in phases:
        lines.append(f"rollout:            {rollout.kv_text()}, "
                     f"{rollout.concurrent_seqs} sequences at once, "
                     f"{rollout.seqs_per_rank} per rank" + empty_pool_text(estimate))
        filled = c.fill_gpu
        if filled and setting(filled.gpu_memory_utilization) \
                > estimate.layout.gpu_memory_utilization:
            lines.append(f"filling the GPU:    gpu_memory_utilization "
                         f"{setting(filled.gpu_memory_utilization):.2f}, "
                         f"{filled.kv_text()}, {PEAK_NAME} "
                         f"{gib(filled.peak_bytes):.2f} GiB: generate "
                         f"{c.times.seconds.generate:.2f} -> "
                         f"{filled.generate_s:.2f} s, step "
                         f"{c.step_time_s:.2f} -> {filled.step_time_s:.2f} s")
    if c.timed and c.times is not None:
        step = c.step_time_s
        lines.append("time (s):           " + "  ".join(
            f"{phase} {value:.2f} ({100 * value / step:.0f}%)"
            for phase, value in c.times.seconds.items())
            + f"  -> step {step:.2f} s, "
              f"{c.tokens_per_s_per_gpu:.0f} tokens/s/GPU, actor MFU "
              f"{100 * c.mfu:.1f}%{verl_mfu_note(estimate.model)}")
    elif c.timed:
        lines.append(f"time:               step {c.step_time_s:.3f} s, "
                     f"{c.tokens_per_s_per_gpu:.0f} tokens/s/GPU, "
                     f"{c.tflops_per_gpu:.0f} TFLOP/s/GPU, "
                     f"MFU {100 * c.mfu:.1f}%")
    if c.timed and c.step_time_start_s is not None and c.step_time_start_s != c.step_time_end_s:
        lines.append(f"over the run:       step {band_text(c)}")
    if c.timed and c.times is not None:
        for phase, parts in c.times.parts.items():
            shown = [f"{part[:-2]} {value:.2f}" for part, value in parts.items()
                     if f"{value:.2f}" != "0.00"]
            if shown:
                lines.append(f"  {phase + ':':18}" + "  ".join(shown))
    if c.flags:
        lines.append("unwise:             " + ", ".join(c.flags))
    lines += pipeline_starvation_lines(estimate)
    lines += answer_lines(estimate.workload, estimate.request.cost)
    return "\n".join(lines)
