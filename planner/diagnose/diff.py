"""``plan-parallel diff A B``: what changes between two verl jobs, how risky it is, and what it
does to memory and throughput.

Both jobs are read as ``validate`` reads them (composed with verl's own config), so a setting
that only moves between the script and the YAML is not a change.  Every changed key gets a risk
from what it touches:

* high — parallel sizes (TP, PP, VPP, CP, EP, ETP, the stage split): the global architecture of
  the job; checkpoints saved under one layout need resharding to load under another;
* medium — per-GPU load and batch shape (micro-batches, token budgets, mini/train batch, n,
  lengths, rollout memory fraction): memory and optimisation dynamics (the rollout TP counts as
  a parallel size: high);
* low — recomputation and offload (speed and memory only), KL/entropy/clip settings (algorithm
  stability), logging and naming.

A safe range is given where the planner knows one (divisors the rules allow, the 0.3-0.9
rollout memory band); predicted peak memory and throughput come from the planner's models.
"""

from __future__ import annotations

import re
from dataclasses import replace

from planner.diagnose.validate import JobContext, JobInput, dry_run
from planner.errors import PlanInputError
from planner.output import Summary, exact_of

RISKS = (
    # verl's CP key is context_parallel_size; the stage split: first/last stage layers, the
    # embedding/loss counted as layers, or a layout string
    (re.compile(r"(tensor|pipeline|virtual_pipeline|expert)_model_parallel_size$|"
                r"context_parallel_size$|expert_(tensor_)?parallel_size$|"
                r"num_layers_in_(first|last)_pipeline_stage$|"
                r"account_for_(embedding|loss)_in_pipeline_split$|"
                r"pipeline_model_parallel_layout$|rollout\.(data_parallel_size)$"),
     "high", "global architecture: the layout and checkpoint sharding change"),
    (re.compile(r"micro_batch_size|max_token_len|ppo_mini_batch_size|train_batch_size|"
                r"rollout\.n$|max_(prompt|response)_length|gpu_memory_utilization|"
                r"use_dynamic_bsz|max_num_seqs|"
                r"max_num_batched_tokens|ppo_epochs|optim\.lr$"),
     "medium", "per-GPU load, memory and optimisation dynamics"),
    (re.compile(r"recompute|offload|sequence_parallel|kl_|entropy|clip_ratio|loss_agg_mode|"
                r"use_kl"),
     "low", "speed/memory only, or algorithm stability within verl's tested range"),
)


def classify(key: str) -> tuple[str, str]:
    for pattern, risk, why in RISKS:
        if pattern.search(key):
            return risk, why
    return "low", "bookkeeping (names, logging, paths) or a setting the planner does not model"


def flatten(config, prefix: str = "") -> dict:
    out = {}
    if isinstance(config, dict):
        for key, value in config.items():
            out.update(flatten(value, f"{prefix}{key}."))
    else:
        out[prefix[:-1]] = config
    return out


def safe_range(key: str, job: JobContext) -> str:
    """What the planner's rules allow for a parallel size or a memory knob, where it knows."""
    model, cluster = job.model, job.cluster
    if key.endswith("actor.megatron.tensor_model_parallel_size"):
        values = [d for d in range(1, model.num_attention_heads + 1)
                  if model.num_attention_heads % d == 0 and cluster.num_gpus % d == 0
                  and d <= cluster.fast_domain_gpus]
        return "TP within a node dividing the heads: " + ", ".join(map(str, values))
    if key.endswith("expert_model_parallel_size") and model.is_moe:
        values = [d for d in range(1, model.num_experts + 1)
                  if model.num_experts % d == 0 and cluster.num_gpus % d == 0]
        return "EP dividing the experts and the GPUs: " + ", ".join(map(str, values))
    if key.endswith("gpu_memory_utilization"):
        return "0.3-0.9, with what stays resident (actor, reference) fitting beside it"
    if key.endswith("pipeline_model_parallel_size"):
        return f"PP dividing {model.num_layers} layers (or an uneven first/last split)"
    return ""


def compare(a: str, b: str, job_input: JobInput) -> dict:
    """Both jobs read as validate reads them (``job_input`` gives the settings, model, GPU)."""
    run_a, run_b = (dry_run(replace(job_input, inputs=(path,))) for path in (a, b))
    report_a, report_b = run_a.report, run_b.report
    for path, run in ((a, run_a), (b, run_b)):
        report = run.report
        if run.job is None:
            errors = [f["message"] for f in report["findings"] if f.get("level") == "error"]
            unsafe = [f["message"] for f in report["findings"] if f["check"] == "unsafe_target"]
            raise PlanInputError(f"cannot read a verl Megatron job from {path!r}"
                                 f"{': ' + (unsafe or errors)[0] if errors else ''}; run "
                                 f"`plan-parallel validate {path}`")
    flat_a, flat_b = flatten(run_a.job.config), flatten(run_b.job.config)
    changes = []
    for key in sorted(set(flat_a) | set(flat_b)):
        before, after = flat_a.get(key, "<unset>"), flat_b.get(key, "<unset>")
        if before == after:
            continue
        risk, why = classify(key)
        changes.append({"key": key, "before": before, "after": after, "risk": risk,
                        "why": why, "safe_range": safe_range(key, run_b.job)})
    order = {"high": 0, "medium": 1, "low": 2}
    changes.sort(key=lambda c: (order[c["risk"]], c["key"]))

    def prediction(report) -> Summary:
        """The JSON's rounded figures, and the exact ones the text rounds once."""
        memory = report.get("memory") or {}
        keys = ("fits", "peak_memory_gib", "peak_phase", "memory_utilization", "step_time_s",
                "tokens_per_s_per_gpu")
        # the rules a job breaks, which is why it has no estimate
        errors = [f["message"] for f in report["findings"] if f.get("level") == "error"]
        return Summary({**{key: memory.get(key) for key in keys}, "errors": errors},
                       {**{key: exact_of(memory).get(key) for key in keys}, "errors": errors})

    gpu = run_b.job.cluster.gpu.name
    return {"a": a, "b": b, "gpu_type": gpu, "changes": changes,
            "before": prediction(report_a), "after": prediction(report_b),
            "would_launch": {"a": report_a["would_launch"], "b": report_b["would_launch"]}}


def _fmt_prediction(p: dict, path: str) -> str:
    if p.get("peak_memory_gib") is None:
        errors = p.get("errors") or []
        if not errors:
            return "not estimated (the layout breaks a rule)"
        more = f" (and {len(errors) - 1} more: `plan-parallel validate {path}`)" \
            if len(errors) > 1 else ""
        return f"not estimated: {errors[0]}{more}"
    text = (f"peak {p['peak_memory_gib']:.1f} GiB ({100 * p['memory_utilization']:.0f}%) in "
            f"{p['peak_phase']}, {'fits' if p['fits'] else 'does NOT fit'}")
    if p.get("tokens_per_s_per_gpu"):
        text += f", {p['step_time_s']:.1f} s per step, {p['tokens_per_s_per_gpu']:.0f} tokens/s/GPU"
    return text


def diff_text(result: dict, gpu_given: bool = False) -> str:
    """The changes, riskiest first, and both jobs' predictions (``gpu_given``: the GPU type
    came from --gpu-type, so the line does not ask for it)."""
    lines = []
    if not result["changes"]:
        lines.append("no setting differs once both configs are composed")
    for change in result["changes"]:
        lines.append(f"[{change['risk']:>6}] {change['key']}: {change['before']} -> "
                     f"{change['after']}  ({change['why']})")
        if change["safe_range"]:
            lines.append(f"         safe: {change['safe_range']}")
    lines.append("")
    if result.get("gpu_type"):
        hint = "" if gpu_given else " (pass --gpu-type to choose)"
        lines.append(f"predicted on {result['gpu_type']}{hint}:")
    lines.append(f"before: {_fmt_prediction(exact_of(result['before']), result['a'])}")
    lines.append(f"after:  {_fmt_prediction(exact_of(result['after']), result['b'])}")
    return "\n".join(lines)
