"""What a study leaves behind: ``trials.csv`` (every trial) and the best layout as a verl job.

The best layout is written through the same export as ``plan-parallel ... --write`` (launch
script, Hydra config, plan.json) -- an asynchronous mode's best split as ``plan --mode ...
--write`` writes it (the mode's entry module, both pools, ``async_training.*``) -- plus
``tuned.json`` with what was measured.  In a training-mode study ``trials.csv`` also has each
trial's mode, pools and staleness threshold.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from planner.cost.columns import time_column
from planner.modes import Launch, export_job
from planner.phases import PHASES
from planner.verl.files import write_job
from trials import study_state as attrs
from trials.candidates import SEARCH_FIELDS, Candidate

if TYPE_CHECKING:
    import pandas as pd
    from optuna import Study
    from optuna.trial import FrozenTrial

CSV_FILE = "trials.csv"
INTEGER_COLUMNS = ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "micro_batch", "rollout_tp",
                   "rollout_dp", "rollout_ep", "steps", "retry_of", "trainer_gpus",
                   "rollout_gpus")
PLACEMENT_COLUMNS = ("mode", "trainer_gpus", "rollout_gpus", "staleness_threshold")
TUNED_FILE = "tuned.json"


def _round(value, digits: int = 3):
    return None if value is None else round(float(value), digits)


def trial_row(trial: "FrozenTrial") -> dict:
    user = trial.user_attrs
    layout = user.get(attrs.LAYOUT) or {}
    measured = user.get(attrs.MEASURED) or {}
    predicted = user.get(attrs.PREDICTED) or {}
    row = {"trial": trial.number, "state": trial.state.name,
           "category": user.get(attrs.CATEGORY) or ("skipped" if attrs.SKIPPED in user
                                                    else "not measured"),
           "layout_key": user.get(attrs.KEY, "")}
    if attrs.PLACEMENT in user or trial.params.keys() & set(PLACEMENT_COLUMNS):
        placement = user.get(attrs.PLACEMENT) or {}
        row.update({name: placement.get(name, trial.params.get(name))
                    for name in PLACEMENT_COLUMNS})
    row.update({field: layout.get(field) for field in (*SEARCH_FIELDS, "dp")})
    tokens = measured.get("tokens_per_s_per_gpu")
    expected = predicted.get("tokens_per_s_per_gpu")
    row.update({
        "tokens_per_s_per_gpu": _round(tokens, 2),
        "predicted_tokens_per_s_per_gpu": _round(expected, 2),
        "prediction_error_pct": (_round(100 * (expected / tokens - 1), 1)
                                 if tokens and expected else None),
        "step_time_s": _round(measured.get("step_time_s")),
        "predicted_step_time_s": _round(predicted.get("step_time_s")),
        "mfu": _round(measured.get("mfu"), 4),
        "peak_memory_gib": _round(measured.get("peak_memory_gib")),
        "predicted_peak_gib": _round(predicted.get("peak_gib")),
        "gpu_mean_utilization": (measured.get("gpu") or {}).get("mean_utilization"),
    })
    phases = measured.get("phase_times_s") or {}
    for phase in sorted(phases):
        row[time_column(phase)] = _round(phases[phase])
    for phase in PHASES:
        row[f"predicted_mem_{phase}_gib"] = _round((predicted.get("memory_gib") or {}).get(phase))
    row.update({"oom_phase": user.get(attrs.OOM_PHASE), "reason": user.get(attrs.REASON)
                or user.get(attrs.SKIPPED, ""),
                "steps": measured.get("steps_recorded"), "metrics_source": measured.get("source"),
                "duration_s": _round(user.get(attrs.DURATION), 1),
                "retry_of": user.get(attrs.RETRY_OF), "log_path": user.get(attrs.LOG),
                "started": trial.datetime_start, "completed": trial.datetime_complete})
    return row


def trials_frame(trials: Sequence["FrozenTrial"]) -> "pd.DataFrame":
    import pandas as pd

    frame = pd.DataFrame([trial_row(trial) for trial in sorted(trials, key=lambda t: t.number)])
    for name in INTEGER_COLUMNS:  # skipped trials have no layout: keep the others integers
        if name in frame:
            frame[name] = frame[name].astype("Int64")
    return frame


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def write_trials_csv(study: "Study", directories: Sequence[Path]) -> list[Path]:
    text = trials_frame(study.get_trials(deepcopy=False)).to_csv(index=False)
    paths = []
    for directory in directories:
        path = Path(directory) / CSV_FILE
        _atomic_write(path, text)
        paths.append(path)
    return paths


JOB_FILES = ("run_grpo.sh", "grpo.yaml", "plan.json", TUNED_FILE, CSV_FILE)


def check_write_dir(directory: Path, study_name: str, force: bool) -> None:
    """Refuse a ``--write`` directory holding a job this study did not write, unless
    ``force``: a job a user wrote (or another study's best) is never replaced unasked.  What
    this study wrote before (its ``tuned.json`` names it, or only its ``trials.csv`` is there)
    is its own to update when the study resumes."""
    from planner.bounds import check_output_folder
    from planner.errors import PlanInputError

    directory = Path(directory)
    check_output_folder(directory, "--write")  # a plain file, a read-only folder: at once
    present = [name for name in JOB_FILES if (directory / name).exists()]
    if force or not present:
        return
    tuned = directory / TUNED_FILE
    if tuned.is_file():
        try:
            owner = json.loads(tuned.read_text()).get("study")
        except (OSError, ValueError, AttributeError):
            owner = None
        if owner == study_name:
            return
        whose = f"study {owner!r}'s best layout" if owner else "a job"
    elif present == [CSV_FILE] and _is_trials_csv(directory / CSV_FILE):
        return
    else:
        whose = "a job"
    raise PlanInputError(f"--write {directory} already holds {whose} ({', '.join(present)}); "
                         f"pass --force to replace it, or choose another directory")


def _is_trials_csv(path: Path) -> bool:
    try:
        with open(path) as handle:
            return handle.readline().startswith("trial,state,category,layout_key")
    except (OSError, UnicodeDecodeError):
        return False


def update_tuned(directory: Path, values: dict) -> Path | None:
    """Add ``values`` to the ``tuned.json`` a study wrote in ``directory`` (None: none there)."""
    path = Path(directory) / TUNED_FILE
    try:
        tuned = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(tuned, dict):
        return None
    _atomic_write(path, json.dumps({**tuned, **values}, indent=2, default=str) + "\n")
    return path


def write_best(candidate: Candidate, trial: "FrozenTrial", directory: Path, *, study_name: str,
               model_path: str | None, train_files: str | None, val_files: str | None,
               overrides: Sequence[str]) -> list[Path]:
    """The best measured candidate as a verl job in ``directory``: its rank of its plan, or of
    its mode's plan for an asynchronous split."""
    job = export_job(candidate.plan, candidate.rank, Launch(
        model_path=model_path, train_files=train_files, val_files=val_files,
        extra_overrides=tuple(overrides)))
    paths = write_job(job, Path(directory), force=True)
    tuned = {"study": study_name, "trial": trial.number,
             "layout_key": trial.user_attrs.get(attrs.KEY),
             **({"placement": dict(candidate.placement)} if candidate.placement else {}),
             "layout": trial.user_attrs.get(attrs.LAYOUT),
             "measured": trial.user_attrs.get(attrs.MEASURED),
             "predicted": trial.user_attrs.get(attrs.PREDICTED),
             "log_path": trial.user_attrs.get(attrs.LOG)}
    path = Path(directory) / TUNED_FILE
    _atomic_write(path, json.dumps(tuned, indent=2, default=str) + "\n")
    return [*paths, path]
