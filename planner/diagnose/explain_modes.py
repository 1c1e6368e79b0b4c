"""``plan-parallel explain --mode one-step-off|fully-async|best``: the chosen training mode and
split in words.

For an asynchronous mode (:mod:`planner.placement`): the split the plan chooses (trainer and
rollout GPUs), which pool is the bottleneck and by how much (its busy time over the other
pool's), each pool's idle fraction, the neighbouring splits -- one node more and one node less
for the trainer (one GPU in a single node) -- with their predicted step and the pool that makes
them slower, the parameter sync's share of the step, and the staleness the mode brings (it
changes the algorithm: :data:`~planner.placement.OFF_POLICY_NOTE`).  For ``best``: the mode
that wins, its speed-up over sync and the other modes' steps, the winner's split explained as
above when it is asynchronous, and the same caveat.  ``sync`` is
:func:`planner.diagnose.explain.explain` (the colocated layout next to the rules of thumb).
"""

from __future__ import annotations

from dataclasses import replace

from planner.catalog.hardware import ClusterSpec
from planner.cost.request import PlanRequest
from planner.errors import NoFitError, PlanInputError
from planner.placement import (
    OFF_POLICY_NOTE,
    AsyncOptions,
    ModePlan,
    best_table_rows,
    plan_best,
    plan_mode,
    pool_splits,
)
from planner.search.space import SearchOptions

TIE = 1e-9  # step ratios within this are ties (the plan then prefers the larger rollout pool)


def split_step(cluster: ClusterSpec) -> int:
    """GPUs between neighbouring splits: a node across nodes, one GPU in a single node."""
    return cluster.gpus_per_node if cluster.num_gpus > cluster.gpus_per_node else 1


def _busy(candidate: dict, pool: str) -> float:
    return candidate["time_s"]["train" if pool == "trainer" else "generate"]


def _pool_words(candidate: dict, pool: str) -> str:
    gpus = candidate["placement"][f"{pool}_gpus"]
    verb = "trains" if pool == "trainer" else "generates"
    return f"the {gpus}-GPU {pool} pool {verb} in {_busy(candidate, pool):.1f} s"


def neighbour_reason(chosen: dict, other: dict) -> str:
    """Words for why the split ``other`` is slower than ``chosen``: its bottleneck pool's busy
    time against the chosen split's same pool, and a parameter sync that changed."""
    ratio = other["step_time_s"] / chosen["step_time_s"]
    if ratio <= 1 + TIE:
        return (f"as fast ({other['step_time_s']:.1f} s per step); the plan prefers the "
                f"larger rollout pool on a tie")
    pool = other["bottleneck"]
    text = (f"{other['step_time_s']:.1f} s per step, {ratio:.2f}x slower: {pool} bound, "
            f"{_pool_words(other, pool)} (the chosen split: {_busy(chosen, pool):.1f} s)")
    sync, chosen_sync = other["time_s"]["param_sync"], chosen["time_s"]["param_sync"]
    if abs(sync - chosen_sync) > 0.05 * chosen["step_time_s"]:
        text += f"; its parameter sync takes {sync:.1f} s ({chosen_sync:.1f} s)"
    return text


def _tried(plan: ModePlan) -> list[int]:
    return list(plan.async_options.trainer_gpus) or pool_splits(plan.cluster)


def neighbours(plan: ModePlan, chosen: dict) -> list[dict]:
    """The splits one step (:func:`split_step`) less and more for the trainer, each with its
    predicted step and a verdict in words."""
    cluster = plan.cluster
    step = split_step(cluster)
    unit = "node" if step > 1 else "GPU"
    by_trainer = {c["placement"]["trainer_gpus"]: c for c in plan.candidates}
    trainer_gpus = chosen["placement"]["trainer_gpus"]
    out = []
    for delta, change in ((-step, f"one {unit} less for the trainer"),
                          (step, f"one {unit} more for the trainer")):
        gpus = trainer_gpus + delta
        entry = {"change": change, "trainer_gpus": gpus, "rollout_gpus": cluster.num_gpus - gpus}
        other = by_trainer.get(gpus)
        if not 0 < gpus < cluster.num_gpus:
            entry["verdict"] = f"no such split: each pool needs at least one {unit}"
        elif gpus not in _tried(plan):
            entry["verdict"] = "not tried (--trainer-gpus leaves it out)"
        elif other is None:
            why = [n.split(": ", 1)[1] for n in plan.notes if n.startswith(f"{gpus} trainer ")]
            entry["verdict"] = f"does not fit: {why[0] if why else 'nothing fits'}"
        else:
            entry.update({"step_time_s": other["step_time_s"],
                          "slower_by": round(other["step_time_s"] / chosen["step_time_s"], 3),
                          "bottleneck": other["bottleneck"], "time_s": other["time_s"],
                          "verdict": neighbour_reason(chosen, other)})
        out.append(entry)
    return out


def explain_split(plan: ModePlan) -> dict:
    """The chosen split of an asynchronous mode's plan, in figures and words."""
    chosen = plan.best
    if chosen is None:
        raise NoFitError(f"no split of {plan.cluster.num_gpus} x {plan.cluster.gpu.name} fits "
                         f"{plan.model.name} in --mode {plan.mode}"
                         + (f" ({'; '.join(plan.notes)})" if plan.notes else ""))
    times, step = chosen["time_s"], chosen["step_time_s"]
    pool = chosen["bottleneck"]
    other = "rollout" if pool == "trainer" else "trainer"
    busy, spare = _busy(chosen, pool), _busy(chosen, other)
    return {
        "mode": plan.mode, "model": plan.model.name, "gpus": plan.cluster.num_gpus,
        "gpu_type": plan.cluster.gpu.name, "chosen": chosen,
        "bottleneck": {"pool": pool, "busy_s": round(busy, 3), "other_pool_busy_s":
                       round(spare, 3), "longer_by": round(busy / spare - 1, 4) if spare else None},
        "idle_fraction": chosen["idle_fraction"],
        "param_sync": {"per_step_s": times["param_sync"],
                       "share_of_step": round(times["param_sync"] / step, 4),
                       "parts_s": chosen["param_sync_s"]},
        "boundary_wait_s": times["boundary_wait"],
        "neighbours": neighbours(plan, chosen),
        "splits_tried": plan.splits_tried, "splits_fit": len(plan.candidates),
        "staleness": chosen["staleness"], "caveat": OFF_POLICY_NOTE,
    }


def explain_mode(request: PlanRequest, mode: str,
                 async_options: AsyncOptions | None = None) -> dict:
    """``explain --mode one-step-off|fully-async`` (the default search, as ``explain``)."""
    if not request.workload.has_rollout:
        raise PlanInputError(f"explain --mode {mode} compares GRPO plans; drop --workload "
                             f"pretrain")
    return explain_split(plan_mode(replace(request, options=SearchOptions()), mode,
                                   async_options or AsyncOptions()))


def explain_best(request: PlanRequest, async_options: AsyncOptions | None = None) -> dict:
    """``explain --mode best``: which mode wins, by how much over sync, and why (its split)."""
    model, cluster = request.model, request.cluster
    if not request.workload.has_rollout:
        raise PlanInputError("explain --mode best compares GRPO plans; drop --workload pretrain")
    plans = plan_best(replace(request, options=SearchOptions()), async_options or AsyncOptions())
    rows = best_table_rows(plans)
    fitting = [row for row in rows if row["best"] is not None]
    if not fitting:
        raise NoFitError(f"no plan of {model.name} fits on {cluster.num_gpus} x "
                         f"{cluster.gpu.name} in any mode; add GPUs or use a larger GPU")
    winner = min(fitting, key=lambda row: row["best"]["step_time_s"])
    sync = next(row["best"] for row in rows if row["mode"] == "sync")
    modes = [{"mode": row["mode"], "fits": row["best"] is not None,
              **({"step_time_s": row["best"]["step_time_s"],
                  "speedup_vs_sync": row["speedup_vs_sync"],
                  "placement": row["best"]["placement"]} if row["best"] else {})}
             for row in rows]
    result = {"mode": "best", "model": model.name, "gpus": cluster.num_gpus,
              "gpu_type": cluster.gpu.name, "winner": winner["mode"],
              "step_time_s": winner["best"]["step_time_s"],
              "speedup_vs_sync": winner["speedup_vs_sync"],
              "sync_step_time_s": sync["step_time_s"] if sync else None, "modes": modes,
              "caveat": OFF_POLICY_NOTE}
    if winner["mode"] != "sync":
        result["split"] = explain_split(next(p for p in plans if p.mode == winner["mode"]))
    return result


# --- text ------------------------------------------------------------------------------------


def _split_lines(result: dict) -> list[str]:
    chosen = result["chosen"]
    placement, times, lay = chosen["placement"], chosen["time_s"], chosen["layout"]
    neck, idle, sync = result["bottleneck"], result["idle_fraction"], result["param_sync"]
    other = "rollout" if neck["pool"] == "trainer" else "trainer"
    lines = [
        f"{result['model']} on {result['gpus']} x {result['gpu_type']}, {result['mode']}: the "
        f"plan splits {placement['trainer_gpus']} trainer + {placement['rollout_gpus']} rollout "
        f"GPUs ({result['splits_fit']} of {result['splits_tried']} splits fit)",
        f"  actor TP{lay['tp']} PP{lay['pp']} CP{lay['cp']} EP{lay['ep']} DP{lay['dp']} "
        f"micro-batch {lay['micro_batch']} on the trainer pool; rollout TP{lay['rollout_tp']} "
        f"DP{lay['rollout_dp']} EP{lay['rollout_ep']} at gpu_memory_utilization "
        f"{lay['gpu_memory_utilization']:.2f} on the rollout pool",
        f"  {chosen['step_time_s']:.1f} s per step: generate {times['generate']:.1f} s and "
        f"train {times['train']:.1f} s overlap, then "
        + (f"a boundary wait of {times['boundary_wait']:.1f} s and " if times["boundary_wait"]
           else "")
        + f"the parameter sync, {sync['per_step_s']:.1f} s ({sync['share_of_step']:.0%} of the "
          f"step: " + ", ".join(f"{part} {seconds:.1f}" for part, seconds
                               in sync["parts_s"].items() if part != "total") + " s)",
        f"  bottleneck: the {neck['pool']} pool, busy {neck['busy_s']:.1f} s against the "
        f"{other} pool's {neck['other_pool_busy_s']:.1f} s"
        + (f" ({neck['longer_by']:.0%} longer)" if neck["longer_by"] is not None else "")
        + f"; idle: trainer {idle['trainer']:.0%}, rollout {idle['rollout']:.0%} of the step",
    ]
    for entry in result["neighbours"]:
        lines.append(f"- {entry['change']} ({entry['trainer_gpus']} trainer + "
                     f"{entry['rollout_gpus']} rollout GPUs): {entry['verdict']}")
    stale = result["staleness"]
    lines.append(f"  staleness: a sample lags the policy by up to {stale['max_versions_behind']} "
                 f"version(s), {stale['stale_sample_fraction']:.0%} of samples are stale")
    return lines


def explain_mode_text(result: dict) -> str:
    """``explain --mode`` (one asynchronous mode or ``best``) as text."""
    if result["mode"] != "best":
        return "\n".join(_split_lines(result) + [f"note: {result['caveat']}"])
    speedup = result["speedup_vs_sync"]
    lines = [f"{result['model']} on {result['gpus']} x {result['gpu_type']}: {result['winner']} "
             f"wins, {result['step_time_s']:.1f} s per step"
             + (f", a {speedup:.2f}x speed-up over sync ({result['sync_step_time_s']:.1f} s)"
                if speedup is not None else " (sync fits no layout)")]
    for entry in result["modes"]:
        if not entry["fits"]:
            lines.append(f"- {entry['mode']}: nothing fits")
            continue
        placement = entry["placement"]
        where = ("colocated on every GPU" if placement.get("colocated") else
                 f"{placement['trainer_gpus']} trainer + {placement['rollout_gpus']} rollout "
                 f"GPUs")
        versus = ("" if entry["speedup_vs_sync"] is None or entry["mode"] == "sync"
                  else f", {entry['speedup_vs_sync']:.2f}x over sync")
        lines.append(f"- {entry['mode']}: {entry['step_time_s']:.1f} s per step, {where}{versus}")
    if "split" in result:
        lines += ["", *_split_lines(result["split"])]
    lines.append(f"note: {result['caveat']}")
    return "\n".join(lines)
