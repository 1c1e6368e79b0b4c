"""``sync``: verl's hybrid engine -- actor, reference and rollout engine take turns on every GPU
(``verl.trainer.main_ppo``).  Its plan is :func:`planner.plan.make_plan`'s, unchanged; its
explanation sets the chosen layout next to the rules of thumb users quote.

The rules of thumb are the ones users quote for Megatron layouts: about 7B -- TP2 x PP2; about
30B -- TP4 x PP4; 100B and more, or MoE -- expert parallelism, TP4 x EP8; always BF16 rather than
FP32 (half the weight and activation memory, tensor-core rate).  On a GPU without BF16 (V100)
the seed guide's decision path for a ~7B dense model joins them: "7B -> 8xV100 -> TP x PP 2x4
-> FP16 -> micro-batch 8" (fixed micro-batches of 8 sequences, FP16 with loss scaling; the
search still picks what the path leaves open: recompute, offload, the rollout layout).  It is
quoted for 8 V100s; on another count it is compared all the same, as the same path scaled by
data parallelism.  For each rule that applies, the best layout obeying it (the planner's own
search with those sizes pinned) is scored, so the comparison is like for like; the reason is
read from the phase times: which phase dominates the step, which phase the plan saves the most
time in (for the actor update, its compute, pipeline bubble and exposed communication), and
whether a slow link is involved.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from planner.cost.request import PlanRequest
from planner.errors import NoFitError, PlanInputError
from planner.modes.base import Launch, TrainingMode
from planner.modes.registry import register
from planner.no_fit import remedy
from planner.output import exact_of, layout_summary_json
from planner.phases import PHASES
from planner.placement import ModePlan
from planner.plan import Estimate, PlanReads, estimate_layout, make_plan
from planner.results import COLOCATED_MODE, ON_POLICY, Staleness
from planner.search.layout import Layout
from planner.search.space import SearchOptions
from planner.units import GIB

if TYPE_CHECKING:
    from planner.verl.export import ExportedJob

RANKS_KEPT = 1000  # ranked layouts a short list's colocated plan keeps for --write --rank


@register
class SyncMode(TrainingMode):
    """Colocated: one plan of layouts (:func:`planner.plan.make_plan`), on-policy."""

    name = COLOCATED_MODE
    summary = "colocated hybrid engine (verl.trainer.main_ppo)"
    colocated = True
    off_policy = False

    def plan(self, request: PlanRequest, top: int | None = None,
             cache: dict | None = None) -> ModePlan:
        if top is None:
            plan = make_plan(request)
        else:
            # a short list (``--mode best``'s best): its first ``top`` ranked layouts, the ties
            # beyond them neither timed nor counted (the counts of layouts stay every
            # layout's); its search space and actor memory are let go before the split modes
            # plan (``job`` plans again for a rank beyond them)
            plan = replace(make_plan(request, reads=PlanReads.best(top)), actors=None)
        return ModePlan(mode=self.name, request=request,
                        candidates=plan.top(top, staleness=self.staleness(), mode=self.name),
                        async_options=self.settings, sync_plan=plan, splits_tried=1)

    def estimate(self, request: PlanRequest, layout: Layout, pin_rollout: bool) -> Estimate:
        """The layout on every GPU; without ``pin_rollout`` the rollout layout (and, when the
        options give none, ``gpu_memory_utilization``) a plan would choose for it."""
        return estimate_layout(request, layout,
                               pick_utilization=request.options.gpu_memory_utilization is None,
                               choose_rollout_layout=not pin_rollout)

    def staleness(self) -> Staleness:
        return ON_POLICY

    def explain(self, request: PlanRequest, plan: ModePlan | None = None) -> dict:
        return explain_layout(request)

    def explain_text(self, report: dict) -> str:
        return explain_text(report)

    def job(self, plan: ModePlan, rank: int, launch: Launch) -> ExportedJob:
        from planner.verl.export import job_from_plan

        layouts = plan.sync_plan
        if layouts.fit_total is not None and rank > layouts.rows < RANKS_KEPT:
            # a short list, and a rank beyond it: the first RANKS_KEPT ranked layouts
            layouts = make_plan(plan.request, reads=PlanReads(keep=RANKS_KEPT))
        return job_from_plan(layouts, rank, model_path=launch.model_path,
                             train_files=launch.train_files, val_files=launch.val_files,
                             extra_overrides=launch.extra_overrides)


# --- explain: the rules of thumb ------------------------------------------------------------


@dataclass(frozen=True)
class RuleOfThumb:
    name: str
    pins: tuple[tuple[str, int], ...]
    applies: str  # when people quote it
    options: tuple[tuple[str, object], ...] = ()  # SearchOptions the rule also fixes


# The seed guide's decision path on V100 (no BF16): TP2 x PP4, FP16, 8 sequences per micro-batch
SEED_V100_PATH = RuleOfThumb(
    "seed guide: 7B -> 8xV100 -> TP x PP 2x4 -> FP16 -> micro-batch 8",
    (("tp", 2), ("pp", 4), ("micro_batch", 8)),
    "dense ~7B models on V100s (no BF16)", (("dynamic_batch", False),))


def rules_of_thumb(model, gpus_per_node: int = 8, gpu=None) -> list[RuleOfThumb]:
    billions = model.params.total / 1e9
    rules = []
    if billions < 20 and not model.is_moe and gpu is not None and not gpu.bf16:
        rules.append(SEED_V100_PATH)
    if billions < 20 and not model.is_moe:
        rules.append(RuleOfThumb("7B: TP2 x PP2", (("tp", 2), ("pp", 2)), "dense models ~7B"))
    if 20 <= billions < 100 and not model.is_moe:
        rules.append(RuleOfThumb("30B: TP4 x PP4", (("tp", 4), ("pp", 4)), "dense ~30B"))
    if billions >= 100 or model.is_moe:
        rules.append(RuleOfThumb("100B+/MoE: TP4 x EP8", (("tp", 4), ("ep", 8)),
                                 "100B+ and MoE models"))
    rules.append(RuleOfThumb(f"TP = GPUs per node ({gpus_per_node})", (("tp", gpus_per_node),),
                             "'fill the node with TP'"))
    return rules


def reason(best: dict, other: dict, recompute: tuple[str, str] = ("none", "none")) -> str:
    """Words for why ``best`` beats ``other``, from their phase times (``recompute``: the two
    layouts' recompute settings, ``other``'s first)."""
    dominant = max(best["time_s"], key=best["time_s"].get)
    share = best["time_s"][dominant] / max(best["step_time_s"], 1e-9)
    savings = {p: other["time_s"][p] - best["time_s"][p] for p in PHASES}
    phase = max(savings, key=savings.get)
    speedup = other["step_time_s"] / max(best["step_time_s"], 1e-9)
    if speedup < 0.99:  # the rule's layout is predicted faster
        if best.get("within_error_of_best"):
            return (f"{1 / speedup:.2f}x slower than this rule's layout by the prediction, "
                    f"within the model's ranking uncertainty: the plan prefers the simpler "
                    f"layout (fewer unwise flags, memory inside the band, fewer offloads and "
                    f"parallel dimensions); {dominant} dominates the step ({share:.0%})")
        return (f"{1 / speedup:.2f}x slower than this rule's layout, whose nvidia-smi peak is "
                f"above the memory band; {dominant} dominates the step ({share:.0%})")
    if speedup < 1.01:
        return (f"about as fast (within 1%); {dominant} dominates the step "
                f"({share:.0%})")
    return (f"{speedup:.2f}x faster: {phase} takes {savings[phase]:.1f} s less "
            f"({other['time_s'][phase]:.1f} -> {best['time_s'][phase]:.1f} s"
            f"{_update_parts(best, other, recompute) if phase == 'update_actor' else ''}); "
            f"{dominant} "
            f"dominates the step ({share:.0%})")


def _update_parts(best: dict, other: dict, recompute: tuple[str, str]) -> str:
    """The actor update's compute, pipeline bubble and exposed communication, the other
    layout's first; a drop in compute names the recompute setting it comes from."""
    parts = [f"{name} {other[key]:.1f} -> {best[key]:.1f} s"
             for name, key in (("compute", "update_compute_s"),
                               ("pipeline bubble", "update_bubble_s"),
                               ("exposed communication", "update_comm_s"))
             if key in best and key in other and abs(other[key] - best[key]) >= 0.5]
    weight = {"none": 0, "selective": 1, "full": 2}  # forward work redone in the backward
    theirs, ours = recompute
    if parts and parts[0].startswith("compute") and other["update_compute_s"] > \
            best["update_compute_s"] and weight.get(theirs, 0) > weight.get(ours, 0):
        parts[0] += f", recompute {theirs} -> {ours}"
    return f": {', '.join(parts)}" if parts else ""


def explain_layout(request: PlanRequest) -> dict:
    """The plan's choice next to the rules of thumb (``request``: its options are ignored --
    the default search, and each rule's pins on it)."""
    model, cluster, workload = request.model, request.cluster, request.workload
    if not workload.has_rollout:
        raise PlanInputError("explain compares GRPO layouts; drop --workload pretrain")
    request = replace(request, options=SearchOptions())
    plan = make_plan(request)
    if not plan.fitting_count:
        raise NoFitError(f"no layout of {model.name} fits on {cluster.num_gpus} x "
                         f"{cluster.gpu.name}; {remedy(plan)}")
    best = plan.candidate(0, fitting=True)
    chosen = layout_summary_json(best)
    comparisons = []
    for rule in rules_of_thumb(model, cluster.gpus_per_node, cluster.gpu):
        pins = rule.pins
        entry = {"rule": rule.name, "applies_to": rule.applies}
        too_big = [f"{k.upper()} {v}" for k, v in pins if v > cluster.num_gpus]
        if too_big:
            entry["verdict"] = (f"not applicable: {', '.join(too_big)} exceeds the "
                                f"{cluster.num_gpus} GPUs")
            comparisons.append(entry)
            continue
        try:
            pinned = make_plan(replace(request, options=SearchOptions(fixed=pins,
                                                                      **dict(rule.options))))
        except PlanInputError as error:
            entry["verdict"] = f"not applicable: {error}"
            comparisons.append(entry)
            continue
        if pinned.candidates.empty:
            entry["verdict"] = "breaks a rule for this model and cluster (" + ", ".join(
                sorted(pinned.rejected, key=pinned.rejected.get, reverse=True)[:2]) + ")"
        elif not pinned.fitting_count:
            closest = pinned.candidate(0)
            entry["verdict"] = (f"does not fit: {closest.memory.peak_bytes / GIB:.1f} GiB peak "
                                f"in {closest.memory.peak_phase}")
        else:
            rule_best = pinned.candidate(0, fitting=True)
            entry = layout_summary_json(rule_best).framed(entry)
            # the verdict is JSON too: it reads the rounded figures
            entry["verdict"] = "plan " + reason(chosen, entry, (rule_best.layout.recompute,
                                                                best.layout.recompute))
        comparisons.append(entry)
    weights = best.memory.breakdown.weights
    half = "BF16" if cluster.gpu.bf16 else "FP16"
    without = "" if cluster.gpu.bf16 else (f"{cluster.gpu.name} has no BF16 tensor cores, so "
                                           f"FP16 with loss scaling takes its place; ")
    precision = {"rule": "BF16, not FP32",
                 "verdict": f"{without}the plan trains in {workload.precision}; FP32 would "
                            f"double weights ({weights * 2 / GIB:.1f} GiB "
                            f"instead of {weights / GIB:.1f} GiB per GPU) "
                            f"and activations, and run off the tensor-core {half} rate"}
    comparisons.append(precision)
    links = []
    if "tp_across_nodes" in best.flags:
        links.append("tensor parallelism crosses nodes: TP collectives run at network speed")
    exposed = best.update_comm_s
    update = best.times.seconds.update_actor
    if update > 0 and exposed / update > 0.15:
        links.append(f"{exposed / update:.0%} of the actor update is exposed communication")
    return {"model": model.name, "gpus": cluster.num_gpus, "gpu_type": cluster.gpu.name,
            "chosen": chosen, "flags": list(best.flags), "links": links,
            "rules_of_thumb": comparisons}


def explain_text(result: dict) -> str:
    """The rules-of-thumb report (:meth:`SyncMode.explain`) as text."""
    chosen = exact_of(result["chosen"])  # one rounding, here: the JSON's are two decimals
    layout = chosen["layout"]
    lines = [f"{result['model']} on {result['gpus']} x {result['gpu_type']}: the plan chooses "
             f"{Layout(**layout).actor_text()}; {Layout(**layout).rollout_text()}"]
    lines.append(f"  {chosen['step_time_s']:.1f} s per step, {chosen['tokens_per_s_per_gpu']:.0f} "
          f"tokens/s/GPU, peak {chosen['peak_memory_gib']:.1f} GiB; phases: "
          + ", ".join(f"{p} {t:.1f} s" for p, t in chosen["time_s"].items()))
    for note in result["links"] + [f"flag: {f}" for f in result["flags"]]:
        lines.append(f"  {note}")
    lines.append("")
    for entry in result["rules_of_thumb"]:
        line = f"- {entry['rule']}: "
        if "step_time_s" in entry:
            verdict, entry = entry["verdict"], exact_of(entry)
            lay = entry["layout"]
            batch = (f" micro-batch {lay['micro_batch']}" if not lay.get("dynamic_batch", True)
                     else "")
            line += (f"best such layout TP{lay['tp']} PP{lay['pp']} EP{lay['ep']} DP{lay['dp']}"
                     f"{batch} -> {entry['step_time_s']:.1f} s, "
                     f"{entry['tokens_per_s_per_gpu']:.0f} tokens/s/GPU, "
                     f"{entry['peak_memory_gib']:.1f} GiB peak, fits; ")
        else:
            verdict = entry["verdict"]
        lines.append(line + verdict)
    return "\n".join(lines)
