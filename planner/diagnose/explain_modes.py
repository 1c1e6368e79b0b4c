"""``plan-parallel explain --mode best``: the training mode that wins, in words.

(``--mode M`` is the mode's own explanation, :meth:`planner.modes.TrainingMode.explain`: the
colocated layout next to the rules of thumb, or the chosen split of separate pools.)  ``best``:
the mode that wins, its speed-up over the baseline (``sync``) and the other modes' steps, the
winner's own explanation when it is not the baseline, and the off-policy caveat.
"""

from __future__ import annotations

from dataclasses import replace

from planner.cost.request import PlanRequest
from planner.errors import NoFitError, PlanInputError
from planner.modes import all_modes, get_mode, off_policy_note, plan_all
from planner.no_fit import modes_remedy
from planner.output import Summary, exact_of, mode_bests, placement_json, reported_step
from planner.placement import AsyncOptions
from planner.search.space import SearchOptions


def explain_best(request: PlanRequest, async_options: AsyncOptions | None = None) -> dict:
    """``explain --mode best``: which mode wins, by how much over sync, and why."""
    model, cluster = request.model, request.cluster
    if not request.workload.has_rollout:
        raise PlanInputError("explain --mode best compares GRPO plans; drop --workload pretrain")
    settings = async_options or AsyncOptions()
    plans = plan_all(replace(request, options=SearchOptions()), settings, every_split=True)
    rows = mode_bests(plans)
    fitting = [row for row in rows if row[1] is not None]
    if not fitting:
        raise NoFitError(f"no plan of {model.name} fits on {cluster.num_gpus} x "
                         f"{cluster.gpu.name} in any mode; {modes_remedy(plans)}")
    winner_plan, winner, speedup = min(fitting, key=lambda row: reported_step(row[1]))
    baseline = rows[0][1]
    modes = [_mode_entry(plan.mode, best, gain) for plan, best, gain in rows]
    shown = {"mode": "best", "model": model.name, "gpus": cluster.num_gpus,
             "gpu_type": cluster.gpu.name, "winner": winner_plan.mode,
             "step_time_s": reported_step(winner), "speedup_vs_sync": speedup,
             "sync_step_time_s": None if baseline is None else reported_step(baseline),
             "modes": modes, "caveat": off_policy_note()}
    # the text rounds the exact step times once (the JSON's have three decimals)
    result = Summary(shown, {**shown, "step_time_s": float(winner.step_time_s),
                             "sync_step_time_s": None if shown["sync_step_time_s"] is None
                             else float(baseline.step_time_s)})
    if winner_plan is not plans[0]:
        result["split"] = get_mode(winner_plan.mode, settings).explain(request, winner_plan)
    return result


def _mode_entry(mode: str, best, gain: float | None) -> dict:
    """One mode of ``explain --mode best``: its best plan's step time (the JSON's three
    decimals; ``exact`` unrounded, for the text) and placement."""
    if best is None:
        return {"mode": mode, "fits": False}
    shown = {"mode": mode, "fits": True, "step_time_s": reported_step(best),
             "speedup_vs_sync": gain, "placement": placement_json(best.placement)}
    return Summary(shown, {**shown, "step_time_s": float(best.step_time_s)})


def explain_best_text(result: dict) -> str:
    """``explain --mode best`` as text, each step time rounded once from its exact value."""
    split = result.get("split")
    result = exact_of(result)
    speedup = result["speedup_vs_sync"]
    baseline = all_modes()[0].name
    if result["winner"] == baseline:  # no speed-up of the baseline over itself
        versus = "; no other mode is faster"
    elif speedup is not None:
        versus = (f", a {speedup:.2f}x speed-up over {baseline} "
                  f"({result['sync_step_time_s']:.1f} s)")
    else:
        versus = f" ({baseline} fits no layout)"
    lines = [f"{result['model']} on {result['gpus']} x {result['gpu_type']}: {result['winner']} "
             f"wins, {result['step_time_s']:.1f} s per step{versus}"]
    for entry in result["modes"]:
        if not entry["fits"]:
            lines.append(f"- {entry['mode']}: nothing fits")
            continue
        placement = entry["placement"]
        where = ("colocated on every GPU" if placement.get("colocated") else
                 f"{placement['trainer_gpus']} trainer + {placement['rollout_gpus']} rollout "
                 f"GPUs")
        versus = ("" if entry["speedup_vs_sync"] is None or entry["mode"] == baseline
                  else f", {entry['speedup_vs_sync']:.2f}x over {baseline}")
        lines.append(f"- {entry['mode']}: {exact_of(entry)['step_time_s']:.1f} s per step, "
                     f"{where}{versus}")
    if split is not None:
        winner_text = get_mode(result["winner"]).explain_text(split)
        lines += ["", *winner_text.split("\n")[:-1]]  # its own caveat line: the one below
    lines.append(f"note: {result['caveat']}")
    return "\n".join(lines)
