"""From a model, a cluster and a workload to a ranked table of layouts.

This is the one place the pieces meet: search space -> cost model -> ranking.  It returns
plain data (:class:`Plan`, a pandas DataFrame of candidates plus counts); formatting for people
lives in :mod:`planner.report` and exit codes in :mod:`planner.cli`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Union

import numpy as np

from planner.errors import InvalidLayoutError
from planner.hardware import GIB, ClusterSpec
from planner.layout import LAYOUT_FIELDS, RECOMPUTE, Columns, Layout
from planner.memory import PHASES, estimate_memory
from planner.models import ModelSpec
from planner.ranking import rank_order
from planner.rules import UNWISE_FLAGS, explain, pipeline_split, unwise_flags
from planner.space import SearchOptions, build_space
from planner.timing import TIME_PHASES, grpo_step, load_efficiency, pretrain_step
from planner.workload import GrpoWorkload, PretrainWorkload

Workload = Union[GrpoWorkload, PretrainWorkload]

if TYPE_CHECKING:
    import pandas as pd

PLANNER_VERSION = "0.1.0"


@dataclass
class Plan:
    model: ModelSpec
    cluster: ClusterSpec
    workload: Workload
    candidates: "pd.DataFrame"  # ranked, best first; every valid layout, fitting or not
    enumerated: int
    valid: int
    rejected: dict[str, int] = field(default_factory=dict)

    @property
    def fitting(self) -> "pd.DataFrame":
        return self.candidates[self.candidates["fits"]]


def score_columns(model: ModelSpec, cluster: ClusterSpec, workload: Workload,
                  cols: Columns, pick_utilization: bool, calibration: dict | None = None,
                  actor_memory: dict | None = None) -> Columns:
    """Cost-model columns (memory, time, flags) for layouts that obey every rule.

    ``first_stage_layers``/``last_stage_layers`` stay as given (0: automatic split) while
    scoring; :func:`resolve_stage_split` fills in the split for output.
    """
    memory = estimate_memory(model, cluster, workload, cols, pick_utilization=pick_utilization,
                             actor=actor_memory)
    training_peak = np.max([memory[f"mem_{phase}_bytes"] for phase in
                            ("update_actor", "old_log_prob", "ref", "weight_sync")
                            if phase in workload.phases], axis=0)
    flags = unwise_flags(model, cluster, workload,
                         {**cols, "train_peak_fraction": training_peak / cluster.gpu.memory_bytes})
    out = {**cols, **memory}
    efficiency = load_efficiency(cluster.gpu, workload.precision, calibration)
    if workload.kind == "pretrain":
        out.update(pretrain_step(model, cluster, workload, out, efficiency))
    else:
        out.update(grpo_step(model, cluster, workload, out, memory, efficiency))
    for name in UNWISE_FLAGS:
        out[f"flag_{name}"] = flags[name]
    out["unwise_count"] = np.sum([flags[name] for name in UNWISE_FLAGS], axis=0)
    return out


def resolve_stage_split(model: ModelSpec, cols: Columns) -> Columns:
    """The layers of the first and last pipeline stage, as megatron-core will build them."""
    first, _, last, _ = pipeline_split(model.num_layers, cols["pp"],
                                       cols.get("first_stage_layers"),
                                       cols.get("last_stage_layers"))
    return {**cols, "first_stage_layers": first, "last_stage_layers": last}


def _frame(cols: Columns) -> "pd.DataFrame":
    import pandas as pd

    frame = pd.DataFrame(cols, copy=False)
    frame["recompute"] = pd.Categorical.from_codes(frame["recompute"].astype(int), RECOMPUTE)
    frame["peak_phase"] = pd.Categorical.from_codes(frame["peak_phase"].astype(int), PHASES)
    if "dominant_phase" in frame:
        frame["dominant_phase"] = pd.Categorical.from_codes(
            frame["dominant_phase"].astype(int), TIME_PHASES)
    frame["peak_memory_gib"] = frame["peak_bytes"] / GIB
    for phase in PHASES:
        frame[f"mem_{phase}_gib"] = frame[f"mem_{phase}_bytes"] / GIB
    return frame


def search_options_for(workload: Workload, options: SearchOptions) -> SearchOptions:
    """A pretraining step has no rollout, no reference model and no verl offload."""
    if workload.kind != "pretrain":
        return options
    return replace(options, offload=(False,), ref_param_offload=(False,),
                   fixed=options.fixed + (("rollout_tp", 1), ("rollout_dp", 1),
                                          ("rollout_ep", 1)))


def make_plan(model: ModelSpec, cluster: ClusterSpec, workload: Workload,
              options: SearchOptions = SearchOptions(), calibration: dict | None = None) -> Plan:
    options = search_options_for(workload, options)
    efficiency = load_efficiency(cluster.gpu, workload.precision, calibration)
    space = build_space(model, cluster, workload, options, efficiency)
    scored = score_columns(model, cluster, workload, space.columns,
                           pick_utilization=options.gpu_memory_utilization is None,
                           calibration=calibration, actor_memory=space.actor_memory)
    order = rank_order(scored)
    ranked = {name: values[order] for name, values in scored.items()}
    ranked["rank"] = np.arange(1, len(order) + 1)
    frame = _frame(resolve_stage_split(model, ranked))
    return Plan(model=model, cluster=cluster, workload=workload, candidates=frame,
                enumerated=space.enumerated, valid=space.valid, rejected=space.rejected)


@dataclass
class Estimate:
    model: ModelSpec
    cluster: ClusterSpec
    workload: Workload
    layout: Layout
    row: dict  # every cost-model column for this layout


def estimate_layout(model: ModelSpec, cluster: ClusterSpec, workload: Workload,
                    layout: Layout, pick_utilization: bool = False,
                    calibration: dict | None = None) -> Estimate:
    """Score one layout; raises :class:`InvalidLayoutError` listing every broken rule."""
    broken = explain(model, cluster, workload, layout.to_dict())
    if broken:
        raise InvalidLayoutError(broken)
    scored = resolve_stage_split(model, score_columns(model, cluster, workload,
                                                      layout.to_columns(), pick_utilization,
                                                      calibration))
    row = {name: values[0].item() if hasattr(values[0], "item") else values[0]
           for name, values in scored.items()}
    values = {name: row[name] for name in LAYOUT_FIELDS}
    values["recompute"] = RECOMPUTE[int(values["recompute"])]
    return Estimate(model=model, cluster=cluster, workload=workload,
                    layout=Layout(**values), row=row)
