"""Text of the training-mode plans (:mod:`planner.modes`): one mode's candidates, ``--mode
best``'s best plan of each mode side by side, and ``estimate --mode`` of a split mode.  The
JSON of the same is :mod:`planner.output`'s; the text prints each figure rounded once from
its exact value (the JSON's rounded figure printed at fewer decimals would round twice)."""

from __future__ import annotations

import math

from planner.modes import get_mode, off_policy_note
from planner.no_fit import modes_remedy
from planner.output import finite as reported
from planner.output import fraction, gib, mode_bests, rate, setting
from planner.placement import ModePlan, SplitEstimate
from planner.policy import DEFAULT_POLICY, PEAK_NAME, MemoryPolicy
from planner.report.text import answer_lines, format_table
from planner.results import Candidate, ColocatedCandidate, SplitCandidate
from planner.units import GIB

TRAINING_PHASES = ("old_log_prob", "ref", "update_actor")


def _header(plan: ModePlan) -> list[str]:
    model, cluster = plan.model, plan.cluster
    return [f"model    {model.name}: {model.params.total / 1e9:.2f}B params",
            f"cluster  {cluster.num_gpus} x {cluster.gpu.name} ({cluster.gpu.memory_gib:.1f} "
            f"GiB), {cluster.gpus_per_node} per node",
            f"workload {plan.workload.describe()}"]


def _layout_text(candidate: Candidate) -> tuple[str, str]:
    lay = candidate.layout
    actor = f"TP{lay.tp} PP{lay.pp} CP{lay.cp} EP{lay.ep} DP{lay.dp} mbs{lay.micro_batch}"
    rollout = f"{lay.rollout_tp}/{lay.rollout_dp}/{lay.rollout_ep}"
    return actor, rollout


def _seconds(value: float | None) -> str:
    """A time of the table; "-" where a pool that does not fit has none."""
    return "-" if value is None else f"{value:.1f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _exact(value: float | None, _json_digits: int = 3) -> float | None:
    """A figure the text prints at its own precision, unrounded (rounded once when printed:
    the JSON's 3-decimal seconds printed at one decimal would round twice); None for a time or
    rate a pool that cannot run has not got (inf, NaN)."""
    return None if value is None or not math.isfinite(float(value)) else float(value)


def _step_cell(candidate: Candidate, value: float | None) -> str:
    """A step time cell (the run's expected step, or its first or last step's), unrounded;
    '-' where the candidate is not timed or cannot run."""
    return _seconds(_exact(value) if candidate.timed else None)


def _split_cells(c: SplitCandidate) -> dict:
    feasible = c.feasible
    idle_t = _exact(c.idle.trainer, 4) if feasible else None
    idle_r = _exact(c.idle.rollout, 4) if feasible else None
    return {"gen": _seconds(_exact(c.times.generate)),
            "train": f"{_exact(c.times.train):.1f}",
            "param_sync": f"{_exact(c.times.param_sync):.1f}",
            "bottleneck": c.bottleneck, "idle": f"{_percent(idle_t)}/{_percent(idle_r)}",
            "tps": _rate(_exact(c.tokens_per_s_per_gpu, 1) if feasible else None),
            "tmem": f"{c.trainer_pool.peak_bytes / GIB:.1f}",
            "rmem": f"{c.rollout_pool.peak_bytes / GIB:.1f}"}


def _colocated_cells(c: ColocatedCandidate) -> dict:
    times = c.times if c.timed else None
    return {"gen": _seconds(None if times is None else float(times.seconds.generate)),
            "train": "-" if times is None else
            f"{sum(times.seconds.of_phase(p) for p in TRAINING_PHASES):.1f}",
            "param_sync": "-" if times is None else
            f"{times.seconds.weight_sync:.1f}",
            "bottleneck": "shared", "idle": "-",
            "tps": _rate(rate(c.tokens_per_s_per_gpu) if c.timed else None),
            "tmem": f"{c.memory.peak_bytes / GIB:.1f}", "rmem": "(shared)"}


def _row(candidate: Candidate) -> dict:
    actor, rollout = _layout_text(candidate)
    placement = candidate.placement
    cells = (_split_cells(candidate) if isinstance(candidate, SplitCandidate)
             else _colocated_cells(candidate))
    return {
        "rank": "-" if candidate.rank is None else candidate.rank, "mode": candidate.mode,
        "trainer": placement.trainer_gpus, "rollout": placement.rollout_gpus,
        "actor": actor, "rtp": rollout,
        "util": f"{setting(candidate.layout.gpu_memory_utilization):.2f}",
        "step": _step_cell(candidate, candidate.step_time_s),
        "start": _step_cell(candidate, candidate.step_time_start_s),
        "end": _step_cell(candidate, candidate.step_time_end_s), **cells,
        "stale": 0 if candidate.staleness is None else candidate.staleness.max_versions_behind,
    }


COLUMNS = [("#", "rank"), ("mode", "mode"), ("trainer GPUs", "trainer"),
           ("rollout GPUs", "rollout"), ("actor", "actor"), ("rollout TP/DP/EP", "rtp"),
           ("util", "util"), ("step s", "step"), ("gen s", "gen"), ("train s", "train"),
           ("sync s", "param_sync"), ("bottleneck", "bottleneck"), ("idle T/R", "idle"),
           ("tok/s/GPU", "tps"), ("trainer GiB", "tmem"), ("rollout GiB", "rmem"),
           ("stale", "stale")]
OVER_RUN_COLUMNS = [("start", "start"), ("end", "end")]


def table_columns(workload, columns=COLUMNS) -> list[tuple[str, str]]:
    """``columns`` with the step time at the run's first and last step after ``step s`` (the
    run's expected step time, what ranks) when the mean response length moves over the run."""
    if not getattr(workload, "moving_lengths", False):
        return list(columns)
    at = [key for _, key in columns].index("step") + 1
    return [*columns[:at], *OVER_RUN_COLUMNS, *columns[at:]]


OVER_RUN_LEGEND = ("step s: the run's expected step time (ranked by); start, end: at its first "
                   "and last step, as the mean response length moves")


def mode_table(plan: ModePlan, top: int) -> str:
    mode = get_mode(plan.mode, plan.async_options)
    lines = _header(plan)
    lines.append(f"mode     {plan.mode}: {mode.summary}")
    lines += mode.settings_lines(plan.workload)
    lines.append(f"splits   {plan.splits_tried} tried, {len(plan.candidates)} fit")
    lines.append("")
    rows = [_row(c) for c in plan.candidates[:top]]
    lines.append(format_table(rows, table_columns(plan.workload)) if rows
                 else "no split fits in GPU memory")
    if rows and plan.workload.moving_lengths:
        lines.append(OVER_RUN_LEGEND)
    lines += answer_lines(plan.workload, plan.request.cost)
    lines += [f"note: {note}" for note in plan.notes]
    if mode.off_policy:
        lines.append(f"note: {off_policy_note()}")
    return "\n".join(lines)


def best_table(plans: list[ModePlan]) -> str:
    lines = _header(plans[0])
    lines.append("best plan of each mode (step = one train batch in the steady state):")
    lines.append("")
    columns = [c for c in table_columns(plans[0].workload) if c[1] != "rank"]
    keys = [key for _, key in columns]
    columns.insert(keys.index("end" if "end" in keys else "step") + 1, ("vs sync", "speedup"))
    rows = []
    for plan, best, speedup in mode_bests(plans):
        if best is None:  # every column, the run's start/end among them, says "-"
            rows.append({**{key: "-" for _, key in columns}, "mode": plan.mode,
                         "speedup": "no fit"})
            continue
        rows.append({**_row(best), "rank": "-",
                     "speedup": "-" if speedup is None else f"{speedup:.2f}x"})
    lines.append(format_table(rows, columns))
    if all(row["speedup"] == "no fit" for row in rows):
        lines.append(f"no plan fits in any mode: {modes_remedy(plans)}")
    lines.append("")
    lines.append("idle T/R: idle fraction of the trainer / rollout pool; stale: parameter "
                 "versions a sample can lag (at most)")
    if plans[0].workload.moving_lengths:
        lines.append(OVER_RUN_LEGEND)
    lines += answer_lines(plans[0].workload, plans[0].request.cost)
    lines.append(f"note: {off_policy_note()}")
    return "\n".join(lines)


# --- estimate --mode of a split mode -------------------------------------------------------


def _band(fraction_of_gpu: float, policy: MemoryPolicy) -> str:
    return f"{policy.position(fraction_of_gpu)} the {policy.band_text} band"


def _pool_lines(c: SplitCandidate, capacity_gib: float, policy: MemoryPolicy) -> list[str]:
    trainer, rollout = c.trainer_pool, c.rollout_pool
    times = c.times
    trainer_share, rollout_share = fraction(trainer.utilization), fraction(rollout.utilization)
    generated = (None if rollout.generated_tokens_per_s is None
                 else _exact(rollout.generated_tokens_per_s, 1))
    lines = [
        f"trainer pool  {trainer.gpus} GPUs: {PEAK_NAME} {gib(trainer.peak_bytes):.2f} GiB "
        f"({100 * trainer_share:.0f}% of {capacity_gib:.1f} GiB, "
        f"{_band(trainer_share, policy)}) in "
        f"{trainer.peak_phase}{'' if trainer.fits else ' - does NOT fit'}; train "
        f"{_seconds(_exact(times.train))} s = " + " + ".join(
            f"{phase} {_exact(value):.2f}" for phase, value in
            (*trainer.phase_s.items(), ("step_fixed", trainer.step_fixed_s))),
        f"rollout pool  {rollout.gpus} GPUs: {PEAK_NAME} {gib(rollout.peak_bytes):.2f} GiB "
        f"({100 * rollout_share:.0f}%, vLLM's pool) at gpu_memory_utilization "
        f"{setting(rollout.gpu_memory_utilization):.2f}"
        f"{'' if rollout.fits else ' - does NOT fit'}"
        f"; {rollout.kv_text()}, "
        f"{rollout.concurrent_seqs} sequences at once, generate "
        f"{_seconds(_exact(times.generate))} s ({_rate(generated)} generated tokens/s)",
        "param sync    " + "  ".join(f"{part} {_seconds(_exact(value))}"
                                     for part, value in c.param_sync.items() if part != "total")
        + f" -> {_seconds(_exact(c.param_sync.total))} s per sync, "
          f"{_seconds(_exact(times.param_sync))} s per step",
    ]
    if c.feasible:
        wait = _exact(times.boundary_wait) if reported(times.boundary_wait) else None
        lines.append(
            f"step          {_exact(c.step_time_s):.1f} s = max(generate "
            f"{_exact(times.generate):.1f}, train {_exact(times.train):.1f}) + "
            f"{f'boundary wait {wait:.1f} + ' if wait else ''}"
            f"param sync {_exact(times.param_sync):.1f}; bottleneck {c.bottleneck}, idle "
            f"trainer {_percent(_exact(c.idle.trainer, 4))}, rollout "
            f"{_percent(_exact(c.idle.rollout, 4))}; "
            f"{_exact(c.tokens_per_s_per_gpu, 1):,.0f} tokens/s/GPU")
    stale = c.staleness
    lines.append(f"staleness     samples lag the policy by up to {stale.max_versions_behind} "
                 f"version(s); {100 * fraction(stale.stale_sample_fraction):.0f}% of them are "
                 f"stale")
    return lines


SPLIT_COLUMNS = [("", "mark"), ("trainer GPUs", "trainer"), ("rollout GPUs", "rollout"),
                 ("rollout TP/DP/EP", "rtp"), ("fits", "fits"), ("step s", "step"),
                 ("bottleneck", "bottleneck")]


def _split_row(split: SplitCandidate, marked: bool) -> dict:
    lay = split.layout
    return {"mark": "*" if marked else "", "trainer": split.placement.trainer_gpus,
            "rollout": split.placement.rollout_gpus, "step": _step_cell(split, split.step_time_s),
            "start": _step_cell(split, split.step_time_start_s),
            "end": _step_cell(split, split.step_time_end_s),
            "fits": "yes" if split.fits else "NO", "bottleneck": split.bottleneck,
            "rtp": f"{lay.rollout_tp}/{lay.rollout_dp}/{lay.rollout_ep}"}


def split_estimate_text(estimate: SplitEstimate, policy: MemoryPolicy = DEFAULT_POLICY) -> str:
    """``estimate --mode`` as text: the reported split in words and per pool, its row of the
    plan table, and every split scored when there were several (the reported one marked)."""
    c = estimate.candidate
    mode = get_mode(estimate.mode, estimate.async_options)
    layout, placement = c.layout, c.placement
    lines = [f"{estimate.model.name} on {estimate.cluster.num_gpus} x {estimate.cluster.gpu.name}"
             f", {estimate.mode}: {placement.trainer_gpus} trainer + "
             f"{placement.rollout_gpus} rollout GPUs",
             f"actor    {layout.actor_text(estimate.model.is_moe)} (trainer pool)",
             f"rollout  {layout.rollout_text().removeprefix('rollout ')} (rollout pool)",
             f"mode     {mode.summary}"]
    lines += mode.settings_lines(estimate.workload)
    lines += [f"fits: {'yes' if c.fits else 'NO'}", ""]
    lines += _pool_lines(c, estimate.cluster.gpu.memory_gib, policy)
    lines += ["", format_table([{**_row(c), "rank": "-"}],
                               table_columns(estimate.workload, COLUMNS[1:]))]
    if len(estimate.splits) > 1:
        lines += ["", "splits scored for this actor layout (* reported):",
                  format_table([_split_row(split, i == 0)
                                for i, split in enumerate(estimate.splits)],
                               table_columns(estimate.workload, SPLIT_COLUMNS))]
    lines += [f"note: {note}" for note in estimate.notes]
    lines.append(f"note: {off_policy_note()}")
    lines += answer_lines(estimate.workload, estimate.request.cost)
    return "\n".join(lines)
