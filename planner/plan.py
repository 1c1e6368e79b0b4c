"""From a model, a cluster and a workload to a ranked table of layouts.

This is the one place the pieces meet: search space -> cost model -> ranking.  The search space
(:mod:`planner.search.space`) yields every valid actor layout and every valid rollout option;
here each actor layout gets the rollout option that fits beside it and generates fastest, the
cost model scores the result, and the layouts are ranked.  It returns plain data (:class:`Plan`:
the ranked layouts as numpy columns, as a pandas DataFrame on first use, plus counts); rendering
lives in :mod:`planner.report` and exit codes in :mod:`planner.cli`.

Ranking is :mod:`planner.ranking`'s rule (fits, inside the memory band, predicted step time,
more headroom), with the layouts the model cannot tell from the best moved to the top simplest
first (:func:`planner.ranking.tie_order`).
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from planner.cost.columns import (
    flag_column,
    memory_column,
)
from planner.cost.deferred import DeferredColumns
from planner.cost.engine_pairs import engine_pairs
from planner.cost.memory import (
    actor_memory,
    actor_reduction,
    actor_rows,
    estimate_memory,
    rollout_layout_terms,
    rollout_memory,
    rollout_memory_of_terms,
)
from planner.cost.request import OfRequest, PlanRequest
from planner.cost.timing import (
    LayoutRows,
    Runs,
    StepGroups,
    generate_s,
    step_columns,
    step_time_s,
)
from planner.cost.trajectory import (
    expected_over_run,
    node_lengths,
    request_at,
    seconds_over_run,
    step_columns_over_run,
)
from planner.errors import InvalidLayoutError
from planner.first_ties import rows_for_first_ties
from planner.phases import PHASES, TRAINING_PHASES
from planner.policy import FILL_POLICY
from planner.ranking import (
    band_pool,
    fastest_in_band,
    first_in_order,
    rows_before,
    simplicity_keys,
    tie_order,
    tied_with_best,
)
from planner.results import COLOCATED_MODE, ColocatedCandidate, Placement, Staleness
from planner.search.batches import update_batch_count
from planner.search.layout import RECOMPUTE, Columns, Layout, RowsAt, distinct
from planner.search.rules import (
    UNWISE_FLAGS,
    UPDATE_COUNT,
    PipelineStarvation,
    explain,
    pipeline_starvation,
    unwise_flags,
)
from planner.search.space import (
    SearchOptions,
    SearchSpace,
    build_space,
    rollout_options,
    valid_rollouts,
)
from planner.step_bound import (
    StepRecord,
    actor_fits_alone,
    row_bounds,
    step_rest_s,
)
from planner.units import GIB

if TYPE_CHECKING:
    import pandas as pd

ROLLOUT_FIELDS = ("rollout_tp", "rollout_dp", "rollout_ep")
KEEP_NOT_FITTING = 2000  # layouts that do not fit a plan keeps (smallest peak first)
FILL_ROWS = 50  # best fitting layouts a plan prices the memory band's headroom for
CHOICE_CELLS = 1 << 19  # (rollout option, resident size) pairs choose_rollout scores at once
# rows whose memory columns a plan read at its head computes at once (score_rows)
SCORE_CHUNK_ROWS = 1 << 17
# above this many rows, an actor evaluation is held per cell (some 190 bytes a row less: about
# 300 MB at DeepSeek-V3 x 1024's 1.6 million) and each plan computes its rows' arrays a chunk
# at a time; below, once per row (a pass per plan and the rollout choice's cost some CPU, and
# a plan of fewer rows peaks below 600 MB without it)
HELD_ACTOR_ROWS = 8 * SCORE_CHUNK_ROWS


@dataclass
class Plan(OfRequest):
    request: PlanRequest  # what was asked (model, cluster, workload, options, cost, policy)
    # ranked, best first: every valid layout that fits, then the closest that do not, as
    # columns (numpy arrays; ``recompute``, ``peak_phase`` and ``dominant_phase`` as indices);
    # :attr:`candidates` is the same as a pandas DataFrame
    columns: Columns = field(repr=False, compare=False)
    # the space and actor memory behind it, for a plan of the same request under another policy
    actors: "ActorEvaluation | None" = field(repr=False, compare=False)
    enumerated: int = 0
    valid: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    scored: int = 0  # actor layouts the cost model scored (each with its chosen rollout)
    merged: int = 0  # valid actor layouts merged into an equivalent scored one (SearchSpace)
    # layouts that fit when ``candidates`` keeps only the first few (``PlanReads.keep``)
    fit_total: int | None = None
    # of those, with the peak at most the band's top, when ``candidates`` keeps only the rows
    # the text table reads (``PlanReads.table``)
    below_top_total: int | None = None
    # the ties, whenever ``candidates`` keeps only the first few (``PlanReads.keep``)
    tie_total: int | None = None
    # False: only the ties that can be among the kept rows were timed
    # (``PlanReads.count_ties``): :attr:`ties` is not known
    ties_counted: bool = True
    # step-time ratio within which layouts are ties, and where the figure comes from
    tie_tolerance: float = 0.0
    tie_source: str = ""
    # False: the kept rows were found without scoring every layout
    # (``PlanReads(count_fits=False)``): :attr:`fitting_count` is not known
    fits_counted: bool = True
    # the kept rows were found from the bounds another policy's plan gives (:func:`_bounded_head`)
    bounded: bool = False

    @cached_property
    def candidates(self) -> "pd.DataFrame":
        """The ranked layouts as a DataFrame (built on first use: the text table reads
        :attr:`columns` and does not import pandas)."""
        return _frame(self.columns)

    @property
    def rows(self) -> int:
        """Layouts the plan keeps (:attr:`columns`' length)."""
        return len(self.columns["tp"])

    @property
    def fitting(self) -> "pd.DataFrame":
        frame = self.candidates
        count = self.fitting_count
        head = frame.iloc[:count]
        if bool(head["fits"].all()):  # ranked: the layouts that fit come first (a view)
            return head
        return frame[frame["fits"]]

    def fitting_rows(self) -> np.ndarray:
        """The positions of the kept layouts that fit, in rank order (:attr:`fitting`'s)."""
        fits = np.asarray(self.columns["fits"])
        if not self.fits_counted:
            return np.flatnonzero(fits)
        head = fits[:self.fitting_count]
        if head.all():  # ranked: the layouts that fit come first
            return np.arange(len(head))
        return np.flatnonzero(fits)

    def _check_fits_counted(self, what: str) -> None:
        """Refuse a count of every layout (those ``what``) where the kept rows were found
        without scoring every layout (:attr:`fits_counted`)."""
        if not self.fits_counted:
            raise ValueError(f"this plan found its first rows without scoring every layout "
                             f"(PlanReads(count_fits=False)): the count of those {what} is "
                             f"not known")

    @property
    def fitting_count(self) -> int:
        """Layouts that fit in memory (all of them, also when the frame keeps fewer)."""
        self._check_fits_counted("that fit")
        if self.fit_total is not None:
            return self.fit_total
        return int(np.count_nonzero(self.columns["fits"]))

    @property
    def fitting_below_top(self) -> int:
        """Layouts that fit with their nvidia-smi peak at most the memory band's top (all of
        them, also when the frame keeps fewer)."""
        self._check_fits_counted("that fit below the band's top")
        if self.below_top_total is not None:
            return self.below_top_total
        fraction = np.asarray(self.columns["memory_utilization"])[self.fitting_rows()]
        return int(np.count_nonzero(fraction <= self.policy.high + 1e-9))

    @property
    def ties(self) -> int:
        """Layouts within the ranking uncertainty of the best (``within_error_of_best``)."""
        if not self.ties_counted:
            raise ValueError("this plan timed only the ties among its first rows "
                             "(PlanReads(count_ties=False)): their count is not known")
        if self.tie_total is not None:
            return self.tie_total
        tied = self.columns.get("within_error_of_best")
        return 0 if tied is None else int(np.count_nonzero(tied))

    def records(self, rows: np.ndarray) -> list[dict]:
        """The kept layouts at positions ``rows`` as :attr:`candidates`' records
        (``DataFrame.to_dict("records")``): Python scalars, the phase and recompute columns
        by name, ``peak_memory_gib`` added."""
        cols = (self.columns.at(rows) if isinstance(self.columns, RankedColumns) else
                {name: np.asarray(values)[rows] for name, values in self.columns.items()})
        cols.update(_named(cols))
        cols["peak_memory_gib"] = cols["peak_bytes"] / GIB
        lists = {name: values.tolist() for name, values in cols.items()}
        return [dict(zip(lists, values)) for values in zip(*lists.values())]

    def top(self, count: int | None = None, fitting: bool = False,
            staleness: Staleness | None = None,
            mode: str = COLOCATED_MODE) -> list[ColocatedCandidate]:
        """The first ``count`` ranked layouts (None: all; ``fitting``: of those that fit) as
        typed candidates on every GPU of ``mode``; ``staleness``: what a timed one reports."""
        rows = self.fitting_rows() if fitting else np.arange(self.rows)
        placement = Placement.shared(self.cluster)
        return [ColocatedCandidate.from_row(row, placement, mode, staleness,
                                            self.workload.phases)
                for row in self.records(rows if count is None else rows[:count])]

    @cached_property
    def fastest_in_band(self) -> ColocatedCandidate | None:
        """The predicted-fastest layout inside the memory band
        (:func:`planner.ranking.fastest_in_band`); None: none fits or none is timed."""
        rows = self.fitting_rows()
        index = fastest_in_band({name: np.asarray(self.columns[name])[rows] for name in
                                 ("tp", "fits", "step_time_s", "memory_utilization")
                                 if name in self.columns}, self.policy)
        return None if index is None else self.candidate(index, fitting=True)

    def candidate(self, index: int, fitting: bool = False) -> ColocatedCandidate:
        """The ``index``-th ranked layout (0: the best; ``fitting``: of those that fit)."""
        rows = self.fitting_rows() if fitting else np.arange(self.rows)
        return ColocatedCandidate.from_row(self.records(rows[[index]])[0],
                                           Placement.shared(self.cluster),
                                           phases=self.workload.phases)


@dataclass(frozen=True)
class RolloutChoice:
    """The rollout option :func:`choose_rollout` gives the actor layouts: once per distinct
    (resident, beside) pair of their memory (``resident`` and ``beside``, bytes per pair;
    ``chosen``: the rollout TP/DP/EP and ``gpu_memory_utilization`` per pair), and per row the
    index of its pair (``inverse``).  The pairs are the actor evaluation's own (its memory
    alone), so plans of one evaluation under other policies index the same pairs."""

    chosen: Columns
    resident: np.ndarray
    beside: np.ndarray
    inverse: np.ndarray

    def spread(self, actor: Columns) -> Columns:
        """The actor columns with each row's chosen rollout."""
        return {**actor, **{name: values[self.inverse] for name, values in self.chosen.items()}}


def choose_rollout(request: PlanRequest, actor: Columns, rollouts: Columns,
                   utilization: float | None, memory: dict | None = None,
                   ) -> tuple[Columns, dict]:
    """The actor columns with the rollout :func:`rollout_choice` gives them, and the actor
    memory (``memory``: when already computed)."""
    memory = actor_memory(request, actor) if memory is None else memory
    return rollout_choice(request, rollouts, utilization, memory).spread(actor), memory


def rollout_choice(request: PlanRequest, rollouts: Columns, utilization: float | None,
                   memory: dict) -> RolloutChoice:
    """Give each actor layout the rollout option that fits beside it, inside the memory band
    where one does, and generates fastest over the run (:func:`planner.cost.timing.generate_s`
    expected over the trajectory of the mean response length, :mod:`planner.cost.trajectory`;
    for a workload without a rollout, whose one option runs nothing, the fewest waves), its
    ``gpu_memory_utilization`` kept below the memory band's top and its KV pool judged for
    sequences of the maximum length (:func:`planner.cost.memory.rollout_memory`).  ``memory``:
    the actor layouts' :func:`planner.cost.memory.actor_memory`.

    The choice depends on the actor only through the memory it keeps resident during rollout
    and in the phase the engine's other memory joins (the weight sync, where a sleeping engine
    wakes its weights; every training phase, where it keeps its whole pool), so it is made once
    per distinct pair of them (micro-batch and recompute do not change it).
    """
    workload = request.workload
    timed = workload.has_rollout
    capacity = float(request.cluster.gpu.memory_bytes)
    # what the engine joins outside generation (planner.cost.memory.estimate_memory)
    sleeps = timed and workload.engine.free_cache_engine
    joined = ("weight_sync",) if sleeps else tuple(
        phase for phase in TRAINING_PHASES if phase in workload.phases)

    # the actor's memory alone: found once per actor evaluation (the plans that share it)
    resident, beside, inverse = actor_reduction(
        memory, "rollout_pairs_" + "+".join(joined),
        lambda: engine_pairs(memory, joined, SCORE_CHUNK_ROWS))
    n, options = len(resident), len(rollouts["rollout_tp"])
    chosen = {name: np.ones(n, dtype=np.int64) for name in ROLLOUT_FIELDS}
    chosen["gpu_memory_utilization"] = np.full(n, 0.5)
    # every option against a chunk of resident sizes at once, (option, size) tables: the
    # options' own terms found once, each a column beside a row of sizes
    # (rollout_memory_of_terms broadcasts; chunks keep the cells, and so memory, bounded)
    terms = {name: np.asarray(values)[:, None] if np.ndim(values) else values
             for name, values in rollout_layout_terms(request, rollouts).items()}
    step = max(1, CHOICE_CELLS // max(options, 1))
    for start in range(0, n, step):
        part = resident[None, start:start + step]
        m = part.shape[1]
        fixed_util = None if utilization is None else np.full((options, m), utilization)
        result = rollout_memory_of_terms(request, terms, part, fixed_util)
        # where nothing fits, a miss whose rollout weights alone fit under the band's top
        # first (a larger TP / EP), not the first option, which may not hold them at all
        holds = result["rollout_weights_bytes"] <= request.policy.high * capacity
        fits = np.where(result["rollout_fits"], 0, np.where(holds, 1e12, 2e12))
        picked = np.broadcast_to(result["gpu_memory_utilization"], (options, m))
        if timed:
            # fits first, then inside the memory band (an option whose pool cannot shrink
            # below the band's top for one sequence takes more: planner.ranking's rule ranks
            # it after those inside), then the predicted generation time.  The time depends on
            # the resident memory only through the picked utilization (a few 0.01 steps): time
            # each option at each of its utilizations once
            pair = (np.arange(options)[:, None] * 1000
                    + np.round(picked * 100).astype(np.int64)).reshape(-1)
            once, back = distinct(pair)
            # (LayoutRows: the options' layout terms found once for the run's three points)
            few = LayoutRows({name: values[once // m] for name, values in rollouts.items()})
            at_utils = rollout_memory(request, few, np.zeros(len(once)),
                                      picked.reshape(-1)[once])
            seconds = seconds_over_run(request, lambda at, few=few, kv=at_utils:
                                       generate_s(at, few, kv)["total_s"])[0][back]
            joins = result["rollout_weights_bytes" if sleeps else "rollout_budget_bytes"]
            peak = np.maximum(result["mem_generate_bytes"],
                              beside[None, start:start + step] + joins)
            over_band = peak > request.policy.high * capacity + 1.0
            key = (fits + np.where(over_band, 5e11, 0.0)
                   + np.minimum(seconds, 1e11).reshape(options, m))
        else:
            # fits first, then fewest waves, then the smallest replica
            replica = (rollouts["rollout_tp"] * rollouts["rollout_dp"])[:, None]
            key = fits + np.minimum(result["rollout_waves"], 1e6) * 1e4 + replica
        # the first option with the smallest key (a NaN key is never chosen; none: defaults)
        key = np.where(np.isnan(key), np.inf, key)
        best = np.argmin(key, axis=0)
        found = np.isfinite(key[best, np.arange(m)])
        where = slice(start, start + m)
        for name in ROLLOUT_FIELDS:
            chosen[name][where] = np.where(found, rollouts[name][best], chosen[name][where])
        chosen["gpu_memory_utilization"][where] = np.where(
            found, picked[best, np.arange(m)], chosen["gpu_memory_utilization"][where])
    return RolloutChoice(chosen, resident, beside, inverse)


@dataclass(frozen=True)
class ScoredRows:
    """The cost model's columns of every row, the time columns held for the timed rows only
    (a plan times the layouts that fit, and its frame keeps those and a few more: spreading
    every time column over millions of rows to take most of them back would cost more than the
    timing), and of a plan read at its head the memory and flag columns the ranking reads
    alone (the others computed for the rows asked, ``rest``)."""

    untimed: Columns  # layout, memory and flag columns of every row
    times: Columns  # time columns of the rows ``timed`` marks, in row order
    timed: np.ndarray  # which rows were timed
    names: tuple[str, ...]  # every column, in the order the frame shows them
    # the columns ``untimed`` lacks at some rows (an index), computed for them (None: none lacks)
    rest: Callable[[np.ndarray], Mapping] | None = None
    # (a head's, of a GRPO step) per row, ``E - T`` and whether it fits apart from the rollout
    # (:class:`planner.step_bound.StepRecord`)
    record: tuple[np.ndarray, np.ndarray] | None = None

    @cached_property
    def _position(self) -> np.ndarray | None:
        """Each row's index among the timed rows (-1: not timed); None when every row is."""
        if self.timed.all():
            return None
        position = np.full(len(self.timed), -1, dtype=np.int64)
        position[self.timed] = np.arange(int(self.timed.sum()))
        return position

    def column(self, name: str, rows: np.ndarray | None = None) -> np.ndarray:
        """Column ``name`` at ``rows`` (None: every row); an untimed row's time is NaN (-1 for
        a whole-number column)."""
        return self._column(name, rows, self._timed_index(rows), self._rest(name, rows))

    def take(self, rows: np.ndarray | None = None) -> Columns:
        """Every column at ``rows`` (None: every row)."""
        at = self._timed_index(rows)  # once for every column
        rest = self._rest(None, rows)
        return {name: self._column(name, rows, at, rest) for name in self.names}

    def _rest(self, name: str | None, rows: np.ndarray | None) -> Mapping:
        """The columns ``untimed`` lacks at ``rows`` (``name``: when that one is read)."""
        if self.rest is None or (name is not None and (name in self.untimed
                                                       or name in self.times)):
            return {}
        return self.rest(np.arange(len(self.timed)) if rows is None else np.asarray(rows))

    def _timed_index(self, rows: np.ndarray | None) -> np.ndarray | None:
        """Per row of ``rows``, its position among the timed rows, -1 where it was not timed
        (None: every row was timed)."""
        position = self._position
        if position is None:
            return None
        return position if rows is None else position[rows]

    def _column(self, name: str, rows: np.ndarray | None, at: np.ndarray | None,
                rest: Mapping) -> np.ndarray:
        if name not in self.times:
            if name not in self.untimed:
                return np.asarray(rest[name])
            values = np.asarray(self.untimed[name])
            return values if rows is None else values[rows]
        values = self.times[name]
        if at is None:  # every row was timed
            return values if rows is None else values[rows]
        return _spread(values, at)


def _spread(values: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Timed ``values`` at positions ``at`` (-1: an untimed row, which reads NaN, or -1 for a
    whole-number column): one gather from the values with the fill appended."""
    floating = np.issubdtype(np.asarray(values).dtype, np.floating)
    padded = np.empty(len(values) + 1, dtype=np.float64 if floating else np.int64)
    padded[:-1] = values
    padded[-1] = np.nan if floating else -1
    return padded[at]


class RankedColumns(Mapping):
    """A plan's ranked columns (``rows`` at positions ``order``, then ``extra``, the columns
    the plan adds to its kept rows), each gathered from ``rows`` when first read and kept:
    the :attr:`Plan.columns` of a plan that reads ``PlanReads(lazy=True)``, for a caller that
    reads a few columns of every kept row and every column of a few (a sizing sweep: the
    parallel and rollout columns of its probes' fitting layouts and the best row's record, not
    the hundred columns of thousands of layouts).  The same values, in the same order, as
    ``{**rows.take(order), **extra}``."""

    def __init__(self, rows: ScoredRows, order: np.ndarray, extra: Columns) -> None:
        self._rows, self._order, self._extra = rows, order, extra
        self._gathered: Columns = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self._extra:
            return self._extra[name]
        values = self._gathered.get(name)
        if values is None:
            if name not in self._rows.names:
                raise KeyError(name)
            values = self._gathered[name] = self._rows.column(name, self._order)
        return values

    def __contains__(self, name: object) -> bool:
        return name in self._extra or name in self._rows.names

    def __iter__(self):
        yield from dict.fromkeys((*self._rows.names, *self._extra))

    def __len__(self) -> int:
        return len(dict.fromkeys((*self._rows.names, *self._extra)))

    def at(self, rows: np.ndarray) -> Columns:
        """Every column at the kept positions ``rows`` (gathered for them alone)."""
        at = {**self._rows.take(self._order[rows]), **self._extra}
        return {name: at[name] if name not in self._extra else np.asarray(at[name])[rows]
                for name in self}


@dataclass(frozen=True)
class Head:
    """The first ``rows`` of a plan's ranking, the layouts within ``tie_tolerance`` of the
    best moved to the top (:func:`planner.ranking.tie_order`; 0: a strict ranking): all a
    caller that reads no further needs timed (:func:`score_rows`)."""

    rows: int
    tie_tolerance: float = 0.0
    # also the fastest layout inside the memory band and every layout ranked before it
    # (:func:`planner.ranking.fastest_in_band`: what the text table reads beyond the head)
    band_fastest: bool = False
    # False: of the ties only those that can be among the first ``rows`` are kept (their
    # count is then not known: :func:`planner.first_ties.rows_for_first_ties`)
    count_ties: bool = True
    # (a GRPO step) also record per row what bounds its step time under another memory
    # policy (:attr:`ScoredRows.record`, :class:`planner.step_bound.StepRecord`)
    record: bool = False


# the memory and flag columns a ranking reads of every row (planner.ranking, make_plan)
RANKING_COLUMNS = ("fits", "peak_bytes", "memory_utilization", flag_column("memory_tight"),
                   "unwise_count")


def _columns_at(request: PlanRequest, cols: Columns, actor: dict, rows: slice | np.ndarray,
                pick_utilization: bool) -> Mapping:
    """Every column of ``rows`` of ``cols`` (a slice, or an index whose layout columns are
    gathered when read): the layout columns, and the memory and flag columns computed for
    those rows alone (:func:`planner.cost.memory.estimate_memory`,
    :func:`planner.search.rules.unwise_flags`; row by row, so the same values as computed for
    every row).  A chunk (a slice of the rows, not all of them: :func:`score_rows`') comes as
    a :class:`planner.cost.deferred.DeferredColumns` whose memory columns no fit or peak reads
    are computed when first read (:func:`planner.cost.memory.estimate_memory`'s
    ``deferred``)."""
    whole = isinstance(rows, slice) and rows == slice(0, len(cols["tp"]))
    chunk = isinstance(rows, slice) and not whole
    if whole:
        layout, rows_actor = cols, actor
    elif chunk:
        layout = {name: values[rows] if np.ndim(values) else values
                  for name, values in cols.items()}
        rows_actor = actor_rows(actor, rows)
    else:
        layout, rows_actor = RowsAt(cols, rows), actor_rows(actor, rows)
    memory = estimate_memory(request, layout, pick_utilization, rows_actor, deferred=chunk)
    read = {"peak_fraction": memory["memory_utilization"]}
    heads = rows_actor["parts"].core_heads() if chunk else None
    if heads is not None:
        # the update's micro-batches read core-row fields alone: once per core row
        read[UPDATE_COUNT] = np.take(update_batch_count(request.workload, RowsAt(layout, heads)),
                                     rows_actor["parts"].core)
    flags = unwise_flags(request.model, request.cluster, request.workload,
                         ChainMap(read, layout), request.policy)
    scored = DeferredColumns() if chunk else dict(memory)
    if chunk:
        scored.update_from(layout)
        scored.update_from(memory)
    for name in UNWISE_FLAGS:
        scored[flag_column(name)] = flags[name]
    scored["unwise_count"] = np.sum([flags[name] for name in UNWISE_FLAGS], axis=0)
    if chunk:
        return scored
    return RowsAt(cols, rows, scored) if isinstance(layout, RowsAt) else {**layout, **scored}


def score_rows(request: PlanRequest, cols: Columns, actor: dict | None = None, *,
               pick_utilization: bool, time_rows: "str | Head" = "all") -> ScoredRows:
    """Cost-model columns (memory, time, flags) for layouts that obey every rule.

    ``actor``: the :func:`planner.cost.memory.actor_memory` of these rows, when already
    computed.  ``pick_utilization``: choose each layout's ``gpu_memory_utilization`` below the
    memory band's top instead of reading it from ``cols``.  ``time_rows``: which rows get time
    columns (the others' are NaN) -- ``"all"``; ``"fitting"``, the layouts that fit in memory (a
    plan ranks the others by memory alone); a :class:`Head`, of those only the ones that can be
    in it, for a caller that reads no further: a layout whose expected step time ranks it
    after them is left untimed too (:func:`_rows_that_can_lead`).

    With a :class:`Head`, the rows are scored :data:`SCORE_CHUNK_ROWS` at a time (memory,
    flags, and the expected step time of those that fit: the step time alone at each point
    of the run, :func:`_expected_s`), and of each chunk only what the ranking reads is kept
    (:data:`RANKING_COLUMNS`, the expected step time): the memory columns of millions of rows
    are never held at once.  The rows that can lead keep that step time (the ranking's).
    The other columns, time columns included, are computed again for the rows a caller takes
    (:attr:`ScoredRows.rest`).  Each row's columns are its own alone, so the values are those
    of one pass over every row.
    """
    if isinstance(time_rows, str) and time_rows not in ("all", "fitting"):
        raise ValueError(f"time_rows {time_rows!r}: valid are 'all', 'fitting' or a Head")
    head = time_rows if isinstance(time_rows, Head) else None
    actor = actor_memory(request, cols) if actor is None else actor
    n = len(cols["tp"])
    size = max(n if head is None else SCORE_CHUNK_ROWS, 1)  # no rows: one empty pass
    whole = size >= n
    kept, timed_parts, expected_parts, memory_names = [], [], [], None
    # (a head's that records, of a GRPO step) what bounds the rows' step times under another
    # policy
    record = ([], []) if head is not None and head.record and request.workload.has_rollout \
        else None
    # (a GRPO step's head) rows in blocks of each core row's knob combinations: their size
    cells = actor.get("cells") if head is not None and request.workload.has_rollout else None
    blocks = (len(cells.knobs) if cells is not None and cells.in_order and cells.knobs
              and len(cells) == n else None)
    for start in range(0, max(n, 1), size):
        out = _columns_at(request, cols, actor, slice(start, start + size), pick_utilization)
        if memory_names is None:
            memory_names = _memory_names(out, cols)
        timed = (np.ones(len(out["fits"]), dtype=bool) if time_rows == "all"
                 else np.asarray(out["fits"]).astype(bool))
        timed_parts.append(timed)
        kept.append(out if whole else {name: out[name] for name in RANKING_COLUMNS})
        if head is not None:
            # every layout that fits: its expected step time alone, a quarter chunk at a time
            # (each piece's step groups found once for the three points of the run: the
            # step's arrays of a whole chunk would raise the peak); the head is found from it
            fitting = np.flatnonzero(timed)
            piece = max(SCORE_CHUNK_ROWS // 4, 1)
            pieces = [_expected_s(request, RowsAt(out, rows),
                                  None if blocks is None else _runs(out, rows, start, blocks))
                      for at in range(0, len(fitting), piece)
                      for rows in (fitting[at:at + piece],)]
            expected_parts += pieces
            if record is not None:
                _record_chunk(request, out, fitting, pieces, record)
        # a chunk's columns freed before the next chunk's are computed (its deferred memory
        # columns hold their inputs until read or freed)
        del out
    timed = timed_parts[0] if whole else np.concatenate(timed_parts)
    untimed = kept[0] if whole else {**cols, **{name: np.concatenate([part[name] for part in kept])
                                               for name in RANKING_COLUMNS}}

    def rows_at(index: np.ndarray) -> Mapping:
        """Every column of the rows ``index`` (the memory computed again unless kept)."""
        if whole:
            return untimed if len(index) == n else RowsAt(untimed, index)
        return _columns_at(request, cols, actor, index, pick_utilization)

    index = np.flatnonzero(timed)  # once for every column (a mask would be scanned per column)
    expected = None  # the kept rows' expected step time, when a head found it
    if head is not None:
        expected = np.concatenate([np.zeros(0), *expected_parts])
        leads = _rows_that_can_lead(
            request, expected, head,
            {"memory_tight": untimed[flag_column("memory_tight")][timed],
             "fraction": untimed["memory_utilization"][timed], "rows": RowsAt(untimed, index)})
        timed[timed] = leads
        index = np.flatnonzero(timed)
        expected = expected[leads]
    recorded = None if record is None else tuple(np.concatenate(part) for part in record)
    if not whole:
        # (a head's) the step time the ranking reads is the kept rows' expected step time,
        # found in the chunks (the same operations on the same values: the same numbers)
        return replace(_rows_timed_at(request, untimed, memory_names, rows_at,
                                      (timed, expected)), record=recorded)
    # each column gathered when the step reads it (a few dozen of about a hundred)
    times = _step_over_run(request, rows_at(index))
    names = _column_names(cols, memory_names, list(times))
    untimed = {name: values for name, values in untimed.items() if name not in times}
    return ScoredRows(untimed, dict(times), timed, names, record=recorded)


def _memory_names(out: Mapping, cols: Columns) -> list[str]:
    """The memory columns of ``out`` (:func:`_columns_at`'s), in its order."""
    flags = {flag_column(name) for name in UNWISE_FLAGS} | {"unwise_count"}
    return [name for name in out if name not in cols and name not in flags]


def _column_names(cols: Columns, memory_names: list[str], time_names: list[str]
                  ) -> tuple[str, ...]:
    """Every column of a plan's rows, in the order the frame shows them."""
    names = [*cols, *memory_names, *time_names]
    names += [flag_column(name) for name in UNWISE_FLAGS] + ["unwise_count"]
    return tuple(dict.fromkeys(names))


def _record_chunk(request: PlanRequest, out: Mapping, fitting: np.ndarray,
                  pieces: list[np.ndarray], record: tuple[list, list]) -> None:
    """Append a scoring chunk's part of the rows' :class:`planner.step_bound.StepRecord`
    (``out``: its columns; ``fitting``: its rows that fit, whose expected step times are
    ``pieces``) to ``record``'s lists: ``E - T`` (NaN where not timed), and whether each row
    fits apart from the rollout."""
    rest = np.full(len(out["fits"]), np.nan)
    if len(fitting):
        rest[fitting] = step_rest_s(request, RowsAt(out, fitting), np.concatenate(pieces))
    record[0].append(rest)
    record[1].append(actor_fits_alone(request, out))


def _rows_timed_at(request: PlanRequest, untimed: Columns, memory_names: list[str],
                   rows_at: Callable[[np.ndarray], Mapping],
                   timed: tuple[np.ndarray, np.ndarray]) -> ScoredRows:
    """The :class:`ScoredRows` of rows whose ranking columns are ``untimed`` (the layout
    columns at least) and whose step time is known at the rows ``timed[0]`` marks
    (``timed[1]``, in row order); the other columns are computed again for the rows a caller
    takes (``rows_at``: every column of some rows; the time columns of the timed ones timed
    again, an untimed row's NaN, or -1; their names from a step of no rows)."""
    mask, expected = timed
    time_names = list(_step_over_run(request, rows_at(np.zeros(0, dtype=np.int64))))

    def rest(rows: np.ndarray) -> Mapping:
        """Every column of the rows ``rows``, the time columns of the timed ones among them
        timed again (an untimed row's NaN, or -1)."""
        out = rows_at(rows)
        mine = mask[rows]
        at = np.full(len(rows), -1, dtype=np.int64)
        at[mine] = np.arange(int(np.count_nonzero(mine)))
        step = _step_over_run(request, out.at(np.flatnonzero(mine)))
        return ChainMap({name: _spread(step[name], at) for name in time_names}, out)

    cols_names = [name for name in untimed if name not in memory_names
                  and name not in RANKING_COLUMNS]
    untimed = {name: values for name, values in untimed.items() if name not in time_names}
    return ScoredRows(untimed, {"step_time_s": expected}, mask,
                      _column_names(cols_names, memory_names, time_names), rest)


def _expected_s(request: PlanRequest, subset: Mapping, runs: Runs | None = None
                ) -> np.ndarray:
    """The run's expected step time of the rows ``subset`` alone (``step_time_s`` of
    :func:`_step_over_run`, the same sum of the same values; a length that does not move: its
    one point's), the groups found once for every point (``runs``: the rows' runs of one core
    row, :class:`planner.cost.timing.Runs`) and the step time alone computed at each
    (:func:`planner.cost.timing.step_time_s`, whose operations are those of
    :func:`planner.cost.timing.step_columns`: the same number to the bit)."""
    groups = StepGroups.of(subset, subset, runs) if request.workload.has_rollout else None
    if not request.workload.moving_lengths:  # one point: its step time
        return step_time_s(request, subset, subset, groups)
    return expected_over_run([step_time_s(request_at(request, point), subset, subset, groups)
                              for point in node_lengths(request.workload.lengths)])


def _runs(chunk: Mapping, rows: np.ndarray, start: int, knobs: int) -> Runs:
    """The :class:`planner.cost.timing.Runs` of the rows ``rows`` (in order) of ``chunk``, the
    rows from ``start`` on of rows in blocks of ``knobs`` combinations of each core row."""
    core = (rows + start) // knobs
    starts = np.flatnonzero(np.concatenate(([True], core[1:] != core[:-1])))
    return Runs(RowsAt(chunk, np.take(rows, starts)), np.diff(np.append(starts, len(rows))))


def _step_over_run(request: PlanRequest, subset: Mapping) -> Columns:
    """The run's expected step time columns of the rows ``subset`` and the step time at its
    first and last step (:func:`planner.cost.trajectory.step_columns_over_run`), each phase
    timed once per distinct row of what it reads, the groups found once for every point."""
    groups = StepGroups.of(subset, subset) if request.workload.has_rollout else None
    return step_columns_over_run(request, lambda at: step_columns(at, subset, subset, groups))


def _rows_that_can_lead(request: PlanRequest, expected: np.ndarray, head: Head,
                        memory: Columns) -> np.ndarray:
    """Which of the fitting rows can be in the ``head`` of the ranking, from their expected
    step time over the run (``expected``, :func:`_expected_s`: the number the ranking reads),
    their memory-tight flag (``memory["memory_tight"]``) and, for ``head.band_fastest``, their
    peak's share of the GPU (``memory["fraction"]``, :func:`_rows_up_to_band_fastest`).

    The ranking puts fitting rows inside the memory band's top before the memory-tight ones,
    each tier by ``E`` (then by memory and simplicity).  In the tier where the head's last row
    falls, of its ``k`` rows with the smallest ``E`` the largest is the tier's ``k``-th
    smallest and the smallest the tier's best, so ``U = max(largest, (1 + tolerance) *
    smallest)`` bounds both the head's rows and the ties (the ties are the tier of the best,
    the first tier with rows: they are the tier's rows with the smallest ``E``, moved to the
    top).  A row with ``E > U`` is no tie and ranks after at least ``k`` rows, so it cannot
    be in the head; every row with ``E <= U`` is kept, so rows of equal ``E`` are ordered by
    the ranking itself.  Tiers after it are not needed at all.  (A relative margin of 1e-9 on
    ``U`` covers the rounding of the ranking's tie ratio.)

    Where the ties fill the head and are not counted (``head.count_ties`` False) only the rows
    of the simplicity groups it reaches are kept (:func:`planner.first_ties.rows_for_first_ties`;
    ``memory["rows"]``: the rows' memory and layout columns)."""
    expected = np.asarray(expected, dtype=float)
    tight = np.asarray(memory["memory_tight"]).astype(bool)
    leads = np.zeros(len(expected), dtype=bool)
    left, ties = head.rows, max(head.tie_tolerance, 0.0)
    for level in (False, True):
        if left <= 0:
            break
        members = tight == level
        size = int(np.count_nonzero(members))
        if size > left:
            rows = np.flatnonzero(members)
            first = None if ties <= 0 or head.count_ties else rows_for_first_ties(
                rows, expected, left, ties, lambda at: simplicity_keys(memory["rows"].at(at),
                                                                       request.policy))
            if first is not None:
                members = np.zeros_like(members)
                members[first] = True
            else:
                times = expected[rows[np.argpartition(expected[rows], left - 1)[:left]]]
                bound = max(float(np.max(times)), (1 + ties) * float(np.min(times)))
                members &= ~(expected > bound * (1 + 1e-9))  # NaN bound: nothing is dropped
        leads |= members
        if size:
            ties = 0.0  # the ties are the first tier with rows
        left -= size
    if head.band_fastest:
        leads |= _rows_up_to_band_fastest(request, expected, tight,
                                          np.asarray(memory["fraction"]))
    return leads


def _rows_up_to_band_fastest(request: PlanRequest, expected: np.ndarray, tight: np.ndarray,
                             fraction: np.ndarray) -> np.ndarray:
    """Which of the fitting rows can be the fastest inside the memory band
    (:func:`planner.ranking.fastest_in_band`) or rank before it, from their expected step
    times (:func:`_rows_that_can_lead`).

    The band's pool (inside the band, else below its top, else every fitting row) depends on
    memory alone; its fastest has the pool's smallest ``E``, ``E_f``.  A row ranked before the
    fastest is in an earlier tier or in its tier with ``E <= E_f`` (the ties before it are
    such rows too), so a row of its tier with ``E > E_f`` is neither the fastest nor before
    it.  The pool lies in the first tier (not memory-tight) unless no row fits below the
    band's top; then every row of the first tier is kept."""
    policy = request.policy
    everything = np.ones(len(expected), dtype=bool)
    for pool in ((fraction >= policy.low) & (fraction <= policy.high),
                 fraction <= policy.high, everything):
        if pool.any():
            break
    else:
        return ~everything
    rows = np.flatnonzero(pool & np.isfinite(expected))
    if not len(rows):
        return everything
    bound = float(np.min(expected[rows]))
    within = ~(expected > bound * (1 + 1e-9))  # a NaN time keeps the row
    return (~tight | within) if (pool & tight).any() else (~tight & within)


def score_columns(request: PlanRequest, cols: Columns, actor: dict | None = None, *,
                  pick_utilization: bool, time_rows: "str | Head" = "all") -> Columns:
    """:func:`score_rows` as columns of every row."""
    return score_rows(request, cols, actor, pick_utilization=pick_utilization,
                      time_rows=time_rows).take()


def fill_columns(request: PlanRequest, cols: Columns, count: int) -> Columns:
    """What the memory band's headroom costs the first ``count`` rows: the same layout with
    the rollout pool grown as far as it would go were the GPU filled (:data:`FILL_POLICY`,
    never below the row's own pool), its KV-cache tokens, generation time
    (:func:`planner.cost.timing.generate_s`, expected over the run as the rows' own) and
    nvidia-smi peak.  Other rows hold NaN."""
    n = len(cols["tp"])
    names = ("gpu_memory_utilization_fill", "kv_cache_tokens_per_gpu_fill",
             "time_generate_s_fill", "peak_bytes_fill")
    out = {name: np.full(n, np.nan) for name in names}
    workload = request.workload
    if not workload.has_rollout or "time_generate_s" not in cols or count <= 0:
        return out
    few = {name: np.asarray(values)[:count] for name, values in cols.items()
           if np.asarray(values).ndim == 1}
    resident = few["mem_generate_bytes"] - few["rollout_budget_bytes"]
    filling = replace(request, policy=FILL_POLICY)
    picked = rollout_memory(filling, few, resident)["gpu_memory_utilization"]
    utilization = np.maximum(picked, few["gpu_memory_utilization"])
    filled = rollout_memory(request, few, resident, utilization)
    seconds = seconds_over_run(request, lambda at: generate_s(at, few, filled)["total_s"])[0]
    others = np.max([few[memory_column(phase)] for phase in TRAINING_PHASES
                     if phase in workload.phases], axis=0)
    for name, values in zip(names, (utilization, filled["kv_cache_tokens_per_gpu"], seconds,
                                    np.maximum(others, filled["mem_generate_bytes"]))):
        out[name][:count] = values
    return out


# the columns a plan keeps as indices into these names, and a frame as pandas Categoricals
NAMED_COLUMNS = (("recompute", RECOMPUTE), ("peak_phase", PHASES), ("dominant_phase", PHASES))


def _named(cols: Columns) -> dict[str, np.ndarray]:
    """The index columns of :data:`NAMED_COLUMNS` in ``cols`` as arrays of their names (NaN
    for -1, an untimed row's: a Categorical's missing value)."""
    named = {}
    for name, names in NAMED_COLUMNS:
        if name in cols:
            codes = np.asarray(cols[name]).astype(int)
            named[name] = np.where(codes >= 0, np.asarray(names, dtype=object)[codes], np.nan)
    return named


def _frame(cols: Columns) -> "pd.DataFrame":
    import pandas as pd

    columns = dict(cols)
    for name, names in NAMED_COLUMNS:
        if name in cols:
            columns[name] = pd.Categorical.from_codes(np.asarray(cols[name]).astype(int), names)
    columns["peak_memory_gib"] = np.asarray(cols["peak_bytes"]) / GIB
    return pd.DataFrame(columns, copy=False)


def search_options_for(request: PlanRequest) -> SearchOptions:
    """The request's search options for its workload: a workload without a rollout is a plain
    Megatron step (pretraining) -- no rollout, no reference model, no verl offload and no
    verl dynamic batches."""
    options = request.options
    if request.workload.has_rollout:
        return options
    return replace(options, offload=(False,), ref_param_offload=(False,),
                   optimizer_cpu_fraction=(0.0,), dynamic_batch=False,
                   fixed=options.fixed + tuple((name, 1) for name in ROLLOUT_FIELDS))


@dataclass(frozen=True)
class ActorEvaluation:
    """What a plan computes before its memory policy matters: the search space and the actor's
    memory per phase and stage (:func:`planner.cost.memory.actor_memory`, which reads neither
    the policy nor the rollout).  Plans of one request under other policies (the text table's
    filled-GPU plan) share it."""

    request: PlanRequest  # the request it was computed for (its policy aside)
    space: SearchSpace
    memory: dict
    # what its plans found that bounds another policy's plan ("steps": the last plan read at
    # its head, :class:`planner.step_bound.StepRecord`)
    records: dict = field(default_factory=dict, compare=False, repr=False)

    def serves(self, request: PlanRequest) -> bool:
        """Whether ``request`` has the same search space and actor memory: the same request
        but for the memory policy and the GPU type.  Neither the rules nor the actor's memory
        read the GPU beyond its NVLink domain (ETP's bound), so a sizing sweep's GPU types
        share it at one count."""
        mine, theirs = self.request.cluster, request.cluster
        if mine.fast_domain_gpus != theirs.fast_domain_gpus:
            return False
        same_gpu = replace(self.request, policy=request.policy,
                           cluster=replace(mine, gpu=theirs.gpu))
        return same_gpu == request


def evaluate_actors(request: PlanRequest) -> ActorEvaluation:
    """The request's search space and the memory of its actor layouts: per row, or held per
    core row and knob combination when more than :data:`HELD_ACTOR_ROWS` (computed again a
    chunk of rows at a time by each plan, :func:`planner.cost.memory.actor_memory`'s
    ``held``)."""
    space = build_space(request.model, request.cluster, request.workload,
                        search_options_for(request))
    held = len(space.columns["tp"]) > HELD_ACTOR_ROWS
    return ActorEvaluation(request, space, actor_memory(request, space.columns, reduced=True,
                                                        held=held))


@dataclass(frozen=True)
class PlanReads:
    """What the caller of :func:`make_plan` reads of the plan: only that is ranked, timed and
    priced.  The default reads everything (every layout ranked, the memory band's headroom
    priced, the ties counted)."""

    # put only the first ``keep`` ranked layouts in the frame (a caller that reads the best
    # alone), and time only the layouts that can be among them (:class:`Head`); the counts
    # (:attr:`Plan.fitting_count`) stay those of every layout.  None: every layout
    keep: int | None = None
    # (with ``keep``) what the text table reads -- the first ``keep`` rows, and up to the
    # fastest layout inside the memory band (:attr:`Plan.fastest_in_band`, its rank), with the
    # exact counts of ties (:attr:`Plan.ties`) and of layouts below the band's top
    # (:attr:`Plan.fitting_below_top`); only the layouts that can be among those rows are timed
    # at every point of the run
    table: bool = False
    # price the memory band's headroom (:func:`fill_columns`); False leaves those columns NaN
    # (a sizing sweep, which reads none of them)
    fill: bool = True
    # gather each column of the kept rows when first read (:class:`RankedColumns`), for a
    # caller that reads few of them (a sizing sweep)
    lazy: bool = False
    # False (with ``keep``): of the ties only those that can be among the first ``keep`` rows
    # are timed (:func:`planner.first_ties.rows_for_first_ties`), and :attr:`Plan.ties` is not
    # known (a caller that reads the best alone: ``--mode best``)
    count_ties: bool = True
    # False (with ``keep``, under a strict ranking): the counts of fitting layouts are not read
    # either (:attr:`Plan.fitting_count` is then not known), so a plan whose actor evaluation
    # holds a plan of its request under another policy scores only the layouts whose step
    # time that plan bounds within reach of the first rows (:func:`_bounded_head`)
    count_fits: bool = True
    # (with ``keep``) record on :attr:`Plan.actors` what bounds the step times of a plan of the
    # same request under another memory policy read by :meth:`first_rows` (the text table's,
    # which the filled-GPU plan follows): some 9 bytes a layout
    record: bool = False

    @classmethod
    def first_rows(cls, top: int) -> PlanReads:
        """A caller's that reads the first ``top`` layouts of a strict ranking alone (the text
        table's filled-GPU plan): no counts, no headroom priced."""
        return cls(keep=top, fill=False, count_fits=False)

    @classmethod
    def text_table(cls, top: int, filled_next: bool = True) -> PlanReads:
        """The text table's: its first ``top`` rows, its fastest layout in the band, counts;
        with ``filled_next`` (a filled-GPU plan follows it), what bounds that plan recorded."""
        return cls(keep=top, table=True, record=filled_next)

    @classmethod
    def best(cls, top: int) -> PlanReads:
        """``--mode best``'s: the first ``top`` ranked layouts, the ties beyond them neither
        timed nor counted."""
        return cls(keep=top, count_ties=False)

    @classmethod
    def sweep(cls) -> PlanReads:
        """A sizing sweep's: every layout, no fill columns, the columns gathered when read."""
        return cls(fill=False, lazy=True)


def make_plan(request: PlanRequest, tie_tolerance: float | None = None,
              actors: ActorEvaluation | None = None, reads: PlanReads = PlanReads()) -> Plan:
    """Rank every valid layout.  ``tie_tolerance``: the step-time ratio within which layouts
    are ties (None: the cost model's ranking uncertainty; 0: a strict ranking).  ``actors``:
    the request's :class:`ActorEvaluation` when already computed (by a plan of the same
    request under another memory policy, :attr:`Plan.actors`).  ``reads``: what the caller
    reads of the plan (:class:`PlanReads`; the default: everything)."""
    keep = reads.keep
    options = search_options_for(request)
    if actors is None or not actors.serves(request):
        actors = evaluate_actors(request)
    space = actors.space
    choice = rollout_choice(request, space.rollouts, options.gpu_memory_utilization,
                            actors.memory)
    actor, memory = choice.spread(space.columns), actors.memory
    tolerance = request.cost.uncertainty if tie_tolerance is None else tie_tolerance
    # a ranking read only at its head times only the fitting rows that can be in it
    head = keep is not None and not options.exhaustive
    table = reads.table and keep is not None
    tie = (tolerance, request.cost.uncertainty_source if tie_tolerance is None else "given")
    if head and not reads.count_fits and tolerance <= 0 and not table:
        # a strict head without counts: bounded by another policy's plan where one was made
        bounded = _bounded_head(request, actor, actors, choice, keep)
        if bounded is not None:
            return _bounded_plan(request, actors, bounded, reads, tie)
    # without counting ties, a moving length's head times only its first ties (Head)
    counted = reads.count_ties or table or not (head and request.workload.moving_lengths)
    rows = score_rows(request, actor, memory,
                      pick_utilization=options.gpu_memory_utilization is None,
                      time_rows=Head(keep, tolerance, table, counted, reads.record)
                      if head else "fitting")
    if rows.record is not None:  # what bounds a plan of this request under another policy
        actors.records["steps"] = StepRecord(request, choice.chosen, *rows.record)
    # the ranking reads one time column: the step time
    scored = {**rows.untimed, "step_time_s": rows.column("step_time_s")}
    fitting = int(np.count_nonzero(scored["fits"]))
    totals = {}
    if table:
        order, tied = _table_order(scored, min(keep, fitting + KEEP_NOT_FITTING), tolerance,
                                   request.policy)
        fraction = scored["memory_utilization"][scored["fits"].astype(bool)]
        totals = {"tie_total": int(np.count_nonzero(tied)), "below_top_total": int(
            np.count_nonzero(fraction <= request.policy.high + 1e-9))}
        keep = len(order)
    elif keep is not None and tolerance <= 0:
        # a strict ranking read only at its head: the first rows without sorting them all
        order = first_in_order(scored, keep)
        tied = np.zeros(len(scored["tp"]), dtype=bool)
    else:
        # of the layouts that do not fit, only as many as the frame keeps are sorted (of
        # those that do, without counting the ties, only the first ``keep`` of the strict
        # ranking: the ties timed are the first rows, or every tie)
        order, tied = tie_order(scored, tolerance, request.policy,
                                misses=KEEP_NOT_FITTING if keep is None else keep,
                                first=None if counted else keep)
        if keep is not None and counted:
            # the frame keeps the first ``keep`` rows; the tie count stays every layout's
            # (``--write --rank`` after ``--mode best`` keeps RANKS_KEPT rows of a plan with
            # more ties than that)
            totals = {"tie_total": int(np.count_nonzero(tied))}
    # Every fitting layout, and of the rest only the closest misses (the frame of DeepSeek-V3 on
    # 1,024 GPUs would otherwise hold millions of rows that no command shows).
    order = order[:fitting + KEEP_NOT_FITTING if keep is None else keep]
    extra = {"within_error_of_best": tied[order], "rank": np.arange(1, len(order) + 1)}
    ranked = RankedColumns(rows, order, extra) if reads.lazy else {**rows.take(order), **extra}
    filled = fill_columns(request, ranked, min(fitting, FILL_ROWS) if reads.fill else 0)
    (extra if reads.lazy else ranked).update(filled)
    return Plan(request=request, columns=ranked, actors=actors, enumerated=space.enumerated,
                valid=space.valid, rejected=space.rejected, scored=len(scored["tp"]),
                merged=space.merged, fit_total=None if keep is None else fitting, **totals,
                ties_counted=counted, tie_tolerance=tie[0], tie_source=tie[1])


BOUND_SEEDS = 64  # rows of the smallest bounds scored first for a bounded head's incumbent
# a bounded head scores at most this many rows (more: the plan scores every row instead)
BOUND_MAX_ROWS = SCORE_CHUNK_ROWS // 4


def _bounded_head(request: PlanRequest, cols: Columns, actors: ActorEvaluation,
                  choice: RolloutChoice, keep: int) -> tuple[np.ndarray, ScoredRows] | None:
    """The first ``keep`` rows of the strict ranking (:func:`planner.ranking.first_in_order`)
    of ``cols`` (the actor layouts with ``choice``, their rollout under ``request``'s policy),
    found from the lower bounds :mod:`planner.step_bound` gives their expected step times from
    a plan of the same request under another policy (``actors.records``), and their
    :class:`ScoredRows` (timed at those rows).  None: no such plan, or the bound does not
    narrow the rows enough (the caller scores every row).

    The rows that may fit and have the smallest bounds are scored exactly first; the
    ``keep``-th smallest expected step time ``U`` of those that fit inside the band's top (not
    memory-tight) bounds the head: each of its rows fits, is not memory-tight and has ``E <=
    U``, so its bound is at most ``U``.  Every row that may fit with a bound at most ``U``, or
    none (the other plan did not time it), is then scored exactly and ranked by the same
    keys, in row order: the same first rows as every row scored."""
    record = actors.records.get("steps")
    if (record is None or not request.workload.has_rollout
            or replace(record.request, policy=request.policy) != request
            or len(record.rest_s) != len(choice.inverse)):
        return None
    bound, may_fit = row_bounds(record, request, choice)
    rows = np.flatnonzero(may_fit)
    bounds = bound[rows]
    known = ~np.isnan(bounds)
    unknown = rows[~known]
    seeds = rows[known]
    if len(seeds) > BOUND_SEEDS:
        seeds = seeds[np.argpartition(bounds[known], BOUND_SEEDS - 1)[:BOUND_SEEDS]]
    n = len(choice.inverse)
    first = _scored_at(request, cols, actors.memory, _rows_in(n, seeds, unknown))
    if first is None:
        return None
    lead = first["step_time_s"][first["fits"] & ~first["tight"]]
    if len(lead) < keep:
        return None
    limit = np.partition(lead, keep - 1)[keep - 1]
    scored = _scored_at(request, cols, actors.memory,
                        _rows_in(n, rows[~(bounds > limit)], first["rows"]))
    if scored is None:
        return None
    index = scored["rows"]
    order = index[first_in_order({"fits": scored["fits"], "step_time_s": scored["step_time_s"],
                                  "peak_bytes": scored["peak_bytes"],
                                  flag_column("memory_tight"): scored["tight"]}, keep)]
    timed = np.zeros(n, dtype=bool)
    timed[index[scored["fits"]]] = True
    expected = scored["step_time_s"][scored["fits"]]  # in row order, as ``timed``
    pick = request.options.gpu_memory_utilization is None

    def rows_at(at: np.ndarray) -> Mapping:
        return _columns_at(request, cols, actors.memory, at, pick)

    return order, _rows_timed_at(request, cols, scored["names"], rows_at, (timed, expected))


def _rows_in(n: int, *parts: np.ndarray) -> np.ndarray:
    """The rows (of ``n``) in any of ``parts``, ascending (``np.union1d`` without its sort,
    nor the masked-array module it imports)."""
    mask = np.zeros(n, dtype=bool)
    for part in parts:
        mask[part] = True
    return np.flatnonzero(mask)


def _scored_at(request: PlanRequest, cols: Columns, actor: dict, rows: np.ndarray
               ) -> dict | None:
    """The ranking's columns of ``rows`` (ascending) scored exactly: fits, memory-tight,
    peak and expected step time (NaN where the row does not fit), and the memory columns'
    names; None: more than :data:`BOUND_MAX_ROWS`."""
    if len(rows) > BOUND_MAX_ROWS:
        return None
    out = _columns_at(request, cols, actor, rows,
                      request.options.gpu_memory_utilization is None)
    fits = np.asarray(out["fits"]).astype(bool)
    step = np.full(len(rows), np.nan)
    fitting = np.flatnonzero(fits)
    if len(fitting):
        step[fitting] = _expected_s(request, out.at(fitting))
    return {"rows": rows, "fits": fits, "step_time_s": step,
            "tight": np.asarray(out[flag_column("memory_tight")]).astype(bool),
            "peak_bytes": np.asarray(out["peak_bytes"]), "names": _memory_names(out, cols)}


def _bounded_plan(request: PlanRequest, actors: ActorEvaluation,
                  bounded: tuple[np.ndarray, ScoredRows], reads: PlanReads,
                  tie: tuple[float, str]) -> Plan:
    """The plan of a bounded head (:func:`_bounded_head`: its rows in rank order and their
    scored rows), kept as :func:`make_plan` keeps a strict head's; the counts not known."""
    order, rows = bounded
    space = actors.space
    extra = {"within_error_of_best": np.zeros(len(order), dtype=bool),
             "rank": np.arange(1, len(order) + 1)}
    ranked = RankedColumns(rows, order, extra) if reads.lazy else {**rows.take(order), **extra}
    fitting = int(np.count_nonzero(np.asarray(ranked["fits"])))
    filled = fill_columns(request, ranked, min(fitting, FILL_ROWS) if reads.fill else 0)
    (extra if reads.lazy else ranked).update(filled)
    return Plan(request=request, columns=ranked, actors=actors, enumerated=space.enumerated,
                valid=space.valid, rejected=space.rejected, scored=len(space.columns["tp"]),
                merged=space.merged, fits_counted=False, bounded=True,
                tie_tolerance=tie[0], tie_source=tie[1])


def _table_order(scored: Columns, keep: int, tolerance: float,
                 policy) -> tuple[np.ndarray, np.ndarray]:
    """The first rows of :func:`planner.ranking.tie_order` that the text table reads: the
    first ``keep``, and up to the fastest layout inside the memory band (its rank), without
    sorting every row; and the mask of every tie.  The ties are the first rows of the strict
    ranking (the best's tier's fastest), so counting them needs its best row alone; the
    fastest's position (any of the rows as fast as it in the band's pool: the first of them
    in the ranking is the one shown) is that of the ties, or the count of rows ranked before
    it (:func:`planner.ranking.rows_before`)."""
    tied = tied_with_best(scored, first_in_order(scored, 1), tolerance)
    count = max(keep, int(np.count_nonzero(tied)))
    pool = band_pool(scored, policy)
    fastest = None
    if pool is not None:
        step = np.asarray(scored["step_time_s"], dtype=float)
        fastest = pool & (step == np.min(step[pool]))
        candidates = np.flatnonzero(fastest)
        last = candidates[np.lexsort((candidates, scored["peak_bytes"][candidates],
                                      scored[flag_column("memory_tight")][candidates]))[-1]]
        count = max(count, rows_before(scored, int(last)) + 1)
    order, tied = tie_order(scored, tolerance, policy, first=count)
    shown = keep
    if fastest is not None:
        shown = max(keep, int(np.flatnonzero(fastest[order])[0]) + 1)
    return order[:shown], tied


@dataclass
class Estimate(OfRequest):
    request: PlanRequest
    layout: Layout
    row: dict  # every cost-model column for this layout (the raw columns; see ``candidate``)

    @cached_property
    def candidate(self) -> ColocatedCandidate:
        """The layout's prediction, typed: on every GPU of the request's cluster."""
        return ColocatedCandidate.from_row(self.row, Placement.shared(self.cluster),
                                           phases=self.workload.phases)

    @property
    def rollout_without_room(self) -> bool:
        """``gpu_memory_utilization`` was picked and none leaves vLLM room for its weights and
        workspace beside the trainer's state: the pool sits at the picker's floor with no KV
        cache, a number scored but not a setting to use."""
        return (self.workload.has_rollout and self.request.options.gpu_memory_utilization is None
                and self.candidate.rollout.kv_cache_tokens_per_gpu == 0)

    def rollout_text(self) -> str:
        """The rollout layout as printed; a picked utilization without room is named so."""
        if not self.rollout_without_room:
            return self.layout.rollout_text()
        return self.layout.rollout_text(
            f"with no gpu_memory_utilization that leaves room (scored at the floor, "
            f"{self.layout.gpu_memory_utilization:.2f})")

    @cached_property
    def pipeline_starvation(self) -> PipelineStarvation | None:
        """Fewer micro-batches per optimizer step than pipeline stages (the
        ``pipeline_starved`` flag), with the numbers; None where the pipeline is fed."""
        return pipeline_starvation(self.workload, self.layout.to_dict())


def with_chosen_rollout(request: PlanRequest, cols: Columns,
                        utilization: float | None) -> Columns:
    """One actor layout with the rollout layout and ``gpu_memory_utilization`` a plan would
    give it (:func:`choose_rollout` over every rollout option vLLM and verl accept)."""
    model, cluster = request.model, request.cluster
    rollouts, _ = valid_rollouts(model, cluster, request.workload,
                                 rollout_options(model, cluster, SearchOptions()))
    chosen, _ = choose_rollout(request, cols, rollouts, utilization)
    return chosen


def estimate_layout(request: PlanRequest, layout: Layout, pick_utilization: bool = False,
                    choose_rollout_layout: bool = False) -> Estimate:
    """Score one layout; raises :class:`InvalidLayoutError` listing every broken rule.

    ``choose_rollout_layout``: replace the layout's rollout TP/DP/EP (and, with
    ``pick_utilization``, its ``gpu_memory_utilization``) by the plan's choice for this actor
    layout."""
    broken = explain(request.model, request.cluster, request.workload, layout.to_dict())
    if broken:
        raise InvalidLayoutError(broken)
    cols = layout.to_columns()
    if choose_rollout_layout and request.workload.has_rollout:
        cols = with_chosen_rollout(request, cols,
                                   None if pick_utilization else layout.gpu_memory_utilization)
        pick_utilization = False  # the choice picked it, as a plan does
    scored = score_columns(request, cols, pick_utilization=pick_utilization)
    scored.update(fill_columns(request, scored, 1))
    row = {name: values[0].item() if hasattr(values[0], "item") else values[0]
           for name, values in scored.items()}
    return Estimate(request=request, layout=Layout.from_row(row), row=row)
