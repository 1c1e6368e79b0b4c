"""Read a trial's ``trainer.log`` once, in bounded memory, for everything the tuner needs.

A trainer's log can be gigabytes (a spinning warning, a debug flag); the tuner never holds it.
One pass over the file (:func:`trials.metrics.iter_blocks`: fixed-size chunks, long lines
cut, one regex search per chunk)
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

from dataclasses import dataclass
from pathlib import Path

from trials.failures import (
    ANY_SIGNATURE,
    ERROR_WORDS,
    PHASE_SEARCH_LINES,
    SIGNATURE_WORDS,
    SIGNATURES,
    is_error_line,
    mentions,
)
from trials.metrics import MetricLimits, MetricsReader, StepRecord, iter_blocks

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
    window: list[str] = []  # the lines above the current block, for an excerpt's context
    tail: list[str] = []
    excerpts: dict[str, list[str]] = {}
    error_line = None
    for block in iter_blocks(Path(path)):
        text = "\n".join(block)  # one regex search per block; lines only where it hits
        if "step:" in text:
            for line in block:
                if "step:" in line:
                    reader.console_line(line)
        if len(excerpts) < len(SIGNATURES) and mentions(text, SIGNATURE_WORDS):
            for index, line in enumerate(block):
                if not mentions(line, SIGNATURE_WORDS) or not ANY_SIGNATURE.search(line):
                    continue
                for signature in SIGNATURES:
                    if signature.name not in excerpts and signature.pattern.search(line):
                        above = (window + block[max(0, index - PHASE_SEARCH_LINES):index])
                        excerpts[signature.name] = [
                            item[:STORED_LINE_CHARS]
                            for item in above[-PHASE_SEARCH_LINES:] + [line]]
        if mentions(text, ERROR_WORDS):
            error_line = next((line[:STORED_LINE_CHARS] for line in reversed(block)
                               if is_error_line(line)), error_line)
        window = [line[:STORED_LINE_CHARS] for line in (window + block[-PHASE_SEARCH_LINES:])
                  [-PHASE_SEARCH_LINES:]]
        tail = (tail + [line[:STORED_LINE_CHARS] for line in block[-TAIL_KEEP:]])[-TAIL_KEEP:]
    lines = [line for excerpt in excerpts.values() for line in excerpt]
    return LogScan(tuple(reader.records()), reader.bad_lines, (*lines, *tail), error_line,
                   Path(path).stat().st_size)
