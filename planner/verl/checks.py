"""The checks verl does not make, or makes only once the job is running, on a composed config.

Each finding names the verl keys and their values and says what would be valid:

* backend: ``model_engine`` must be ``megatron``; GRPO and vLLM are what the planner models;
* actor/reference/rollout agreement: the reference is built in the actor's Megatron parallel
  state, so its sizes must equal the actor's (the "tensor model parallel size mismatch");
  rollout replicas must tile the nodes;
* batches: verl's run-time assertions (mini-batch over DP, micro-batches, log-prob micro-batches,
  dynamic batch token budgets);
* megatron-core's model-build rules: recompute settings, uneven pipeline stages;
* every rule of :mod:`planner.search.rules` (heads, query groups, layers, experts, ETP*EP*PP and
  TP*PP*CP against the world size, rollout EP = TP*DP, VPP, batch divisibility).
"""

from __future__ import annotations

import math

from planner.cost.request import PlanRequest
from planner.search.pipeline import default_split, pipeline_split, split_problems
from planner.search.rules import explain
from planner.verl.findings import Finding
from planner.verl.job import JobReading
from planner.verl.keys import ACTOR, MEGATRON, PARALLEL_KEYS, REF, ROLLOUT, TRANSFORMER, get

WORLD_KEYS = ("trainer.nnodes", "trainer.n_gpus_per_node")
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe",
                     "shared_experts")
PLANNED_ROLLOUTS = ("vllm", "sglang")


def _m(name: str) -> str:
    return f"{MEGATRON}.{PARALLEL_KEYS[name]}"


def _r(name: str) -> str:
    return f"{ROLLOUT}.{name}"


FIRST_STAGE = f"{TRANSFORMER}.num_layers_in_first_pipeline_stage"
LAST_STAGE = f"{TRANSFORMER}.num_layers_in_last_pipeline_stage"
SPLIT_KEYS = (FIRST_STAGE, LAST_STAGE, f"{TRANSFORMER}.account_for_embedding_in_pipeline_split",
              f"{TRANSFORMER}.account_for_loss_in_pipeline_split",
              f"{TRANSFORMER}.pipeline_model_parallel_layout")
MINI = f"{ACTOR}.ppo_mini_batch_size"
MICRO = f"{ACTOR}.ppo_micro_batch_size_per_gpu"

# The verl keys behind each planner rule (planner.search.rules.RULES), for the message.
RULE_KEYS = {
    "world_size": (_m("tp"), _m("pp"), _m("cp"), *WORLD_KEYS),
    "tp_divides_heads": (_m("tp"),),
    "tp_divides_query_groups": (_m("tp"),),
    "tp_divides_ffn": (_m("tp"),),
    "tp_divides_linear_attention_heads": (_m("tp"),),
    "cp_linear_attention": (_m("cp"),),
    "cp_attention_sinks": (_m("cp"),),
    "tp_divides_mamba_heads": (_m("tp"),),
    "cp_divides_mamba_heads": (_m("cp"), _m("tp")),
    "pipeline_split": (_m("pp"), *SPLIT_KEYS),
    "vpp_needs_pp": (_m("vpp"), _m("pp")),
    "vpp_divides_stage_layers": (_m("vpp"), _m("pp"), *SPLIT_KEYS),
    "mamba_pipeline": (_m("vpp"), _m("pp"), *SPLIT_KEYS),
    "dense_model_has_no_experts": (_m("ep"),),
    "ep_divides_experts": (_m("ep"),),
    "etp_divides_moe_ffn": (_m("etp"),),
    "etp_moe_bias": (_m("etp"),),
    "expert_grid": (_m("etp"), _m("ep"), _m("pp"), *WORLD_KEYS),
    "batch_divides_dp": ("data.train_batch_size", _r("n"), MICRO),
    "mini_batch_divides_dp": (MINI, _r("n")),
    "micro_batch_divides_mini_batch": (MINI, _r("n"), MICRO),
    "interleaved_microbatches": (_m("vpp"), _m("pp"), MINI, MICRO),
    "rollout_tp_divides_heads": (_r("tensor_model_parallel_size"),),
    "rollout_tp_kv_heads": (_r("tensor_model_parallel_size"),),
    "rollout_world": (_r("tensor_model_parallel_size"), _r("data_parallel_size"), *WORLD_KEYS),
    "rollout_ep": (_r("expert_parallel_size"), _r("tensor_model_parallel_size"),
                   _r("data_parallel_size")),
    "rollout_dp_moe_only": (_r("data_parallel_size"),),
}
# Planner rules that are the search's own choices, not launch failures.
ADVISORY_RULES = {"rollout_dp_moe_only"}
# Planner rules validate checks per verl key itself (_batch_findings names the key at fault).
CHECKED_PER_KEY = {"token_budget_holds_a_sequence"}
# verl checks these itself when batches are static, and rounds instead when they are dynamic.
STATIC_BATCH_RULES = {"batch_divides_dp", "micro_batch_divides_mini_batch"}


def key_values(config: dict, keys) -> str:
    shown = [f"{key}={get(config, key, None)!r}".replace("'", "") for key in keys
             if get(config, key, None) is not None]
    return f" [{', '.join(shown)}]" if shown else ""


def backend_findings(config: dict) -> list[Finding]:
    out = []
    engine = get(config, "model_engine", None)
    if engine != "megatron":
        out.append(Finding("backend", f"model_engine={engine}: verl would train with its {engine}"
                           f" backend, not Megatron; add model_engine=megatron (or "
                           f"--config-name=ppo_megatron_trainer)", ("model_engine",)))
    estimator = get(config, "algorithm.adv_estimator", None)
    if estimator != "grpo":
        out.append(Finding("algorithm", f"algorithm.adv_estimator={estimator}: the planner "
                           f"models GRPO (no critic); a critic's memory and time are not in "
                           f"the estimate", ("algorithm.adv_estimator",), "warning"))
    name = get(config, _r("name"), None)
    if name not in PLANNED_ROLLOUTS:
        out.append(Finding("rollout_engine", f"{_r('name')}={name}: the rollout memory model is "
                           f"vLLM's (SGLang's is alike); valid: vllm, sglang", (_r("name"),),
                           "warning"))
    return out


def reference_findings(job: JobReading) -> list[Finding]:
    """verl builds the reference in the actor's Megatron parallel state (the first engine to
    initialise megatron's process groups wins), so every size must match."""
    out = []
    for name, key in PARALLEL_KEYS.items():
        actor, ref = job.actor[name], job.ref[name]
        if name == "vpp":
            actor, ref = actor or 1, ref or 1
        if actor != ref:
            out.append(Finding(
                "reference_parallel_mismatch",
                f"{REF}.megatron.{key}={ref} but {MEGATRON}.{key}={actor}: the reference model "
                f"runs in the actor's Megatron parallel state, so a different size fails at "
                f"start-up (tensor model parallel size mismatch); set it to {actor} or drop the "
                f"override (verl copies the actor's)", (f"{REF}.megatron.{key}", _m(name))))
    return out


def rollout_findings(job: JobReading) -> list[Finding]:
    rollout, out = job.rollout, []
    tp, dp, pp = rollout["tp"], rollout["dp"], rollout["pp"]
    replica = tp * dp * pp
    keys = (_r("tensor_model_parallel_size"), _r("data_parallel_size"), "trainer.n_gpus_per_node")
    if replica > job.gpus_per_node and replica % job.gpus_per_node:
        out.append(Finding("rollout_nodes", f"a rollout replica of TP*DP*PP = {tp}*{dp}*{pp} = "
                           f"{replica} GPUs spans nodes of {job.gpus_per_node} GPUs unevenly; "
                           f"verl needs a replica larger than a node to be a multiple of "
                           f"trainer.n_gpus_per_node ({job.gpus_per_node})", keys))
    if dp > 1 and job.gpus_per_node % tp:
        out.append(Finding("rollout_nodes", f"with {_r('data_parallel_size')}={dp} verl's vLLM "
                           f"server needs n_gpus_per_node ({job.gpus_per_node}) divisible by "
                           f"{_r('tensor_model_parallel_size')}={tp}", keys))
    utilization = rollout["gpu_memory_utilization"]
    if not 0.05 <= utilization <= 0.99:
        out.append(Finding("rollout_memory", f"{_r('gpu_memory_utilization')}={utilization} is "
                           f"outside 0.05..0.99", (_r("gpu_memory_utilization"),)))
    return out


def _padded_batch(job: JobReading) -> int:
    """verl's V1 trainer pads a step's sequences to lcm(DP, ppo_mini_batch_size*n)."""
    multiple = math.lcm(job.dp, job.mini_batch_size * job.rollout_n)
    return -(-job.train_batch_size * job.rollout_n // multiple) * multiple


def batch_findings(config: dict, job: JobReading) -> list[Finding]:
    out = []
    if job.train_batch_size % job.mini_batch_size:
        if get(config, "trainer.use_v1", True) is False:
            # the legacy trainer (main_ppo_v0) balances without padding: the engine's
            # tensordict_utils.make_iterator asserts whole mini-batches per DP rank
            out.append(Finding("mini_batch_padding", f"data.train_batch_size="
                               f"{job.train_batch_size} is not a multiple of {MINI}="
                               f"{job.mini_batch_size}: verl's legacy trainer "
                               f"(trainer.use_v1=False) does not pad the step and asserts "
                               f"whole mini-batches", ("data.train_batch_size", MINI,
                                                       "trainer.use_v1")))
        else:
            out.append(Finding("mini_batch_padding", f"data.train_batch_size="
                               f"{job.train_batch_size} is not a multiple of {MINI}="
                               f"{job.mini_batch_size}: verl pads the last mini-batch with "
                               f"no-op samples (an optimizer step on a partial mini-batch)",
                               ("data.train_batch_size", MINI), "warning"))
    if job.dynamic_batch:
        budgets = ((f"{ACTOR}.ppo_max_token_len_per_gpu", True),
                   (f"{ROLLOUT}.log_prob_max_token_len_per_gpu", True),
                   (f"{REF}.log_prob_max_token_len_per_gpu", job.use_kl))
        for key, used in budgets:
            tokens = get(config, key, None)
            if used and isinstance(tokens, int) and tokens * job.actor["cp"] < job.sequence_length:
                out.append(Finding("token_budget", f"{key}={tokens} x context_parallel_size "
                                   f"{job.actor['cp']} is below the longest sequence "
                                   f"{job.sequence_length} (data.max_prompt_length + "
                                   f"max_response_length); verl asserts max_token_len >= it",
                                   (key, "data.max_prompt_length", "data.max_response_length")))
        rollout_dynamic = get(config, f"{ROLLOUT}.log_prob_use_dynamic_bsz", True)
        if not rollout_dynamic:
            out.append(Finding("dynamic_batch", f"{ACTOR}.use_dynamic_bsz=True but "
                               f"{ROLLOUT}.log_prob_use_dynamic_bsz=False; verl's worker "
                               f"asserts they are equal", (f"{ACTOR}.use_dynamic_bsz",
                                                           f"{ROLLOUT}.log_prob_use_dynamic_bsz")))
        return out
    per_rank = _padded_batch(job) // job.dp
    for key, micro, used in ((f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu",
                              job.rollout["micro"], True),
                             (f"{REF}.log_prob_micro_batch_size_per_gpu", job.ref_micro_batch,
                              job.use_kl)):
        if used and isinstance(micro, int) and micro > 0 and per_rank % micro:
            out.append(Finding("log_prob_micro_batch", f"{key}={micro} does not divide the "
                               f"{per_rank} sequences each of the {job.dp} DP ranks scores "
                               f"(train_batch_size*n padded to a multiple of lcm(DP, "
                               f"ppo_mini_batch_size*n)); verl asserts it at run time",
                               (key, "data.train_batch_size", _r("n"))))
    return out


def recompute_findings(job: JobReading, model=None) -> list[Finding]:
    """megatron-core's TransformerConfig checks, which fail only when the model is built."""
    t, out = job.transformer, []
    granularity, method = t.get("recompute_granularity"), t.get("recompute_method")
    layers, modules = t.get("recompute_num_layers"), t.get("recompute_modules") or []
    key = TRANSFORMER
    if granularity not in (None, "full", "selective"):
        out.append(Finding("recompute", f"{key}.recompute_granularity={granularity}: valid: "
                           f"full, selective or null", (f"{key}.recompute_granularity",)))
    if method not in (None, "uniform", "block"):
        out.append(Finding("recompute", f"{key}.recompute_method={method}: valid: uniform, "
                           f"block or null", (f"{key}.recompute_method",)))
    if granularity == "full":
        if method is None:
            out.append(Finding("recompute", f"{key}.recompute_granularity=full needs "
                               f"recompute_method uniform or block (megatron-core raises at "
                               f"model build)", (f"{key}.recompute_method",)))
        if not isinstance(layers, int) or layers < 1:
            out.append(Finding("recompute", f"{key}.recompute_granularity=full needs "
                               f"recompute_num_layers >= 1, got {layers}",
                               (f"{key}.recompute_num_layers",)))
    if granularity == "selective":
        if layers is not None:
            out.append(Finding("recompute", f"{key}.recompute_num_layers={layers} must be null "
                               f"with recompute_granularity=selective",
                               (f"{key}.recompute_num_layers",)))
        unknown = [name for name in modules if name not in RECOMPUTE_MODULES]
        if unknown:
            out.append(Finding("recompute", f"{key}.recompute_modules has {unknown}; valid: "
                               f"{', '.join(RECOMPUTE_MODULES)}", (f"{key}.recompute_modules",)))
        if model is not None and "mla_up_proj" in modules and not model.is_mla:
            out.append(Finding("recompute", f"{key}.recompute_modules has mla_up_proj but "
                               f"{model.name} has no multi-latent attention",
                               (f"{key}.recompute_modules",)))
    accounted = [name for name in ("account_for_embedding_in_pipeline_split",
                                   "account_for_loss_in_pipeline_split") if t.get(name)]
    if accounted and (job.first_stage_layers or job.last_stage_layers):
        out.append(Finding("pipeline_split", f"{key}.{accounted[0]}=True cannot be combined with "
                           f"num_layers_in_first/last_pipeline_stage (megatron-core raises)",
                           (f"{key}.{accounted[0]}", FIRST_STAGE, LAST_STAGE)))
    return out


def uniform_chunk_misfit(model, layout, chunk: int) -> list[int] | None:
    """The layers of each model chunk when full uniform recompute in chunks of ``chunk``
    layers does not divide them all (megatron-core's transformer_block loops ``range(start,
    start + chunk)`` and indexes past the model chunk); None when it divides."""
    sizes = _chunk_layers(model, layout)
    return sizes if any(size % chunk for size in sizes) else None


def _chunk_layers(model, layout) -> list[int]:
    first, middle, last, _ = (int(part[0]) for part in pipeline_split(
        model.num_layers, [layout.pp], [layout.first_stage_layers], [layout.last_stage_layers],
        [layout.account_embedding], [layout.account_loss]))
    stages = [first, last] + ([middle] if layout.pp > 2 else [])
    return sorted({stage // layout.vpp for stage in stages if stage})


SPLIT_KEYS = {"pipeline_layout": f"{TRANSFORMER}.pipeline_model_parallel_layout",
              "account_embedding": f"{TRANSFORMER}.account_for_embedding_in_pipeline_split",
              "account_loss": f"{TRANSFORMER}.account_for_loss_in_pipeline_split"}


def context_findings(config: dict, job: JobReading, model) -> list[Finding]:
    """The sequence against the model's context: verl 0.9.1's rollout server refuses a
    ``max_model_len`` above ``max_position_embeddings`` and, unset, takes that as the limit,
    cutting each response to what its prompt leaves (``vllm_async_server``)."""
    limit, total = model.max_position_embeddings, job.prompt_length + job.response_length
    max_model_len = get(config, _r("max_model_len"), None)
    if limit and isinstance(max_model_len, int) and max_model_len > limit:
        return [Finding("context_length", f"{_r('max_model_len')}={max_model_len} exceeds "
                        f"{model.name}'s max_position_embeddings {limit}: verl's rollout "
                        f"server raises ('max_model_len should be less than or equal to "
                        f"max_position_embeddings')", (_r("max_model_len"),))]
    if limit and total > limit:
        keys = ("data.max_prompt_length", "data.max_response_length")
        return [Finding("context_length", f"data.max_prompt_length + data.max_response_length"
                        f" = {total} exceeds {model.name}'s max_position_embeddings {limit}: "
                        f"verl's rollout serves at most {limit} tokens (max_model_len) and cuts "
                        f"each response to what its prompt leaves; shorten the lengths or raise "
                        f"max_position_embeddings in the model's config.json", keys,
                        "warning")]
    return []


def model_findings(config: dict, job: JobReading, request: PlanRequest,
                   layout) -> list[Finding]:
    """The planner's rules, and the model-shape rules verl leaves to megatron-core
    (``request``: the job's model, cluster and workload)."""
    model, cluster, workload = request.model, request.cluster, request.workload
    out = []
    pp, layers = layout.pp, model.num_layers
    given = (job.first_stage_layers or job.last_stage_layers or layout.account_embedding
             or layout.account_loss or layout.pipeline_layout)
    for field, message in split_problems(layers, pp, layout.vpp, layout.first_stage_layers,
                                         layout.last_stage_layers, layout.account_embedding,
                                         layout.account_loss, layout.pipeline_layout):
        out.append(Finding("pipeline_split", message, (SPLIT_KEYS.get(field, _m("pp")),)))
    if pp > 1 and not given and layers % pp:
        first, last, embedding, loss = default_split(layers, pp, layout.vpp)
        if embedding or loss:
            keys = [SPLIT_KEYS[name] for name, on in (("account_embedding", embedding),
                                                       ("account_loss", loss)) if on]
            fix = "set " + " and ".join(f"+{key}=True" for key in keys) + ", or "
        elif first or last:
            fix = "set " + " and ".join(f"+{key}={value}" for key, value in
                                         ((FIRST_STAGE, first), (LAST_STAGE, last)) if value) \
                + ", or "
        else:
            fix = ""
        out.append(Finding("pipeline_split", f"{model.name} has {layers} layers, not divisible by "
                           f"{_m('pp')}={pp}, and num_layers_in_first/last_pipeline_stage are "
                           f"not set, nor the embedding/loss counted as layers (megatron-core: "
                           f"'num_layers should be divisible by pipeline_model_parallel_size'); "
                           f"{fix}use a PP that divides {layers}",
                           (_m("pp"), FIRST_STAGE, LAST_STAGE)))
    if model.is_moe and job.actor["etp"] is None:
        out.append(Finding("expert_tensor_parallel", f"{_m('etp')} is null, so megatron-core "
                           f"splits every expert over TP={layout.tp}; set it explicitly (1 keeps "
                           f"experts whole)", (_m("etp"),), "warning"))
    if model.is_moe and layout.etp > 1 and not model.linear_bias \
            and job.transformer.get("add_bias_linear") is True:  # biased models: etp_moe_bias
        out.append(Finding("expert_tensor_parallel", f"{TRANSFORMER}.add_bias_linear=True with "
                           f"{_m('etp')}={layout.etp}: megatron-core supports MoE biases only "
                           f"with ETP 1", (f"{TRANSFORMER}.add_bias_linear", _m("etp"))))
    t = job.transformer
    if t.get("recompute_granularity") == "full" and t.get("recompute_method") == "uniform" \
            and isinstance(t.get("recompute_num_layers"), int) and t["recompute_num_layers"] > 0:
        chunk = t["recompute_num_layers"]
        sizes = uniform_chunk_misfit(model, layout, chunk)
        if sizes:
            out.append(Finding("recompute", f"{TRANSFORMER}.recompute_num_layers={chunk} with "
                               f"recompute_method=uniform does not divide the {sizes} layers of "
                               f"each model chunk; megatron-core indexes past the chunk (1 "
                               f"always works)", (f"{TRANSFORMER}.recompute_num_layers",)))
    out += context_findings(config, job, model)
    for rule, message in explain(model, cluster, workload, layout.to_dict()):
        if rule in CHECKED_PER_KEY or (job.dynamic_batch and rule in STATIC_BATCH_RULES):
            continue
        if rule == "pipeline_split" and pp > 1 and not given and layers % pp:
            continue  # reported above, with the settings to add
        level = "warning" if rule in ADVISORY_RULES else "error"
        keys = RULE_KEYS.get(rule, ())
        out.append(Finding(rule, message + key_values(config, keys), keys, level))
    return out
