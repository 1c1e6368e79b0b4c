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
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import numpy as np

from planner.cost.columns import memory_column, time_column
from planner.phases import PHASES
from planner.plan import Plan
from planner.search.layout import Layout
from planner.units import GIB

if TYPE_CHECKING:
    import pandas as pd

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
    if field == "recompute":
        return str(value)
    if field.endswith("offload"):
        return bool(value)
    if field == "gpu_memory_utilization":
        return round(float(value), 2)
    return int(value)


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


@dataclass(frozen=True)
class Candidate:
    index: int  # position in the set (predicted best first)
    key: str
    rank: int  # the plan's rank (what `plan-parallel ... --write --rank` takes)
    layout: Layout
    params: Mapping[str, Any]  # SEARCH_FIELDS values
    predicted: Mapping[str, Any]  # tokens/s/GPU, step time, peak and per-phase memory and time


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


class CandidateSet:
    """Ranked candidate layouts with vectorised look-ups (membership, margins, nearest)."""

    def __init__(self, frame: "pd.DataFrame", capacity_bytes: float):

        frame = frame.drop_duplicates(subset=list(SEARCH_FIELDS)).reset_index(drop=True)
        self.capacity_bytes = float(capacity_bytes)
        self.rows = frame
        records = frame.to_dict("records")
        self.candidates: list[Candidate] = []
        for index, row in enumerate(records):
            params = {field: normalise(field, row[field]) for field in SEARCH_FIELDS}
            self.candidates.append(Candidate(
                index=index, key=layout_key(params), rank=int(row["rank"]),
                layout=Layout.from_row(row), params=params, predicted=_predicted(row)))
        self.index = {candidate.key: candidate.index for candidate in self.candidates}
        self.choices = {field: tuple(sorted({c.params[field] for c in self.candidates},
                                            key=lambda value: (str(type(value)), value)))
                        for field in SEARCH_FIELDS}
        self.codes = np.array([[self.choices[field].index(c.params[field])
                                for field in SEARCH_FIELDS] for c in self.candidates],
                              dtype=np.int64).reshape(len(self.candidates), len(SEARCH_FIELDS))
        self.memory = frame[[memory_column(phase) for phase in PHASES]].to_numpy(dtype=float)

    @classmethod
    def from_plan(cls, plan: "Plan", memory_margin: float = 0.0,
                  limit: int | None = None) -> "CandidateSet":
        """The plan's layouts predicted to fit with ``memory_margin`` to spare (0.1: 10%),
        best predicted first, at most ``limit``."""
        frame = plan.candidates
        capacity = float(plan.cluster.gpu.memory_bytes)
        keep = frame["fits"].astype(bool) & (frame["peak_bytes"] * (1 + memory_margin)
                                             <= capacity)
        frame = frame[keep]
        if limit:
            frame = frame.head(limit)
        return cls(frame, capacity)

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
            key = layout_key(params)
        except (KeyError, TypeError, ValueError):
            return None
        return key if key in self.index else None

    def fingerprint(self) -> str:
        digest = hashlib.sha256("\n".join(c.key for c in self.candidates).encode())
        return digest.hexdigest()[:16]

    def distributions(self) -> dict:
        """One Optuna categorical distribution per search field."""
        from optuna.distributions import CategoricalDistribution

        return {field: CategoricalDistribution(self.choices[field]) for field in SEARCH_FIELDS}

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
        codes = np.array([self.choices[field].index(normalise(field, params[field]))
                          if normalise(field, params[field]) in self.choices[field] else -1
                          for field in SEARCH_FIELDS])
        distance = (self.codes != codes).sum(axis=1).astype(float)
        distance[~mask] = np.inf
        return int(np.argmin(distance))  # ties: the lowest index, i.e. the best predicted


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
