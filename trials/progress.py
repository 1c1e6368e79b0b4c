"""How a running study reports itself: a live table on a terminal, plain lines in a log.

Both show the same :class:`Status` (trial k of N, elapsed, best so far, ETA) and one row per
finished trial; :func:`make_progress` picks the live view only when stderr is a terminal.
"""

from __future__ import annotations

import abc
import sys
import time
from dataclasses import dataclass, field
from typing import IO


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "--"
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}"


@dataclass
class Status:
    target: int  # trials the study should measure
    measured: int = 0  # measured so far (every tuner process)
    started: float = field(default_factory=time.monotonic)
    best_value: float | None = None
    best_trial: int | None = None
    best_key: str = ""
    running: str = ""  # "#12 tp2-pp1-..." while a trial runs here
    mean_trial_s: float | None = None  # of trials this process ran
    deadline: float | None = None  # monotonic time the study's --timeout ends

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    @property
    def eta_s(self) -> float | None:
        if self.mean_trial_s is None:
            return None
        eta = max(self.target - self.measured, 0) * self.mean_trial_s
        if self.deadline is not None:
            eta = min(eta, max(self.deadline - time.monotonic(), 0))
        return eta

    def line(self, done: bool = False) -> str:
        """The status: the trial under way (``trial k of N``), or with ``done`` (a line about a
        trial that has just finished, counted in ``measured``) the trials done so far."""
        best = (f"best {self.best_value:,.1f} tok/s/GPU (#{self.best_trial})"
                if self.best_value is not None else "best --")
        count = (f"{self.measured} of {self.target} done" if done
                 else f"trial {min(self.measured + 1, self.target)} of {self.target}")
        return (f"{count} | elapsed "
                f"{format_duration(self.elapsed_s)} | {best} | eta "
                f"{format_duration(self.eta_s)}")


@dataclass(frozen=True)
class Row:
    number: int
    key: str
    category: str
    measured: float | None  # tokens/s/GPU
    predicted: float | None
    duration_s: float
    reason: str = ""


class Progress(abc.ABC):
    """Receives the study's events; never raises (reporting must not stop a study)."""

    @abc.abstractmethod
    def started(self, status: Status, number: int, key: str) -> None: ...

    @abc.abstractmethod
    def finished(self, status: Status, row: Row) -> None: ...

    @abc.abstractmethod
    def note(self, text: str) -> None: ...

    def close(self) -> None:
        pass


def _value(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


class PlainProgress(Progress):
    """One line per event, flushed: readable in log files and CI output."""

    def __init__(self, stream: IO[str] | None = None):
        self.stream = stream or sys.stderr

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def started(self, status: Status, number: int, key: str) -> None:
        self._print(f"[{status.line()}] trial #{number} started: {key}")

    def finished(self, status: Status, row: Row) -> None:
        result = (f"{_value(row.measured)} tok/s/GPU (predicted {_value(row.predicted)})"
                  if row.category == "ok" else failure_text(row))
        self._print(f"[{status.line(done=True)}] trial #{row.number} {row.key} "
                    f"{format_duration(row.duration_s)} {result}")

    def note(self, text: str) -> None:
        self._print(text)


def failure_text(row: "Row") -> str:
    """``category: reason``, once: a reason read from the log already starts with its category
    (``oom in update_actor: ...``, ``nccl: ...``; :func:`trials.failures.classify`)."""
    category = str(row.category)
    if row.reason.startswith((f"{category}:", f"{category} in ")):
        return row.reason
    return f"{category}: {row.reason}" if row.reason else category


class LiveProgress(Progress):
    """A table of the latest trials with the status line under it (rich, on a terminal)."""

    MAX_ROWS = 12

    def __init__(self, console=None):
        from rich.console import Console
        from rich.live import Live

        self.console = console or Console(stderr=True)
        self.rows: list[Row] = []
        self.status: Status | None = None
        self.live = Live(self, console=self.console, refresh_per_second=1, transient=False)
        self.live.start()

    def __rich__(self):
        from rich.table import Table

        table = Table(title="plan-parallel tune", title_justify="left", expand=False)
        for name, justify in (("#", "right"), ("layout", "left"), ("result", "left"),
                              ("tok/s/GPU", "right"), ("predicted", "right"),
                              ("time", "right")):
            table.add_column(name, justify=justify)
        for row in self.rows[-self.MAX_ROWS:]:
            result = row.category if row.category == "ok" else failure_text(row)
            table.add_row(str(row.number), row.key, result[:60], _value(row.measured),
                          _value(row.predicted), format_duration(row.duration_s))
        caption = self.status.line() if self.status else ""
        if self.status and self.status.running:
            caption += f" | running {self.status.running}"
        table.caption = caption
        table.caption_justify = "left"
        return table

    def started(self, status: Status, number: int, key: str) -> None:
        self.status = status
        self.live.refresh()

    def finished(self, status: Status, row: Row) -> None:
        self.status = status
        self.rows.append(row)
        self.live.refresh()

    def note(self, text: str) -> None:
        self.console.print(text)

    def close(self) -> None:
        self.live.stop()


def make_progress(stream: IO[str] | None = None) -> Progress:
    stream = stream or sys.stderr
    if stream.isatty():
        try:
            return LiveProgress()
        except ImportError:
            pass
    return PlainProgress(stream)
