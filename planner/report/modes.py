"""Text and JSON of the training-mode plans (:mod:`planner.placement`): one asynchronous mode's
splits, or ``--mode best``'s best plan of each mode side by side."""

from __future__ import annotations

from planner.placement import OFF_POLICY_NOTE, ModePlan, SplitEstimate, best_table_rows
from planner.plan import ROLLOUT_FIELDS
from planner.policy import DEFAULT_POLICY, PEAK_NAME, MemoryPolicy
from planner.report.text import format_table
from planner.search.layout import Layout

ENTRY_TEXT = {"sync": "colocated hybrid engine (verl.trainer.main_ppo)",
              "one-step-off": "separate pools, generation of step k+1 overlaps training of "
                              "step k (verl.experimental.one_step_off_policy)",
              "fully-async": "separate pools, streaming rollout (verl.experimental."
                             "fully_async_policy)"}


def _header(plan: ModePlan) -> list[str]:
    model, cluster = plan.model, plan.cluster
    return [f"model    {model.name}: {model.params.total / 1e9:.2f}B params",
            f"cluster  {cluster.num_gpus} x {cluster.gpu.name} ({cluster.gpu.memory_gib:.1f} "
            f"GiB), {cluster.gpus_per_node} per node",
            f"workload {plan.workload.describe()}"]


def _layout_text(candidate: dict) -> tuple[str, str]:
    lay = candidate["layout"]
    actor = (f"TP{lay['tp']} PP{lay['pp']} CP{lay['cp']} EP{lay['ep']} DP{lay['dp']} "
             f"mbs{lay['micro_batch']}")
    rollout = f"{lay['rollout_tp']}/{lay['rollout_dp']}/{lay['rollout_ep']}"
    return actor, rollout


def _seconds(value: float | None) -> str:
    """A time of the table; "-" where a pool that does not fit has none."""
    return "-" if value is None else f"{value:.1f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _row(candidate: dict) -> dict:
    actor, rollout = _layout_text(candidate)
    placement, times = candidate["placement"], candidate.get("time_s", {})
    idle = candidate.get("idle_fraction")
    colocated = placement.get("colocated", False)
    return {
        "rank": candidate.get("rank", "-"), "mode": candidate["mode"],
        "trainer": placement["trainer_gpus"], "rollout": placement["rollout_gpus"],
        "actor": actor, "rtp": rollout,
        "util": f"{candidate['layout']['gpu_memory_utilization']:.2f}",
        "step": _seconds(candidate.get("step_time_s")),
        "gen": _seconds(times.get("generate")),
        "train": (f"{times['train']:.1f}" if "train" in times else
                  f"{sum(times.get(p, 0) for p in ('old_log_prob', 'ref', 'update_actor')):.1f}"
                  if times else "-"),
        "sync": f"{times.get('param_sync', times.get('weight_sync', 0)):.1f}" if times else "-",
        "bottleneck": candidate.get("bottleneck", "-" if not colocated else "shared"),
        "idle": f"{_percent(idle['trainer'])}/{_percent(idle['rollout'])}" if idle else "-",
        "tps": _rate(candidate.get("tokens_per_s_per_gpu")),
        "tmem": (f"{candidate['pools']['trainer']['peak_memory_gib']:.1f}"
                 if "pools" in candidate else f"{candidate['peak_memory_gib']:.1f}"),
        "rmem": (f"{candidate['pools']['rollout']['peak_memory_gib']:.1f}"
                 if "pools" in candidate else "(shared)"),
        "stale": candidate.get("staleness", {}).get("max_versions_behind", 0),
    }


COLUMNS = [("#", "rank"), ("mode", "mode"), ("trainer GPUs", "trainer"),
           ("rollout GPUs", "rollout"), ("actor", "actor"), ("rollout TP/DP/EP", "rtp"),
           ("util", "util"), ("step s", "step"), ("gen s", "gen"), ("train s", "train"),
           ("sync s", "sync"), ("bottleneck", "bottleneck"), ("idle T/R", "idle"),
           ("tok/s/GPU", "tps"), ("trainer GiB", "tmem"), ("rollout GiB", "rmem"),
           ("stale", "stale")]


def mode_table(plan: ModePlan, top: int) -> str:
    lines = _header(plan)
    lines.append(f"mode     {plan.mode}: {ENTRY_TEXT[plan.mode]}")
    if plan.mode == "fully-async":
        o = plan.async_options
        lines.append(f"         staleness_threshold {o.staleness_threshold:g}, parameter sync "
                     f"every "
                     f"{o.trigger_for(plan.workload)} mini-batch(es), partial rollout "
                     f"{'on' if o.partial_rollout else 'off'}")
    lines.append(f"splits   {plan.splits_tried} tried, {len(plan.candidates)} fit")
    lines.append("")
    rows = [_row(c) for c in plan.candidates[:top]]
    lines.append(format_table(rows, COLUMNS) if rows else "no split fits in GPU memory")
    lines += [f"note: {note}" for note in plan.notes]
    if plan.mode != "sync":
        lines.append(f"note: {OFF_POLICY_NOTE}")
    return "\n".join(lines)


def best_table(plans: list[ModePlan]) -> str:
    lines = _header(plans[0])
    lines.append("best plan of each mode (step = one train batch in the steady state):")
    lines.append("")
    rows = []
    for entry in best_table_rows(plans):
        if entry["best"] is None:
            rows.append({**{key: "-" for _, key in COLUMNS}, "mode": entry["mode"],
                         "speedup": "no fit"})
            continue
        speedup = entry["speedup_vs_sync"]
        rows.append({**_row(entry["best"]), "rank": "-",
                     "speedup": "-" if speedup is None else f"{speedup:.2f}x"})
    columns = [c for c in COLUMNS if c[1] != "rank"]
    columns.insert(7, ("vs sync", "speedup"))
    lines.append(format_table(rows, columns))
    lines.append("")
    lines.append("idle T/R: idle fraction of the trainer / rollout pool; stale: parameter "
                 "versions a sample can lag (at most)")
    lines.append(f"note: {OFF_POLICY_NOTE}")
    return "\n".join(lines)


def mode_dict(plan: ModePlan, top: int | None) -> dict:
    return {"model": {**plan.model.to_dict(), "params": plan.model.params.to_dict()},
            "cluster": plan.cluster.to_dict(), "workload": plan.workload.to_dict(),
            "mode": plan.mode, "splits_tried": plan.splits_tried, "notes": plan.notes,
            "candidates": plan.candidates if top is None else plan.candidates[:top]}


def best_dict(plans: list[ModePlan]) -> dict:
    first = plans[0]
    return {"model": {**first.model.to_dict(), "params": first.model.params.to_dict()},
            "cluster": first.cluster.to_dict(), "workload": first.workload.to_dict(),
            "mode": "best", "note": OFF_POLICY_NOTE,
            "modes": [{"mode": entry["mode"], "speedup_vs_sync": entry.get("speedup_vs_sync"),
                       "best": entry["best"]} for entry in best_table_rows(plans)],
            "candidates": [entry["best"] for entry in best_table_rows(plans) if entry["best"]]}


# --- estimate --mode one-step-off|fully-async -----------------------------------------------


def split_estimate_dict(estimate: SplitEstimate) -> dict:
    """``estimate --mode`` as JSON: the reported split in the contract of a plan candidate of
    the mode, ``valid``, and every split scored (``splits``, the reported one first)."""
    return {"valid": True, "model": estimate.model.name, "cluster": estimate.cluster.to_dict(),
            "workload": estimate.workload.to_dict(), **estimate.candidate,
            "splits": list(estimate.splits), "notes": list(estimate.notes),
            "note": OFF_POLICY_NOTE}


def _band(fraction: float, policy: MemoryPolicy) -> str:
    return f"{policy.position(fraction)} the {policy.band_text} band"


def _pool_lines(candidate: dict, capacity_gib: float, policy: MemoryPolicy) -> list[str]:
    trainer, rollout = candidate["pools"]["trainer"], candidate["pools"]["rollout"]
    times = candidate["time_s"]
    sync = candidate["param_sync_s"]
    lines = [
        f"trainer pool  {trainer['gpus']} GPUs: {PEAK_NAME} {trainer['peak_memory_gib']:.2f} GiB "
        f"({100 * trainer['memory_utilization']:.0f}% of {capacity_gib:.1f} GiB, "
        f"{_band(trainer['memory_utilization'], policy)}) in "
        f"{trainer['peak_phase']}{'' if trainer['fits'] else ' - does NOT fit'}; train "
        f"{_seconds(times['train'])} s = " + " + ".join(
            f"{phase} {seconds:.2f}" for phase, seconds in trainer["time_s"].items()),
        f"rollout pool  {rollout['gpus']} GPUs: {PEAK_NAME} {rollout['peak_memory_gib']:.2f} GiB "
        f"({100 * rollout['memory_utilization']:.0f}%, vLLM's pool) at gpu_memory_utilization "
        f"{rollout['gpu_memory_utilization']:.2f}{'' if rollout['fits'] else ' - does NOT fit'}"
        f"; {rollout['kv_cache_tokens_per_gpu']:,} KV tokens per GPU, "
        f"{rollout['concurrent_seqs']} sequences at once, generate {_seconds(times['generate'])} "
        f"s ({_rate(rollout['generated_tokens_per_s'])} generated tokens/s)",
        "param sync    " + "  ".join(f"{part} {_seconds(seconds)}"
                                     for part, seconds in sync.items() if part != "total")
        + f" -> {_seconds(sync['total'])} s per sync, {_seconds(times['param_sync'])} s per step",
    ]
    step = candidate["step_time_s"]
    if step is not None:
        wait = times["boundary_wait"]
        lines.append(
            f"step          {step:.1f} s = max(generate {times['generate']:.1f}, train "
            f"{times['train']:.1f}) + {f'boundary wait {wait:.1f} + ' if wait else ''}"
            f"param sync {times['param_sync']:.1f}; bottleneck {candidate['bottleneck']}, idle "
            f"trainer {_percent(candidate['idle_fraction']['trainer'])}, rollout "
            f"{_percent(candidate['idle_fraction']['rollout'])}; "
            f"{candidate['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU")
    stale = candidate["staleness"]
    lines.append(f"staleness     samples lag the policy by up to {stale['max_versions_behind']} "
                 f"version(s); {100 * stale['stale_sample_fraction']:.0f}% of them are stale")
    return lines


SPLIT_COLUMNS = [("", "mark"), ("trainer GPUs", "trainer"), ("rollout GPUs", "rollout"),
                 ("rollout TP/DP/EP", "rtp"), ("fits", "fits"), ("step s", "step"),
                 ("bottleneck", "bottleneck")]


def _split_row(split: dict, reported: bool) -> dict:
    return {"mark": "*" if reported else "", "trainer": split["trainer_gpus"],
            "rollout": split["rollout_gpus"], "step": _seconds(split["step_time_s"]),
            "fits": "yes" if split["fits"] else "NO", "bottleneck": split["bottleneck"],
            "rtp": "/".join(str(split["rollout"][name]) for name in ROLLOUT_FIELDS)}


def split_estimate_text(estimate: SplitEstimate, policy: MemoryPolicy = DEFAULT_POLICY) -> str:
    """``estimate --mode`` as text: the reported split in words and per pool, its row of the
    plan table, and every split scored when there were several (the reported one marked)."""
    c = estimate.candidate
    layout = Layout.from_row(c["layout"])
    placement = c["placement"]
    lines = [f"{estimate.model.name} on {estimate.cluster.num_gpus} x {estimate.cluster.gpu.name}"
             f", {estimate.mode}: {placement['trainer_gpus']} trainer + "
             f"{placement['rollout_gpus']} rollout GPUs",
             f"actor    {layout.actor_text(estimate.model.is_moe)} (trainer pool)",
             f"rollout  {layout.rollout_text().removeprefix('rollout ')} (rollout pool)",
             f"mode     {ENTRY_TEXT[estimate.mode]}"]
    if estimate.mode == "fully-async":
        o = c["async_training"]
        lines.append(f"         staleness_threshold {o['staleness_threshold']:g}, parameter "
                     f"sync every {o['trigger_parameter_sync_step']} mini-batch(es), partial "
                     f"rollout {'on' if o['partial_rollout'] else 'off'}")
    lines += [f"fits: {'yes' if c['fits'] else 'NO'}", ""]
    lines += _pool_lines(c, estimate.cluster.gpu.memory_gib, policy)
    lines += ["", format_table([{**_row(c), "rank": "-"}], COLUMNS[1:])]
    if len(estimate.splits) > 1:
        lines += ["", "splits scored for this actor layout (* reported):",
                  format_table([_split_row(split, i == 0)
                                for i, split in enumerate(estimate.splits)], SPLIT_COLUMNS)]
    lines += [f"note: {note}" for note in estimate.notes]
    lines.append(f"note: {OFF_POLICY_NOTE}")
    return "\n".join(lines)
