"""``plan-parallel explain``: the chosen layout next to the rules of thumb, and why it differs.

The rules of thumb are the ones users quote for Megatron layouts: about 7B — TP2 x PP2; about
30B — TP4 x PP4; 100B and more, or MoE — expert parallelism, TP4 x EP8; always BF16 rather than
FP32 (half the weight and activation memory, tensor-core rate).  On a GPU without BF16 (V100)
the seed guide's decision path for a ~7B dense model joins them: "7B -> 8xV100 -> TP x PP 2x4
-> FP16 -> micro-batch 8" (fixed micro-batches of 8 sequences, FP16 with loss scaling; the
search still picks what the path leaves open: recompute, offload, the rollout layout).  It is
quoted for 8 V100s; on another count it is compared all the same, as the same path scaled by
data parallelism.  For each rule that applies, the
best layout obeying it (the planner's own search with those sizes pinned) is scored, so the
comparison is like for like; the reason is read from the phase times: which phase dominates the
step, which phase the plan saves the most time in, and whether a slow link is involved.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.columns import breakdown_column, time_column
from planner.errors import NoFitError, PlanInputError
from planner.phases import PHASES
from planner.plan import make_plan
from planner.policy import DEFAULT_POLICY, MemoryPolicy
from planner.search.layout import Layout
from planner.search.space import SearchOptions
from planner.units import GIB


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


def _summary(row) -> dict:
    return {"layout": Layout.from_row(row).to_dict(),
            "step_time_s": round(float(row["step_time_s"]), 2),
            "tokens_per_s_per_gpu": round(float(row["tokens_per_s_per_gpu"]), 1),
            "peak_memory_gib": round(float(row["peak_bytes"]) / GIB, 1),
            "time_s": {p: round(float(row[time_column(p)]), 2) for p in PHASES},
            "update_compute_s": round(float(row.get(breakdown_column("update_actor", "compute_s"),
                                                    0.0)), 2),
            "update_bubble_s": round(float(row.get("update_bubble_s", 0.0)), 2),
            "update_comm_s": round(float(row.get("update_comm_s", 0.0)), 2),
            "within_error_of_best": bool(row.get("within_error_of_best", False))}


def reason(best: dict, other: dict) -> str:
    """Words for why ``best`` beats ``other``, from their phase times."""
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
            f"{_update_parts(best, other) if phase == 'update_actor' else ''}); {dominant} "
            f"dominates the step ({share:.0%})")


def _update_parts(best: dict, other: dict) -> str:
    """The actor update's pipeline bubble and exposed communication, the other layout's first."""
    parts = [f"{name} {other[key]:.1f} -> {best[key]:.1f} s"
             for name, key in (("compute", "update_compute_s"),
                               ("pipeline bubble", "update_bubble_s"),
                               ("exposed communication", "update_comm_s"))
             if key in best and key in other and abs(other[key] - best[key]) >= 0.5]
    weight = {"none": 0, "selective": 1, "full": 2}  # forward work redone in the backward
    theirs, ours = other["layout"].get("recompute"), best["layout"].get("recompute")
    if parts and parts[0].startswith("compute") and other["update_compute_s"] > \
            best["update_compute_s"] and weight.get(theirs, 0) > weight.get(ours, 0):
        parts[0] += f", recompute {theirs} -> {ours}"
    return f": {', '.join(parts)}" if parts else ""


def explain(model, cluster, workload, calibration=None,
            policy: MemoryPolicy = DEFAULT_POLICY) -> dict:
    if workload.kind != "grpo":
        raise PlanInputError("explain compares GRPO layouts; drop --workload pretrain")
    plan = make_plan(model, cluster, workload, SearchOptions(), calibration, policy)
    fitting = plan.candidates[plan.candidates["fits"]]
    if fitting.empty:
        raise NoFitError(f"no layout of {model.name} fits on {cluster.num_gpus} x "
                             f"{cluster.gpu.name}; add GPUs or use a larger GPU")
    chosen_row = fitting.iloc[0]
    chosen = _summary(chosen_row)
    flags = [c[5:] for c in fitting.columns if c.startswith("flag_") and bool(chosen_row[c])]
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
            pinned = make_plan(model, cluster, workload,
                               SearchOptions(fixed=pins, **dict(rule.options)), calibration,
                               policy)
        except PlanInputError as error:
            entry["verdict"] = f"not applicable: {error}"
            comparisons.append(entry)
            continue
        fits = pinned.candidates[pinned.candidates["fits"]]
        if pinned.candidates.empty:
            entry["verdict"] = "breaks a rule for this model and cluster (" + ", ".join(
                sorted(pinned.rejected, key=pinned.rejected.get, reverse=True)[:2]) + ")"
        elif fits.empty:
            closest = pinned.candidates.iloc[0]
            entry["verdict"] = (f"does not fit: {closest['peak_bytes'] / GIB:.1f} GiB peak in "
                                f"{closest['peak_phase']}")
        else:
            entry.update(_summary(fits.iloc[0]))
            entry["verdict"] = "plan " + reason(chosen, entry)
        comparisons.append(entry)
    half = "BF16" if cluster.gpu.bf16 else "FP16"
    without = "" if cluster.gpu.bf16 else (f"{cluster.gpu.name} has no BF16 tensor cores, so "
                                           f"FP16 with loss scaling takes its place; ")
    precision = {"rule": "BF16, not FP32",
                 "verdict": f"{without}the plan trains in {workload.precision}; FP32 would "
                            f"double weights ({chosen_row['weights_bytes'] * 2 / GIB:.1f} GiB "
                            f"instead of {chosen_row['weights_bytes'] / GIB:.1f} GiB per GPU) "
                            f"and activations, and run off the tensor-core {half} rate"}
    comparisons.append(precision)
    links = []
    if chosen_row["flag_tp_across_nodes"]:
        links.append("tensor parallelism crosses nodes: TP collectives run at network speed")
    exposed = float(chosen_row["update_comm_s"])
    update = float(chosen_row["time_update_actor_s"])
    if update > 0 and exposed / update > 0.15:
        links.append(f"{exposed / update:.0%} of the actor update is exposed communication")
    return {"model": model.name, "gpus": cluster.num_gpus, "gpu_type": cluster.gpu.name,
            "chosen": chosen, "flags": flags, "links": links, "rules_of_thumb": comparisons}


def explain_text(result: dict) -> str:
    chosen = result["chosen"]
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
            lay = entry["layout"]
            batch = (f" micro-batch {lay['micro_batch']}" if not lay.get("dynamic_batch", True)
                     else "")
            line += (f"best such layout TP{lay['tp']} PP{lay['pp']} EP{lay['ep']} DP{lay['dp']}"
                     f"{batch} -> {entry['step_time_s']:.1f} s, "
                     f"{entry['tokens_per_s_per_gpu']:.0f} tokens/s/GPU, "
                     f"{entry['peak_memory_gib']:.1f} GiB peak, fits; ")
        lines.append(line + entry["verdict"])
    return "\n".join(lines)
