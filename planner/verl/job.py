"""The planner's reading of a composed verl config: cluster size, workload, layout.

Input is the resolved config as plain data (:func:`planner.verl.config.to_plain`).  Values that
are missing or of the wrong type become findings that name the key, so a dry run reports them
instead of failing on them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from planner.catalog.workload import GrpoWorkload
from planner.errors import PlanInputError
from planner.search.layout import Layout, modules_mask
from planner.verl.findings import Finding
from planner.verl.keys import (
    _MISSING,
    ACTOR,
    MEGATRON,
    MODEL,
    PARALLEL_KEYS,
    REF,
    ROLLOUT,
    TRANSFORMER,
    get,
)


@dataclass(frozen=True)
class JobReading:
    """The values the planner needs, each from its verl key; ``None`` where unreadable."""

    world: int
    nnodes: int
    gpus_per_node: int
    actor: dict[str, int | None]  # tp, pp, vpp (None = 1), cp, ep, etp (None = TP)
    ref: dict[str, int | None]
    sequence_parallel: bool
    distributed_optimizer: bool
    param_offload: bool
    optimizer_offload: bool
    ref_param_offload: bool
    recompute: str
    first_stage_layers: int  # 0: not set
    last_stage_layers: int
    dynamic_batch: bool
    micro_batch: int  # actor ppo_micro_batch_size_per_gpu, or tokens-equivalent when dynamic
    rollout: dict[str, Any]  # tp, dp, ep, pp, name, gpu_memory_utilization, micro
    ref_micro_batch: int | None
    train_batch_size: int
    rollout_n: int
    prompt_length: int
    response_length: int
    mini_batch_size: int
    ppo_epochs: int
    precision: str
    use_kl: bool  # a reference model is built (KL loss or KL in the reward)
    use_kl_loss: bool
    max_num_seqs: int
    transformer: dict = field(default_factory=dict)  # override_transformer_config
    # what else the layout and the workload take from the job (see layout_of, workload_of)
    layout_extra: dict = field(default_factory=dict)
    workload_extra: dict = field(default_factory=dict)

    @property
    def dp(self) -> int:
        size = self.actor["tp"] * self.actor["pp"] * self.actor["cp"]
        return max(self.world // size, 1)

    @property
    def sequence_length(self) -> int:
        return self.prompt_length + self.response_length


class _Reader:
    def __init__(self, config: dict):
        self.config = config
        self.findings: list[Finding] = []

    def value(self, key: str, kind: type, default: Any = _MISSING, allow_none: bool = False,
              minimum: int | None = 1) -> Any:
        value = get(self.config, key, default)
        if value is _MISSING:
            self.findings.append(Finding("missing_key", f"{key} is not set", (key,)))
            return None
        if value is None and allow_none:
            return None
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            what = {int: "an integer", bool: "True or False", float: "a number",
                    str: "a string"}[kind]
            self.findings.append(Finding("bad_value", f"{key}={value!r} is not {what}", (key,)))
            return None
        if kind is int and minimum is not None and value < minimum:
            self.findings.append(Finding("bad_value", f"{key}={value} must be >= {minimum}",
                                         (key,)))
            return None
        return value


def recompute_kind(transformer: dict) -> str:
    granularity = transformer.get("recompute_granularity")
    return granularity if granularity in ("full", "selective") else "none"


def _layout_extra(r: "_Reader", config: dict, transformer: dict, dynamic: bool) -> dict:
    """The layout fields beyond the parallel sizes: pipeline split, recompute detail, the CPU
    optimizer, token budgets and log-prob micro-batches, each read from its verl key."""
    optim = f"{ACTOR}.optim.override_optimizer_config"
    cpu = bool(get(config, f"{optim}.optimizer_cpu_offload", False))
    fraction = get(config, f"{optim}.optimizer_offload_fraction", 1.0 if cpu else 0.0)
    if not isinstance(fraction, (int, float)) or isinstance(fraction, bool) \
            or not 0 <= fraction <= 1:
        key = f"{optim}.optimizer_offload_fraction"
        r.findings.append(Finding("bad_value", f"{key}={fraction!r} is not a number in 0..1",
                                  (key,)))
        fraction = 0.0
    modules = transformer.get("recompute_modules") or []
    try:
        mask = modules_mask(modules if isinstance(modules, list) else [modules])
    except PlanInputError as error:
        r.findings.append(Finding("recompute", f"{TRANSFORMER}.recompute_modules: {error}",
                                  (f"{TRANSFORMER}.recompute_modules",)))
        mask = 0
    layers = transformer.get("recompute_num_layers")
    layout_string = transformer.get("pipeline_model_parallel_layout") or ""
    extra = {
        "account_embedding": bool(transformer.get("account_for_embedding_in_pipeline_split")),
        "account_loss": bool(transformer.get("account_for_loss_in_pipeline_split")),
        "pipeline_layout": str(layout_string) if layout_string else "",
        "recompute_modules": mask,
        "recompute_num_layers": layers if isinstance(layers, int) and layers > 0 else 1,
        "recompute_block": transformer.get("recompute_method") == "block",
        "optimizer_cpu_fraction": float(fraction) if cpu else 0.0,
        "dynamic_batch": dynamic,
    }
    if dynamic:
        budget = r.value(f"{ACTOR}.ppo_max_token_len_per_gpu", int)
        log_prob = get(config, f"{ROLLOUT}.log_prob_max_token_len_per_gpu", budget)
        extra["max_token_len"] = budget or 0
        extra["log_prob_max_token_len"] = log_prob if isinstance(log_prob, int) and \
            not isinstance(log_prob, bool) and log_prob > 0 else 0
    else:
        micro = get(config, f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu", None)
        extra["log_prob_micro_batch"] = micro if isinstance(micro, int) and \
            not isinstance(micro, bool) and micro > 0 else 0
    return extra


def _workload_extra(config: dict) -> dict:
    """The workload settings beyond the batch shape: algorithm switches, kernels, the rollout
    engine's settings, each read from its verl key (verl 0.9.1's default when absent)."""
    optim = f"{ACTOR}.optim"
    precision_aware = bool(get(config, f"{optim}.use_precision_aware_optimizer", False)) or bool(
        get(config, f"{optim}.override_optimizer_config.use_precision_aware_optimizer", False))
    grads = str(get(config, f"{optim}.main_grads_dtype", "fp32"))
    ddp = get(config, f"{MEGATRON}.override_ddp_config", {}) or {}
    # verl: fp32 grad reduction unless the precision-aware optimizer keeps lower-precision
    # grads; an explicit override_ddp_config value wins (workers/engine/megatron/transformer_impl)
    grad_fp32 = ddp.get("grad_reduce_in_fp32", not (precision_aware and grads != "fp32"))
    moments = str(get(config, f"{optim}.exp_avg_dtype", "fp32"))
    quantization = get(config, f"{ROLLOUT}.quantization", None)
    chunking = bool(get(config, f"{ACTOR}.entropy_from_logits_with_chunking", False))
    chunk = get(config, f"{ACTOR}.entropy_from_logits_chunk_size", 2048)
    name = get(config, f"{ROLLOUT}.name", "vllm")
    return {
        "use_kl_in_reward": bool(get(config, "algorithm.use_kl_in_reward", False)),
        "bypass_old_log_prob": bool(get(config, "algorithm.rollout_correction.bypass_mode",
                                        False)),
        "fused_kernels": bool(get(config, f"{MODEL}.use_fused_kernels", False)),
        "entropy_chunk_tokens": int(chunk) if chunking and isinstance(chunk, int) else 0,
        "grad_reduce_in_fp32": bool(grad_fp32),
        # verl's DDP config has overlap_grad_reduce False unless override_ddp_config sets it
        # (utils/megatron_utils.py): off, the update's DP gradient reduce is exposed
        "overlap_grad_reduce": bool(ddp.get("overlap_grad_reduce", False)),
        "adam_moment_bytes": 2 if precision_aware and moments in ("bf16", "fp16") else 4,
        "rollout_engine": name if name in ("vllm", "sglang") else "vllm",
        "rollout_precision": "fp8" if quantization == "fp8" else "bf16",
        "enforce_eager": bool(get(config, f"{ROLLOUT}.enforce_eager", False)),
        "free_cache_engine": bool(get(config, f"{ROLLOUT}.free_cache_engine", True)),
        "max_num_batched_tokens": int(get(config, f"{ROLLOUT}.max_num_batched_tokens", 8192)
                                      or 8192),
        "prefix_caching": bool(get(config, f"{ROLLOUT}.enable_prefix_caching", True)),
    }


def read_job(config: dict) -> tuple[JobReading | None, list[Finding]]:
    """The reading, or ``None`` with the findings that prevented it."""
    r = _Reader(config)
    nnodes = r.value("trainer.nnodes", int)
    per_node = r.value("trainer.n_gpus_per_node", int)
    actor = {name: r.value(f"{MEGATRON}.{key}", int, allow_none=name in ("vpp", "etp"))
             for name, key in PARALLEL_KEYS.items()}
    ref = {name: get(config, f"{REF}.megatron.{key}", None) for name, key in PARALLEL_KEYS.items()}
    transformer = get(config, TRANSFORMER, {}) or {}
    dynamic = bool(r.value(f"{ACTOR}.use_dynamic_bsz", bool))
    prompt = r.value("data.max_prompt_length", int)
    response = r.value("data.max_response_length", int)
    if dynamic:  # verl ignores the fixed micro-batch size; the token budget rules
        micro = r.value(f"{ACTOR}.ppo_micro_batch_size_per_gpu", int, default=1,
                        allow_none=True) or 1
    else:
        micro = r.value(f"{ACTOR}.ppo_micro_batch_size_per_gpu", int)
    dtype = get(config, f"{MEGATRON}.dtype", "bfloat16")
    rollout = {
        "name": get(config, f"{ROLLOUT}.name", None),
        "tp": r.value(f"{ROLLOUT}.tensor_model_parallel_size", int),
        "dp": r.value(f"{ROLLOUT}.data_parallel_size", int),
        "ep": r.value(f"{ROLLOUT}.expert_parallel_size", int),
        "pp": r.value(f"{ROLLOUT}.pipeline_model_parallel_size", int, default=1),
        "gpu_memory_utilization": r.value(f"{ROLLOUT}.gpu_memory_utilization", float),
        "micro": get(config, f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu", None),
        "free_cache_engine": bool(get(config, f"{ROLLOUT}.free_cache_engine", True)),
    }
    values = dict(
        train_batch_size=r.value("data.train_batch_size", int),
        rollout_n=r.value(f"{ROLLOUT}.n", int),
        mini_batch_size=r.value(f"{ACTOR}.ppo_mini_batch_size", int),
        ppo_epochs=r.value(f"{ACTOR}.ppo_epochs", int),
        max_num_seqs=r.value(f"{ROLLOUT}.max_num_seqs", int),
    )
    first = transformer.get("num_layers_in_first_pipeline_stage") or 0
    last = transformer.get("num_layers_in_last_pipeline_stage") or 0
    for name, layers in (("first", first), ("last", last)):
        if not isinstance(layers, int) or isinstance(layers, bool) or layers < 0:
            r.findings.append(Finding("bad_value", f"{TRANSFORMER}.num_layers_in_{name}_pipeline"
                                      f"_stage={layers!r} is not a positive integer",
                                      (f"{TRANSFORMER}.num_layers_in_{name}_pipeline_stage",)))
    if dtype not in ("bfloat16", "float16"):
        r.findings.append(Finding("bad_value", f"{MEGATRON}.dtype={dtype!r}: verl's Megatron "
                                  f"engine trains in bfloat16 or float16", (f"{MEGATRON}.dtype",)))
    required = [nnodes, per_node, *(actor[name] for name in ("tp", "pp", "cp", "ep")), micro,
                prompt, response, *values.values(),
                *(rollout[name] for name in ("tp", "dp", "ep", "pp", "gpu_memory_utilization"))]
    if any(value is None for value in required) or r.findings:
        return None, r.findings
    use_kl = bool(get(config, f"{ACTOR}.use_kl_loss", False)) or \
        bool(get(config, "algorithm.use_kl_in_reward", False))
    layout_extra = _layout_extra(r, config, transformer, dynamic)
    if r.findings:
        return None, r.findings
    reading = JobReading(
        world=nnodes * per_node, nnodes=nnodes, gpus_per_node=per_node, actor=actor, ref=ref,
        sequence_parallel=bool(get(config, f"{MEGATRON}.sequence_parallel", True)),
        distributed_optimizer=bool(get(config, f"{MEGATRON}.use_distributed_optimizer", True)),
        param_offload=bool(get(config, f"{MEGATRON}.param_offload", False)),
        optimizer_offload=bool(get(config, f"{MEGATRON}.optimizer_offload", False)),
        ref_param_offload=bool(get(config, f"{REF}.megatron.param_offload", False)),
        recompute=recompute_kind(transformer), first_stage_layers=first,
        last_stage_layers=last, dynamic_batch=dynamic, micro_batch=micro, rollout=rollout,
        ref_micro_batch=get(config, f"{REF}.log_prob_micro_batch_size_per_gpu", None),
        prompt_length=prompt, response_length=response,
        precision="bf16" if dtype == "bfloat16" else "fp16", use_kl=use_kl,
        use_kl_loss=bool(get(config, f"{ACTOR}.use_kl_loss", False)),
        transformer=transformer, layout_extra=layout_extra,
        workload_extra=_workload_extra(config), **values)
    return reading, []


def workload_of(job: JobReading):
    """The GRPO workload the config describes (raises PlanInputError when inconsistent)."""
    return GrpoWorkload(train_batch_size=job.train_batch_size, rollout_n=job.rollout_n,
                        prompt_length=job.prompt_length, response_length=job.response_length,
                        mini_batch_size=job.mini_batch_size, ppo_epochs=job.ppo_epochs,
                        precision=job.precision, use_kl_loss=job.use_kl_loss,
                        max_num_seqs=job.max_num_seqs, **job.workload_extra)


def layout_of(job: JobReading, is_moe: bool):
    """The planner's layout for the job.  ETP unset means TP for an MoE model (megatron-core's
    default); a dense model has no experts, so its ETP reads as 1.  Raises PlanInputError on
    out-of-range values."""
    actor = job.actor
    etp = (actor["tp"] if actor["etp"] is None else actor["etp"]) if is_moe else 1
    return Layout(tp=actor["tp"], pp=actor["pp"], vpp=actor["vpp"] or 1, cp=actor["cp"],
                  ep=actor["ep"], etp=etp,
                  dp=job.dp, micro_batch=job.micro_batch, recompute=job.recompute,
                  param_offload=job.param_offload, optimizer_offload=job.optimizer_offload,
                  ref_param_offload=job.ref_param_offload,
                  sequence_parallel=job.sequence_parallel and actor["tp"] > 1,
                  distributed_optimizer=job.distributed_optimizer,
                  first_stage_layers=job.first_stage_layers,
                  last_stage_layers=job.last_stage_layers,
                  **job.layout_extra,
                  rollout_tp=job.rollout["tp"], rollout_dp=job.rollout["dp"],
                  rollout_ep=job.rollout["ep"],
                  gpu_memory_utilization=job.rollout["gpu_memory_utilization"])
