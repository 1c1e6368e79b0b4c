"""``plan-parallel fix PATH``: what to change when a verl job will not fit, or sits outside the
memory band.

Reads the job as ``validate`` does (launch script, Hydra YAML or overrides) and judges the same
quantity against the same band: the job's nvidia-smi peak (:data:`planner.policy.PEAK_NAME`:
reserved memory, vLLM's whole ``gpu_memory_utilization`` pool and the state resident during
rollout included) against the memory policy's band (:mod:`planner.policy`, 70-85% by
default).  Outside it, it tries the mitigations users reach for, one change at a time, each
scored by the planner's memory and time models:

* over the band (or not fitting): a lower rollout ``gpu_memory_utilization``; offloading what
  stays resident during rollout (reference, optimizer, parameters); Megatron's CPU optimizer;
  smaller micro-batch (static batches) or token budget (dynamic batches); selective, then full
  recomputation; larger TP, PP, EP or CP (DP shrinks to keep the world size);
* under the band: the reverse -- larger micro-batch or token budget, less recomputation, less
  offload, the optimizer back on the GPU, a higher ``gpu_memory_utilization``, less model
  parallelism.

A change is listed only when it moves the judged peak in the needed direction (by at least
:data:`MIN_MOVE_BYTES`): recompute never appears for a peak set by the rollout pool.  When the
pool sets the peak, the changes that shrink it or what stays resident beside it come first, each
with its predicted generation time; otherwise changes are cheapest first by predicted step time.
Mitigations that break a rule are dropped.  ``--write DIR`` writes the best one as a runnable job
(the planner's export of the fixed layout, keeping the input's own overrides that the fix does
not touch).

``precision`` is not offered: the memory model keeps BF16 weights and FP32 optimizer state for
every precision (FP8 training in Megatron keeps BF16/FP32 copies too), so it would promise
nothing.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

from planner.cost.request import PlanRequest
from planner.diagnose.validate import JobContext, JobInput, dry_run
from planner.errors import InvalidLayoutError, PlanInputError
from planner.output import colocated_json, exact_of, fix_summary_json
from planner.plan import estimate_layout
from planner.policy import DEFAULT_POLICY, PEAK_NAME, WORKING_SET_NAME, MemoryPolicy
from planner.results import ColocatedCandidate
from planner.units import GIB
from planner.verl.export import ExportedJob, job_overrides, override_key
from planner.verl.files import write_job
from planner.verl.keys import get

# A change that moves the judged peak by less than this is not a mitigation: it would print as
# "88.7 GiB -> 88.7 GiB".
MIN_MOVE_BYTES = 0.1 * GIB
# Changes aimed at the rollout pool and at what stays resident beside it during generation.
ROLLOUT_KINDS = ("rollout", "offload")


def _step(c: ColocatedCandidate) -> float:
    """The predicted step in seconds (inf: the layout cannot run)."""
    return math.inf if c.step_time_s is None else c.step_time_s


def over_band(c: ColocatedCandidate, policy: MemoryPolicy = DEFAULT_POLICY) -> bool:
    """Does not fit, or its nvidia-smi peak is above the band."""
    return (not c.fits) or policy.position(c.memory.utilization) == "above"


def in_band(c: ColocatedCandidate, policy: MemoryPolicy = DEFAULT_POLICY) -> bool:
    return c.fits and policy.position(c.memory.utilization) == "inside"


def moves_peak(c: ColocatedCandidate, current: ColocatedCandidate, over: bool) -> bool:
    """The change moves the judged peak (nvidia-smi) the needed way: down when over the band,
    up when under it."""
    moved = current.memory.peak_bytes - c.memory.peak_bytes if over \
        else c.memory.peak_bytes - current.memory.peak_bytes
    return moved >= MIN_MOVE_BYTES


@dataclass(frozen=True)
class Mitigation:
    name: str
    layout: object  # planner.search.layout.Layout
    candidate: ColocatedCandidate  # the layout's prediction
    overrides: tuple[str, ...]
    kind: str = "layout"  # rollout, offload, batch, recompute, parallel, or a chain

    @property
    def fits(self) -> bool:
        return self.candidate.fits


def _halvings(value: int) -> list[int]:
    out = []
    while value > 1:
        value //= 2
        out.append(value)
    return out


def _batch_changes(layout, smaller: bool) -> list[tuple[str, object, str]]:
    """Smaller (larger) micro-batches: with static batches the micro-batch size, with dynamic
    batches the token budgets (``ppo_max_token_len_per_gpu`` and, when set apart, the log-prob
    one); a budget below the longest sequence breaks a rule and is dropped when scored."""
    factors = (0.5, 0.25) if smaller else (2, 4)
    if not layout.dynamic_batch:
        sizes = _halvings(layout.micro_batch) if smaller else \
            [layout.micro_batch * int(f) for f in factors]
        return [(f"micro-batch {layout.micro_batch} -> {mbs}", replace(layout, micro_batch=mbs),
                 "batch") for mbs in sizes]
    out = []
    for factor in factors:
        budget = int(layout.max_token_len * factor)
        log_prob = int(layout.log_prob_max_token_len * factor)
        out.append((f"token budget {layout.max_token_len} -> {budget} per GPU",
                    replace(layout, max_token_len=budget, log_prob_max_token_len=log_prob),
                    "batch"))
    return out


def _utilization_changes(layout, steps, sign: int) -> list[tuple[str, object, str]]:
    out = []
    for step in steps:
        util = round(layout.gpu_memory_utilization + sign * step, 2)
        if 0.1 <= util <= 0.95:
            out.append((f"gpu_memory_utilization {layout.gpu_memory_utilization} -> {util}",
                        replace(layout, gpu_memory_utilization=util), "rollout"))
    return out


def candidate_changes(layout, model, cluster, over: bool,
                      needs_reference: bool = True) -> list[tuple[str, object, str]]:
    """(description, changed layout, kind) for every single change worth scoring."""
    changes = []
    if over:
        # every 0.05 step down to 0.10: the listing keeps the highest that is enough
        changes += _utilization_changes(layout, [0.05 * k for k in range(1, 18)], -1)
        if needs_reference and not layout.ref_param_offload:
            changes.append(("reference offload", replace(layout, ref_param_offload=True),
                            "offload"))
        if not layout.optimizer_offload and layout.optimizer_cpu_fraction < 1:
            changes.append(("optimizer offload", replace(layout, optimizer_offload=True),
                            "offload"))
        if not layout.param_offload:
            changes.append(("parameter offload (actor and reference)",
                            replace(layout, param_offload=True, ref_param_offload=True),
                            "offload"))
        if layout.optimizer_cpu_fraction < 1 and layout.distributed_optimizer:
            changes.append(("Megatron CPU optimizer (optimizer_offload_fraction 1)",
                            replace(layout, optimizer_cpu_fraction=1.0,
                                    optimizer_offload=False), "offload"))
        changes += _batch_changes(layout, smaller=True)
        for level in ("selective", "full"):
            if ("none", "selective", "full").index(level) > ("none", "selective", "full").index(
                    layout.recompute):
                changes.append((f"recompute {layout.recompute} -> {level}",
                                replace(layout, recompute=level), "recompute"))
        for field in ("tp", "pp", "cp") + (("ep",) if model.is_moe else ()):
            bigger = getattr(layout, field) * 2
            if field == "ep":
                changed = replace(layout, ep=bigger)
            elif layout.dp % 2:  # the GPUs come from DP: an odd DP (DP 1) has none to give
                continue
            else:
                changed = replace(layout, **{field: bigger}, dp=layout.dp // 2,
                                  sequence_parallel=(True if field == "tp"
                                                     else layout.sequence_parallel))
            changes.append((f"{field.upper()} {getattr(layout, field)} -> {bigger}", changed,
                            "parallel"))
    else:
        changes += _batch_changes(layout, smaller=False)
        if layout.recompute != "none":
            changes.append((f"recompute {layout.recompute} -> none",
                            replace(layout, recompute="none"), "recompute"))
        if layout.param_offload or layout.ref_param_offload:
            changes.append(("no parameter offload",
                            replace(layout, param_offload=False, ref_param_offload=False),
                            "offload"))
        if layout.optimizer_offload:
            changes.append(("no optimizer offload", replace(layout, optimizer_offload=False),
                            "offload"))
        if layout.optimizer_cpu_fraction > 0:
            changes.append(("optimizer on the GPU (no CPU optimizer)",
                            replace(layout, optimizer_cpu_fraction=0.0), "offload"))
        changes += _utilization_changes(layout, (0.05, 0.10, 0.20), +1)
        for field in ("tp", "pp", "cp"):
            value = getattr(layout, field)
            if value > 1 and value % 2 == 0:
                changes.append((f"{field.upper()} {value} -> {value // 2}",
                                replace(layout, **{field: value // 2, "dp": layout.dp * 2},
                                        sequence_parallel=(layout.tp // 2 > 1
                                                           if field == "tp"
                                                           else layout.sequence_parallel)),
                                "parallel"))
    return changes


def score(request: PlanRequest, layout) -> ColocatedCandidate | None:
    """The layout's prediction, None when it breaks a rule."""
    try:
        return estimate_layout(request, layout).candidate
    except (InvalidLayoutError, PlanInputError):
        return None


def layout_overrides(job: JobContext, layout) -> list[str]:
    """The planner's overrides of ``layout`` for the job read (its paths kept)."""
    config = job.config
    return job_overrides(job.model, job.cluster, job.workload, layout,
                         model_path=str(get(config, "actor_rollout_ref.model.path", "")),
                         train_files=str(get(config, "data.train_files", "")),
                         val_files=str(get(config, "data.val_files", "")))


def _single_changes(request: PlanRequest, layout, over: bool):
    model, cluster = request.model, request.cluster
    for name, changed, kind in candidate_changes(layout, model, cluster, over,
                                                 request.workload.needs_reference):
        scored = score(request, changed)
        if scored is not None:
            yield name, changed, scored, kind


def greedy_chain(request: PlanRequest, layout, current: ColocatedCandidate,
                 max_steps: int = 6):
    """Changes applied one after another, each time the one that buys the most memory per
    second of step time, until the job fits below the band's top (or nothing helps)."""
    names = []
    for _ in range(max_steps):
        if not over_band(current, request.policy):
            break
        best, best_value = None, 0.0
        for name, changed, new, _ in _single_changes(request, layout, over=True):
            saved = current.memory.peak_bytes - new.memory.peak_bytes
            cost = max(_step(new) - _step(current), 0.0) + 1e-3
            if saved >= MIN_MOVE_BYTES and saved / cost > best_value:
                best, best_value = (name, changed, new), saved / cost
        if best is None:
            return None
        names.append(best[0])
        layout, current = best[1], best[2]
    return (chain_name(names), layout, current) if current.fits and names else None


# "micro-batch 16 -> 8", "token budget 8192 -> 4096 per GPU": a setting, its old and new value
_CHANGE = re.compile(r"(?P<what>.+?) (?P<old>\S+) -> (?P<new>\S+)(?P<rest>.*)")


def chain_name(names: list[str]) -> str:
    """A chain's changes in words, joined by ``+``; a setting the chain changes twice reads as
    one change from its first value to its last (``micro-batch 16 -> 8`` then ``8 -> 4``:
    ``micro-batch 16 -> 4``), in the place of its first step."""
    out: list[str] = []
    for name in names:
        step = _CHANGE.fullmatch(name)
        for i, done in enumerate(out):
            before = _CHANGE.fullmatch(done)
            if step and before and before["new"] == step["old"] and \
                    (before["what"], before["rest"]) == (step["what"], step["rest"]):
                out[i] = f"{step['what']} {before['old']} -> {step['new']}{step['rest']}"
                break
        else:
            out.append(name)
    return " + ".join(out)


def mitigations(job: JobContext, policy: MemoryPolicy = DEFAULT_POLICY
                ) -> tuple[ColocatedCandidate, list[Mitigation]]:
    """The job's own prediction and the scored changes, best first.

    Only changes that move the nvidia-smi peak the needed way are kept (:func:`moves_peak`).
    Single changes that bring it into the band come first: when the rollout pool sets the
    peak, those aimed at the pool and at what stays resident beside it (kinds
    :data:`ROLLOUT_KINDS`) lead; then by predicted step time.  When none is enough, the
    greedy chain of changes that is comes first, followed by the single changes that help but
    are not enough alone (``fits`` False).
    """
    request, layout = job.request(policy), job.layout
    current = score(request, layout)
    if current is None:
        raise PlanInputError("the job breaks a layout rule; run `plan-parallel validate` and "
                             "fix those first")
    if in_band(current, policy):
        return current, []
    over = over_band(current, policy)
    before = set(layout_overrides(job, layout))
    pool_peak = current.memory.peak_phase == "generate"

    def mitigation(name, changed, scored, kind):
        after = layout_overrides(job, changed)
        return Mitigation(name, changed, scored, tuple(o for o in after if o not in before),
                          kind)

    fitting, partial = [], []
    for name, changed, scored, kind in _single_changes(request, layout, over):
        if not moves_peak(scored, current, over):
            continue
        if scored.fits and not over_band(scored, policy):
            fitting.append(mitigation(name, changed, scored, kind))
        elif over:
            partial.append(mitigation(name, changed, scored, kind))
    # Of the gpu_memory_utilization steps keep one: the highest that is enough (the least KV
    # cache given up), or of those that are not, the one that moves the peak most.
    fitting = _one_pool_step(fitting, max)
    partial = _one_pool_step(partial, min) if over else partial
    fitting.sort(key=lambda m: (over and pool_peak and m.kind not in ROLLOUT_KINDS,
                                _step(m.candidate)))
    if fitting or not over:
        return current, fitting
    chain = greedy_chain(request, layout, current)
    partial.sort(key=lambda m: m.candidate.memory.peak_bytes)
    return current, ([mitigation(*chain, "chain")] if chain else []) + partial


def _one_pool_step(found: list[Mitigation], pick) -> list[Mitigation]:
    """``found`` with only one ``gpu_memory_utilization`` change: ``pick`` (max or min) by the
    utilization it sets."""
    steps = [m for m in found if m.kind == "rollout"]
    if len(steps) <= 1:
        return found
    keep = pick(steps, key=lambda m: m.layout.gpu_memory_utilization)
    return [m for m in found if m.kind != "rollout" or m is keep]


@dataclass(frozen=True)
class FixResult:
    """What ``fix`` found: the job's prediction, whether it sits in the band, the mitigations
    (cheapest first), and what ``--write`` wrote."""

    data: dict  # the --format json output
    mitigations: tuple[Mitigation, ...]
    job: JobContext  # what the dry run read
    report: dict | None = None  # validate's report of the same job (planner.diagnose.validate)

    @property
    def has_fix(self) -> bool:
        return bool(self.mitigations) and self.mitigations[0].fits


def fix_job(job_input: JobInput, top: int = 8) -> FixResult:
    """Read the job as validate does and score the mitigations."""
    run = dry_run(job_input)
    report = run.report
    if run.job is None:
        errors = [f["message"] for f in report["findings"] if f.get("level") == "error"]
        raise PlanInputError("cannot read a layout from the job: "
                             + ("; ".join(errors[:2]) or "see `plan-parallel validate`"))
    policy = job_input.policy
    current, found = mitigations(run.job, policy)
    data = {"judges": PEAK_NAME, "band": [policy.low, policy.high],
            "current": fix_summary_json(current, policy), "in_band": in_band(current, policy),
            "mitigations": [fix_summary_json(m.candidate, policy).framed(
                {"change": m.name, "kind": m.kind}, {"overrides": list(m.overrides)})
                for m in found[:top]]}
    return FixResult(data=data, mitigations=tuple(found), job=run.job, report=report)


def write_fix(result: FixResult, directory: Path, force: bool = False) -> list[Path]:
    """The best mitigation as a runnable job (the planner's export of the fixed layout, with
    the input's own overrides that the fix does not touch)."""
    best, read = result.mitigations[0], result.job
    config = read.config
    fixed_keys = {override_key(o) for o in layout_overrides(read, best.layout)}
    kept = tuple(o for o in read.overrides if override_key(o) not in fixed_keys)
    job = ExportedJob(model=read.model, cluster=read.cluster, workload=read.workload,
                      layout=best.layout, prediction=colocated_json(best.candidate),
                      model_path=get(config, "actor_rollout_ref.model.path", None),
                      train_files=get(config, "data.train_files", None),
                      val_files=get(config, "data.val_files", None), extra=kept)
    return write_job(job, directory, force)


def fix_text(result: FixResult, policy: MemoryPolicy = DEFAULT_POLICY) -> str:
    """``fix`` as text: the figures unrounded (``exact``), rounded once at the text's precision
    (the JSON's are two decimals)."""
    data = result.data
    now = exact_of(data["current"])
    lines = [f"now: {PEAK_NAME} {now['peak_memory_gib']:.1f} GiB "
             f"({100 * now['memory_utilization']:.0f}%, {now['band_position']} the "
             f"{policy.band_text} band) in {now['peak_phase']}, {WORKING_SET_NAME} "
             f"{now['working_set_gib']:.1f} GiB; {'fits' if now['fits'] else 'does NOT fit'}, "
             f"generate {now['generate_s']:.1f} s, {now['step_time_s']:.1f} s per step, "
             f"{now['tokens_per_s_per_gpu']:.0f} tokens/s/GPU"]
    if data["in_band"]:
        lines.append(f"the {PEAK_NAME} is within the {policy.band_text} band: nothing to fix")
        return "\n".join(lines)
    if not data["mitigations"] or not result.has_fix:
        lines.append("no change or chain of changes brings it into the band; try "
                     "`plan-parallel --model ... --gpus ...` for a new layout")
        if not data["mitigations"]:
            return "\n".join(lines)
    direction = "lower" if now["band_position"] != "below" or not now["fits"] else "raise"
    lines.append(f"mitigations that {direction} the {PEAK_NAME}, best first (predicted):")
    for i, m in enumerate(map(exact_of, data["mitigations"]), 1):
        alone = "" if m["fits"] else " [not enough alone]"
        generate = f"generate {now['generate_s']:.1f} -> {m['generate_s']:.1f} s"
        lines.append(f"{i:>2}. {m['change']}{alone}: {PEAK_NAME} {now['peak_memory_gib']:.1f} -> "
                     f"{m['peak_memory_gib']:.1f} GiB ({100 * m['memory_utilization']:.0f}%, "
                     f"{m['peak_phase']}), {generate}, {m['step_time_s']:.1f} s per step, "
                     f"{m['tokens_per_s_per_gpu']:.0f} tokens/s/GPU")
        lines += [f"      {override}" for override in m["overrides"]]
    return "\n".join(lines)
