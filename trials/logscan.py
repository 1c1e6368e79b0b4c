"""Read a trial's ``trainer.log`` once, in bounded memory, for everything the tuner needs.

A trainer's log can be gigabytes (a spinning warning, a debug flag); the tuner never holds it.
One pass over the file (:func:`trials.metrics.iter_lines`: fixed-size chunks, long lines cut)
keeps only:

* the console step records (:class:`trials.metrics.MetricsReader`, one per step);
* for each failure signature (:data:`trials.failures.SIGNATURES`) its first matching line with
  the :data:`~trials.failures.PHASE_SEARCH_LINES` lines above it (the traceback that names the
  GRPO phase of an OOM);
* the last :data:`TAIL_KEEP` lines, and the last line that reads like an error
  (:func:`trials.failures.is_error_line`).

Stored lines are cut to :data:`STORED_LINE_CHARS`, so the memory is bounded whatever the file.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from pathlib import Path

from trials.failures import ANY_SIGNATURE, PHASE_SEARCH_LINES, SIGNATURES, is_error_line
from trials.metrics import MetricLimits, MetricsReader, StepRecord, iter_lines

TAIL_KEEP = 200
STORED_LINE_CHARS = 2000


@dataclass(frozen=True)
class LogScan:
    records: tuple[StepRecord, ...]  # console step records, in step order
    bad_lines: int  # console step lines skipped as impossible
    lines: tuple[str, ...]  # what classify() reads: the signatures' excerpts, then the tail
    error_line: str | None  # the last line that reads like an error
    size_bytes: int


def scan_log(path: Path | None, limits: MetricLimits | None = None) -> LogScan:
    reader = MetricsReader(limits)
    if path is None or not Path(path).is_file():
        return LogScan((), 0, (), None, 0)
    window: deque[str] = deque(maxlen=PHASE_SEARCH_LINES + 1)
    tail: deque[str] = deque(maxlen=TAIL_KEEP)
    excerpts: dict[str, list[str]] = {}
    error_line = None
    for line in iter_lines(Path(path)):
        reader.console_line(line)
        stored = line[:STORED_LINE_CHARS]
        window.append(stored)
        tail.append(stored)
        if len(excerpts) < len(SIGNATURES) and ANY_SIGNATURE.search(line):
            for signature in SIGNATURES:
                if signature.name not in excerpts and signature.pattern.search(line):
                    excerpts[signature.name] = list(window)
        if is_error_line(line):
            error_line = stored
    lines = [line for excerpt in excerpts.values() for line in excerpt]
    return LogScan(tuple(reader.records()), reader.bad_lines, (*lines, *tail), error_line,
                   Path(path).stat().st_size)
