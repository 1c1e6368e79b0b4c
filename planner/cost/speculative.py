"""Speculative decoding with the model's multi-token-prediction (MTP) layers, and those layers in
the actor: pure functions of the model, the workload and a few integers (TP/EP degrees may be
numpy arrays, one value per candidate).

verl 0.9.1 (``actor_rollout_ref.model.mtp``, ``verl/workers/config/model.py MtpConfig``):

* ``mtp.enable`` builds the MTP layers into the Megatron actor (megatron-core's
  ``MultiTokenPredictionBlock`` after the last decoder layer, so on the last pipeline stage) and
  keeps them in the checkpoint and the weight export; without it verl zeroes
  ``num_nextn_predict_layers`` / ``mtp_num_hidden_layers`` (``HFModelConfig.__post_init__``).
  ``check_mtp_config`` (``utils/megatron_utils.py``) refuses it on a model without MTP layers.
  They are ordinary parameters: weights, main grads and optimizer state whether or not they
  are trained.
* ``mtp.enable_train`` passes the labels to the last stage so the MTP block runs and adds its
  loss (``models/mcore/model_forward.py``; scaled by ``mtp_loss_scaling_factor``): one more
  decoder layer, the ``2h -> h`` projection and one more full-vocabulary cross entropy per MTP
  layer.  verl's ``FlopsCounter`` does not count them (``perf/mfu/actor`` leaves them out).
* ``mtp.enable_rollout`` hands vLLM ``speculative_config={"method": mtp.method,
  "num_speculative_tokens": k}`` (``vllm_rollout/utils.py build_mtp_speculative_config``; SGLang:
  EAGLE with ``speculative_num_steps`` / ``speculative_num_draft_tokens``) and syncs the actor's
  MTP weights into the drafter (``_iter_all_models``).

One verification step of vLLM's MTP proposer (``vllm/v1/spec_decode/eagle.py``, which MTP
reuses): the target runs ``k + 1`` query tokens per sequence against the cached context (weights
and the K/V read once, FLOPs and activation traffic ``k + 1`` times), then the drafter runs
``k`` forward steps of one token per sequence (its layer, the ``eh_proj`` and the shared output
layer), and the sequence advances by the accepted tokens plus one: ``acceptance_length`` tokens
on average (Leviathan et al. 2023, eq. 1).  The drafter's attention layers keep their own K/V in
the same pool; every running sequence reserves ``k`` lookahead slots; a Gated DeltaNet / Mamba
layer keeps ``k`` more state pages and ``k`` more conv columns
(:func:`planner.cost.layer_kinds.recurrent_state_bytes_layer`, ``KvCacheLayout``).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from planner.catalog.layers import LayerSpec, MixerKind, MlpKind
from planner.catalog.models import ModelSpec
from planner.cost.layer_kinds import kv_bytes_per_token_layer, layer_tensor_count
from planner.errors import PlanInputError

BF16_BYTES = 2
# Per MTP layer beside its decoder layer: the two input norms (embedding, hidden state), the
# 2h -> h projection and the shared head's norm (DeepSeek-V3 §2.2: ``enorm``, ``hnorm``,
# ``eh_proj``, ``shared_head.norm``)
MTP_EXTRA_TENSORS = 4


def _f(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def check_mtp(model: ModelSpec, workload) -> None:
    """Refuse MTP on a model without MTP layers, by name (verl's ``check_mtp_config``: "enable
    mtp while model has no mtp layer")."""
    if not workload.mtp_enabled or model.mtp_layers:
        return
    from planner.catalog.models import builtin_model, catalog_names  # on refusal only

    flag = ("--speculative mtp (mtp.enable_rollout)" if workload.speculative == "mtp"
            else "--train-mtp (mtp.enable_train)")
    with_mtp = [name for name in catalog_names() if builtin_model(name).mtp_layers]
    raise PlanInputError(f"{flag}: model {model.name} has no MTP layers "
                         f"(num_nextn_predict_layers / mtp_num_hidden_layers = 0); verl "
                         f"0.9.1 refuses mtp.enable on it (check_mtp_config). Catalog models "
                         f"with MTP layers: {', '.join(with_mtp)}")


def mtp_layer(model: ModelSpec) -> LayerSpec:
    """The decoder layer inside one MTP layer: the model's attention (MLA or full) and its last
    feed-forward kind (:func:`planner.catalog.params.mtp_params`)."""
    mixer = MixerKind.MLA if model.is_mla else MixerKind.FULL
    mlp = next((layer.mlp for layer in reversed(model.layers) if layer.mlp is not MlpKind.NONE),
               MlpKind.DENSE)
    return LayerSpec(mixer, mlp)


@lru_cache(maxsize=32)
def mtp_is_moe(model: ModelSpec) -> bool:
    """Whether the MTP layers' feed-forward is MoE (once per model: every training pass asks)."""
    return mtp_layer(model).mlp is MlpKind.MOE


def mtp_param_split(model: ModelSpec) -> tuple[int, int]:
    """(non-expert, routed-expert) parameters of all MTP layers (their sum is
    ``model.mtp_params``)."""
    experts = model.mtp_layers * model.params.experts_per_layer if mtp_is_moe(model) else 0
    return model.mtp_params - experts, experts


def mtp_active_params_per_token(model: ModelSpec) -> float:
    """Parameters one token passes through in one MTP layer (its top-k experts only)."""
    non_expert, experts = mtp_param_split(model)
    per_layer = non_expert / max(model.mtp_layers, 1)
    if experts:
        per_layer += model.params.active_experts_per_layer
    return float(per_layer)


def output_layer_params(model: ModelSpec) -> int:
    """The output layer the drafter shares with the model (the embedding when tied)."""
    p = model.params
    return p.output_layer or p.embedding


# --- rollout ----------------------------------------------------------------------------------


def drafter_weight_bytes(model: ModelSpec, rollout_tp, rollout_ep, linear_bytes: int = 2
                         ) -> np.ndarray:
    """The drafter's own weights on one rollout GPU (the MTP layers; the embedding and output
    layer are the target's): non-expert parts split by TP, experts by EP (else TP), at
    ``linear_bytes`` per weight (1 with an FP8 rollout)."""
    non_expert, experts = mtp_param_split(model)
    tp = _f(rollout_tp)
    expert_shards = np.where(_f(rollout_ep) > 1, _f(rollout_ep), tp)
    return linear_bytes * (non_expert / tp + experts / expert_shards)


def drafter_kv_bytes_per_token(model: ModelSpec, rollout_tp, kv_dtype: str = "bfloat16"
                               ) -> np.ndarray:
    """K/V bytes per token the MTP layers' attention adds to one rank's pool: one attention
    layer each, sized as the model's (MLA latent, or GQA heads over TP)."""
    mixer = mtp_layer(model).mixer
    return model.mtp_layers * _f(kv_bytes_per_token_layer(model, mixer, rollout_tp, kv_dtype))


def pool_bytes_per_token(target_bytes_per_token, drafter_bytes_per_token) -> np.ndarray:
    """Bytes one token of a sequence costs the KV pool: the target's growing K/V plus the
    drafter's (vLLM allocates the drafter's attention layers in the same KV-cache groups)."""
    return _f(target_bytes_per_token) + _f(drafter_bytes_per_token)


def lookahead_tokens(workload) -> int:
    """Slots a running sequence reserves for the drafted tokens (vLLM's scheduler allocates
    ``num_lookahead_tokens = num_speculative_tokens`` ahead of every decode)."""
    return int(getattr(workload, "draft_tokens", 0))


def verified_tokens(workload) -> int:
    """Query tokens per sequence in one target forward: the last token plus the ``k`` drafted
    ones (1 without speculation)."""
    return 1 + lookahead_tokens(workload)


def decode_steps(token_steps, workload) -> np.ndarray:
    """Verification steps that emit what ``token_steps`` one-token decode steps would: each
    advances ``acceptance_length`` tokens per sequence (:attr:`tokens_per_verification`)."""
    return _f(token_steps) / float(getattr(workload, "tokens_per_verification", 1.0))


def drafter_step_flops(model: ModelSpec, tokens) -> np.ndarray:
    """FLOPs of one drafter forward over ``tokens`` tokens (one per running sequence), all
    MTP layers: ``2 x`` the parameters each token passes (its layer with the top-k experts, the
    ``eh_proj``, the norms) and the output layer's logits (Kaplan et al. 2020's ``2N`` per
    token; attention over the context is left to the caller)."""
    per_token = model.mtp_layers * mtp_active_params_per_token(model) \
        + model.mtp_layers * output_layer_params(model)
    return 2.0 * _f(tokens) * per_token


def drafter_step_weight_bytes(model: ModelSpec, rollout_tp, rollout_ep, batch,
                              linear_bytes: int = 2) -> np.ndarray:
    """Weight bytes one drafter forward reads on one GPU: its layers (of an MoE layer only the
    experts the batch routes to, ``E * (1 - (1 - k/E)^b)`` as in the target's decode) and the
    shared output layer (bf16, split by TP)."""
    tp = _f(rollout_tp)
    weights = drafter_weight_bytes(model, rollout_tp, rollout_ep, linear_bytes)
    if mtp_is_moe(model):
        e, k = model.num_experts, model.moe_top_k
        expert_shards = np.where(_f(rollout_ep) > 1, _f(rollout_ep), tp)
        per_expert = model.params.experts_per_layer / e * linear_bytes * model.mtp_layers
        touched = e * (1 - (1 - k / e) ** _f(batch))
        weights = weights - e * per_expert / expert_shards + touched * per_expert / expert_shards
    return weights + BF16_BYTES * output_layer_params(model) / tp


def mtp_tensor_count(model: ModelSpec) -> int:
    """Checkpoint tensors of the MTP layers verl exports with ``mtp.enable`` (the decoder layer's
    own, as :func:`planner.cost.layer_kinds.layer_tensor_count` counts them, plus the norms and
    ``eh_proj``)."""
    if not model.mtp_layers:
        return 0
    return model.mtp_layers * (layer_tensor_count(model, mtp_layer(model)) + MTP_EXTRA_TENSORS)


# --- the actor ---------------------------------------------------------------------------------


def mtp_stage_params(model: ModelSpec, workload, tp, ep, etp) -> tuple[np.ndarray, np.ndarray]:
    """(non-expert, expert) MTP parameters one GPU of the last pipeline stage holds when verl
    builds them (``mtp.enable``): non-expert split by TP, routed experts by EP x ETP; zero
    otherwise."""
    if not workload.mtp_enabled or not model.mtp_layers:
        zero = np.zeros_like(_f(tp))
        return zero, zero
    non_expert, experts = mtp_param_split(model)
    return non_expert / _f(tp), experts / (_f(ep) * _f(etp))


def trains_mtp(model: ModelSpec, workload) -> bool:
    """The MTP block runs in the actor's passes (``mtp.enable_train``: the labels reach the
    last stage)."""
    return workload.train_mtp and model.mtp_layers > 0
