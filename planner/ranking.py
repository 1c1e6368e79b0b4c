"""How layouts are ranked: one rule, used wherever the planner picks a best.

The rule (:func:`prediction_order`), strictly by the prediction:

1. layouts that fit before those that do not;
2. layouts whose nvidia-smi peak stays inside the memory policy's band (``tight``: a peak above
   the band's top) before those that do not: users hold jobs to the band, the fixed overheads
   are estimates and responses vary in length;
3. predicted seconds (a step, a pool's share of it, a generation) -- the other unwise choices
   (TP across nodes, starved pipelines, CP on short sequences) are priced into them;
4. a tie-break, smaller first: lower peak memory (more headroom) for a layout, the smaller
   engine replica for a rollout option, the larger rollout pool for a split.

Layouts that do not fit are ordered by the tie-break alone (the closest miss first).  A plan
ranks its layouts with it (:func:`rank_order`), the trainer pool of a split picks its actor
layout with it, and the rollout pool its engine layout.

A plan then treats the layouts of the first tier whose predicted step time lies within the
model's measured ranking uncertainty of the best (``benchmarks/accuracy.py``: the median error
of the predicted throughput ratio of two layouts of one job, stored in the calibration file)
as ties -- the model cannot tell them apart -- and moves them to the top ordered simplest first
(:func:`simplicity_keys`): no unwise flags, peak inside the memory band, no offload, fewer
parallel dimensions, a smaller TP x PP x CP group, then predicted step time.  They carry
``within_error_of_best``.

Without a step-time column (memory-only scoring) a memory-headroom rule stands in for 3:
fewer unwise flags, less recompute and offload, less model parallelism, larger micro-batches.
"""

from __future__ import annotations

import numpy as np

from planner.cost.columns import flag_column
from planner.policy import DEFAULT_POLICY, MemoryPolicy
from planner.search.layout import Columns


def best_first(*keys) -> np.ndarray:
    """Indices that sort rows by ``keys``, the most important first, each ascending (a stable
    lexicographic sort)."""
    return np.lexsort(keys[::-1])


def prediction_order(fits, seconds, tiebreak, tight=None) -> np.ndarray:
    """Indices best first by the ranking rule (module docstring, steps 1-4): ``fits``,
    ``tight`` (None: nothing is), ``seconds`` and ``tiebreak`` are one value per row."""
    fits = np.asarray(fits).astype(bool)
    tight = np.zeros_like(fits) if tight is None else np.asarray(tight).astype(bool)
    # rows that do not fit are ordered by the tie-break alone (the closest miss first)
    return best_first(~fits, fits & tight, np.where(fits, seconds, 0.0), tiebreak)


def first_in_order(cols: Columns, count: int) -> np.ndarray:
    """The first ``count`` indices of :func:`rank_order` (scored layouts with a step-time
    column), without sorting every row: the rows of the tiers (fits, then memory-tight) before
    the one the ``count``-th row falls in, and of that tier those whose key is at most the
    ``count``-th smallest (its ties included), sorted as :func:`rank_order` sorts them.  The
    sort is stable and keeps the rows' order, so the result is that of the full sort."""
    fits = np.asarray(cols["fits"]).astype(bool)
    tight = fits & np.asarray(cols[flag_column("memory_tight")]).astype(bool)
    seconds = np.where(fits, cols["step_time_s"], 0.0)
    tier = np.where(fits, tight.astype(np.int8), np.int8(2))
    keep = np.zeros(len(fits), dtype=bool)
    left = count
    for level, key in ((0, seconds), (1, seconds), (2, np.asarray(cols["peak_bytes"]))):
        if left <= 0:
            break
        members = tier == level
        size = int(np.count_nonzero(members))
        if size > left:
            values = key[members]
            bound = np.partition(values, left - 1)[left - 1]
            if not np.isnan(bound):  # NaN sorts last: then the whole tier is kept
                members &= (key <= bound)
        keep |= members
        left -= size
    rows = np.flatnonzero(keep)
    sub = {name: np.asarray(cols[name])[rows] for name in
           ("fits", "step_time_s", "peak_bytes", flag_column("memory_tight"))}
    return rows[rank_order(sub)][:count]


def offload_count(cols: Columns) -> np.ndarray:
    """Offloads a layout switches on (actor parameters, optimizer, reference, CPU optimizer)."""
    n = len(cols["tp"])
    return (cols["param_offload"].astype(int) + cols["optimizer_offload"].astype(int)
            + cols["ref_param_offload"].astype(int)
            + (np.asarray(cols.get("optimizer_cpu_fraction", np.zeros(n))) > 0).astype(int))


def rank_order(cols: Columns, misses: int | None = None) -> np.ndarray:
    """Indices that sort scored layouts best first, strictly by the prediction
    (:func:`prediction_order` on step time, the memory band and the peak; without a step-time
    column the memory-headroom rule of the module docstring).  ``misses``: of the layouts
    that do not fit (last, the closest miss first), only the first ``misses``
    (:func:`_closest_misses`; None: all)."""
    if "step_time_s" in cols:
        if misses is not None:
            return _with_closest_misses(cols, misses)
        return prediction_order(cols["fits"], cols["step_time_s"], cols["peak_bytes"],
                                cols[flag_column("memory_tight")])
    return best_first(~cols["fits"].astype(bool), cols["unwise_count"], cols["recompute"],
                      offload_count(cols), cols["tp"] * cols["pp"] * cols["cp"],
                      cols["ep"] * cols["etp"], -cols["micro_batch"], cols["peak_bytes"])


def _with_closest_misses(cols: Columns, misses: int) -> np.ndarray:
    """:func:`prediction_order`'s first rows: every layout that fits, then the first
    ``misses`` of those that do not, without sorting them all.  The sort is stable and the
    layouts that fit come first, so sorting them apart keeps their order; the others are
    ordered by the peak alone (:func:`_closest_misses`)."""
    fits = np.asarray(cols["fits"]).astype(bool)
    fitting = np.flatnonzero(fits)
    peak = np.asarray(cols["peak_bytes"])
    head = fitting[prediction_order(np.ones(len(fitting), dtype=bool),
                                    np.asarray(cols["step_time_s"])[fitting], peak[fitting],
                                    np.asarray(cols[flag_column("memory_tight")])[fitting])]
    return np.concatenate([head, _closest_misses(np.flatnonzero(~fits), peak, misses)])


def _closest_misses(rows: np.ndarray, peak: np.ndarray, count: int) -> np.ndarray:
    """The first ``count`` of ``rows`` by ``peak`` (stably, NaN last), without sorting them
    all: those whose peak is at most the ``count``-th smallest, sorted."""
    if count <= 0:
        return rows[:0]
    values = peak[rows]
    if len(rows) > count:
        bound = np.partition(values, count - 1)[count - 1]
        if not np.isnan(bound):  # NaN sorts last: then every row is a candidate
            keep = values <= bound
            rows, values = rows[keep], values[keep]
    return rows[np.argsort(values, kind="stable")][:count]


def parallel_dimensions(cols: Columns) -> np.ndarray:
    """Model-parallel dimensions in use: TP, PP, VPP, CP, EP and expert TP (each a set of
    collectives, process groups and checkpoint shards to get right)."""
    return ((cols["tp"] > 1).astype(int) + (cols["pp"] > 1) + (cols["vpp"] > 1)
            + (cols["cp"] > 1) + (cols["ep"] > 1) + (cols["etp"] > 1))


def simplicity_keys(cols: Columns, policy: MemoryPolicy = DEFAULT_POLICY) -> list[np.ndarray]:
    """Sort keys, most important first, that order layouts the model cannot tell apart:
    fewer unwise flags, peak inside the memory band, fewer offloads, fewer parallel
    dimensions, a smaller TP x PP x CP group."""
    fraction = np.asarray(cols["memory_utilization"], dtype=float)
    outside_band = (fraction < policy.low) | (fraction > policy.high)
    # then the smaller dense model-parallel group (TP x PP x CP: TP2 before PP8)
    return [np.asarray(cols["unwise_count"]), outside_band.astype(int), offload_count(cols),
            parallel_dimensions(cols), np.asarray(cols["tp"] * cols["pp"] * cols["cp"])]


def tie_limit_s(best_step_s, tolerance: float):
    """The slowest step time the model cannot tell from ``best_step_s``: ``tolerance`` (its
    ranking uncertainty, a ratio) above it.  Elementwise on arrays."""
    return best_step_s * (1 + tolerance)


def tied_with_best(cols: Columns, order: np.ndarray, tolerance: float) -> np.ndarray:
    """Mask of the layouts the model cannot tell from the best-ranked one: in its tier (fits,
    and not memory-tight unless it is), predicted step time within ``tolerance`` of it."""
    n = len(cols["tp"])
    tied = np.zeros(n, dtype=bool)
    if (tolerance <= 0 or "step_time_s" not in cols or not n or not len(order)
            or not bool(cols["fits"][order[0]])):
        return tied
    best = order[0]
    tight = cols[flag_column("memory_tight")].astype(bool)
    step = np.asarray(cols["step_time_s"], dtype=float)
    tied = (cols["fits"].astype(bool) & (tight == tight[best])
            & (step <= tie_limit_s(step[best], tolerance)))
    return tied


def band_pool(cols: Columns, policy: MemoryPolicy = DEFAULT_POLICY) -> np.ndarray | None:
    """Mask of the rows :func:`fastest_in_band` chooses among: the timed layouts that fit with
    their peak inside the memory band; where none is inside, those that fit below the band's
    top, else those that fit.  None: nothing fits, or nothing is timed."""
    if "step_time_s" not in cols or not len(cols["tp"]):
        return None
    step = np.asarray(cols["step_time_s"], dtype=float)
    fits = np.asarray(cols["fits"]).astype(bool) & np.isfinite(step)
    fraction = np.asarray(cols["memory_utilization"], dtype=float)
    for pool in (fits & (fraction >= policy.low) & (fraction <= policy.high),
                 fits & (fraction <= policy.high), fits):
        if pool.any():
            return pool
    return None


def fastest_in_band(cols: Columns, policy: MemoryPolicy = DEFAULT_POLICY) -> int | None:
    """Row of the predicted-fastest layout (least ``step_time_s``, the run's expected step time)
    among those that fit with their peak inside the memory band; where none is inside, among
    those that fit below the band's top, else among those that fit (:func:`band_pool`).  None:
    nothing fits, or nothing is timed.  What the tie rule's simplest layout is compared with
    (issue 26)."""
    pool = band_pool(cols, policy)
    if pool is None:
        return None
    step = np.asarray(cols["step_time_s"], dtype=float)
    return int(np.flatnonzero(pool)[np.argmin(step[pool])])


def rows_before(cols: Columns, row: int) -> int:
    """How many rows :func:`rank_order` puts before ``row`` (scored layouts with a step-time
    column), without sorting: the rows whose keys (fits, memory-tight, step time, peak; then
    the row's index, the sort being stable) are smaller, a NaN key sorting last."""
    fits = np.asarray(cols["fits"]).astype(bool)
    tier = np.where(fits, (fits & np.asarray(cols[flag_column("memory_tight")]).astype(bool))
                    .astype(np.int8), np.int8(2))
    seconds = np.where(fits, np.asarray(cols["step_time_s"], dtype=float), 0.0)
    peak = np.asarray(cols["peak_bytes"], dtype=float)
    earlier = np.arange(len(fits)) < row
    before = earlier
    for key in (peak, seconds, tier):  # the least important first
        mine = key[row]
        if np.issubdtype(key.dtype, np.floating) and np.isnan(mine):
            less, same = ~np.isnan(key), np.isnan(key)
        else:
            less, same = key < mine, key == mine
        before = less | (same & before)
    return int(np.count_nonzero(before))


TIE_FIELDS = ("tp", "pp", "vpp", "cp", "ep", "etp", "param_offload", "optimizer_offload",
              "ref_param_offload", "optimizer_cpu_fraction", "memory_utilization",
              "unwise_count", "step_time_s", "peak_bytes")


def tie_order(cols: Columns, tolerance: float, policy: MemoryPolicy = DEFAULT_POLICY,
              misses: int | None = None, first: int | None = None,
              ) -> tuple[np.ndarray, np.ndarray]:
    """The ranking with ties resolved towards simple layouts (module docstring): returns
    ``(order, tied)`` -- indices best first, and the mask of layouts tied with the best.
    ``misses``: of the layouts that do not fit, ``order`` holds only the first ``misses``
    (:func:`rank_order`; ties are layouts that fit).  ``first``: ``order`` holds only the first
    ``first`` rows, found without sorting every row (:func:`first_in_order`; at least the
    number of ties: the ties are the first rows of :func:`rank_order`, the best's tier's
    fastest)."""
    order = rank_order(cols, misses) if first is None else first_in_order(cols, first)
    tied = tied_with_best(cols, order, tolerance)
    if not tied.any():
        return order, tied
    members = np.flatnonzero(tied)
    sub = {name: np.asarray(values)[members] for name, values in cols.items()
           if name in TIE_FIELDS}
    first = members[best_first(*simplicity_keys(sub, policy), sub["step_time_s"],
                               sub["peak_bytes"])]
    rest = order[~tied[order]]
    return np.concatenate([first, rest]), tied
