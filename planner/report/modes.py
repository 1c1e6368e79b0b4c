"""Text and JSON of the training-mode plans (:mod:`planner.placement`): one asynchronous mode's
splits, or ``--mode best``'s best plan of each mode side by side."""

from __future__ import annotations

from planner.placement import OFF_POLICY_NOTE, ModePlan, best_table_rows
from planner.report.text import format_table

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
        "step": f"{candidate['step_time_s']:.1f}" if "step_time_s" in candidate else "-",
        "gen": f"{times['generate']:.1f}" if "generate" in times else "-",
        "train": (f"{times['train']:.1f}" if "train" in times else
                  f"{sum(times.get(p, 0) for p in ('old_log_prob', 'ref', 'update_actor')):.1f}"
                  if times else "-"),
        "sync": f"{times.get('param_sync', times.get('weight_sync', 0)):.1f}" if times else "-",
        "bottleneck": candidate.get("bottleneck", "-" if not colocated else "shared"),
        "idle": (f"{100 * idle['trainer']:.0f}%/{100 * idle['rollout']:.0f}%" if idle
                 else "-"),
        "tps": f"{candidate.get('tokens_per_s_per_gpu', 0):.0f}",
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
