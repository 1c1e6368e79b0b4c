"""Where trials run: :class:`~trials.launchers.local.LocalLauncher` (a process group on this
node) or :class:`~trials.launchers.ray_jobs.RayJobLauncher` (a job on a Ray cluster), both
behind :class:`~trials.launchers.launcher.Launcher`."""

from __future__ import annotations

from typing import Mapping

from trials.launchers.launcher import Launcher, LaunchOutcome, LaunchRequest, Watchdog

LAUNCHERS = ("local", "ray")

__all__ = ["LAUNCHERS", "Launcher", "LaunchOutcome", "LaunchRequest", "Watchdog",
           "launcher_for_handle"]


def launcher_for_handle(handle: Mapping[str, object], current: Launcher) -> Launcher:
    """The launcher that can :meth:`~Launcher.abandon` the trial described by ``handle``: the
    current one when it launched it, else one made from the handle."""
    kind = handle.get("launcher")
    if kind == current.name and (kind != "ray"
                                 or handle.get("address") == getattr(current, "address", None)):
        return current
    if kind == "ray":
        from trials.launchers.ray_jobs import RayJobLauncher

        return RayJobLauncher(str(handle.get("address")))
    from trials.launchers.local import LocalLauncher

    return LocalLauncher(gpus=0)
