"""What a study's storage says right now, read the same way by every tuner process.

Everything that must hold across tuner processes and restarts is derived from the trials in
storage, never from a process's memory: which layouts were measured (a trial that carries a
``category``), which are running (a RUNNING trial that claimed a layout), the OOMs that raise
the memory margins, the best measurement, and the trials since it last improved.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from planner.units import GIB

if TYPE_CHECKING:
    from optuna import Study
    from optuna.trial import FrozenTrial

STUDY = "plan_parallel"  # the study's user attribute: what it searches (model, cluster, ...)
# the study's user attribute: could an untried layout beat the best (trials.confidence)?
CONFIDENCE = "confidence"

# Trial user attributes (also what optuna-dashboard and trials.csv show).
KEY = "layout_key"  # set first: a RUNNING trial with it has claimed that layout
LAYOUT = "layout"
CATEGORY = "category"  # set only when the trial measured something (ok or a failure)
REASON = "reason"
EVIDENCE = "evidence"
OOM_PHASE = "oom_phase"
OOM_NUMBERS = "oom_numbers"  # PyTorch's OOM figures (GiB): requested, total, free, in use
RELIEVES = "relieves"  # an enqueued trial: the OOM trial whose failing phase it relieves
CAUSE = "cause"  # a failure's category and telling line without numbers
PREDICTED = "predicted"
PLACEMENT = "placement"  # training-mode studies: mode, trainer/rollout GPUs, staleness threshold
MEASURED = "measured"
LOG = "log_path"
LAUNCH = "launch"
SKIPPED = "skipped"  # a trial that ran nothing (duplicate, limit reached, excluded)
SKIP_KIND = "skip_kind"  # done, busy, limit or memory
DURATION = "duration_s"
RETRY_OF = "retry_of"
TUNER = "tuner"  # host:pid:run of the tuner process that ran it


@dataclass
class Snapshot:
    measured: dict[str, int] = field(default_factory=dict)  # layout key -> trial number
    running: dict[str, list[int]] = field(default_factory=dict)  # key -> RUNNING numbers
    # phase, predicted bytes, trial number, need ratio (None without the OOM's figures)
    ooms: list[tuple[str, float, int, float | None]] = field(default_factory=list)
    relieved: set[int] = field(default_factory=set)  # OOM trials a relief was enqueued for
    finished: list = field(default_factory=list)  # measured trials, in completion order
    best: "FrozenTrial | None" = None
    waiting: int = 0

    @property
    def measured_count(self) -> int:
        return len(self.finished)

    def running_except(self, number: int) -> dict[str, list[int]]:
        return {key: [n for n in numbers if n != number]
                for key, numbers in self.running.items()
                if any(n != number for n in numbers)}


def measured_value(trial: "FrozenTrial") -> float | None:
    """Measured tokens/s/GPU of a successful trial (from its attributes, so a trial whose
    tuner died between measuring and reporting still counts), else None."""
    if trial.user_attrs.get(CATEGORY) != "ok":
        return None
    value = (trial.user_attrs.get(MEASURED) or {}).get("tokens_per_s_per_gpu")
    return float(value) if value is not None else None



def read_snapshot(study: "Study") -> Snapshot:
    from optuna.trial import TrialState

    snap = Snapshot()
    for trial in study.get_trials(deepcopy=False):
        attrs = trial.user_attrs
        key = attrs.get(KEY)
        if attrs.get(RELIEVES) is not None:
            snap.relieved.add(int(attrs[RELIEVES]))
        if trial.state == TrialState.WAITING:
            snap.waiting += 1
        elif trial.state == TrialState.RUNNING:
            if key:
                snap.running.setdefault(key, []).append(trial.number)
        elif CATEGORY in attrs and key:
            snap.measured.setdefault(key, trial.number)
            snap.finished.append(trial)
            if attrs[CATEGORY] == "oom":
                phase = attrs.get(OOM_PHASE) or attrs.get(PREDICTED, {}).get("peak_phase")
                predicted = attrs.get(PREDICTED, {}).get("memory_gib", {}).get(phase)
                if phase and predicted:
                    snap.ooms.append((phase, float(predicted) * GIB, trial.number,
                                      need_ratio(attrs.get(OOM_NUMBERS))))
            value = measured_value(trial)
            if value is not None and (snap.best is None
                                      or value > measured_value(snap.best)):
                snap.best = trial
    snap.finished.sort(key=lambda t: (t.datetime_complete or t.datetime_start, t.number))
    snap.ooms.sort(key=lambda oom: oom[2])
    return snap


def need_ratio(numbers) -> float | None:
    """What an OOM says the layout needed, as a share of the GPU: (total - free + requested)
    / total, from PyTorch's message (above 1: it did not fit); None without its figures."""
    try:
        total = float(numbers["total_gib"])
        need = total - float(numbers["free_gib"]) + float(numbers["requested_gib"])
    except (TypeError, KeyError, ValueError):
        return None
    return need / total if total > 0 and need > 0 else None


def trials_since_improvement(finished: list, min_improvement: float) -> int:
    """Measured trials since the last one that beat the best before it by ``min_improvement``
    (0.01: 1%); every trial counts when none succeeded."""
    best = None
    since = 0
    for trial in finished:
        value = measured_value(trial)
        if value is not None:
            if best is None or value > best * (1 + min_improvement):
                best, since = value, 0
                continue
        since += 1
    return since
