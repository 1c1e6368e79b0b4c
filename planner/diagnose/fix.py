"""``plan-parallel fix PATH``: what to change when a verl job will not fit, or wastes memory.

Reads the job as ``validate`` does (launch script, Hydra YAML or overrides).  When its predicted
peak is over the GPU or outside the memory policy's band (:mod:`planner.policy`, 70-85% by
default), it tries the mitigations users reach for, one change at a time, each scored by the
planner's memory and time models:

* over the band (a phase other than generation above the band, or a training phase above the
  tight level): smaller micro-batch (static batches) or token budget (dynamic batches);
  selective, then full recomputation; optimizer offload, Megatron's CPU optimizer, parameter
  (and reference) offload; a lower rollout ``gpu_memory_utilization``; larger TP, PP, EP or CP
  (DP shrinks to keep the world size);
* under the band: the reverse -- larger micro-batch or token budget, less recomputation, less
  offload, the optimizer back on the GPU, a higher ``gpu_memory_utilization``, less model
  parallelism.

Mitigations that break a rule are dropped; the rest are listed cheapest first by predicted step
time, with predicted peak memory, utilisation and the exact Hydra overrides to apply.
``--write DIR`` writes the best one as a runnable job (the planner's export of the fixed layout,
keeping the input's own overrides that the fix does not touch).

``precision`` is not offered: the memory model keeps BF16 weights and FP32 optimizer state for
every precision (FP8 training in Megatron keeps BF16/FP32 copies too), so it would promise
nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from planner.cost.columns import flag_column, memory_column
from planner.diagnose.validate import JobInput, dry_run
from planner.errors import InvalidLayoutError, PlanInputError
from planner.phases import PHASES, TRAINING_PHASES
from planner.plan import candidate_dict, estimate_layout
from planner.policy import DEFAULT_POLICY, MemoryPolicy
from planner.units import GIB
from planner.verl.export import ExportedJob, job_overrides, override_key
from planner.verl.files import write_job
from planner.verl.keys import get

# The rollout engine fills its gpu_memory_utilization budget on purpose, so the band's top
# applies to the other phases (as validate's checks do); under-use looks at the overall peak.


def band_share(row: dict) -> float:
    """Peak of the phases the band applies to, as a fraction of GPU memory."""
    return max(row[memory_column(phase)] for phase in TRAINING_PHASES) / row["peak_bytes"] \
        * row["memory_utilization"]


def over_band(row: dict, policy: MemoryPolicy = DEFAULT_POLICY) -> bool:
    return (not row["fits"]) or band_share(row) > policy.high \
        or bool(row[flag_column("memory_tight")])


def in_band(row: dict, policy: MemoryPolicy = DEFAULT_POLICY) -> bool:
    return not over_band(row, policy) and row["memory_utilization"] >= policy.low


@dataclass(frozen=True)
class Mitigation:
    name: str
    layout: object  # planner.search.layout.Layout
    row: dict  # the cost model's columns for the layout
    overrides: tuple[str, ...]

    @property
    def fits(self) -> bool:
        return bool(self.row["fits"])


def _halvings(value: int) -> list[int]:
    out = []
    while value > 1:
        value //= 2
        out.append(value)
    return out


def _batch_changes(layout, smaller: bool) -> list[tuple[str, object]]:
    """Smaller (larger) micro-batches: with static batches the micro-batch size, with dynamic
    batches the token budgets (``ppo_max_token_len_per_gpu`` and, when set apart, the log-prob
    one); a budget below the longest sequence breaks a rule and is dropped when scored."""
    factors = (0.5, 0.25) if smaller else (2, 4)
    if not layout.dynamic_batch:
        sizes = _halvings(layout.micro_batch) if smaller else \
            [layout.micro_batch * int(f) for f in factors]
        return [(f"micro-batch {layout.micro_batch} -> {mbs}", replace(layout, micro_batch=mbs))
                for mbs in sizes]
    out = []
    for factor in factors:
        budget = int(layout.max_token_len * factor)
        log_prob = int(layout.log_prob_max_token_len * factor)
        out.append((f"token budget {layout.max_token_len} -> {budget} per GPU",
                    replace(layout, max_token_len=budget, log_prob_max_token_len=log_prob)))
    return out


def candidate_changes(layout, model, cluster, over: bool) -> list[tuple[str, object]]:
    """(description, changed layout) for every single change worth scoring."""
    changes = []
    if over:
        changes += _batch_changes(layout, smaller=True)
        for level in ("selective", "full"):
            if ("none", "selective", "full").index(level) > ("none", "selective", "full").index(
                    layout.recompute):
                changes.append((f"recompute {layout.recompute} -> {level}",
                                replace(layout, recompute=level)))
        if not layout.optimizer_offload and layout.optimizer_cpu_fraction < 1:
            changes.append(("optimizer offload", replace(layout, optimizer_offload=True)))
        if layout.optimizer_cpu_fraction < 1 and layout.distributed_optimizer:
            changes.append(("Megatron CPU optimizer (optimizer_offload_fraction 1)",
                            replace(layout, optimizer_cpu_fraction=1.0,
                                    optimizer_offload=False)))
        if not layout.param_offload:
            changes.append(("parameter offload (actor and reference)",
                            replace(layout, param_offload=True, ref_param_offload=True)))
        for step in (0.05, 0.10, 0.15, 0.20, 0.30):
            util = round(layout.gpu_memory_utilization - step, 2)
            if util >= 0.1:
                changes.append((f"gpu_memory_utilization {layout.gpu_memory_utilization} -> "
                                f"{util}", replace(layout, gpu_memory_utilization=util)))
        for field in ("tp", "pp", "cp") + (("ep",) if model.is_moe else ()):
            bigger = getattr(layout, field) * 2
            changed = replace(layout, **{field: bigger})
            if field in ("tp", "pp", "cp"):
                changed = replace(changed, dp=layout.dp // 2 if layout.dp % 2 == 0 else 0)
                if field == "tp":
                    changed = replace(changed, sequence_parallel=True)
            if changed.dp >= 1:
                changes.append((f"{field.upper()} {getattr(layout, field)} -> {bigger}", changed))
    else:
        changes += _batch_changes(layout, smaller=False)
        if layout.recompute != "none":
            changes.append((f"recompute {layout.recompute} -> none",
                            replace(layout, recompute="none")))
        if layout.param_offload or layout.ref_param_offload:
            changes.append(("no parameter offload",
                            replace(layout, param_offload=False, ref_param_offload=False)))
        if layout.optimizer_offload:
            changes.append(("no optimizer offload", replace(layout, optimizer_offload=False)))
        if layout.optimizer_cpu_fraction > 0:
            changes.append(("optimizer on the GPU (no CPU optimizer)",
                            replace(layout, optimizer_cpu_fraction=0.0)))
        for step in (0.05, 0.10, 0.20):
            util = round(layout.gpu_memory_utilization + step, 2)
            if util <= 0.95:
                changes.append((f"gpu_memory_utilization {layout.gpu_memory_utilization} -> "
                                f"{util}", replace(layout, gpu_memory_utilization=util)))
        for field in ("tp", "pp", "cp"):
            value = getattr(layout, field)
            if value > 1 and value % 2 == 0:
                changes.append((f"{field.upper()} {value} -> {value // 2}",
                                replace(layout, **{field: value // 2, "dp": layout.dp * 2},
                                        sequence_parallel=(layout.tp // 2 > 1
                                                           if field == "tp"
                                                           else layout.sequence_parallel))))
    return changes


def score(model, cluster, workload, layout, policy: MemoryPolicy = DEFAULT_POLICY) -> dict | None:
    try:
        return estimate_layout(model, cluster, workload, layout, policy=policy).row
    except (InvalidLayoutError, PlanInputError):
        return None


def layout_overrides(model, cluster, workload, layout, config: dict) -> list[str]:
    return job_overrides(model, cluster, workload, layout,
                         model_path=str(get(config, "actor_rollout_ref.model.path", "")),
                         train_files=str(get(config, "data.train_files", "")),
                         val_files=str(get(config, "data.val_files", "")))


def _single_changes(context, layout, over):
    model, cluster, workload = context["model"], context["cluster"], context["workload"]
    policy = context.get("policy", DEFAULT_POLICY)
    for name, changed in candidate_changes(layout, model, cluster, over):
        row = score(model, cluster, workload, changed, policy)
        if row is not None:
            yield name, changed, row


def greedy_chain(context, layout, row, max_steps: int = 6):
    """Changes applied one after another, each time the one that buys the most memory per
    second of step time, until the job fits below the band's top (or nothing helps)."""
    names = []
    policy = context.get("policy", DEFAULT_POLICY)
    for _ in range(max_steps):
        if not over_band(row, policy):
            break
        best, best_value = None, 0.0
        for name, changed, new in _single_changes(context, layout, over=True):
            saved = row["peak_bytes"] - new["peak_bytes"]
            cost = max(new["step_time_s"] - row["step_time_s"], 0.0) + 1e-3
            if saved > 0 and saved / cost > best_value:
                best, best_value = (name, changed, new), saved / cost
        if best is None:
            return None
        names.append(best[0])
        layout, row = best[1], best[2]
    return (" + ".join(names), layout, row) if row["fits"] and names else None


def mitigations(context: dict) -> tuple[dict, list[Mitigation]]:
    """The job's own prediction and the scored changes, cheapest first.

    Single changes that fit come first (by predicted step time); when none does, the greedy
    chain of changes that makes it fit is offered instead, followed by the single changes that
    help but are not enough alone (``fits`` False).
    """
    model, cluster = context["model"], context["cluster"]
    workload, layout, config = context["workload"], context["layout"], context["config"]
    policy = context.get("policy", DEFAULT_POLICY)
    current = score(model, cluster, workload, layout, policy)
    if current is None:
        raise PlanInputError("the job breaks a layout rule; run `plan-parallel validate` and "
                             "fix those first")
    over = over_band(current, policy)
    before = set(layout_overrides(model, cluster, workload, layout, config))

    def mitigation(name, changed, row):
        after = layout_overrides(model, cluster, workload, changed, config)
        return Mitigation(name, changed, row, tuple(o for o in after if o not in before))

    fitting, partial = [], []
    for name, changed, row in _single_changes(context, layout, over):
        if row["fits"] and not over_band(row, policy):
            fitting.append(mitigation(name, changed, row))
        elif over and row["peak_bytes"] < current["peak_bytes"]:
            partial.append(mitigation(name, changed, row))
    fitting.sort(key=lambda m: (bool(m.row[flag_column("memory_tight")]), m.row["step_time_s"]))
    if fitting or not over:
        return current, fitting
    chain = greedy_chain(context, layout, current)
    partial.sort(key=lambda m: m.row["peak_bytes"])
    return current, ([mitigation(*chain)] if chain else []) + partial


def _summary(row: dict) -> dict:
    return {"fits": bool(row["fits"]), "peak_memory_gib": round(row["peak_bytes"] / GIB, 2),
            "memory_utilization": round(float(row["memory_utilization"]), 4),
            "peak_phase": PHASES[int(row["peak_phase"])],
            "step_time_s": round(float(row["step_time_s"]), 2),
            "tokens_per_s_per_gpu": round(float(row["tokens_per_s_per_gpu"]), 1)}


@dataclass(frozen=True)
class FixResult:
    """What ``fix`` found: the job's prediction, whether it sits in the band, the mitigations
    (cheapest first), and what ``--write`` wrote."""

    data: dict  # the --format json output
    mitigations: tuple[Mitigation, ...]
    context: dict

    @property
    def has_fix(self) -> bool:
        return bool(self.mitigations) and self.mitigations[0].fits


def fix_job(job_input: JobInput, top: int = 8) -> FixResult:
    """Read the job as validate does and score the mitigations."""
    context: dict = {"policy": job_input.policy}
    report = dry_run(job_input, context)
    if "layout" not in context:
        errors = [f["message"] for f in report["findings"] if f.get("level") == "error"]
        raise PlanInputError("cannot read a layout from the job: "
                             + ("; ".join(errors[:2]) or "see `plan-parallel validate`"))
    current, found = mitigations(context)
    data = {"current": _summary(current), "in_band": in_band(current, job_input.policy),
            "band": [job_input.policy.low, job_input.policy.high],
            "mitigations": [{"change": m.name, **_summary(m.row), "overrides": list(m.overrides)}
                            for m in found[:top]]}
    return FixResult(data=data, mitigations=tuple(found), context=context)


def write_fix(result: FixResult, directory: Path, force: bool = False) -> list[Path]:
    """The best mitigation as a runnable job (the planner's export of the fixed layout, with
    the input's own overrides that the fix does not touch)."""
    best = result.mitigations[0]
    context = result.context
    config = context["config"]
    fixed_keys = {override_key(o) for o in layout_overrides(
        context["model"], context["cluster"], context["workload"], best.layout, config)}
    kept = tuple(o for o in context["overrides"] if override_key(o) not in fixed_keys)
    job = ExportedJob(model=context["model"], cluster=context["cluster"],
                      workload=context["workload"], layout=best.layout,
                      prediction=candidate_dict(best.row),
                      model_path=get(config, "actor_rollout_ref.model.path", None),
                      train_files=get(config, "data.train_files", None),
                      val_files=get(config, "data.val_files", None), extra=kept)
    return write_job(job, directory, force)


def fix_text(result: FixResult, policy: MemoryPolicy = DEFAULT_POLICY) -> str:
    data = result.data
    now = data["current"]
    lines = [f"now: peak {now['peak_memory_gib']:.1f} GiB ({100 * now['memory_utilization']:.0f}%)"
             f" in {now['peak_phase']}, {'fits' if now['fits'] else 'does NOT fit'}, "
             f"{now['step_time_s']:.1f} s per step, {now['tokens_per_s_per_gpu']:.0f} "
             f"tokens/s/GPU"]
    if data["in_band"]:
        lines.append(f"within the {policy.band_text} band: nothing to fix")
        return "\n".join(lines)
    if not result.has_fix:
        lines.append("no change or chain of changes makes it fit; try `plan-parallel --model ... "
                     "--gpus ...` for a new layout")
        return "\n".join(lines)
    lines.append("mitigations, cheapest first (predicted):")
    for i, m in enumerate(data["mitigations"], 1):
        alone = "" if m["fits"] else " [not enough alone]"
        lines.append(f"{i:>2}. {m['change']}{alone}: peak {m['peak_memory_gib']:.1f} GiB "
                     f"({100 * m['memory_utilization']:.0f}%, {m['peak_phase']}), "
                     f"{m['step_time_s']:.1f} s per step, {m['tokens_per_s_per_gpu']:.0f} "
                     f"tokens/s/GPU")
        lines += [f"      {override}" for override in m["overrides"]]
    return "\n".join(lines)
