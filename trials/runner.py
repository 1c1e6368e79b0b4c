"""Run one trial: launch its job, read what it measured, say how it went.

The result is also written next to the trial's log as ``result.json``, so a sweep directory
explains itself without the study's storage.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from trials.failures import Category, Classification, classify
from trials.launchers.launcher import Launcher, LaunchOutcome, LaunchRequest
from trials.logscan import scan_log
from trials.metrics import MetricLimits, MetricsSummary, read_metrics_file, summarise
from trials.trial_job import write_command, write_private

RESULT_FILE = "result.json"


@dataclass(frozen=True)
class TrialResult:
    classification: Classification
    summary: MetricsSummary
    outcome: LaunchOutcome
    request: LaunchRequest

    @property
    def category(self) -> Category:
        return self.classification.category

    @property
    def ok(self) -> bool:
        return self.category is Category.OK and self.summary.tokens_per_s_per_gpu is not None

    @property
    def peak_memory_gib(self) -> float | None:
        """The larger of NVML's peak (every process on the GPU) and verl's allocator peak."""
        figures = [value for value in (
            self.outcome.gpu.peak_gib if self.outcome.gpu else None,
            self.summary.peak_memory_gb) if value is not None]
        return max(figures) if figures else None

    def measured(self) -> dict:
        return {**self.summary.to_dict(),
                "peak_memory_gib": self.peak_memory_gib,
                "gpu": self.outcome.gpu.to_dict() if self.outcome.gpu else None,
                "exit_code": self.outcome.exit_code, "stopped": self.outcome.stopped,
                "duration_s": round(self.outcome.duration_s, 3)}

    def to_dict(self) -> dict:
        return {"category": self.category.value, **self.classification.to_dict(),
                "measured": self.measured(), "log_path": str(self.request.log_path),
                "argv": list(self.request.argv)}


def run_trial(request: LaunchRequest, launcher: Launcher, *, steps: int, warmup_steps: int,
              n_gpus: int, on_start: Callable[[dict], None] | None = None,
              limits: MetricLimits | None = None,
              tokens_from_step_time: bool = False,
              monitor: Callable[[], str | None] | None = None) -> TrialResult:
    """Launch ``request`` with ``launcher`` and classify what happened.  The log and metrics
    are read in one streaming pass each (bounded memory, whatever their size); metric lines
    outside ``limits`` are skipped and counted.  ``tokens_from_step_time``: an asynchronous
    trial, whose tokens/s/GPU is its tokens over its step time and all ``n_gpus`` (see
    :func:`trials.metrics.summarise`).  ``monitor``: the launcher's (a
    :class:`trials.pruning.StepReporter` stops a trailing trial; it is then ``pruned``)."""
    request.workdir.mkdir(parents=True, exist_ok=True)
    write_command(request)
    outcome = launcher.run(request, on_start, monitor=monitor)
    scan = scan_log(request.log_path, limits)
    metrics = read_metrics_file(request.metrics_path, limits)
    if metrics.latest:
        records, source, bad = metrics.records(), "file", metrics.bad_lines
    elif scan.records:
        records, source, bad = list(scan.records), "console", scan.bad_lines
    else:
        records, source, bad = [], "none", metrics.bad_lines + scan.bad_lines
    summary = summarise(records, warmup_steps, n_gpus, source, bad_lines=bad, limits=limits,
                        tokens_from_step_time=tokens_from_step_time)
    classification = classify(list(scan.lines), exit_code=outcome.exit_code,
                              stopped=outcome.stopped, steps_recorded=summary.steps_recorded,
                              steps_expected=steps,
                              timeouts=(request.wall_timeout_s, request.hang_timeout_s),
                              error_line=scan.error_line,
                              log_limit_bytes=request.max_log_bytes)
    if classification.category is Category.OK and summary.tokens_per_s_per_gpu is None:
        skipped = f"; {bad} impossible metric lines skipped" if bad else ""
        classification = Classification(Category.CRASH, f"{summary.steps_recorded} steps "
                                        f"recorded but no throughput metric "
                                        f"(perf/throughput or timing_s/step){skipped}",
                                        cause="crash: no throughput metric")
    result = TrialResult(classification, summary, outcome, request)
    write_private(Path(request.workdir / RESULT_FILE),
                  json.dumps(result.to_dict(), indent=2) + "\n")
    return result
