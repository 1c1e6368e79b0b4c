"""The search space: every GRPO layout the rules allow, as columns, with rejection counts.

Generators of legal values are divisors of the world size (TP, PP, CP, EP, ETP and the rollout
sizes must all divide it) crossed with the per-GPU knobs (micro-batch, recompute, offload).
The space is built in three stages so it stays small enough to score in well under a second
for DeepSeek-V3 on 1024 GPUs:

1. parallel sizes (TP, PP, VPP, CP, EP, ETP), checked against megatron-core's rules;
2. crossed with the knobs, checked against verl's batch rules;
3. the rollout engine's options (TP, DP, EP), checked against vLLM/verl's rules.  Which one
   each actor layout gets is the cost model's call (:func:`planner.plan.choose_rollout`): the
   rollout touches the actor only through the memory left to it and the generation time, so
   choosing per actor layout is what ranking the cross product would pick, up to the small
   effect of the rollout TP on weight sync.

Rejections are counted in units of the joint (actor x rollout) space: a parallel-size
combination that breaks a rule rejects every knob and rollout combination with it.  So
``enumerated == valid + sum(rejected.values())``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.catalog.hardware import ClusterSpec
from planner.catalog.models import ModelSpec
from planner.catalog.workload import GrpoWorkload
from planner.search.layout import RECOMPUTE, Columns
from planner.search.rules import RULES, first_violation, violations

PARALLEL_RULES = ("world_size", "tp_divides_heads", "tp_divides_query_groups", "tp_divides_ffn",
                  "pipeline_split",
                  "vpp_needs_pp", "vpp_divides_stage_layers", "dense_model_has_no_experts",
                  "ep_divides_experts", "etp_divides_moe_ffn", "expert_grid")
BATCH_RULES = ("batch_divides_dp", "mini_batch_divides_dp", "micro_batch_divides_mini_batch",
               "interleaved_microbatches")
ROLLOUT_RULES = ("rollout_tp_divides_heads", "rollout_tp_kv_heads", "rollout_world",
                 "rollout_ep", "rollout_dp_moe_only")
assert set(PARALLEL_RULES + BATCH_RULES + ROLLOUT_RULES) == {rule.name for rule in RULES}


@dataclass(frozen=True)
class SearchOptions:
    """Which values of each knob the search tries.  ``None`` fixes nothing."""

    micro_batches: tuple[int, ...] = (1, 2, 4, 8)
    recompute: tuple[str, ...] = RECOMPUTE
    offload: tuple[bool, ...] = (False, True)  # actor param offload, optimizer offload, each
    ref_param_offload: tuple[bool, ...] = (False, True)
    vpp: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 8)
    max_cp: int = 16
    gpu_memory_utilization: float | None = None  # None: picked per layout
    # Pin any layout field to one value, e.g. {"tp": 4}; used by `estimate`-style queries.
    fixed: tuple[tuple[str, int], ...] = ()


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _grid(**options) -> Columns:
    names = list(options)
    mesh = np.meshgrid(*[np.asarray(options[name]) for name in names], indexing="ij")
    return {name: axis.ravel() for name, axis in zip(names, mesh)}


def _take(cols: Columns, mask: np.ndarray) -> Columns:
    return {name: values[mask] for name, values in cols.items()}


@dataclass
class SearchSpace:
    """Valid actor layouts (columns) with their chosen rollout and rejection counts."""

    columns: Columns  # one row per valid actor layout (rollout fields not chosen yet)
    rollouts: Columns  # one row per valid rollout option (rollout_tp, rollout_dp, rollout_ep)
    enumerated: int  # joint actor x rollout combinations generated
    valid: int  # joint combinations that break no rule
    rejected: dict[str, int]  # rule name -> joint combinations it rejected first

    def __len__(self) -> int:
        return len(self.columns["tp"])


def _count(rejected: dict[str, int], names: tuple[str, ...], broken: dict[str, np.ndarray],
           weight: int) -> np.ndarray:
    """Add each layout to the first rule it breaks (times ``weight``); return the valid mask."""
    rules = tuple(rule for rule in RULES if rule.name in names)
    stack = {rule.name: broken[rule.name] for rule in rules}
    order = [rule.name for rule in rules]
    first = first_violation(stack, order)
    for index, name in enumerate(order):
        count = int((first == index).sum())
        if count:
            rejected[name] = rejected.get(name, 0) + count * weight
    return first < 0


def parallel_options(model: ModelSpec, cluster: ClusterSpec, options: SearchOptions) -> Columns:
    world = cluster.num_gpus
    sizes = divisors(world)
    fixed = dict(options.fixed)
    grid = dict(
        tp=sizes,
        pp=[d for d in sizes if d <= model.num_layers],
        vpp=list(options.vpp),
        cp=[d for d in sizes if d <= options.max_cp],
        ep=[d for d in sizes if d <= model.num_experts] if model.is_moe else [1],
        etp=[d for d in sizes if d <= cluster.fast_domain_gpus] if model.is_moe else [1],
    )
    for name, value in fixed.items():
        if name in grid:
            grid[name] = [value]
    cols = _grid(**grid)
    cols["dp"] = world // (cols["tp"] * cols["pp"] * cols["cp"])
    return cols


def knob_options(options: SearchOptions) -> Columns:
    fixed = dict(options.fixed)
    grid = dict(
        micro_batch=list(options.micro_batches),
        recompute=[RECOMPUTE.index(r) for r in options.recompute],
        param_offload=list(options.offload),
        optimizer_offload=list(options.offload),
        ref_param_offload=list(options.ref_param_offload),
    )
    for name, value in fixed.items():
        if name in grid:
            grid[name] = [value]
    return _grid(**grid)


def rollout_options(model: ModelSpec, cluster: ClusterSpec, options: SearchOptions) -> Columns:
    sizes = divisors(cluster.num_gpus)
    fixed = dict(options.fixed)
    combos = []
    for tp in sizes:
        for dp in (sizes if model.is_moe else [1]):
            eps = {1, tp * dp} if model.is_moe else {1}
            for ep in sorted(eps):
                combos.append((tp, dp, ep))
    cols = {name: np.array(values) for name, values in
            zip(("rollout_tp", "rollout_dp", "rollout_ep"), zip(*combos))}
    for name in ("rollout_tp", "rollout_dp", "rollout_ep"):
        if name in fixed:
            cols = _take(cols, cols[name] == fixed[name])
    return cols


def _cross(left: Columns, right: Columns) -> Columns:
    n_left, n_right = len(next(iter(left.values()))), len(next(iter(right.values())))
    out = {name: np.repeat(values, n_right) for name, values in left.items()}
    out.update({name: np.tile(values, n_left) for name, values in right.items()})
    return out


def build_space(model: ModelSpec, cluster: ClusterSpec, workload: GrpoWorkload,
                options: SearchOptions = SearchOptions()) -> SearchSpace:
    rejected: dict[str, int] = {}
    parallel = parallel_options(model, cluster, options)
    knobs = knob_options(options)
    rollouts = rollout_options(model, cluster, options)
    n_knobs, n_rollouts = len(knobs["micro_batch"]), len(rollouts["rollout_tp"])
    enumerated = len(parallel["tp"]) * n_knobs * n_rollouts

    # Rollout options first: their validity does not depend on the actor.
    rollout_rejected: dict[str, int] = {}
    probe = {**rollouts, "tp": np.ones_like(rollouts["rollout_tp"])}
    rollout_ok = _count(rollout_rejected, ROLLOUT_RULES,
                        violations(model, cluster, workload, probe, _rules(ROLLOUT_RULES)), 1)
    rollouts = _take(rollouts, rollout_ok)

    first_last = dict(first_stage_layers=np.zeros_like(parallel["pp"]),
                      last_stage_layers=np.zeros_like(parallel["pp"]))
    parallel.update(first_last)
    broken = violations(model, cluster, workload, parallel, _rules(PARALLEL_RULES))
    ok = _count(rejected, PARALLEL_RULES, broken, n_knobs * n_rollouts)
    parallel = _take(parallel, ok)

    actor = _cross(parallel, knobs)
    actor["sequence_parallel"] = actor["tp"] > 1
    actor["distributed_optimizer"] = np.ones_like(actor["tp"], dtype=bool)
    broken = violations(model, cluster, workload, actor, _rules(BATCH_RULES))
    ok = _count(rejected, BATCH_RULES, broken, n_rollouts)
    actor = _take(actor, ok)

    # Every valid actor layout paired with an invalid rollout option is a rejected pair.
    for name, count in rollout_rejected.items():
        rejected[name] = rejected.get(name, 0) + count * len(actor["tp"])

    valid_pairs = len(actor["tp"]) * len(rollouts["rollout_tp"])
    return SearchSpace(columns=actor, rollouts=rollouts, enumerated=enumerated,
                       valid=valid_pairs, rejected=rejected)


def _rules(names: tuple[str, ...]):
    return tuple(rule for rule in RULES if rule.name in names)
