"""The pipeline split of a Mamba-2 hybrid (Nemotron-H, Nemotron-3) against megatron-core 0.16.1.

Megatron builds these models as ``MambaModel``, whose ``MambaStack`` picks each pipeline rank's
layers itself (``_select_layers_for_pipeline_parallel``): it asserts there are no virtual
pipeline stages, and it reads ``num_layers_in_first/last_pipeline_stage`` or splits evenly
(``num_layers // PP``) -- never ``account_for_embedding/loss_in_pipeline_split`` nor a layout
string.  Every layout the planner accepts must build every layer once, with the planner's layers
per rank; every one megatron-core breaks must be refused.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import pytest

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.search.layout import LAYOUT_FIELDS, Layout
from planner.search.rules import explain, pipeline_split, violations

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pytest.importorskip("megatron.core")
    import torch
    from megatron.core.ssm.mamba_block import MambaStack
    from megatron.core.transformer.transformer_config import TransformerConfig

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SPLIT_RULES = ("pipeline_split", "vpp_needs_pp", "vpp_divides_stage_layers", "mamba_pipeline")


def mamba_stack_ranks(num_layers: int, pp: int, vpp: int, split: tuple) -> list[list[int]] | str:
    """The layer indices each PP rank of megatron-core's MambaStack builds, or why it fails."""
    first, last, embedding, loss = split
    kwargs = dict(num_layers=num_layers, hidden_size=64, num_attention_heads=8,
                  pipeline_model_parallel_size=pp, pipeline_dtype=torch.bfloat16,
                  account_for_embedding_in_pipeline_split=embedding,
                  account_for_loss_in_pipeline_split=loss,
                  num_layers_in_first_pipeline_stage=first or None,
                  num_layers_in_last_pipeline_stage=last or None)
    if vpp > 1:
        kwargs["virtual_pipeline_model_parallel_size"] = vpp
    try:
        config = TransformerConfig(**kwargs)
        ranks = []
        for rank in range(pp):
            stack = SimpleNamespace(config=config, pp_group=SimpleNamespace(
                rank=lambda rank=rank: rank, size=lambda: pp))
            _, chosen = MambaStack._select_layers_for_pipeline_parallel(
                stack, list(range(num_layers)))
            ranks.append(chosen)
    except (ValueError, AssertionError, ZeroDivisionError) as error:
        return f"{type(error).__name__}: {error}"
    if sorted(i for chosen in ranks for i in chosen) != list(range(num_layers)):
        return f"layers do not tile 0..{num_layers - 1}: {[len(c) for c in ranks]} per rank"
    return ranks


def test_planner_split_rules_match_mamba_stack():
    model = resolve_model("NVIDIA-Nemotron-3-Nano-30B-A3B")  # 52 layers
    splits = [(0, 0, False, False), (0, 0, True, True), (0, 0, True, False), (0, 0, False, True),
              (12, 0, False, False), (0, 10, False, False), (10, 12, False, False)]
    grid = [(pp, vpp, split) for pp in range(2, 9) for vpp in (1, 2) for split in splits]
    n = len(grid)
    values = {"pp": np.array([g[0] for g in grid]), "vpp": np.array([g[1] for g in grid]),
              "first_stage_layers": np.array([g[2][0] for g in grid]),
              "last_stage_layers": np.array([g[2][1] for g in grid]),
              "account_embedding": np.array([g[2][2] for g in grid]),
              "account_loss": np.array([g[2][3] for g in grid])}
    cols = {name: np.broadcast_to(np.asarray(values.get(name, getattr(Layout(), name))),
                                  (n,)).copy() for name in LAYOUT_FIELDS}
    broken = violations(model, ClusterSpec(get_gpu("h100"), 64, 8), GrpoWorkload(), cols)
    first, middle, last, _ = pipeline_split(model.num_layers, cols["pp"],
                                            cols["first_stage_layers"],
                                            cols["last_stage_layers"], cols["account_embedding"],
                                            cols["account_loss"])
    disagreements, accepted = [], 0
    for i, (pp, vpp, split) in enumerate(grid):
        planner_ok = not any(broken[rule][i] for rule in SPLIT_RULES)
        built = mamba_stack_ranks(model.num_layers, pp, vpp, split)
        expected = [int(first[i])] + [int(middle[i])] * (pp - 2) + [int(last[i])]
        label = f"pp={pp} vpp={vpp} first/last/embedding/loss={split}"
        if planner_ok and isinstance(built, str):
            disagreements.append(f"{label}: planner valid, MambaStack: {built}")
        elif planner_ok and [len(chosen) for chosen in built] != expected:
            disagreements.append(f"{label}: planner costs {expected} layers per rank, MambaStack "
                                 f"builds {[len(chosen) for chosen in built]}")
        elif not planner_ok and not isinstance(built, str) and not any(
                broken[rule][i] for rule in SPLIT_RULES[:3]):
            disagreements.append(f"{label}: planner refuses, MambaStack builds it")
        accepted += planner_ok
    assert not disagreements, "\n".join(disagreements)
    assert accepted  # the grid holds layouts both sides accept


def test_mamba_pipeline_message_names_what_is_valid():
    model = resolve_model("NVIDIA-Nemotron-3-Nano-30B-A3B")
    layout = {"tp": 1, "pp": 2, "vpp": 2, "cp": 1, "ep": 1, "etp": 1, "dp": 4, "micro_batch": 1,
              "rollout_tp": 1, "rollout_dp": 8, "rollout_ep": 1}
    broken = dict(explain(model, ClusterSpec(get_gpu("h100"), 8, 8), GrpoWorkload(), layout))
    assert broken["mamba_pipeline"] == (
        "virtual_pipeline_model_parallel_size 2: NVIDIA-Nemotron-3-Nano-30B-A3B's Mamba-2 "
        "hybrid stack (megatron-core 0.16.1 MambaStack) runs without virtual pipeline stages "
        "(VPP must be 1)")
    accounted = dict(explain(model, ClusterSpec(get_gpu("h100"), 24, 8), GrpoWorkload(),
                             {**layout, "pp": 3, "vpp": 1, "account_embedding": True,
                              "account_loss": True}))
    assert accounted["mamba_pipeline"] == (
        "account_for_embedding/loss_in_pipeline_split: NVIDIA-Nemotron-3-Nano-30B-A3B's Mamba-2 "
        "hybrid stack (megatron-core 0.16.1 MambaStack) splits its 52 layers evenly over PP "
        "(valid PP: 1, 2, 4, 13, 26, 52) or by num_layers_in_first/last_pipeline_stage "
        "(--first-stage-layers/--last-stage-layers); it reads neither the embedding/loss "
        "counted as layers nor a pipeline layout string")
