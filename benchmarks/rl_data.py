"""Published end-to-end RL (GRPO/DAPO) steps as planner inputs, for calibration and accuracy.

    python benchmarks/rl_data.py        # list the cases, what was assumed, and what was skipped
    python benchmarks/rl_data.py --phases   # measured / predicted seconds of every published phase

Reads ``grpo_runs.csv`` (the in-repo copy ``benchmarks/data/grpo_runs.csv`` of
``shared/reference``; ``$PLAN_PARALLEL_REFERENCE_DIR`` overrides) and turns each colocated,
on-policy ``rl_step`` row into a model, cluster, GRPO workload and layout, with the measured step
and phase times.  Asynchronous rows (separate generation and training GPUs) belong to the async
planner and are skipped here, as are rows that do not publish the actor's layout.

What the sources leave out is filled in the same way for every row (never per row, never from the
time being predicted), and recorded in each case's ``notes``:

* prompt length: the math prompts these recipes use (OpenMathInstruct-2, DAPO-Math-17k, MATH)
  run ~100-250 tokens after the chat template; ``ASSUMED_PROMPT_TOKENS`` for all of them;
* NeMo RL's "seq len" is prompt + generated tokens (its v0.3 blog reports generated tokens);
* verl's sweeps publish no mean length but publish ``perf/mfu/actor`` and ``timing_s/update_actor``:
  verl computes that MFU from the batch's token count with its ``FlopsCounter``, so the token count
  is recovered by inverting the same formula (the update's predicted time is then a test of the
  predicted MFU, which is what the update model claims);
* GPU type: the NeMo RL v0.3 blog does not state it ("NVIDIA DGX, very likely H100"): H100;
* Qwen2.5-Math-7B has Qwen2.5-7B's architecture (same layers, widths and vocabulary).
"""

from __future__ import annotations

import csv
import dataclasses
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibration_data import NVL72_GPUS, default_path  # noqa: E402

from planner.catalog.hardware import ClusterSpec, get_gpu  # noqa: E402
from planner.catalog.models import ModelSpec, resolve_model  # noqa: E402
from planner.catalog.workload import GrpoWorkload  # noqa: E402
from planner.cost.calibration import (  # noqa: E402
    PhaseFit,
    PhaseMeasurement,
    fit_phases,
    gpu_key,
    phase_log_errors,
    predict_phases,
)
from planner.cost.efficiency import RL_BY_GPU, RL_SHARED, CostModel  # noqa: E402
from planner.cost.flops import verl_training_flops  # noqa: E402
from planner.search.layout import Layout  # noqa: E402
from planner.search.pipeline import default_split  # noqa: E402

CSV_NAME = "grpo_runs.csv"
ASSUMED_PROMPT_TOKENS = 200
NEMO_MINI_BATCH_SEQUENCES = 512  # grpo_math_*.yaml policy.train_global_batch_size
MODELS = {"Llama-3.1-8B-Instruct": "llama3.1-8b", "Llama-3.1-70B (base)": "llama3.1-70b",
          "Llama-3.3-70B-Instruct": "llama3.1-70b", "Qwen3-32B": "qwen3-32b",
          "Qwen3-30B-A3B": "qwen3-30b", "Qwen3-235B-A22B": "qwen3-235b",
          "DeepSeek-V3": "deepseek-v3", "Qwen2.5-Math-7B": "qwen2.5-7b",
          "Qwen2.5-7B-Instruct": "qwen2.5-7b"}
GPUS = {"H100": "H100-80GB", "GB200": "GB200", "": "H100-80GB"}
# Activation checkpointing of NeMo RL's performance recipes (examples/configs/recipes/llm/
# performance/, policy.megatron_cfg.activation_checkpointing) where the tables' rows do not say:
# grpo-llama3.1-8b-instruct-2n8g.yaml (H100) and -2n4g.yaml (GB200),
# grpo-qwen3-235b-16n8g.yaml (H100; the GB200
# 16n4g recipe inherits it) and grpo-deepseek-v3-32n8g.yaml (the GB200 32n4g recipe inherits
# it).  The async-1off recipes extend these (``defaults:``), so their rows run it too.
NEMO_RECIPE_CHECKPOINTING = {("Llama-3.1-8B-Instruct", "GB200"), ("Qwen3-235B-A22B", "H100"),
                             ("Qwen3-235B-A22B", "GB200"), ("DeepSeek-V3", "H100"),
                             ("DeepSeek-V3", "GB200"), ("Llama-3.1-8B-Instruct", "H100")}
# verl's FlopsCounter divides by the promised dense BF16 peak of the device (flops_counter.py)
VERL_PROMISED_FLOPS = {"H100-80GB": 989e12}
PHASES = ("step", "generate", "update", "log_prob", "weight_sync")


class Skip(Exception):
    pass


@dataclass(frozen=True)
class RlCase:
    row_id: int
    source: str  # nemo-rl-tables | nemo-rl-blog | nemo-rl-pr | verl-sweeps
    framework: str  # nemo-rl | verl
    model: ModelSpec
    cluster: ClusterSpec
    workload: GrpoWorkload
    layout: Layout
    measured: dict  # phase -> seconds (PHASES; absent where not published)
    notes: str = ""
    group: str = field(default="")  # same model, GPUs and workload: layouts to rank
    version: str = ""  # the framework's release as published (framework_version)
    trainer: str = ""  # the training backend as published (framework), e.g. verl (megatron+vLLM)
    rollout_engine: str = ""  # rollout_engine as published (vLLM, ...)


def _float(text: str) -> float | None:
    try:
        value = float(str(text).strip())
    except ValueError:
        return None
    return value if value == value else None


def _int(text: str, default: int | None = None) -> int | None:
    value = _float(text)
    return default if value is None else int(value)


def _source(row: dict) -> tuple[str, str]:
    framework = row["framework"]
    if framework.startswith("verl"):
        return "verl-sweeps", "verl"
    version = row["framework_version"]
    if version.startswith(("v0.4", "v0.5")):
        return "nemo-rl-tables", "nemo-rl"
    if version.startswith(("v0.3", "~v0.3")):
        return "nemo-rl-blog", "nemo-rl"
    return "nemo-rl-pr", "nemo-rl"


def _derived_mean_sequence(model: ModelSpec, gpu_name: str, gpus: int, sequences: int,
                           mfu: float, update_s: float) -> float:
    """Mean tokens per sequence from verl's reported actor MFU (its FlopsCounter inverted)."""
    flops = mfu * update_s * gpus * VERL_PROMISED_FLOPS[gpu_name]
    mean = 2000.0
    for _ in range(20):  # the attention term makes it a fixed point in the mean length
        per_sequence = float(verl_training_flops(model, mean, mean ** 2))
        mean = mean * flops / (sequences * per_sequence)
    return mean


# Fixed micro-batches of rows that leave them unstated, from the launch script the row names:
# ISEEKYAN/verl_megatron_practice GRPO_7B/qwen2.5_7b_megatron_vllm_benchmark.sh sets
# actor.ppo_micro_batch_size_per_gpu=2 and rollout/ref log_prob_micro_batch_size_per_gpu=4
# (its experiment name says "lbmbs4").
SCRIPT_MICRO_BATCHES = {"GRPO_7B/qwen2.5_7b_megatron_vllm_benchmark.sh": (2, 4)}
# No script to read: the DAPO sweep's stated fixed micro-batches (dapo7b.csv, "4/10").
FALLBACK_MICRO_BATCHES = (4, 10)


def _unstated_micro_batches(text: str) -> tuple[int, int, str]:
    """(update, log-prob) micro-batch per GPU of a fixed-micro-batch row that does not state
    them, and where the numbers come from."""
    for script, (micro, log_prob_micro) in SCRIPT_MICRO_BATCHES.items():
        if script in text:
            return micro, log_prob_micro, f"from its launch script {script}"
    micro, log_prob_micro = FALLBACK_MICRO_BATCHES
    return micro, log_prob_micro, "as the DAPO sweep's stated fixed rows (no script named)"


def _token_budgets(notes: str) -> tuple[int, int, int, int]:
    """(actor budget, log-prob budget, micro batch, log-prob micro batch) from the notes."""
    fixed = re.search(r"fixed micro bs (\d+)/(\d+)", notes)
    if fixed:
        return 0, 0, int(fixed.group(1)), int(fixed.group(2))
    budgets = re.search(r"dynamic max tokens \(actor/logp\)=(\d+)k/(\d+)k", notes)
    if budgets:  # the sweep's scripts write budgets as multiples of 1024 ("10k" = 10240)
        return int(budgets.group(1)) * 1024, int(budgets.group(2)) * 1024, 1, 1
    raise Skip("token budgets not stated")


def case_from_row(row: dict) -> RlCase:
    if row["category"] != "rl_step":
        raise Skip(f"category {row['category']}")
    if not row["colocated"].lower().startswith("yes") or "off-policy" in row["sync_mode"]:
        raise Skip("not colocated on-policy (async planner)")
    step = _float(row["step_time_s"])
    if step is None:
        raise Skip(f"no step time ({row['step_time_s'] or 'empty'})")
    if row["model"] not in MODELS:
        raise Skip(f"model {row['model']} not modelled")
    tp, pp = _int(row["actor_tp"]), _int(row["actor_pp"])
    if tp is None or pp is None:
        raise Skip("actor layout not published")
    source, framework = _source(row)
    notes = []
    model = resolve_model(MODELS[row["model"]])
    if row["model"] != model.name:
        notes.append(f"{row['model']} as {model.name}")
    gpu = get_gpu(GPUS[row["gpu_type"].strip()])
    if not row["gpu_type"].strip():
        notes.append("GPU type not stated: H100")
    gpus = _int(row["gpu_count"])
    cluster = ClusterSpec(gpu, gpus, min(4 if gpu.name in NVL72_GPUS else 8, gpus))
    cp = _int(row["actor_cp"], 1)
    ep = _int(row["actor_ep"], 1) if model.is_moe else 1
    dp = gpus // (tp * pp * cp)
    prompts, n = _int(row["train_batch_prompts"]), _int(row["n_per_prompt"])
    text = row["notes"]
    measured = {"step": step}
    for phase, column in (("generate", "gen_time_s"), ("update", "update_time_s"),
                          ("log_prob", "logprob_time_s"), ("weight_sync", "refit_time_s")):
        value = _float(row[column])
        if value is not None:
            measured[phase] = value
    recompute = "full" if ("activation checkpointing on" in text
                           or row["recompute"].strip() == "full") else "none"
    if source == "nemo-rl-tables" and (row["model"], row["gpu_type"].strip()) \
            in NEMO_RECIPE_CHECKPOINTING and recompute == "none":
        recompute = "full"
        notes.append("activation checkpointing from the NeMo RL performance recipe")
    first, last, embedding, loss = default_split(model.num_layers, pp, 1)
    if framework == "nemo-rl":
        max_total = _int(row["max_total_len"])
        reported = re.match(r"\s*(\d+)", row["mean_len_reported"])
        if reported is None:
            raise Skip("mean length not published")
        if source == "nemo-rl-blog":  # generated tokens per sample
            mean_response = int(reported.group(1))
        else:  # prompt + generated
            mean_response = int(reported.group(1)) - ASSUMED_PROMPT_TOKENS
        mini = re.match(r"\s*(\d+)", row["mini_batch"])
        mini_sequences = int(mini.group(1)) if mini else NEMO_MINI_BATCH_SEQUENCES
        if not mini:
            notes.append(f"mini-batch not stated: {NEMO_MINI_BATCH_SEQUENCES} sequences (the "
                         f"recipe's train_global_batch_size)")
        workload = GrpoWorkload(
            train_batch_size=prompts, rollout_n=n, prompt_length=ASSUMED_PROMPT_TOKENS,
            response_length=max_total - ASSUMED_PROMPT_TOKENS,
            mean_response_length=min(mean_response, max_total - ASSUMED_PROMPT_TOKENS),
            mini_batch_size=max(mini_sequences // n, 1), use_kl_loss=True,
            weight_sync="bucketed")
        # sequence packing to one maximal sequence per micro-batch (train_mb_tokens); colocated
        # NeMo RL moves the policy (weights, grads, optimizer) and the reference to the host
        # while vLLM generates (offload_before_refit / offload_after_refit)
        layout = Layout(tp=tp, pp=pp, cp=cp, ep=ep, dp=dp, micro_batch=1, recompute=recompute,
                        param_offload=True, optimizer_offload=True, ref_param_offload=True,
                        sequence_parallel=tp > 1, first_stage_layers=first,
                        last_stage_layers=last, account_embedding=embedding, account_loss=loss,
                        dynamic_batch=True, max_token_len=max_total * cp,
                        rollout_tp=_int(row["rollout_tp"], tp), gpu_memory_utilization=0.6)
        if _int(row["rollout_tp"]) is None:
            notes.append(f"generation TP not stated: the actor's TP{tp}")
        notes.append(f"prompt {ASSUMED_PROMPT_TOKENS} tokens assumed; sequence packing as "
                     f"dynamic batches of {max_total} tokens")
    else:
        actor_budget, log_prob_budget, micro, log_prob_micro = (0, 0, 4, 10)
        dynamic = "dynamic bsz" in text or "dynamic batch=True" in text
        if "dynamic max tokens" in text or "fixed micro bs" in text:
            actor_budget, log_prob_budget, micro, log_prob_micro = _token_budgets(text)
            dynamic = actor_budget > 0
        elif dynamic:
            log_prob = re.search(r"logp max tokens (\d+)k", text)
            actor_budget = 10240
            log_prob_budget = int(log_prob.group(1)) * 1000 if log_prob else actor_budget
            notes.append("token budget not stated: prompt + response")
        else:
            micro, log_prob_micro, where = _unstated_micro_batches(text)
            notes.append(f"micro-batches not stated in the row: {micro} (update) / "
                         f"{log_prob_micro} (log-prob), {where}")
        mfu, update = _float(row["mfu"]), measured.get("update")
        if mfu is None or update is None:
            raise Skip("no mean length and no MFU to recover it from")
        sequences = prompts * n
        mean_sequence = _derived_mean_sequence(model, gpu.name, gpus, sequences, mfu, update)
        response = _int(row["max_response_len"])
        mean_response = int(min(max(mean_sequence - ASSUMED_PROMPT_TOKENS, 1), response))
        notes.append(f"mean response {mean_response} tokens from verl's actor MFU {mfu}")
        utilization = re.search(r"gpu_memory_utilization=([\d.]+)", text)
        offload = row["offload"].strip() == "True"
        is_dapo = "DAPO" in text
        workload = GrpoWorkload(
            train_batch_size=prompts, rollout_n=n, prompt_length=_int(row["max_prompt_len"]),
            response_length=response, mean_prompt_length=ASSUMED_PROMPT_TOKENS,
            mean_response_length=mean_response,
            mini_batch_size=int(re.match(r"\s*(\d+)", row["mini_batch"]).group(1)),
            use_kl_loss=not is_dapo, fused_kernels="fused_kernel" in text)
        layout = Layout(tp=tp, pp=pp, cp=cp, dp=dp, micro_batch=micro, recompute=recompute,
                        sequence_parallel=tp > 1, first_stage_layers=first,
                        last_stage_layers=last, account_embedding=embedding, account_loss=loss,
                        param_offload=offload, optimizer_offload=offload,
                        ref_param_offload=offload and not is_dapo, dynamic_batch=dynamic,
                        max_token_len=actor_budget * cp if dynamic else 0,
                        log_prob_max_token_len=log_prob_budget * cp if dynamic else 0,
                        log_prob_micro_batch=log_prob_micro,
                        rollout_tp=_int(row["rollout_tp"], 1),
                        gpu_memory_utilization=float(utilization.group(1)) if utilization
                        else 0.6)
    group = f"{model.name}|{gpu.name}|{gpus}|{workload.train_batch_size}x{workload.rollout_n}" \
            f"|{workload.response_length}|{framework}"
    return RlCase(row_id=int(row["row_id"]), source=source, framework=framework, model=model,
                  cluster=cluster, workload=workload, layout=layout, measured=measured,
                  notes="; ".join(notes), group=group,
                  version=row["framework_version"].strip(), trainer=row["framework"].strip(),
                  rollout_engine=row["rollout_engine"].strip() or "vLLM")


def load_rl_cases(path: str | Path | None = None) -> tuple[list[RlCase], dict[str, int]]:
    """The colocated on-policy RL steps the planner models, and {reason: count} skipped."""
    cases, skipped = [], {}
    with open(path or default_path(CSV_NAME), newline="") as handle:
        for row in csv.DictReader(handle):
            try:
                cases.append(case_from_row(row))
            except Skip as reason:
                skipped[str(reason)] = skipped.get(str(reason), 0) + 1
    return cases, skipped


def replace_workload(case: RlCase, **changes) -> RlCase:
    return dataclasses.replace(case, workload=dataclasses.replace(case.workload, **changes))


def predicted_phases(row: dict, framework: str) -> dict[str, float]:
    """The planner's columns as the source measures them: verl's ``timing_s/gen`` includes the
    weight reshard and the engine's wake-up; log-prob is old + reference where both run."""
    generate = row["time_generate_s"]
    if framework == "verl":
        generate += row["time_weight_sync_s"]
    return {"step": row["step_time_s"], "generate": generate,
            "update": row["time_update_actor_s"],
            "log_prob": row["time_old_log_prob_s"] + row["time_ref_s"],
            "weight_sync": row["time_weight_sync_s"]}


def predict_rl(cases: list[RlCase], calibration: dict | None = None) -> list[dict[str, float]]:
    """Predicted seconds per measured phase of every case (``calibration``: a calibration
    dict as ``planner/cost/calibration.json`` holds; None: the shipped one)."""
    from planner.cost.request import PlanRequest
    from planner.plan import estimate_layout

    cost = CostModel.load(calibration)
    out = []
    for case in cases:
        estimate = estimate_layout(PlanRequest(case.model, case.cluster, case.workload,
                                               cost=cost), case.layout)
        out.append(predicted_phases(estimate.row, case.framework))
    return out


def print_phases(cases: list[RlCase]) -> None:
    """Measured / predicted seconds of every published phase, with the signed error: where
    the colocated fit trades one phase's error for another's."""
    for case, predicted in zip(cases, predict_rl(cases)):
        parts = []
        for phase in PHASES:
            if phase in case.measured:
                measured = case.measured[phase]
                parts.append(f"{phase} {measured:6.1f}/{predicted[phase]:6.1f} "
                             f"({predicted[phase] / measured - 1:+4.0%})")
        print(f"{case.row_id:>4} {case.source:15} {case.model.name[:14]:14} "
              f"{case.cluster.num_gpus:>4} " + "  ".join(parts))


def main() -> None:
    cases, skipped = load_rl_cases()
    if "--phases" in sys.argv[1:]:
        print_phases(cases)
        return
    for case in cases:
        lay = case.layout
        print(f"{case.row_id:>4} {case.source:15} {case.model.name:16} {case.cluster.num_gpus:>4}x"
              f"{case.cluster.gpu.name:10} tp{lay.tp} pp{lay.pp} cp{lay.cp} ep{lay.ep} "
              f"rtp{lay.rollout_tp} resp~{case.workload.mean_response_length:>5} "
              f"{case.measured}")
    print(f"{len(cases)} cases; skipped: {skipped}")


if __name__ == "__main__":
    main()


# --- fitting the RL constants ------------------------------------------------------------------

# The planner's phase names for the keys of RlCase.measured.
MEASURED_PHASES = {"step": "step", "generate": "generate", "update": "update_actor",
                   "log_prob": "log_prob", "weight_sync": "weight_sync"}


def phase_measurement(case: RlCase) -> PhaseMeasurement:
    """The case as the phase fit reads it: verl's ``timing_s/gen`` includes the reshard."""
    return PhaseMeasurement(case.model, case.cluster, case.workload, case.layout,
                            {MEASURED_PHASES[phase]: seconds
                             for phase, seconds in case.measured.items()},
                            sync_in_generate=case.framework == "verl")


def _rounded(value):
    return float(f"{value:.4g}") if isinstance(value, float) else value


# Parts without RL measurements take the decode efficiency of a measured part of the same
# memory generation (HBM3/3e Hopper; HBM3e Blackwell); the rest the median.
RL_DONORS = {"H200": "H100-80GB", "H800": "H100-80GB", "H20-96GB": "H100-80GB",
             "H100-PCIe": "H100-80GB", "B200": "GB200", "B300": "GB200", "GB300": "GB200",
             "H20-141GB": "H100-80GB", "H200-NVL": "H100-80GB"}


def _lend_decode_efficiency(calibration: dict, fitted_keys: list[str]) -> None:
    by_gpu = calibration["by_gpu"]
    fitted = {key: by_gpu[key]["decode_hbm"] for key in fitted_keys}
    median = float(np.median(list(fitted.values())))
    for key, values in by_gpu.items():
        if key in fitted:
            continue
        gpu, family = key.split("/")
        donor = f"{RL_DONORS.get(gpu, '')}/bf16"
        values["decode_hbm"] = fitted.get(donor, median)
        values["rl_donor"] = donor if donor in fitted else "median"


def log_errors(cases: list[RlCase], predicted: list[dict]) -> np.ndarray:
    return phase_log_errors([phase_measurement(case) for case in cases],
                            [{MEASURED_PHASES.get(k, k): v for k, v in guess.items()}
                             for guess in predicted])


def fit_rl(cases: list[RlCase], calibration: dict) -> dict:
    """The RL constants fitted to the cases' measured phases (least squares in log space with
    weak priors, :func:`planner.cost.calibration.fit_phases`), on top of ``calibration`` (the
    Megatron fit, whose constants stay as they are).  ``decode_hbm`` is per GPU type and
    precision family, the rest shared; GPU types without RL measurements keep the default
    (written as ``"rl_donor"``)."""
    measurements = [phase_measurement(case) for case in cases]
    fitted = fit_phases(measurements, calibration, RL_SHARED + RL_BY_GPU,
                        PhaseFit(measurement_sigma=1.0, prior_weight=1 / 3))
    _lend_decode_efficiency(fitted, sorted({gpu_key(item) for item in measurements}))
    errors = phase_log_errors(measurements, predict_phases(measurements, CostModel.load(fitted)))
    fitted["shared"] = {k: _rounded(v) for k, v in fitted["shared"].items()}
    fitted["by_gpu"] = {key: {k: _rounded(v) for k, v in values.items()}
                        for key, values in fitted["by_gpu"].items()}
    fitted["rl_fit"] = {"cases": len(cases), "phases": int(len(errors)),
                        "mape": _rounded(float(np.mean(np.abs(np.exp(errors) - 1)))),
                        "source": "benchmarks/calibrate.py on shared/reference/grpo_runs.csv"}
    return fitted
