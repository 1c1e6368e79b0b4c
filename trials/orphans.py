"""Trials whose tuner is gone from this host: found at once, not after the grace period.

Heartbeats find a dead tuner's trial only after ``--grace-period`` (180 s by default), and a
tuner restarted sooner would start new trials beside the killed trial's processes -- on GPUs,
their memory makes every new trial fail with OOM.  So each trial also records the tuner that
runs it (:func:`this_tuner`: host, pid and the process's start time, the pair that names one
process for good), and a tuner starting on the same host checks every RUNNING trial: one whose
tuner process no longer exists (or whose pid now belongs to a later process) is orphaned at
once -- marked failed, its leftovers stopped and checked gone (the stale-trial callback: the
launcher's ``abandon``), and retried -- before the first new trial starts.

A trial whose tuner ran on another host cannot be judged from here; heartbeats cover it.  Two
tuners that find the same orphan race to mark it failed; only the one that succeeds cleans up.
A container with its own PID namespace but the host's name would misjudge another container's
tuner: give each container its own hostname (Docker and Kubernetes do).
"""

from __future__ import annotations

import copy
import os
import socket
from typing import Callable

TUNER_PROCESS = "tuner_process"  # the user attribute: {"host", "pid", "create_time"}


def this_tuner() -> dict:
    """This process, as a trial records its tuner."""
    import psutil

    return {"host": socket.gethostname(), "pid": os.getpid(),
            "create_time": psutil.Process().create_time()}


def tuner_gone(record: object, host: str | None = None) -> bool:
    """Whether the tuner process ``record`` names is gone from this host (False when it ran
    elsewhere or the record is unreadable: not ours to judge)."""
    import psutil

    if not isinstance(record, dict) or record.get("host") != (host or socket.gethostname()):
        return False
    try:
        pid, created = int(record["pid"]), float(record["create_time"])
    except (KeyError, TypeError, ValueError):
        return False
    if pid == os.getpid():
        return abs(psutil.Process().create_time() - created) >= 0.01
    try:
        process = psutil.Process(pid)
        return (abs(process.create_time() - created) >= 0.01
                or process.status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:  # exists, but not ours to inspect: alive
        return False


def fail_orphaned_trials(study, on_orphan: Callable) -> list[int]:
    """Mark failed every RUNNING trial of ``study`` whose tuner is gone from this host and call
    ``on_orphan(study, trial)`` for each one this process failed (the stale-trial callback:
    stop its leftovers, retry it).  The trial numbers, in order."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    storage = study._storage
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not tuner_gone(trial.user_attrs.get(TUNER_PROCESS)):
            continue
        try:
            if not storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL):
                continue
        except UpdateFinishedTrialError:  # another tuner got there first
            continue
        failed.append(trial.number)
        on_orphan(study, copy.deepcopy(storage.get_trial(trial._trial_id)))
    return failed


def launch_handle(trial, record: dict | None) -> dict | None:
    """The launch handle of ``trial`` (its ``launch`` attribute), or one rebuilt from its
    trial directory's ``processes.json`` when the tuner died between writing that file and
    recording the handle (local launcher only: the file holds the root pid, its start time and
    the trial's marker)."""
    from pathlib import Path

    from trials import study_state as attrs
    from trials.processes import PROCESSES_FILE, read_tree_file

    handle = trial.user_attrs.get(attrs.LAUNCH)
    if handle or not record or not trial.user_attrs.get(attrs.LOG):
        return handle or None
    tree_file = Path(str(trial.user_attrs[attrs.LOG])).parent / PROCESSES_FILE
    known, marker = read_tree_file(tree_file)
    if not known:
        return None
    import json

    try:
        root = int(json.loads(tree_file.read_text()).get("root"))
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    return {"launcher": "local", "host": record.get("host"), "pgid": root, "pid": root,
            "create_time": known.get(root, 0.0), "marker": marker, "tree_file": str(tree_file),
            "unit": f"plan-parallel-{marker}" if marker else None}
