"""The launcher interface: run one trial's trainer command, watch it, always clean up.

A launcher knows *where* a command runs (a local process group, a Ray cluster's job); the
trial runner (:mod:`trials.runner`) knows *what* runs and what came of it.  Launchers share
:class:`Watchdog`, so the wall-clock and no-progress limits mean the same everywhere.
"""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from trials.gpu_monitor import GpuStats


@dataclass(frozen=True)
class LaunchRequest:
    """One trainer command to run.

    ``argv`` is the full command (trainer command + Hydra overrides), never a shell string;
    ``env`` is added to the environment the command inherits; the command runs in ``workdir``
    and its stdout and stderr go, in order, to ``log_path``.  The trainer writes
    ``metrics_path`` (verl's file logger) when the launcher shares a filesystem with it.
    """

    argv: tuple[str, ...]
    workdir: Path
    log_path: Path
    metrics_path: Path | None
    wall_timeout_s: float
    hang_timeout_s: float
    env: Mapping[str, str] = field(default_factory=dict)
    name: str = "trial"  # for job ids and messages
    max_log_bytes: int | None = None  # stop the trial when its log outgrows this


@dataclass(frozen=True)
class LaunchOutcome:
    exit_code: int | None  # the trainer's exit status; negative: killed by that signal
    stopped: str | None  # "timeout", "hang" or "log_limit" when the launcher stopped it
    duration_s: float
    gpu: GpuStats | None = None  # local GPU sampling (None: not sampled)
    handle: Mapping[str, object] = field(default_factory=dict)  # see Launcher.run


class Watchdog:
    """Wall-clock, no-progress and log-size limits.  Progress is any growth of the watched
    files (the trainer's log and metrics); :meth:`check` says ``"timeout"``, ``"hang"``,
    ``"log_limit"`` (the first file, the log, outgrew ``max_log_bytes``) or None.

    ``monitor`` (see :meth:`Launcher.run`) is asked after each growth of the files, once the
    limits have passed; what it returns (``"pruned"``) is the check's answer."""

    def __init__(self, wall_timeout_s: float, hang_timeout_s: float,
                 paths: Sequence[Path | None], clock: Callable[[], float] = time.monotonic,
                 max_log_bytes: int | None = None,
                 monitor: Callable[[], str | None] | None = None):
        self.monitor = monitor
        self.max_log_bytes = max_log_bytes
        self.wall_timeout_s = wall_timeout_s
        self.hang_timeout_s = hang_timeout_s
        self.paths = [Path(path) for path in paths if path is not None]
        self.clock = clock
        self.started = self.last_progress = clock()
        self._sizes = self._measure()

    def _measure(self) -> tuple[int, ...]:
        sizes = []
        for path in self.paths:
            try:
                sizes.append(path.stat().st_size)
            except OSError:
                sizes.append(-1)
        return tuple(sizes)

    @property
    def elapsed_s(self) -> float:
        return self.clock() - self.started

    def check(self) -> str | None:
        now = self.clock()
        sizes = self._measure()
        grew = sizes != self._sizes
        if grew:
            self._sizes, self.last_progress = sizes, now
        if self.max_log_bytes is not None and sizes and sizes[0] > self.max_log_bytes:
            return "log_limit"
        if now - self.started >= self.wall_timeout_s:
            return "timeout"
        if now - self.last_progress >= self.hang_timeout_s:
            return "hang"
        if grew and self.monitor is not None:
            return self.monitor()
        return None


class Launcher(abc.ABC):
    """Runs trainer commands somewhere and leaves nothing running behind.

    Contract of :meth:`run`:

    * it blocks until the command has exited or has been stopped, and appends the command's
      output to ``request.log_path`` as it arrives (so progress is visible while it runs);
    * it stops the command when it has run ``wall_timeout_s`` (``stopped="timeout"``) or when
      neither the log nor the metrics file has grown for ``hang_timeout_s``
      (``stopped="hang"``);
    * when it returns *or raises* (KeyboardInterrupt included) every process the command
      started has been stopped and reaped, and the GPUs it used are free for the next trial;
    * once the command runs it calls ``on_start(handle)`` with a JSON-able dict; a later tuner
      passes that dict to :meth:`abandon` to stop what a killed tuner left running;
    * while the command runs it calls ``monitor()`` (when given) after the log or the metrics
      file grew; a reason it returns (``"pruned"``: :mod:`trials.pruning`) stops the command
      like a limit does, with ``stopped`` set to that reason.

    ``shares_filesystem`` says whether files the trainer writes (verl's metrics JSONL) can be
    read by the tuner; when False the metrics come from the console log only.
    """

    name: str = ""
    shares_filesystem: bool = True

    @abc.abstractmethod
    def run(self, request: LaunchRequest,
            on_start: Callable[[dict], None] | None = None,
            monitor: Callable[[], str | None] | None = None) -> LaunchOutcome:
        """Run ``request`` to completion, a limit or a stop ``monitor`` asks for (see the
        class contract)."""

    @abc.abstractmethod
    def abandon(self, handle: Mapping[str, object]) -> str:
        """Stop whatever the trial described by ``handle`` (from ``on_start`` of another, dead,
        tuner) still runs; return one line saying what was done."""

    def describe(self) -> str:
        return self.name
