"""The ``architecture`` summary of a model for one workload: what the output contract of issue 22
carries (``plan`` and ``estimate`` JSON wire it in; this module only computes it).

Every figure comes from the layer list: parameters from :mod:`planner.catalog.params`, cache
bytes from vLLM's allocator as :mod:`planner.cost.layer_kinds` restates it, FLOPs in verl
``FlopsCounter``'s convention (:mod:`planner.cost.flops`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from planner.catalog.layers import mixer_counts, mlp_counts
from planner.catalog.models import ModelSpec
from planner.catalog.support import family_of, route_of
from planner.cost.flops import verl_reports_mfu, verl_training_flops_per_sequence
from planner.cost.layer_kinds import (
    VLLM_DEFAULTS,
    EngineCache,
    kv_cache_bytes_per_sequence,
    kv_cache_bytes_per_token,
)


@dataclass(frozen=True)
class ArchitectureSummary:
    """One model at one workload's sequence length (rollout cache figures on one rank at
    ``rollout_tp``)."""

    name: str
    model_type: str
    architecture: str
    family: str
    verl_route: str  # megatron-bridge, mbridge or verl-registry
    total_params: int  # with the vision tower, without MTP layers (as transformers counts)
    active_params: int  # what one text token passes through
    vision_params: int
    mtp_params: int
    layer_counts: dict[str, int]  # mixer kind -> layers
    mlp_counts: dict[str, int]  # dense / moe / none -> layers
    kv_cache_bytes_per_token: int  # the layers whose cache grows with every token
    kv_cache_bytes_per_sequence: int  # all the engine keeps for one sequence, page-rounded
    sequence_tokens: int  # prompt + response
    kv_dtype: str
    rollout_tp: int
    train_tflops_per_sequence: float  # forward + backward, verl FlopsCounter convention
    verl_reports_mfu: bool  # False: verl has no FLOPs function for this model type (MFU 0)

    def to_dict(self) -> dict:
        return asdict(self)


def architecture_summary(model: ModelSpec, prompt_tokens: int, response_tokens: int,
                         cache: EngineCache = VLLM_DEFAULTS) -> ArchitectureSummary:
    """The summary for sequences of ``prompt_tokens + response_tokens`` tokens, the rollout
    engine's cache kept as ``cache`` says (its TP and cache dtype)."""
    kv_dtype, rollout_tp = cache.kv_dtype, cache.tp
    seq = int(prompt_tokens) + int(response_tokens)
    family = family_of(model.architecture, model.model_type)
    params = model.params
    return ArchitectureSummary(
        name=model.name, model_type=model.model_type, architecture=model.architecture,
        family=family.name if family else "",
        verl_route=route_of(model.architecture, model.model_type) or "",
        total_params=params.total, active_params=params.active, vision_params=params.vision,
        mtp_params=model.mtp_params,
        layer_counts=mixer_counts(model.layers), mlp_counts=mlp_counts(model.layers),
        kv_cache_bytes_per_token=int(kv_cache_bytes_per_token(model, rollout_tp, kv_dtype)),
        kv_cache_bytes_per_sequence=int(kv_cache_bytes_per_sequence(model, seq, cache)),
        sequence_tokens=seq, kv_dtype=kv_dtype, rollout_tp=int(rollout_tp),
        train_tflops_per_sequence=float(np.sum(verl_training_flops_per_sequence(model, [seq])))
        / 1e12,
        verl_reports_mfu=verl_reports_mfu(model),
    )
