"""The planner's reading of a composed verl config: cluster size, workload, layout.

Input is the resolved config as plain data (:func:`planner.verl.config.to_plain`).  Values that
are missing or of the wrong type become findings that name the key, so a dry run reports them
instead of failing on them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from planner.catalog.workload import GrpoWorkload
from planner.search.layout import Layout
from planner.verl.findings import Finding
from planner.verl.keys import (
    _MISSING,
    ACTOR,
    MEGATRON,
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
    use_kl: bool
    max_num_seqs: int
    transformer: dict = field(default_factory=dict)  # override_transformer_config

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
    if dynamic:
        tokens = r.value(f"{ACTOR}.ppo_max_token_len_per_gpu", int)
        micro = None if None in (tokens, prompt, response, actor["cp"]) else \
            max(tokens * actor["cp"] // (prompt + response), 1)
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
        transformer=transformer, **values)
    return reading, []


def workload_of(job: JobReading):
    """The GRPO workload the config describes (raises PlanInputError when inconsistent)."""
    return GrpoWorkload(train_batch_size=job.train_batch_size, rollout_n=job.rollout_n,
                        prompt_length=job.prompt_length, response_length=job.response_length,
                        mini_batch_size=job.mini_batch_size, ppo_epochs=job.ppo_epochs,
                        precision=job.precision, use_kl_loss=job.use_kl,
                        max_num_seqs=job.max_num_seqs)


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
                  rollout_tp=job.rollout["tp"], rollout_dp=job.rollout["dp"],
                  rollout_ep=job.rollout["ep"],
                  gpu_memory_utilization=job.rollout["gpu_memory_utilization"])
