"""The layouts a study may run: the cost model's candidates that are predicted to fit.

A study's search space is a fixed, ranked set of layouts taken from the plan (best predicted
first), each identified by the values of :data:`SEARCH_FIELDS` — one Optuna categorical
parameter per field, so samplers see the structure (TP 2 did well, try other TP 2 layouts)
while only whole candidate layouts are ever run.  The set is deterministic for a given model,
cluster, workload and planner version; its fingerprint is stored with the study so a resumed
study is known to search the same space.

Memory safety margins: a layout is allowed while, for every GRPO phase, its predicted memory
times ``1 + margin[phase]`` stays within the GPU.  The margins start at ``--memory-margin`` and
each measured OOM raises its phase's margin -- by a bounded step, and never past what the OOM's
own figures support (:func:`memory_margins`): one OOM on a real cluster is common and must not
empty the study.  After an OOM the study next tries the nearest layout that relieves the
failing phase (:meth:`CandidateSet.relief`: a smaller micro-batch, more TP/PP, recompute, ...).

Training modes (``tune --mode``, :mod:`planner.placement`): an asynchronous study's candidates
are its mode plan's splits -- one per trainer-pool size, each with the trainer pool's actor
layout and the rollout pool's engine layout -- and the study's parameters add the split
(``trainer_gpus``) and, for fully-async, ``async_training.staleness_threshold`` from
:data:`~planner.modes.fully_async.STALENESS_GRID` (each value its own candidate, predicted with
that threshold);
``--mode best`` adds ``mode`` and searches the candidates of all three modes in one study
(sync's ``trainer_gpus`` is the whole cluster, colocated; sync and one-step-off have no
staleness threshold and carry 0).  The plan keeps one peak per pool, so an asynchronous
candidate's per-phase memory is its pool's peak: the trainer pool's for the training phases,
the rollout pool's for ``generate`` less its KV cache -- vLLM sizes the KV cache to what its
``gpu_memory_utilization`` leaves, so a margin can only protect the rest (a standalone engine
at 0.90 would otherwise fail any margin above ~9%).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import numpy as np

from planner.cost.columns import memory_column, time_column
from planner.modes import BEST, all_modes, get_mode, mode_choices
from planner.modes.fully_async import STALENESS_GRID
from planner.output import gib, placement_json, study_prediction_json
from planner.phases import PHASES
from planner.plan import Plan
from planner.results import COLOCATED_MODE
from planner.search.layout import Layout
from planner.units import GIB

if TYPE_CHECKING:
    import pandas as pd

    from planner.placement import ModePlan

# The fields that identify a layout (dp and the stage split follow from them and the plan).
SEARCH_FIELDS = ("tp", "pp", "vpp", "cp", "ep", "etp", "micro_batch", "recompute",
                 "param_offload", "optimizer_offload", "ref_param_offload", "rollout_tp",
                 "rollout_dp", "rollout_ep", "gpu_memory_utilization")
OOM_MARGIN_STEP = 0.02  # beyond the failed layout's own ratio, so it is excluded too
# One OOM raises its phase's margin by at most this (a fraction of the predicted memory); the
# next OOM in that phase raises it again.  The failed layout itself never runs again anyway
# (it is measured), so the margin only has to steer away from layouts just as large.
MAX_OOM_MARGIN_RISE = 0.10


def normalise(field: str, value: Any) -> Any:
    """One field's value as Optuna stores it: int, bool, str, or a 2-decimal float."""
    if hasattr(value, "item"):
        value = value.item()
    if field in ("recompute", "mode"):
        return str(value)
    if field.endswith("offload"):
        return bool(value)
    if field in ("gpu_memory_utilization", "staleness_threshold"):
        return round(float(value), 2)
    return int(value)


def study_fields(mode: str) -> tuple[str, ...]:
    """The parameters of a study of ``mode`` (a registered mode, or ``best``): the layout's and
    what the mode adds (:attr:`~planner.modes.TrainingMode.study_fields`; a sync study adds
    none, so it is what it was before modes existed); ``best`` adds ``mode`` and every mode's."""
    if mode == BEST:
        added = dict.fromkeys(name for m in all_modes() for name in m.study_fields)
        return (*SEARCH_FIELDS, "mode", *added)
    return (*SEARCH_FIELDS, *get_mode(mode).study_fields)


def layout_key(values: Mapping[str, Any]) -> str:
    """A layout's short, stable name, e.g.
    ``tp2-pp1-vpp1-cp1-ep1-etp1-mb4-none-off000-r2x1x1-u0.45``."""
    v = {field: normalise(field, values[field]) for field in SEARCH_FIELDS}
    offload = "".join(str(int(v[name])) for name in ("param_offload", "optimizer_offload",
                                                      "ref_param_offload"))
    return (f"tp{v['tp']}-pp{v['pp']}-vpp{v['vpp']}-cp{v['cp']}-ep{v['ep']}-etp{v['etp']}"
            f"-mb{v['micro_batch']}-{v['recompute']}-off{offload}"
            f"-r{v['rollout_tp']}x{v['rollout_dp']}x{v['rollout_ep']}"
            f"-u{v['gpu_memory_utilization']:.2f}")


def candidate_key(values: Mapping[str, Any], fields: Sequence[str] = SEARCH_FIELDS) -> str:
    """A candidate's key in a study searching ``fields``: :func:`layout_key`, after the mode
    parameters the study searches, e.g. ``fully-async-t2-s0.10-tp1-...``."""
    parts = []
    if "mode" in fields:
        parts.append(normalise("mode", values["mode"]))
    if "trainer_gpus" in fields:
        parts.append(f"t{normalise('trainer_gpus', values['trainer_gpus'])}")
    if "staleness_threshold" in fields:
        parts.append(f"s{normalise('staleness_threshold', values['staleness_threshold']):.2f}")
    return "-".join([*parts, layout_key(values)])


@dataclass(frozen=True)
class Candidate:
    index: int  # position in the set (predicted best first)
    key: str
    rank: int  # the plan's rank (what `plan-parallel ... --write --rank` takes)
    layout: Layout
    params: Mapping[str, Any]  # the study's field values (study_fields)
    predicted: Mapping[str, Any]  # tokens/s/GPU, step time, peak and per-phase memory and time
    mode: str = COLOCATED_MODE
    # mode, trainer_gpus, rollout_gpus, colocated, staleness_threshold ({} in a sync study)
    placement: Mapping[str, Any] = field(default_factory=dict)
    # the Plan (sync) or ModePlan (asynchronous) ``rank`` refers to, for the job's export
    plan: Any = field(default=None, compare=False, repr=False)


def _predicted(row: Mapping[str, Any]) -> dict:
    out = {"tokens_per_s_per_gpu": float(row["tokens_per_s_per_gpu"]),
           "step_time_s": float(row["step_time_s"]),
           "peak_gib": float(row["peak_bytes"]) / GIB,
           "peak_phase": str(row["peak_phase"]),
           "mfu": float(row["mfu"]) if "mfu" in row else None,
           "memory_gib": {phase: float(row[memory_column(phase)]) / GIB for phase in PHASES},
           "time_s": {phase: float(row[time_column(phase)]) for phase in PHASES
                      if time_column(phase) in row}}
    return out


def _fitting_rows(plan: "Plan", memory_margin: float, limit: int | None) -> "pd.DataFrame":
    frame = plan.candidates
    capacity = float(plan.cluster.gpu.memory_bytes)
    keep = frame["fits"].astype(bool) & (frame["peak_bytes"] * (1 + memory_margin) <= capacity)
    frame = frame[keep]
    return frame.head(limit) if limit else frame


def _reindexed(candidate: Candidate, index: int) -> Candidate:
    return replace(candidate, index=index)


def _split_candidates(plan: "ModePlan", memory_margin: float,
                      fields: Sequence[str]) -> list[tuple[Candidate, np.ndarray]]:
    """A split mode plan's fitting splits as candidates (``rank``: the split's rank in ``plan``
    among those that fit, what :meth:`planner.modes.TrainingMode.job` takes).  Per-phase memory
    is the pool's peak (see the module docstring)."""
    capacity = float(plan.cluster.gpu.memory_bytes)
    mode = get_mode(plan.mode, plan.async_options)
    out = []
    for rank, split in enumerate(plan.fitting, start=1):
        trainer_gib = gib(split.trainer_pool.peak_bytes)
        rollout_sized_gib = (gib(split.rollout_pool.peak_bytes)
                             - gib(split.rollout_pool.kv_cache_bytes))
        memory = np.array([(rollout_sized_gib if phase == "generate" else trainer_gib) * GIB
                           for phase in PHASES])
        if memory.max() * (1 + memory_margin) > capacity:
            continue
        layout = split.layout
        placement = {"mode": plan.mode, **placement_json(split.placement),
                     **{name: value for name, value in mode.study_values(split).items()
                        if name != "trainer_gpus"}}
        params = {name: normalise(name, {**layout.to_dict(), **placement}[name])
                  for name in fields}
        out.append((Candidate(index=0, key=candidate_key(params, fields), rank=rank,
                              layout=layout, params=params,
                              predicted=study_prediction_json(split), mode=plan.mode,
                              placement=placement, plan=plan), memory))
    return out


class CandidateSet:
    """Ranked candidate layouts with vectorised look-ups (membership, margins, nearest).

    ``fields``: the study's parameters (:func:`study_fields`); ``memory_bytes``: one row per
    candidate, one column per phase of :data:`~planner.phases.PHASES`."""

    def __init__(self, candidates: Sequence[Candidate], memory_bytes: np.ndarray,
                 capacity_bytes: float, fields: Sequence[str] = SEARCH_FIELDS):
        self.fields = tuple(fields)
        self.capacity_bytes = float(capacity_bytes)
        self.candidates: list[Candidate] = list(candidates)
        self.index = {candidate.key: candidate.index for candidate in self.candidates}
        self.choices = {name: tuple(sorted({c.params[name] for c in self.candidates},
                                           key=lambda value: (str(type(value)), value)))
                        for name in self.fields}
        self.codes = np.array([[self.choices[name].index(c.params[name])
                                for name in self.fields] for c in self.candidates],
                              dtype=np.int64).reshape(len(self.candidates), len(self.fields))
        self.memory = np.asarray(memory_bytes, dtype=float).reshape(len(self.candidates),
                                                                    len(PHASES))

    @classmethod
    def from_frame(cls, frame: "pd.DataFrame", capacity_bytes: float, plan: Any = None,
                   extra: Mapping[str, Any] | None = None,
                   fields: Sequence[str] = SEARCH_FIELDS) -> "CandidateSet":
        """Candidates from a plan's candidate frame (best first); ``extra``: the mode field
        values every row shares (a sync plan's in a ``--mode best`` study)."""
        frame = frame.drop_duplicates(subset=list(SEARCH_FIELDS)).reset_index(drop=True)
        extra = dict(extra or {})
        placement = {key: extra[key] for key in ("mode", "trainer_gpus", "rollout_gpus",
                                                 "colocated", "staleness_threshold")
                     if key in extra}
        candidates = []
        for index, row in enumerate(frame.to_dict("records")):
            params = {name: normalise(name, {**row, **extra}[name]) for name in fields}
            candidates.append(Candidate(
                index=index, key=candidate_key(params, fields), rank=int(row["rank"]),
                layout=Layout.from_row(row), params=params, predicted=_predicted(row),
                mode=str(extra.get("mode", COLOCATED_MODE)), placement=placement, plan=plan))
        memory = frame[[memory_column(phase) for phase in PHASES]].to_numpy(dtype=float)
        return cls(candidates, memory, capacity_bytes, fields)

    @classmethod
    def from_plan(cls, plan: "Plan", memory_margin: float = 0.0,
                  limit: int | None = None) -> "CandidateSet":
        """The plan's layouts predicted to fit with ``memory_margin`` to spare (0.1: 10%),
        best predicted first, at most ``limit``."""
        capacity = float(plan.cluster.gpu.memory_bytes)
        return cls.from_frame(_fitting_rows(plan, memory_margin, limit), capacity, plan=plan)

    @classmethod
    def from_modes(cls, plans: Sequence["ModePlan"], memory_margin: float = 0.0,
                   limit: int | None = None, mode: str | None = None) -> "CandidateSet":
        """The candidates of the training modes' plans (``plans``: a sync plan and/or one
        asynchronous plan per staleness threshold), predicted to fit with ``memory_margin`` to
        spare, the highest predicted tokens/s/GPU first (ties: in the order given); ``limit``
        caps the sync plan's layouts (the asynchronous plans have one candidate per split).
        ``mode``: the study's mode (its fields, :func:`study_fields`); default: the one mode of
        ``plans``, or ``best`` when they differ."""
        modes = {plan.mode for plan in plans}
        mode = mode or (modes.pop() if len(modes) == 1 else "best")
        fields = study_fields(mode)
        parts: list[tuple[Candidate, np.ndarray]] = []
        for plan in plans:
            if plan.sync_plan is not None:  # a colocated mode: its plan of layouts
                n = plan.cluster.num_gpus
                synced = cls.from_frame(
                    _fitting_rows(plan.sync_plan, memory_margin, limit),
                    plan.cluster.gpu.memory_bytes, plan=plan.sync_plan, fields=fields,
                    extra={"mode": plan.mode, "trainer_gpus": n, "rollout_gpus": n,
                           "colocated": True, "staleness_threshold": 0.0})
                parts += list(zip(synced.candidates, synced.memory))
            else:
                parts += _split_candidates(plan, memory_margin, fields)
        order = sorted(range(len(parts)),
                       key=lambda i: -float(parts[i][0].predicted["tokens_per_s_per_gpu"]))
        candidates, memory, seen = [], [], set()
        for i in order:
            candidate, row = parts[i]
            if candidate.key in seen:
                continue
            seen.add(candidate.key)
            candidates.append(_reindexed(candidate, len(candidates)))
            memory.append(row)
        capacity = float(plans[0].cluster.gpu.memory_bytes) if plans else 0.0
        return cls(candidates, np.array(memory, dtype=float).reshape(len(memory), len(PHASES)),
                   capacity, fields)

    def __len__(self) -> int:
        return len(self.candidates)

    def __getitem__(self, index: int) -> Candidate:
        return self.candidates[index]

    def get(self, key: str) -> Candidate | None:
        index = self.index.get(key)
        return None if index is None else self.candidates[index]

    def key_of(self, params: Mapping[str, Any]) -> str | None:
        """The key of the candidate with these parameter values, None if there is none."""
        try:
            key = candidate_key(params, self.fields)
        except (KeyError, TypeError, ValueError):
            return None
        return key if key in self.index else None

    def fingerprint(self) -> str:
        digest = hashlib.sha256("\n".join(c.key for c in self.candidates).encode())
        return digest.hexdigest()[:16]

    def distributions(self) -> dict:
        """One Optuna categorical distribution per field of the study."""
        from optuna.distributions import CategoricalDistribution

        return {name: CategoricalDistribution(self.choices[name]) for name in self.fields}

    def allowed(self, blocked: Iterable[str], margins: Mapping[str, float]) -> np.ndarray:
        """Mask of candidates that are not ``blocked`` and fit with the phase ``margins``."""
        mask = np.ones(len(self), dtype=bool)
        for key in blocked:
            index = self.index.get(key)
            if index is not None:
                mask[index] = False
        factors = np.array([1.0 + margins.get(phase, 0.0) for phase in PHASES])
        mask &= (self.memory * factors <= self.capacity_bytes).all(axis=1)
        return mask

    def fits_margins(self, key: str, margins: Mapping[str, float]) -> bool:
        index = self.index[key]
        return bool(all(self.memory[index, i] * (1.0 + margins.get(phase, 0.0))
                        <= self.capacity_bytes for i, phase in enumerate(PHASES)))

    def relief(self, failed: str, phase: str, mask: np.ndarray,
               need_ratio: float | None = None, max_distance: int = 3) -> int | None:
        """The candidate to try after ``failed`` ran out of memory in ``phase``: allowed by
        ``mask``, predicted to need less in that phase -- with ``need_ratio`` (measured need /
        GPU memory, from the OOM message) less by that ratio, so it would fit even if the model
        underestimates it as much as it did the failed layout, where such a candidate exists --
        and differing from ``failed`` in the fewest fields (at most ``max_distance``), the best
        predicted among equals.  None when no candidate relieves the phase."""
        index = self.index.get(failed)
        if index is None or phase not in PHASES:
            return None
        column = PHASES.index(phase)
        failed_bytes = self.memory[index, column]
        distance = (self.codes != self.codes[index]).sum(axis=1)
        usable = mask & (distance <= max_distance) & (self.memory[:, column] < failed_bytes)
        if need_ratio and need_ratio > 1:
            strict = usable & (self.memory[:, column] * need_ratio <= failed_bytes)
            usable = strict if strict.any() else usable
        if not usable.any():
            return None
        order = np.lexsort((np.arange(len(self)), np.where(usable, distance, 10 ** 6)))
        return int(order[0])

    def nearest(self, params: Mapping[str, Any], mask: np.ndarray) -> int | None:
        """The allowed candidate differing from ``params`` in the fewest fields (the best
        predicted among equals); None when nothing is allowed."""
        if not mask.any():
            return None
        codes = np.array([self.choices[name].index(normalise(name, params[name]))
                          if normalise(name, params[name]) in self.choices[name] else -1
                          for name in self.fields])
        distance = (self.codes != codes).sum(axis=1).astype(float)
        distance[~mask] = np.inf
        return int(np.argmin(distance))  # ties: the lowest index, i.e. the best predicted


def mode_plans(request, mode: str, async_options=None,
               staleness_grid: Sequence[float] = STALENESS_GRID) -> list["ModePlan"]:
    """The plans a study of ``mode`` draws its candidates from: the mode's (``best``: every
    mode's), once per variant it tunes (fully-async: per ``staleness_grid`` value), the pool
    searches shared.  ``async_options``: the splits to try and partial rollout (the staleness
    is the grid's)."""
    from planner.placement import AsyncOptions

    if mode not in mode_choices():
        raise ValueError(mode)
    settings = async_options or AsyncOptions()
    modes = all_modes(settings) if mode == BEST else [get_mode(mode, settings)]
    cache: dict = {}
    return [variant.plan(request, cache=cache)
            for each in modes for variant in each.study_variants(staleness_grid)]


def memory_margins(ooms: Iterable[tuple], capacity_bytes: float,
                   base: float = 0.0) -> dict[str, float]:
    """Per-phase safety margins after the measured OOMs ``(phase, predicted bytes in that
    phase[, number, need_ratio])``, in the order they happened: at least ``base``; each OOM
    raises its phase's margin towards the value that excludes the failed layout
    (``m * (1 + margin) > capacity``, plus :data:`OOM_MARGIN_STEP`), but

    * never past what the OOM's own figures support: ``need_ratio`` = (GPU total - free +
      requested) / GPU total says the layout needed at least that share of the GPU, i.e. at
      least ``need_ratio * capacity`` bytes where ``m`` were predicted;
    * by at most :data:`MAX_OOM_MARGIN_RISE` per OOM.
    """
    margins = {phase: base for phase in PHASES}
    for oom in ooms:
        phase, predicted = oom[0], oom[1]
        need_ratio = oom[3] if len(oom) > 3 else None
        if phase not in margins or not predicted or predicted <= 0:
            continue
        target = capacity_bytes / predicted - 1.0 + OOM_MARGIN_STEP
        if need_ratio and need_ratio > 0:
            target = min(target, need_ratio * capacity_bytes / predicted - 1.0)
        current = margins[phase]
        margins[phase] = max(current, min(target, current + MAX_OOM_MARGIN_RISE))
    return margins
