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
from planner.search.layout import (
    DEFAULT_SELECTIVE_MODULES,
    RECOMPUTE,
    Columns,
    RowsAt,
    applicable_modules,
    distinct,
    sorted_distinct,
    unique_rows,
)
from planner.search.pipeline import pipeline_split, split_candidates
from planner.search.rules import RULES, first_violation, violations

PARALLEL_RULES = ("world_size", "tp_divides_heads", "tp_divides_query_groups", "tp_divides_ffn",
                  "tp_divides_linear_attention_heads",
                  "cp_linear_attention", "cp_attention_sinks", "tp_divides_mamba_heads",
                  "cp_divides_mamba_heads", "pipeline_split",
                  "vpp_needs_pp", "vpp_divides_stage_layers", "mamba_pipeline",
                  "dense_model_has_no_experts",
                  "ep_divides_experts", "etp_divides_moe_ffn", "etp_moe_bias", "expert_grid")
BATCH_RULES = ("batch_divides_dp", "mini_batch_divides_dp", "micro_batch_divides_mini_batch",
               "interleaved_microbatches", "token_budget_holds_a_sequence")
ROLLOUT_RULES = ("rollout_tp_divides_heads", "rollout_tp_kv_heads", "rollout_world",
                 "rollout_ep", "rollout_dp_moe_only")
assert set(PARALLEL_RULES + BATCH_RULES + ROLLOUT_RULES) == {rule.name for rule in RULES}
# the parallel rules RULES lists before the pipeline split, which do not read the split columns
SPLIT_FREE_RULES = ("world_size", "tp_divides_heads", "tp_divides_query_groups",
                    "tp_divides_ffn", "tp_divides_linear_attention_heads", "cp_linear_attention",
                    "cp_attention_sinks", "tp_divides_mamba_heads", "cp_divides_mamba_heads")
SPLIT_RULES = tuple(name for name in PARALLEL_RULES if name not in SPLIT_FREE_RULES)
assert [rule.name for rule in RULES][:len(SPLIT_FREE_RULES)] == list(SPLIT_FREE_RULES)


@dataclass(frozen=True)
class SearchOptions:
    """Which values of each knob the search tries.  ``None`` fixes nothing."""

    # sequences per micro-batch; with dynamic batches the token budget is this many
    # longest sequences per GPU (ppo_max_token_len_per_gpu = m * ceil((prompt+response) / CP))
    micro_batches: tuple[int, ...] = (1, 2, 4, 8)
    recompute: tuple[str, ...] = RECOMPUTE
    offload: tuple[bool, ...] = (False, True)  # actor param offload, optimizer offload, each
    ref_param_offload: tuple[bool, ...] = (False, True)
    # Megatron's CPU optimizer: the fractions of the optimizer state (and Adam step) on the host
    optimizer_cpu_fraction: tuple[float, ...] = (0.0, 1.0)
    dynamic_batch: bool = True  # verl's use_dynamic_bsz, as every large verl example sets it
    max_token_len: int = 0  # a pinned token budget per GPU (0: micro_batches x sequence)
    vpp: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 8)
    max_cp: int = 16
    gpu_memory_utilization: float | None = None  # None: picked per layout
    # Pin any layout field to one value, e.g. {"tp": 4}; used by `estimate`-style queries.
    fixed: tuple[tuple[str, int], ...] = ()
    # Explicit combinations instead of the grids above (a sizing sweep's probes and refinements,
    # planner.sizing): knob_rows are KNOB_FIELDS tuples (recompute by name), parallel_rows
    # PARALLEL_FIELDS tuples (each with its layer split).  None: the grids.
    knob_rows: tuple[tuple, ...] | None = None
    parallel_rows: tuple[tuple, ...] | None = None
    rollout_rows: tuple[tuple, ...] | None = None  # ROLLOUT_FIELDS tuples
    # Score every valid combination, equivalent ones included (the reference the pruned search
    # is tested against, tests/search/test_search_equivalence.py).  False: layouts that build
    # the same stages as a simpler one (:func:`equivalent_splits`) are merged into it.
    exhaustive: bool = False


KNOB_FIELDS = ("micro_batch", "recompute", "param_offload", "optimizer_offload",
               "ref_param_offload", "optimizer_cpu_fraction")
PARALLEL_FIELDS = ("tp", "pp", "vpp", "cp", "ep", "etp", "first_stage_layers",
                   "last_stage_layers", "account_embedding", "account_loss")
ROLLOUT_FIELDS = ("rollout_tp", "rollout_dp", "rollout_ep")


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _grid(**options) -> Columns:
    names = list(options)
    mesh = np.meshgrid(*[np.asarray(options[name]) for name in names], indexing="ij")
    return {name: axis.ravel() for name, axis in zip(names, mesh)}


def _rows(names: tuple[str, ...], rows: tuple[tuple, ...]) -> Columns:
    return {name: np.array([row[i] for row in rows]) if rows else np.zeros(0, dtype=np.int64)
            for i, name in enumerate(names)}


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
    # valid actor layouts merged into an equivalent one (same stages, same prediction), not
    # scored again; they are counted in ``valid``
    merged: int = 0

    def __len__(self) -> int:
        return len(self.columns["tp"])


def _count(rejected: dict[str, int], names: tuple[str, ...], broken: dict[str, np.ndarray],
           weight: "int | np.ndarray") -> np.ndarray:
    """Add each layout to the first rule it breaks (times ``weight``, one for all or one per
    layout); return the valid mask."""
    rules = tuple(rule for rule in RULES if rule.name in names)
    stack = {rule.name: broken[rule.name] for rule in rules}
    order = [rule.name for rule in rules]
    first = first_violation(stack, order)
    for index, name in enumerate(order):
        count = int(np.sum(np.where(first == index, weight, 0)))
        if count:
            rejected[name] = rejected.get(name, 0) + count
    return first < 0


def _valid_in_order(rejected: dict[str, int], rules: tuple, check, cols: Columns,
                    weight: "int | np.ndarray") -> np.ndarray:
    """:func:`_count` of ``rules`` (``check(rule, rows)``: where ``rows`` break ``rule``) on
    ``cols``, each rule checked on the rows no earlier rule rejected alone: the rules are
    row-wise, and a row counts for the first rule it breaks only.  The same counts, added in
    the same order, and the same valid mask."""
    n = len(cols["tp"])
    alive = np.arange(n)
    rows = cols
    for rule in rules:
        if not len(alive):
            break
        broken = np.broadcast_to(np.asarray(check(rule, rows), dtype=bool), (len(alive),))
        hit = np.flatnonzero(broken)
        if not len(hit):
            continue
        count = int(np.sum(np.take(weight, alive[hit]))) if np.ndim(weight) \
            else len(hit) * int(weight)
        if count:
            rejected[rule.name] = rejected.get(rule.name, 0) + count
        alive = alive[~broken]
        rows = RowsAt(cols, alive)
    valid = np.zeros(n, dtype=bool)
    valid[alive] = True
    return valid


def parallel_grid(model: ModelSpec, cluster: ClusterSpec, options: SearchOptions) -> Columns:
    """Every combination of the parallel sizes (TP, PP, VPP, CP, EP, ETP) and the DP they
    leave, before the ways of splitting the layers are added (``options.parallel_rows``: those
    rows, splits included)."""
    world = cluster.num_gpus
    if options.parallel_rows is not None:
        cols = _rows(PARALLEL_FIELDS, options.parallel_rows)
        for name in ("account_embedding", "account_loss"):
            cols[name] = cols[name].astype(bool)
        cols["dp"] = world // np.maximum(cols["tp"] * cols["pp"] * cols["cp"], 1)
        return cols
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


def parallel_options(model: ModelSpec, cluster: ClusterSpec, options: SearchOptions) -> Columns:
    return _with_split_candidates(model, parallel_grid(model, cluster, options))


def _split_counts(model: ModelSpec, pp: np.ndarray) -> np.ndarray:
    """How many split candidates each PP value gets (:func:`_with_split_candidates`)."""
    if len(pp) == 0:
        return np.zeros(0, dtype=np.int64)
    table = np.zeros(int(pp.max()) + 1, dtype=np.int64)
    for size in np.flatnonzero(np.bincount(pp)):
        table[size] = len(split_candidates(model.num_layers, int(size)))
    return table[pp]


def _with_split_candidates(model: ModelSpec, cols: Columns) -> Columns:
    """Each parallel combination once per way of splitting the layers over its PP
    (:func:`planner.search.pipeline.split_candidates`); the rules reject the ways megatron-core
    refuses."""
    if len(cols["pp"]) == 0:  # every combination broke a rule ahead of the split
        empty = np.zeros(0, dtype=np.int64)
        return {**cols, "first_stage_layers": empty, "last_stage_layers": empty,
                "account_embedding": empty.astype(bool), "account_loss": empty.astype(bool)}
    sizes = sorted_distinct(cols["pp"])
    tables = [np.array(split_candidates(model.num_layers, int(pp)), dtype=np.int64).reshape(-1, 4)
              for pp in sizes]
    which = np.searchsorted(sizes, cols["pp"])
    counts = np.array([len(table) for table in tables])[which]
    # each row repeated once per candidate (np.repeat: the same values as an index)
    out = {name: np.repeat(values, counts) for name, values in cols.items()}
    # the k-th copy of a row takes the k-th split candidate of its PP: its position in the
    # concatenated tables is the copy's position less (its row's first copy less its PP's
    # first candidate)
    offsets = np.concatenate([[0], np.cumsum([len(table) for table in tables])])
    start = np.cumsum(counts) - counts
    at = np.arange(int(counts.sum())) - np.repeat(start - offsets[which], counts)
    flat = np.concatenate(tables)
    out["first_stage_layers"] = np.take(flat[:, 0], at)
    out["last_stage_layers"] = np.take(flat[:, 1], at)
    out["account_embedding"] = np.take(flat[:, 2] > 0, at)
    out["account_loss"] = np.take(flat[:, 3] > 0, at)
    return out


def knob_options(options: SearchOptions, workload=None) -> Columns:
    """The per-GPU knobs crossed with every parallel layout.  Combinations that are the same
    job are generated once: without a reference model its offload means nothing, and with the
    whole optimizer on the host (CPU optimizer fraction 1) verl's optimizer offload has nothing
    left to park."""
    fixed = dict(options.fixed)
    needs_reference = getattr(workload, "needs_reference", True)
    if options.knob_rows is not None:
        cols = _rows(KNOB_FIELDS, tuple(dict.fromkeys(options.knob_rows)))
        cols["recompute"] = np.array([RECOMPUTE.index(r) for r in cols["recompute"]],
                                     dtype=np.int64)
        for name in ("param_offload", "optimizer_offload", "ref_param_offload"):
            cols[name] = cols[name].astype(bool)
        cols["optimizer_cpu_fraction"] = cols["optimizer_cpu_fraction"].astype(np.float64)
        # only the values the options allow (a pretraining step has no offload), and the pins
        allowed = {"recompute": [RECOMPUTE.index(r) for r in options.recompute],
                   "param_offload": options.offload, "optimizer_offload": options.offload,
                   "ref_param_offload": options.ref_param_offload,
                   "optimizer_cpu_fraction": options.optimizer_cpu_fraction}
        keep = np.ones(len(cols["micro_batch"]), dtype=bool)
        for name, values in allowed.items():
            keep &= np.isin(cols[name], [fixed.get(name, v) for v in values])
        for name, value in fixed.items():
            if name in cols:
                keep &= cols[name] == value
        if not needs_reference:
            keep &= ~cols["ref_param_offload"]
        return _take(cols, keep)
    grid = dict(
        micro_batch=list(options.micro_batches),
        recompute=[RECOMPUTE.index(r) for r in options.recompute],
        param_offload=list(options.offload),
        optimizer_offload=list(options.offload),
        ref_param_offload=list(options.ref_param_offload) if needs_reference else [False],
        optimizer_cpu_fraction=list(options.optimizer_cpu_fraction),
    )
    for name, value in fixed.items():
        if name in grid:
            grid[name] = [value]
    cols = _grid(**grid)
    redundant = (cols["optimizer_cpu_fraction"] >= 1.0) & cols["optimizer_offload"].astype(bool)
    if "optimizer_offload" in fixed:
        redundant[:] = False
    return _take(cols, ~redundant)


def rollout_options(model: ModelSpec, cluster: ClusterSpec, options: SearchOptions) -> Columns:
    sizes = divisors(cluster.num_gpus)
    fixed = dict(options.fixed)
    combos = []
    for tp in sizes:
        for dp in (sizes if model.is_moe else [1]):
            eps = {1, tp * dp} if model.is_moe else {1}
            for ep in sorted(eps):
                combos.append((tp, dp, ep))
    if options.rollout_rows is not None:
        combos = list(dict.fromkeys(options.rollout_rows))
    cols = _rows(ROLLOUT_FIELDS, tuple(combos))
    for name in ROLLOUT_FIELDS:
        if name in fixed:
            cols = _take(cols, cols[name] == fixed[name])
    return cols


def valid_rollouts(model: ModelSpec, cluster: ClusterSpec, workload: GrpoWorkload,
                   rollouts: Columns) -> tuple[Columns, dict[str, int]]:
    """The rollout options vLLM and verl accept, and how many each rule rejected."""
    rejected: dict[str, int] = {}
    probe = {**rollouts, "tp": np.ones_like(rollouts["rollout_tp"])}
    ok = _count(rejected, ROLLOUT_RULES,
                violations(model, cluster, workload, probe, _rules(ROLLOUT_RULES)), 1)
    return _take(rollouts, ok), rejected


def _cross(left: Columns, right: Columns) -> Columns:
    n_left, n_right = len(next(iter(left.values()))), len(next(iter(right.values())))
    out = {name: np.repeat(values, n_right) for name, values in left.items()}
    out.update({name: np.tile(values, n_left) for name, values in right.items()})
    return out


def build_space(model: ModelSpec, cluster: ClusterSpec, workload: GrpoWorkload,
                options: SearchOptions = SearchOptions()) -> SearchSpace:
    rejected: dict[str, int] = {}
    knobs = knob_options(options, workload)
    rollouts = rollout_options(model, cluster, options)
    n_knobs, n_rollouts = len(knobs["micro_batch"]), len(rollouts["rollout_tp"])

    # Rollout options first: their validity does not depend on the actor.
    rollouts, rollout_rejected = valid_rollouts(model, cluster, workload, rollouts)

    # The rules ahead of the split in RULES' order do not depend on it: rejecting those rows
    # before the split candidates are added gives the same counts at a fraction of the rows
    # (most combinations of divisors break world_size).
    grid = parallel_grid(model, cluster, options)
    explicit = options.parallel_rows is not None  # rows that carry their split already
    weight = (np.ones_like(grid["pp"]) if explicit
              else _split_counts(model, grid["pp"])) * (n_knobs * n_rollouts)
    # each rule checked on the rows the earlier ones left (:func:`_valid_in_order`)
    def check(rule, rows):
        return rule.check(model, cluster, workload, rows)

    ok = _valid_in_order(rejected, _rules(SPLIT_FREE_RULES), check, grid, weight)
    parallel = _take(grid, ok) if explicit else _with_split_candidates(model, _take(grid, ok))
    enumerated = int(weight.sum())

    ok = _valid_in_order(rejected, _rules(SPLIT_RULES), check, parallel, n_knobs * n_rollouts)
    parallel = _take(parallel, ok)

    # The batch rules read the parallel sizes and the micro-batch alone (not recompute nor
    # offload): they are checked once per (parallel row, micro-batch) and the cross product is
    # built from the rows that pass, by index, instead of materialising every column of every
    # combination first.  The counts weigh each checked row by the knob rows it stands for.
    repeats = equivalent_splits(model, parallel)
    micro_first, micro_of_knob = distinct(knobs["micro_batch"])
    micro = {"micro_batch": knobs["micro_batch"][micro_first]}
    probe = _with_batching(model, workload, options, _cross(parallel, micro))
    knobs_per_micro = np.bincount(micro_of_knob, minlength=len(micro_first))
    ok_probe = _valid_in_order(rejected, _rules(BATCH_RULES), check, probe,
                               np.tile(knobs_per_micro, len(parallel["tp"])) * n_rollouts)
    ok = ok_probe.reshape(len(parallel["tp"]), len(micro_first))[:, micro_of_knob]
    merged = 0
    if not options.exhaustive:
        repeated = ok & repeats[:, None]
        merged = int(np.count_nonzero(repeated))
        ok &= ~repeated
    # row-major over (parallel row, knob row), as _cross orders them: each parallel row
    # repeated for its valid knob rows (np.repeat, np.take: the same values as an index)
    knob_row = np.broadcast_to(np.arange(n_knobs), ok.shape)[ok]
    per_parallel = np.count_nonzero(ok, axis=1)
    actor = {name: np.repeat(values, per_parallel) for name, values in parallel.items()}
    actor.update({name: np.take(values, knob_row) for name, values in knobs.items()})
    actor = _with_batching(model, workload, options, actor)

    # Every valid actor layout paired with an invalid rollout option is a rejected pair.
    actors = len(actor["tp"]) + merged
    for name, count in rollout_rejected.items():
        rejected[name] = rejected.get(name, 0) + count * actors

    valid_pairs = actors * len(rollouts["rollout_tp"])
    return SearchSpace(columns=actor, rollouts=rollouts, enumerated=enumerated,
                       valid=valid_pairs, rejected=rejected, merged=merged)


def _with_batching(model: ModelSpec, workload: GrpoWorkload, options: SearchOptions,
                   actor: Columns) -> Columns:
    """The actor columns the search does not vary, and the batching they imply: sequence
    parallel with TP, the distributed optimizer, the recompute detail, verl's dynamic batches
    and their token budget (``micro_batch`` longest sequences per CP rank, or the pinned one)."""
    n = len(actor["tp"])
    actor["sequence_parallel"] = actor["tp"] > 1
    actor["distributed_optimizer"] = constant_column(True, n)
    if "recompute" in actor:
        # the modules where selective, else 0: ``np.where(selective, modules, 0)`` as a product
        # (the same integers, without np.where's scalar broadcast)
        modules = applicable_modules(DEFAULT_SELECTIVE_MODULES, model.is_moe, model.is_mla)
        actor["recompute_modules"] = np.multiply(
            actor["recompute"] == RECOMPUTE.index("selective"), modules,
            dtype=np.result_type(modules, 0))
    actor["recompute_num_layers"] = constant_column(np.int64(1), n)
    actor["recompute_block"] = constant_column(False, n)
    actor["pipeline_layout"] = constant_column(np.str_(""), n)
    dynamic = bool(options.dynamic_batch) and workload.has_rollout  # verl's use_dynamic_bsz
    actor["dynamic_batch"] = constant_column(dynamic, n)
    if dynamic:
        per_cp_rank = _per_cp_rank(workload.sequence_length, actor["cp"])
        actor["max_token_len"] = (np.full(n, options.max_token_len) if options.max_token_len
                                  else actor["micro_batch"] * per_cp_rank)
    else:
        actor["max_token_len"] = constant_column(np.int64(0), n)
    actor["log_prob_max_token_len"] = constant_column(np.int64(0), n)
    actor["log_prob_micro_batch"] = constant_column(np.int64(0), n)
    return actor


def _per_cp_rank(tokens: int, cp: np.ndarray) -> np.ndarray:
    """``-(-tokens // cp)``, the tokens per CP rank rounded up: read from a table per CP value
    where the CPs are few small positive integers (an integer division per row is slow)."""
    cp = np.asarray(cp)
    if cp.dtype.kind not in "iu" or len(cp) < 4096 or cp.min() < 1 or cp.max() > 4096:
        return -(-tokens // cp)
    table = -(-tokens // np.arange(cp.max() + 1, dtype=cp.dtype)[1:])
    return np.take(table, cp - 1)


def constant_column(value, n: int) -> np.ndarray:
    """``n`` rows of ``value`` as a read-only view of one element (stride 0): a column the
    search does not vary costs no memory per row (DeepSeek-V3 on 1,024 GPUs: 1.6 million rows,
    12.5 MB per int64 column).  It reads, slices and gathers like ``np.full(n, value)``."""
    return np.broadcast_to(np.asarray(value), (n,))


SPLIT_FIELDS = ("first_stage_layers", "last_stage_layers", "account_embedding", "account_loss")


def equivalent_splits(model: ModelSpec, parallel: Columns) -> np.ndarray:
    """Which valid parallel rows repeat an earlier row's job: the same sizes and the same
    transformer layers on every pipeline stage, reached by other split settings (PP 2 with 48
    layers: the even split, and the embedding and the loss both counted as layers, both put 24
    layers on each stage).  megatron-core builds the same stages from both, and the cost model
    reads the split only through the layers per stage
    (:func:`planner.search.pipeline.pipeline_split`), so every prediction is equal; the first
    row (in :func:`planner.search.pipeline.split_candidates`' order: the plain split first) is
    kept."""
    n = len(parallel["pp"])
    if n == 0:
        return np.zeros(0, dtype=bool)
    first, middle, last, _ = pipeline_split(
        model.num_layers, parallel["pp"], parallel.get("first_stage_layers"),
        parallel.get("last_stage_layers"), parallel.get("account_embedding"),
        parallel.get("account_loss"))
    key = {name: values for name, values in parallel.items() if name not in SPLIT_FIELDS}
    # a pipeline of one or two stages has no middle stage, whatever the split reports for it
    key.update(first_layers=first, middle_layers=np.where(parallel["pp"] > 2, middle, 0),
               last_layers=last)
    _, inverse = unique_rows(key, tuple(key))
    first_of = np.full(int(inverse.max()) + 1, n, dtype=np.int64)
    np.minimum.at(first_of, inverse, np.arange(n))
    return first_of[inverse] != np.arange(n)


def _rules(names: tuple[str, ...]):
    return tuple(rule for rule in RULES if rule.name in names)
