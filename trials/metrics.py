"""What a verl trial measured: its per-step metrics, read from the file logger or the console.

verl 0.9.1 logs one record per training step through ``Tracking`` (``verl/utils/tracking.py``):

* the **file logger** (``trainer.logger=[console,file]``) appends ``{"step": N, "data": {...}}``
  lines to ``$VERL_FILE_LOGGER_PATH`` (orjson with ``OPT_SERIALIZE_NUMPY``);
* the **console logger** prints ``step:N - key:value - ...`` for numeric values only
  (``verl/utils/logger/aggregate_logger.py``), numbers through ``pprint.pformat``, so NumPy 2
  scalars appear as ``np.float64(1.5)``; lines printed inside Ray actors carry Ray's
  ``(TaskRunner pid=...)`` prefix.

The file is preferred (it is exact and survives Ray's log deduplication); the console is the
fallback when the file is missing, e.g. when the trainer ran on a node whose disk the tuner
cannot read.  :func:`summarise` drops warm-up steps and reduces the rest.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

STEP_TIME = "timing_s/step"
THROUGHPUT = "perf/throughput"  # tokens / (step time * GPUs): tokens/s/GPU
TOTAL_TOKENS = "perf/total_num_tokens"
MFU = "perf/mfu/actor"
TIMING_PREFIX = "timing_s/"
# actor/perf/max_memory_allocated_gb, actor/perf/max_memory_reserved_gb (and any other role's)
MEMORY_KEY = re.compile(r"(^|/)perf/max_memory_\w+_gb$")

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Ray prefixes actor output with "(ActorName pid=123)" or "(ActorName pid=123, ip=10.0.0.1)";
# with RAY_DEDUP_LOGS it may add " [repeated 3x across cluster]" at the end.
_RAY_PREFIX = re.compile(r"^\s*\([^()]*\bpid=\d+[^()]*\)\s*")
_RAY_REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")
_STEP_LINE = re.compile(r"^step:(\d+)(?: - (.*))?$")
_NUMPY_SCALAR = re.compile(r"^np\.[a-z]+\d*\((.*)\)$")


@dataclass(frozen=True)
class StepRecord:
    step: int
    data: Mapping[str, float]


def strip_log_prefix(line: str) -> str:
    """A log line without terminal colours and Ray's ``(Actor pid=...)`` prefix."""
    line = _ANSI.sub("", line.rstrip("\r\n"))
    line = _RAY_PREFIX.sub("", line, count=1)
    return _RAY_REPEATED.sub("", line)


def parse_number(text: str) -> float | None:
    """A console value as a float: ``1.5``, ``np.float64(1.5)``, ``True``, ``nan``; else None."""
    text = text.strip()
    match = _NUMPY_SCALAR.match(text)
    if match:
        text = match.group(1).strip()
    if text in ("True", "False"):
        return 1.0 if text == "True" else 0.0
    try:
        return float(text)
    except ValueError:
        return None


def parse_console_line(line: str) -> StepRecord | None:
    """One ``step:N - key:value - ...`` line (any prefix Ray adds), or None."""
    match = _STEP_LINE.match(strip_log_prefix(line))
    if not match:
        return None
    data = {}
    for part in (match.group(2) or "").split(" - "):
        key, sep, value = part.rpartition(":")
        number = parse_number(value) if sep else None
        if key and number is not None:
            data[key.strip()] = number
    return StepRecord(int(match.group(1)), data)


def parse_console(lines: Iterable[str]) -> list[StepRecord]:
    return _by_step(record for record in map(parse_console_line, lines) if record)


def parse_jsonl(lines: Iterable[str]) -> list[StepRecord]:
    """File-logger lines; a line cut short by a killed trainer is skipped."""
    records = []
    for line in lines:
        try:
            item = json.loads(line)
            step, data = int(item["step"]), item["data"]
        except (ValueError, KeyError, TypeError):
            continue
        if not isinstance(data, dict):
            continue
        values = {key: float(value) for key, value in data.items()
                  if isinstance(value, (int, float))}  # bools count as 0/1, like the console
        records.append(StepRecord(step, values))
    return _by_step(records)


def _by_step(records: Iterable[StepRecord]) -> list[StepRecord]:
    """Records in step order; a step logged twice keeps its last record."""
    latest = {}
    for record in records:
        latest[record.step] = record
    return [latest[step] for step in sorted(latest)]


def _read_lines(path: Path | None) -> list[str]:
    if path is None or not Path(path).is_file():
        return []
    return Path(path).read_text(errors="replace").splitlines()


def read_records(metrics_path: Path | None, log_path: Path | None) -> tuple[list[StepRecord], str]:
    """Step records and where they came from: ``"file"``, ``"console"`` or ``"none"``."""
    records = parse_jsonl(_read_lines(metrics_path))
    if records:
        return records, "file"
    records = parse_console(_read_lines(log_path))
    return (records, "console") if records else ([], "none")


@dataclass(frozen=True)
class MetricsSummary:
    """A trial's steady-state figures (medians over the steps after warm-up)."""

    steps_recorded: int
    steady_steps: int  # steps the medians are over (warm-up dropped)
    source: str  # "file", "console" or "none"
    tokens_per_s_per_gpu: float | None = None
    step_time_s: float | None = None
    mfu: float | None = None
    phase_times_s: Mapping[str, float] = field(default_factory=dict)  # timing_s/<name> medians
    memory_gb: Mapping[str, float] = field(default_factory=dict)  # */perf/max_memory_*_gb max
    last_step: int = 0

    @property
    def peak_memory_gb(self) -> float | None:
        return max(self.memory_gb.values()) if self.memory_gb else None

    def to_dict(self) -> dict:
        return {"steps_recorded": self.steps_recorded, "steady_steps": self.steady_steps,
                "source": self.source, "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
                "step_time_s": self.step_time_s, "mfu": self.mfu,
                "phase_times_s": dict(self.phase_times_s), "memory_gb": dict(self.memory_gb),
                "last_step": self.last_step}


def _median(values: list[float]) -> float | None:
    finite = [value for value in values if math.isfinite(value)]
    return float(statistics.median(finite)) if finite else None


def summarise(records: list[StepRecord], warmup_steps: int, n_gpus: int,
              source: str = "file") -> MetricsSummary:
    """Medians over the steps after the first ``warmup_steps`` (the last step is kept when a
    trial recorded no more than its warm-up), peak memory over every step.

    Tokens/s/GPU is verl's ``perf/throughput``; without it, ``perf/total_num_tokens`` over the
    step time and ``n_gpus``.
    """
    if not records:
        return MetricsSummary(steps_recorded=0, steady_steps=0, source="none")
    steady = records[warmup_steps:] or records[-1:]

    def column(key: str) -> list[float]:
        return [record.data[key] for record in steady if key in record.data]

    throughput = _median(column(THROUGHPUT))
    step_time = _median(column(STEP_TIME))
    if throughput is None and step_time and n_gpus:
        tokens = _median(column(TOTAL_TOKENS))
        throughput = tokens / (step_time * n_gpus) if tokens else None
    timing_keys = sorted({key for record in steady for key in record.data
                          if key.startswith(TIMING_PREFIX)})
    phases = {key[len(TIMING_PREFIX):]: value for key in timing_keys
              if (value := _median(column(key))) is not None}
    memory_keys = sorted({key for record in records for key in record.data
                          if MEMORY_KEY.search(key)})
    memory = {key: max(record.data[key] for record in records if key in record.data)
              for key in memory_keys}
    return MetricsSummary(steps_recorded=len(records), steady_steps=len(steady), source=source,
                          tokens_per_s_per_gpu=throughput, step_time_s=step_time,
                          mfu=_median(column(MFU)), phase_times_s=phases, memory_gb=memory,
                          last_step=records[-1].step)
