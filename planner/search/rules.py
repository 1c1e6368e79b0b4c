"""The rules a GRPO layout must obey, each vectorised over layout columns.

Every rule names the library that enforces it.  ``check`` returns a boolean array, True where
the layout *breaks* the rule; ``message`` formats the broken rule for one layout with its values
and what would be valid.  Rules are listed in the order the search space reports rejections:
a layout is counted under the first rule it breaks, so the counts add up to the rejected total.

Also here: the pipeline split (:func:`pipeline_split`) and the *unwise* flags, legal layouts that
the ranking penalises (tensor parallelism across nodes and the like).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from planner.catalog.hardware import ClusterSpec
from planner.catalog.layers import MixerKind
from planner.catalog.models import ModelSpec
from planner.catalog.workload import GrpoWorkload
from planner.policy import DEFAULT_POLICY, MemoryPolicy
from planner.search.batches import log_prob_batches, update_batch_count, update_batches
from planner.search.layout import Columns
from planner.search.pipeline import layout_vpp, pipeline_split


def micro_batches_per_mini_batch(workload: GrpoWorkload, cols: Columns) -> np.ndarray:
    """Micro-batches each DP rank runs per optimizer step (verl normalises the mini-batch:
    ``ppo_mini_batch_size * n // dp``, then ``// ppo_micro_batch_size_per_gpu``)."""
    per_rank = workload.sequences_per_mini_batch // np.maximum(cols["dp"], 1)
    return np.maximum(per_rank // np.maximum(cols["micro_batch"], 1), 1)


@dataclass(frozen=True)
class Rule:
    name: str
    source: str
    check: Callable[[ModelSpec, ClusterSpec, GrpoWorkload, Columns], np.ndarray]
    message: Callable[[ModelSpec, ClusterSpec, GrpoWorkload, dict], str]


def _split(model: ModelSpec, cols: Columns):
    return pipeline_split(model.num_layers, cols["pp"], cols.get("first_stage_layers"),
                          cols.get("last_stage_layers"), cols.get("account_embedding"),
                          cols.get("account_loss"))


def _has_layout_string(cols: Columns) -> np.ndarray:
    layout = cols.get("pipeline_layout")
    if layout is None:
        return np.zeros(len(cols["tp"]), dtype=bool)
    return np.char.str_len(np.asarray(layout, dtype=str)) > 0


def _layout_vpp(cols: Columns) -> np.ndarray:
    """The VPP a layout string implies (its stages / PP), 0 where there is no string."""
    strings = _has_layout_string(cols)
    out = np.zeros(len(cols["tp"]), dtype=np.int64)
    for index in np.flatnonzero(strings):
        out[index] = layout_vpp(str(cols["pipeline_layout"][index]), int(cols["pp"][index]))
    return out


def _split_breaks(model: ModelSpec, cols: Columns) -> np.ndarray:
    """The split settings megatron-core refuses (a layout string is checked by
    :func:`planner.search.pipeline.layout_ranks` when it is read)."""
    return ~_split(model, cols)[3] & ~_has_layout_string(cols)


def _vpp_breaks(model: ModelSpec, cols: Columns) -> np.ndarray:
    """Each stage's layers divide into VPP chunks (with the embedding/loss counted as layers
    when they are); megatron-core 0.16.1 fails (ZeroDivisionError in
    get_transformer_layer_offset) for PP = 2 with VPP and both uneven stages set; a layout
    string fixes VPP to its stages / PP."""
    first, middle, last, _ = _split(model, cols)
    vpp, pp = cols["vpp"], cols["pp"]
    n = len(cols["tp"])
    given_first = np.asarray(cols.get("first_stage_layers", np.zeros(n))) > 0
    given_last = np.asarray(cols.get("last_stage_layers", np.zeros(n))) > 0
    embedding = np.asarray(cols.get("account_embedding", np.zeros(n))).astype(bool)
    loss = np.asarray(cols.get("account_loss", np.zeros(n))).astype(bool)
    per_rank_first = first + embedding
    per_rank_last = last + loss
    plain = (vpp > 1) & ((per_rank_first % vpp != 0) | (per_rank_last % vpp != 0)
                         | (np.where(pp > 2, middle, 0) % vpp != 0)
                         | (given_first & given_last & (pp == 2)))
    strings = _has_layout_string(cols)
    return np.where(strings, vpp != _layout_vpp(cols), plain)


def _stage_layers_text(model: ModelSpec, values: dict) -> str:
    """``first/middle/last`` layers of one layout's pipeline stages."""
    cols = {key: np.array([value]) for key, value in values.items()}
    return "/".join(str(int(part[0])) for part in _split(model, cols)[:3])


def _one_micro_batch_count(workload, values: dict) -> int:
    return int(micro_batches_per_mini_batch(workload, {k: np.array([x])
                                                       for k, x in values.items()})[0])


def _static(cols: Columns) -> np.ndarray:
    """Layouts with fixed micro-batch sizes: verl's divisibility rules apply to them; with
    dynamic batches verl packs to a token budget and rounds the micro-batch count itself."""
    dynamic = cols.get("dynamic_batch")
    if dynamic is None:
        return np.ones(len(cols["tp"]), dtype=bool)
    return ~np.asarray(dynamic).astype(bool)


def _packed_interleaved_breaks(workload, cols: Columns) -> np.ndarray:
    """Dynamic batches on an interleaved pipeline: verl rounds the packed micro-batch count up
    to a multiple of ``microbatch_group_size_per_vp_stage`` (PP) and raises when that exceeds
    the rank's sequences (``rearrange_micro_batches``: "Requested N non-empty micro-batches,
    but a rank has only M"); judged with every response at the maximum length, as memory is."""
    dp = np.maximum(cols["dp"], 1)
    update = update_batches(workload, cols).memory_count
    log_prob = log_prob_batches(workload, cols).memory_count
    return ~_static(cols) & (cols["vpp"] > 1) & (
        (update > workload.sequences_per_mini_batch // dp)
        | (log_prob > workload.sequences_per_step // dp))


def _interleaved_text(workload, values: dict) -> str:
    if values.get("dynamic_batch"):
        return (f"dynamic batches round the micro-batches of a pipeline with "
                f"virtual_pipeline_model_parallel_size {values['vpp']} up to a multiple of PP "
                f"{values['pp']}, one sequence at least each, but a DP rank has "
                f"{workload.sequences_per_mini_batch // max(values['dp'], 1)} sequences per "
                f"mini-batch (verl rearrange_micro_batches raises); give each rank a multiple "
                f"of PP sequences (fewer DP ranks or a larger mini-batch), or no VPP")
    return (f"with virtual_pipeline_model_parallel_size {values['vpp']} the "
            f"{_one_micro_batch_count(workload, values)} micro-batches per mini-batch must be "
            f">= PP {values['pp']} and a multiple of it")


def _token_budget_breaks(workload, cols: Columns) -> np.ndarray:
    n = len(cols["tp"])
    budget = np.asarray(cols.get("max_token_len", np.zeros(n)))
    log_prob = np.asarray(cols.get("log_prob_max_token_len", np.zeros(n)))
    log_prob = np.where(log_prob > 0, log_prob, budget)
    shortest = np.minimum(budget, log_prob) * cols["cp"]
    return ~_static(cols) & (shortest < workload.sequence_length)


def _gdn_tp_breaks(model: ModelSpec, tp) -> np.ndarray:
    """TP that does not divide the Gated DeltaNet key and value heads (none without them)."""
    g = model.linear_attention
    if g is None or not model.count(MixerKind.LINEAR):
        return np.zeros(np.shape(tp), dtype=bool)
    return (g.num_key_heads % tp != 0) | (g.num_value_heads % tp != 0)


def _mamba_tp_breaks(model: ModelSpec, tp) -> np.ndarray:
    m = model.mamba
    if m is None or not model.count(MixerKind.MAMBA):
        return np.zeros(np.shape(tp), dtype=bool)
    return (m.num_heads % tp != 0) | (m.n_groups % tp != 0)


def _mamba_cp_breaks(model: ModelSpec, tp, cp) -> np.ndarray:
    """megatron-core's MambaContextParallel: every CP rank gets whole heads, and the groups of
    a TP rank split over CP or are replicated across it."""
    m = model.mamba
    if m is None or not model.count(MixerKind.MAMBA):
        return np.zeros(np.shape(tp), dtype=bool)
    tp = np.maximum(np.asarray(tp), 1)
    heads, groups = m.num_heads // tp, np.maximum(m.n_groups // tp, 1)
    return (cp > 1) & ((heads % cp != 0) | ((groups % cp != 0) & (cp % groups != 0)))


def _mamba_pipeline_breaks(model: ModelSpec, cols: Columns) -> np.ndarray:
    """Pipeline settings megatron-core 0.16.1's ``MambaStack`` (Nemotron-H's ``MambaModel``)
    does not honour: it asserts there are no virtual pipeline stages, and its
    ``_select_layers_for_pipeline_parallel`` splits the layers by
    ``num_layers_in_first/last_pipeline_stage`` or evenly (``num_layers // PP``), reading
    neither ``account_for_embedding/loss_in_pipeline_split`` nor a layout string -- so an
    accounted split is built evenly (52 layers over PP 3: 17 + 17 + 17, the last layer never
    built).  An accounted split that equals the even one builds as costed."""
    n = len(cols["tp"])
    if model.mamba is None or not model.count(MixerKind.MAMBA):
        return np.zeros(n, dtype=bool)
    pp = np.maximum(np.asarray(cols["pp"]), 1)
    first, middle, last, _ = _split(model, cols)
    per_rank = model.num_layers // pp
    even = ((model.num_layers % pp == 0) & (first == per_rank) & (last == per_rank)
            & ((pp <= 2) | (middle == per_rank)))
    accounted = (np.asarray(cols.get("account_embedding", np.zeros(n))).astype(bool)
                 | np.asarray(cols.get("account_loss", np.zeros(n))).astype(bool))
    return (cols["vpp"] > 1) | _has_layout_string(cols) | (accounted & ~even)


def _mamba_pipeline_text(model: ModelSpec, values: dict) -> str:
    stack = f"{model.name}'s Mamba-2 hybrid stack (megatron-core 0.16.1 MambaStack)"
    if values["vpp"] > 1:
        return (f"virtual_pipeline_model_parallel_size {values['vpp']}: {stack} runs without "
                f"virtual pipeline stages (VPP must be 1)")
    what = ("pipeline layout string" if values.get("pipeline_layout")
            else "account_for_embedding/loss_in_pipeline_split")
    return (f"{what}: {stack} splits its {model.num_layers} layers evenly over PP (valid PP: "
            f"{_valid_divisors(model.num_layers)}) or by num_layers_in_first/last_pipeline_stage "
            f"(--first-stage-layers/--last-stage-layers); it reads neither the embedding/loss "
            f"counted as layers nor a pipeline layout string")


def _sinks_or_windows(model: ModelSpec) -> str:
    """What of a model's attention Transformer Engine cannot run under p2p context parallelism
    ('' when nothing)."""
    parts = (["attention sinks"] if model.attention_sinks else []) + (
        ["sliding-window layers"] if model.count(MixerKind.SLIDING) else [])
    return " and ".join(parts)


def _valid_tp(model: ModelSpec) -> str:
    """TP sizes megatron-core and vLLM both take for the attention: dividing the heads, with
    the KV heads a multiple or a divisor of TP."""
    heads, groups = model.num_attention_heads, model.num_query_groups
    values = [d for d in range(1, heads + 1)
              if heads % d == 0 and (groups % d == 0 or d % groups == 0)]
    return ", ".join(map(str, values[:12])) + (" ..." if len(values) > 12 else "")


def _ffn_widths(model: ModelSpec) -> int:
    """The MLP widths TP splits (the dense one where a layer is dense, the shared experts'),
    as their greatest common divisor."""
    dense = model.ffn_hidden_size if model.num_layers > model.num_moe_layers else 0
    return math.gcd(dense, model.shared_expert_ffn_hidden_size) or 1


def _splittable_pp(num_layers: int) -> str:
    pp = np.arange(1, num_layers + 1)
    valid = pp[pipeline_split(num_layers, pp)[3]]
    return ", ".join(map(str, valid[:16])) + (" ..." if len(valid) > 16 else "")


def _valid_divisors(n: int, limit: int | None = None) -> str:
    values = [d for d in range(1, n + 1) if n % d == 0 and (limit is None or d <= limit)]
    return ", ".join(map(str, values[:12])) + (" ..." if len(values) > 12 else "")


RULES: tuple[Rule, ...] = (
    Rule("world_size", "verl: actor DP = world / (TP*PP*CP), an integer",
         lambda m, c, w, x: (x["tp"] * x["pp"] * x["cp"] * x["dp"] != c.num_gpus),
         lambda m, c, w, v: f"TP*PP*CP*DP = {v['tp']}*{v['pp']}*{v['cp']}*{v['dp']} != "
                            f"{c.num_gpus} GPUs; TP*PP*CP must divide the world size"),
    Rule("tp_divides_heads", "megatron-core TransformerConfig: num_attention_heads % TP == 0",
         lambda m, c, w, x: m.num_attention_heads % x["tp"] != 0,
         lambda m, c, w, v: f"tensor_model_parallel_size {v['tp']} does not divide "
                            f"num_attention_heads {m.num_attention_heads}; valid TP: "
                            f"{_valid_divisors(m.num_attention_heads)}"),
    Rule("tp_divides_query_groups",
         "megatron-core TransformerConfig: num_query_groups a multiple or divisor of TP",
         lambda m, c, w, x: (m.num_query_groups % x["tp"] != 0)
         & (x["tp"] % m.num_query_groups != 0),
         lambda m, c, w, v: f"num_query_groups (KV heads) {m.num_query_groups} is neither a "
                            f"multiple nor a divisor of tensor_model_parallel_size {v['tp']}; "
                            f"valid TP: {_valid_tp(m)}"),
    Rule("tp_divides_ffn", "megatron-core ColumnParallelLinear: MLP width % TP == 0",
         lambda m, c, w, x: ((m.ffn_hidden_size % x["tp"] != 0)
                             & np.bool_(m.num_layers > m.num_moe_layers))
         | (m.shared_expert_ffn_hidden_size % x["tp"] != 0),
         lambda m, c, w, v: f"tensor_model_parallel_size {v['tp']} does not divide the MLP width "
                            f"{m.ffn_hidden_size}"
                            + (f" / shared-expert width {m.shared_expert_ffn_hidden_size}"
                               if m.shared_expert_ffn_hidden_size else "")
                            + f"; valid TP: {_valid_divisors(_ffn_widths(m))}"),
    Rule("tp_divides_linear_attention_heads",
         "megatron-core 0.16.1 TransformerConfig (gated_delta_net): linear_num_key_heads and "
         "linear_num_value_heads % TP == 0",
         lambda m, c, w, x: _gdn_tp_breaks(m, x["tp"]),
         lambda m, c, w, v: f"tensor_model_parallel_size {v['tp']} does not divide the Gated "
                            f"DeltaNet heads ({m.linear_attention.num_key_heads} key, "
                            f"{m.linear_attention.num_value_heads} value); valid TP: "
                            f"{_valid_divisors(m.linear_attention.num_key_heads)}"),
    Rule("cp_linear_attention",
         "megatron-core 0.16.1 TransformerConfig: 'Gated delta net does not support context "
         "parallel for now' (context_parallel_size == 1; GDN CP is NVIDIA/Megatron-LM PR 2642, "
         "after the pinned release)",
         lambda m, c, w, x: np.bool_(m.count(MixerKind.LINEAR) > 0) & (x["cp"] > 1),
         lambda m, c, w, v: f"context_parallel_size {v['cp']}: {m.name}'s Gated DeltaNet layers "
                            f"run without context parallelism in megatron-core 0.16.1 (CP must "
                            f"be 1)"),
    Rule("cp_attention_sinks",
         "TransformerEngine 2.8+ DotProductAttention under context parallelism: a learnable "
         "softmax (attention sinks, softmax_type='learnable') only with cp_comm_type a2a, a "
         "sliding window not with p2p (its context-parallel tests' support matrix); verl 0.9.1 "
         "sets no cp_comm_type, so megatron-core's TEDotProductAttention runs p2p",
         lambda m, c, w, x: np.bool_(bool(_sinks_or_windows(m))) & (x["cp"] > 1),
         lambda m, c, w, v: f"context_parallel_size {v['cp']}: {m.name}'s "
                            f"{_sinks_or_windows(m)} have no Transformer Engine attention "
                            f"backend under context parallelism with cp_comm_type p2p, which "
                            f"verl runs (TE takes a learnable softmax only with a2a, a window "
                            f"not with p2p); CP must be 1"),
    Rule("tp_divides_mamba_heads",
         "megatron-core 0.16.1 MambaMixer: nheads % TP == 0 and ngroups % TP == 0",
         lambda m, c, w, x: _mamba_tp_breaks(m, x["tp"]),
         lambda m, c, w, v: f"tensor_model_parallel_size {v['tp']} does not divide the Mamba-2 "
                            f"heads {m.mamba.num_heads} and groups {m.mamba.n_groups}; valid TP: "
                            f"{_valid_divisors(m.mamba.n_groups)}"),
    Rule("cp_divides_mamba_heads",
         "megatron-core 0.16.1 MambaContextParallel: (nheads / TP) % CP == 0, and ngroups / TP "
         "a multiple or divisor of CP",
         lambda m, c, w, x: _mamba_cp_breaks(m, x["tp"], x["cp"]),
         lambda m, c, w, v: f"context_parallel_size {v['cp']} with TP {v['tp']}: the Mamba-2 "
                            f"heads per TP rank ({m.mamba.num_heads // v['tp']}) must divide by "
                            f"CP and the groups per TP rank ({m.mamba.n_groups // v['tp']}) be "
                            f"a multiple or divisor of it"),
    Rule("pipeline_split",
         "megatron-core: layers split over PP stages (uneven first/last stages, or the embedding "
         "and loss counted as layers)",
         lambda m, c, w, x: _split_breaks(m, x),
         lambda m, c, w, v: f"{m.num_layers} layers cannot be split over pipeline_model_parallel"
                            f"_size {v['pp']} (first/last stage layers "
                            f"{v.get('first_stage_layers', 0)}/{v.get('last_stage_layers', 0)}, "
                            f"embedding/loss counted "
                            f"{bool(v.get('account_embedding'))}/{bool(v.get('account_loss'))}; "
                            f"the two ways cannot be combined); PP that split evenly or with the "
                            f"embedding/loss counted: {_splittable_pp(m.num_layers)}"),
    Rule("vpp_needs_pp", "megatron-core: virtual pipeline stages need PP > 1",
         lambda m, c, w, x: (x["vpp"] > 1) & (x["pp"] < 2),
         lambda m, c, w, v: f"virtual_pipeline_model_parallel_size {v['vpp']} needs "
                            f"pipeline_model_parallel_size > 1 (got {v['pp']})"),
    Rule("vpp_divides_stage_layers",
         "megatron-core: every stage's layers divide evenly into VPP model chunks",
         lambda m, c, w, x: _vpp_breaks(m, x),
         lambda m, c, w, v: f"virtual_pipeline_model_parallel_size {v['vpp']} does not divide "
                            f"the layers of every pipeline stage, or differs from the stages of "
                            f"the pipeline layout string (first/middle/last: "
                            f"{_stage_layers_text(m, v)})"),
    Rule("mamba_pipeline",
         "megatron-core 0.16.1 MambaStack._select_layers_for_pipeline_parallel: no virtual "
         "pipeline stages (asserted); layers split evenly or by num_layers_in_first/last_pipeline"
         "_stage, the accounted embedding/loss and layout strings not read",
         lambda m, c, w, x: _mamba_pipeline_breaks(m, x),
         lambda m, c, w, v: _mamba_pipeline_text(m, v)),
    Rule("dense_model_has_no_experts", "megatron-core: EP/ETP apply to MoE layers only",
         lambda m, c, w, x: (~np.bool_(m.is_moe)) & ((x["ep"] > 1) | (x["etp"] > 1)),
         lambda m, c, w, v: f"{m.name} is a dense model: expert_model_parallel_size "
                            f"{v['ep']} and expert_tensor_parallel_size {v['etp']} must be 1"),
    Rule("ep_divides_experts", "megatron-core TransformerConfig: num_moe_experts % EP == 0",
         lambda m, c, w, x: np.bool_(m.is_moe) & (max(m.num_experts, 1) % x["ep"] != 0),
         lambda m, c, w, v: f"expert_model_parallel_size {v['ep']} does not divide "
                            f"{m.num_experts} experts; valid EP: {_valid_divisors(m.num_experts)}"),
    Rule("etp_divides_moe_ffn", "megatron-core: expert FFN width split by ETP",
         lambda m, c, w, x: np.bool_(m.is_moe) & (max(m.moe_ffn_hidden_size, 1) % x["etp"] != 0),
         lambda m, c, w, v: f"expert_tensor_parallel_size {v['etp']} does not divide "
                            f"moe_ffn_hidden_size {m.moe_ffn_hidden_size}; valid ETP: "
                            f"{_valid_divisors(m.moe_ffn_hidden_size)}"),
    Rule("etp_moe_bias",
         "megatron-core 0.16.1 TransformerConfig: 'Bias in Moe is only supported when ETP==1' "
         "(add_bias_linear, which the bridge sets for a checkpoint with linear biases)",
         lambda m, c, w, x: np.bool_(m.is_moe and m.linear_bias) & (x["etp"] > 1),
         lambda m, c, w, v: f"expert_tensor_parallel_size {v['etp']}: {m.name}'s linear layers "
                            f"carry biases (add_bias_linear), which megatron-core supports in "
                            f"MoE layers only with ETP 1"),
    Rule("expert_grid", "megatron-core parallel_state: world % (ETP*EP*PP) == 0",
         lambda m, c, w, x: c.num_gpus % (x["etp"] * x["ep"] * x["pp"]) != 0,
         lambda m, c, w, v: f"ETP*EP*PP = {v['etp']}*{v['ep']}*{v['pp']} does not divide "
                            f"{c.num_gpus} GPUs"),
    Rule("batch_divides_dp", "verl: train_batch_size * n divisible by DP * micro-batch",
         lambda m, c, w, x: _static(x) & ((w.sequences_per_step
                                           % np.maximum(x["dp"] * x["micro_batch"], 1)) != 0),
         lambda m, c, w, v: f"train_batch_size*n = {w.sequences_per_step} is not divisible by "
                            f"DP*micro_batch = {v['dp']}*{v['micro_batch']}"),
    Rule("mini_batch_divides_dp", "verl: ppo_mini_batch_size * n divisible by DP",
         lambda m, c, w, x: (w.sequences_per_mini_batch % np.maximum(x["dp"], 1)) != 0,
         lambda m, c, w, v: f"ppo_mini_batch_size*n = {w.sequences_per_mini_batch} is not "
                            f"divisible by DP = {v['dp']}"),
    Rule("micro_batch_divides_mini_batch",
         "verl: per-GPU mini-batch divisible by ppo_micro_batch_size_per_gpu",
         lambda m, c, w, x: _static(x) & (((w.sequences_per_mini_batch
                                            // np.maximum(x["dp"], 1)) % x["micro_batch"]) != 0),
         lambda m, c, w, v: f"per-GPU mini-batch {w.sequences_per_mini_batch // max(v['dp'], 1)}"
                            f" (ppo_mini_batch_size*n/DP) is not divisible by micro-batch "
                            f"{v['micro_batch']}"),
    Rule("interleaved_microbatches",
         "megatron-core interleaved schedule: micro-batches >= PP and a multiple of PP (with "
         "dynamic batches verl rounds up to that and needs a sequence for each)",
         lambda m, c, w, x: (_static(x) & (x["vpp"] > 1)
                             & ((micro_batches_per_mini_batch(w, x) < x["pp"])
                                | (micro_batches_per_mini_batch(w, x) % x["pp"] != 0)))
         | _packed_interleaved_breaks(w, x),
         lambda m, c, w, v: _interleaved_text(w, v)),
    Rule("token_budget_holds_a_sequence",
         "verl rearrange_micro_batches: max_token_len_per_gpu * CP >= the longest sequence",
         lambda m, c, w, x: _token_budget_breaks(w, x),
         lambda m, c, w, v: f"token budget {v.get('max_token_len', 0)} (ppo_max_token_len_per_gpu)"
                            f" / {v.get('log_prob_max_token_len', 0) or v.get('max_token_len', 0)}"
                            f" (log_prob_max_token_len_per_gpu) x CP {v['cp']} is below the "
                            f"longest sequence, {w.sequence_length} tokens (max prompt + "
                            f"response length); verl asserts max_token_len >= it"),
    Rule("rollout_tp_divides_heads", "vLLM: num_attention_heads % tensor_parallel_size == 0",
         lambda m, c, w, x: m.num_attention_heads % x["rollout_tp"] != 0,
         lambda m, c, w, v: f"rollout tensor_model_parallel_size {v['rollout_tp']} does not "
                            f"divide num_attention_heads {m.num_attention_heads}; valid "
                            f"rollout TP: {_valid_tp(m)}"),
    Rule("rollout_tp_kv_heads", "vLLM: KV heads divisible by TP, or TP by KV heads (replicated)",
         lambda m, c, w, x: (m.num_query_groups % x["rollout_tp"] != 0)
         & (x["rollout_tp"] % m.num_query_groups != 0),
         lambda m, c, w, v: f"rollout TP {v['rollout_tp']} and {m.num_query_groups} KV heads: "
                            f"one must divide the other; valid rollout TP: {_valid_tp(m)}"),
    Rule("rollout_world", "verl: rollout replicas of TP*DP GPUs tile the world",
         lambda m, c, w, x: c.num_gpus % (x["rollout_tp"] * x["rollout_dp"]) != 0,
         lambda m, c, w, v: f"rollout TP*DP = {v['rollout_tp']}*{v['rollout_dp']} does not "
                            f"divide {c.num_gpus} GPUs"),
    Rule("rollout_ep", "verl/vLLM: rollout EP is 1 or TP*DP (expert parallel), MoE only",
         lambda m, c, w, x: np.where(np.bool_(m.is_moe),
                                     (x["rollout_ep"] != 1)
                                     & (x["rollout_ep"] != x["rollout_tp"] * x["rollout_dp"]),
                                     x["rollout_ep"] != 1)
         | (np.bool_(m.is_moe) & (max(m.num_experts, 1) % x["rollout_ep"] != 0)),
         lambda m, c, w, v: f"rollout expert_parallel_size {v['rollout_ep']} must be 1 or rollout"
                            f" TP*DP = {v['rollout_tp'] * v['rollout_dp']}"
                            + (f" and divide {m.num_experts} experts" if m.is_moe
                               else f" ({m.name} is dense: 1)")),
    Rule("rollout_dp_moe_only", "verl: rollout data_parallel_size > 1 serves MoE expert parallel",
         lambda m, c, w, x: (~np.bool_(m.is_moe)) & (x["rollout_dp"] > 1),
         lambda m, c, w, v: f"rollout data_parallel_size {v['rollout_dp']} > 1 is for MoE expert "
                            f"parallel; {m.name} is dense (use 1)"),
)

RULE_NAMES = tuple(rule.name for rule in RULES)


def violations(model: ModelSpec, cluster: ClusterSpec, workload: GrpoWorkload,
               cols: Columns, rules: tuple[Rule, ...] = RULES) -> dict[str, np.ndarray]:
    """For each rule, a boolean array: True where the layout breaks it."""
    n = len(cols["tp"])
    return {rule.name: np.broadcast_to(rule.check(model, cluster, workload, cols), (n,))
            for rule in rules}


def first_violation(broken: dict[str, np.ndarray], order: list[str] | tuple[str, ...] = RULE_NAMES
                    ) -> np.ndarray:
    """Index into ``order`` of the first rule each layout breaks, -1 where it breaks none."""
    stack = np.stack([broken[name] for name in order])
    return np.where(stack.any(axis=0), stack.argmax(axis=0), -1)


def explain(model: ModelSpec, cluster: ClusterSpec, workload: GrpoWorkload,
            values: dict) -> list[tuple[str, str]]:
    """Every rule one layout (a dict of field values) breaks, as (name, message)."""
    cols = {key: np.array([value]) for key, value in values.items()}
    broken = violations(model, cluster, workload, cols)
    return [(rule.name, rule.message(model, cluster, workload, values))
            for rule in RULES if bool(broken[rule.name][0])]


# --- legal but unwise ------------------------------------------------------------------------

UNWISE_FLAGS = ("tp_across_nodes", "rollout_tp_across_nodes", "expert_tp_across_nodes",
                "cp_short_sequences", "pipeline_starved", "memory_tight")
SHORT_SEQUENCE_PER_CP_TOKENS = 2048  # below this per CP rank, CP's ring exchange dominates


# a column of :func:`planner.search.batches.update_batch_count`'s values that
# :func:`unwise_flags` reads when given (its own otherwise)
UPDATE_COUNT = "update_batch_count"


def unwise_flags(model: ModelSpec, cluster: ClusterSpec, workload: GrpoWorkload,
                 cols: Columns, policy: MemoryPolicy = DEFAULT_POLICY) -> dict[str, np.ndarray]:
    """Legal layouts that are slow for a known reason; the ranking penalises each flag.

    ``memory_tight``: the nvidia-smi peak (``peak_fraction`` of the GPU, any phase, vLLM's
    pool included) above the memory policy's band -- users hold jobs to the band, the model's
    fixed overheads are estimates, and verl's responses vary in length step to step."""
    domain = cluster.fast_domain_gpus
    # (a plan's chunk: the count found once per core row, UPDATE_COUNT)
    m = cols[UPDATE_COUNT] if UPDATE_COUNT in cols else update_batch_count(workload, cols)
    return {
        "tp_across_nodes": cols["tp"] > domain,
        "rollout_tp_across_nodes": cols["rollout_tp"] > domain,
        "expert_tp_across_nodes": cols["etp"] > domain,
        "cp_short_sequences": _short_per_cp(workload.sequence_length, cols["cp"]),
        # fewer micro-batches than stages leaves the 1F1B pipeline mostly idle
        "pipeline_starved": (cols["pp"] > 1) & (m < cols["pp"]),
        # a peak above the band OOMs on a long response or fragmentation
        "memory_tight": np.zeros(len(cols["tp"]), dtype=bool) if "peak_fraction" not in cols
        else cols["peak_fraction"] > policy.high + 1e-9,
    }


def _short_per_cp(sequence_length, cp) -> np.ndarray:
    """``(cp > 1) & (sequence_length // cp < SHORT_SEQUENCE_PER_CP_TOKENS)``; for integers (cp
    above 1, so positive: ``s // c < t`` is ``s < t * c``, which for an integer ``c`` is
    ``s // t < c``) by one division of the length, not a division per row (nor a product per
    row, which wraps in a narrow or large ``cp``: int16 from 16 on)."""
    cp = np.asarray(cp)
    if isinstance(sequence_length, int) and cp.dtype.kind in "iu" and sequence_length >= 0:
        return (cp > 1) & (cp > sequence_length // SHORT_SEQUENCE_PER_CP_TOKENS)
    return (cp > 1) & (sequence_length // cp < SHORT_SEQUENCE_PER_CP_TOKENS)


@dataclass(frozen=True)
class PipelineStarvation:
    """A pipeline with fewer micro-batches per optimizer step than stages (the
    ``pipeline_starved`` flag): 1F1B idles ``(pp - 1) / vpp`` slots per step (Narayanan et al.
    2021, section 2.2), so the bubble outweighs the work.  ``mini_batch_needed``: the smallest
    mini-batch (prompts; sequences for pretraining) that gives every stage a micro-batch at this
    DP and micro-batch size (with dynamic batching, at one sequence per micro-batch at most)."""

    micro_batches: int  # per optimizer step on one DP rank
    stages: int  # pipeline stages (PP)
    sequences_per_rank: float  # sequences of one optimizer step on one DP rank
    bubble_fraction: float  # idle share of the pipeline: (pp-1)/vpp / (m + (pp-1)/vpp)
    mini_batch_needed: int

    def fixes(self, grpo: bool) -> list[str]:
        option = "--mini-batch-size" if grpo else "--global-batch"
        return ["PP 1" if self.micro_batches == 1 else f"PP <= {self.micro_batches}",
                f"{option} >= {self.mini_batch_needed}",
                "a smaller micro-batch" if self.sequences_per_rank > self.micro_batches
                else "fewer DP ranks"]

    def to_dict(self, grpo: bool) -> dict:
        return {"micro_batches_per_step": self.micro_batches, "pipeline_stages": self.stages,
                "sequences_per_dp_rank": self.sequences_per_rank,
                "bubble_fraction": round(self.bubble_fraction, 3), "fixes": self.fixes(grpo)}


def pipeline_starvation(workload, values: dict) -> PipelineStarvation | None:
    """Why one layout (a dict of field values) is ``pipeline_starved``; None where it is not."""
    cols = {key: np.array([value]) for key, value in values.items()}
    pp, vpp, dp = int(values["pp"]), int(values["vpp"]), max(int(values["dp"]), 1)
    m = int(update_batches(workload, cols).count[0])
    if pp <= 1 or m >= pp:
        return None
    idle = (pp - 1) / vpp
    per_prompt = workload.sequences_per_mini_batch // workload_batch(workload)
    needed = -(-pp * int(values["micro_batch"]) * dp // per_prompt)
    return PipelineStarvation(
        micro_batches=m, stages=pp,
        sequences_per_rank=float(workload.sequences_per_mini_batch) / dp,
        bubble_fraction=idle / (m + idle), mini_batch_needed=int(needed))


def workload_batch(workload) -> int:
    """The user's optimizer-step batch: prompts (GRPO's mini-batch) or sequences (pretraining's
    global batch)."""
    return getattr(workload, "mini_batch_size", None) or workload.global_batch
