"""Training modes as plug-ins: how verl runs a GRPO step on a cluster.

Public names (import them from here)::

    from planner.modes import TrainingMode, register, get_mode, all_modes, mode_names

:class:`TrainingMode` states the contract (:mod:`planner.modes.base`); each mode lives in its
own module -- :mod:`~planner.modes.sync`, :mod:`~planner.modes.one_step_off`,
:mod:`~planner.modes.fully_async` (the last two on separate pools, :mod:`~planner.modes.split`)
-- and registers itself (:mod:`planner.modes.registry`).  A new mode subclasses
:class:`TrainingMode` (or :class:`~planner.modes.split.SplitMode`) and passes the class to
:func:`register`; the CLI's ``--mode``, the reports, ``explain`` and ``tune`` find it there.
"""

from planner.modes.base import Launch, TrainingMode
from planner.modes.registry import (
    BEST,
    all_modes,
    baseline_name,
    export_job,
    get_mode,
    mode_choices,
    mode_names,
    mode_of_config,
    off_policy_note,
    plan_all,
    register,
    unregister,
)

# the built-in modes register themselves, in this order: sync (the baseline) here, the split
# modes when the registry is first read beyond it (planner.modes.registry._LATER)
from planner.modes.sync import SyncMode  # noqa: E402  isort: skip

_LAZY = {"OneStepOffMode": "planner.modes.one_step_off",
         "FullyAsyncMode": "planner.modes.fully_async", "SplitMode": "planner.modes.split"}


def __getattr__(name: str):
    """The split modes' classes, imported on first use (a plan of the baseline reads none)."""
    if name not in _LAZY:
        raise AttributeError(f"module 'planner.modes' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)


__all__ = ["BEST", "FullyAsyncMode", "Launch", "OneStepOffMode", "SplitMode", "SyncMode",
           "TrainingMode", "all_modes", "baseline_name", "export_job", "get_mode", "mode_choices",
           "mode_names", "mode_of_config", "off_policy_note", "plan_all", "register",
           "unregister"]
