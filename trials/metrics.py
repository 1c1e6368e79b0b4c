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
cannot read.  :func:`summarise` drops warm-up steps and reduces the rest.  Records logged at one
step are merged (a later value of a key wins).

The asynchronous trainers (verl 0.9.1 ``verl.experimental``) log differently:

* one-step-off (``one_step_off_policy/ray_trainer.py``) logs one record per step like
  ``main_ppo``, with ``timing_s/gen`` (the wait for the batch generated during the previous
  step), ``timing_s/generate_async``, ``timing_s/sync_rollout_weights`` and ``timing_s/step``;
  but its ``perf/throughput`` divides by the trainer pool's GPUs only
  (``resource_pool_manager.get_n_gpus()``: the rollout pool is not in it);
* fully-async (``fully_async_policy/fully_async_trainer.py``) logs per parameter version
  (``step`` = ``current_param_version``), two records at each: the rollouter's
  (``fully_async/rollouter/idle_ratio``, ``active_time``, ``version_time``,
  ``step_generated_samples``) and then the trainer's local steps since the previous sync,
  aggregated by ``detach_utils.MetricsAggregator``: ``timing_s/*``, ``perf/total_num_tokens``
  and ``perf/time_per_step`` summed, ``perf/throughput`` recomputed over trainer + rollout GPUs,
  ``fully_async/trainer/idle_ratio`` = gen / step, ``fully_async/count/*`` (the parameter sync is
  ``timing_s/timing_s/param_sync``: its timer is named with the prefix).  The first version's
  record covers one local step less (the last local step of a cycle is aggregated into the
  next version's record), which the warm-up drops.

So for an asynchronous trial, :func:`summarise` takes tokens/s/GPU as ``perf/total_num_tokens``
over ``timing_s/step`` and all the cluster's GPUs (``tokens_from_step_time``), the steady-state
step time as the median ``timing_s/step`` (one train batch per record with one sync per train
batch), and keeps the medians of the ``fully_async/`` metrics.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from planner.bounds import MAX_TOKENS

STEP_TIME = "timing_s/step"
THROUGHPUT = "perf/throughput"  # tokens / (step time * GPUs): tokens/s/GPU
TOTAL_TOKENS = "perf/total_num_tokens"
MFU = "perf/mfu/actor"
TIMING_PREFIX = "timing_s/"
ASYNC_PREFIX = "fully_async/"
# actor/perf/max_memory_allocated_gb, actor/perf/max_memory_reserved_gb (and any other role's)
MEMORY_KEY = re.compile(r"(^|/)perf/max_memory_\w+_gb$")

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Ray prefixes actor output with "(ActorName pid=123)" or "(ActorName pid=123, ip=10.0.0.1)";
# with RAY_DEDUP_LOGS it may add " [repeated 3x across cluster]" at the end.
_RAY_PREFIX = re.compile(r"^\s*\([^()]*\bpid=\d+[^()]*\)\s*")
_RAY_REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")
_STEP_LINE = re.compile(r"^step:(\d{1,12})(?: - (.*))?$")
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


def parse_console(lines: Iterable[str], limits: "MetricLimits | None" = None) -> list[StepRecord]:
    reader = MetricsReader(limits)
    for line in lines:
        reader.console_line(line)
    return reader.records()


def parse_jsonl(lines: Iterable[str], limits: "MetricLimits | None" = None) -> list[StepRecord]:
    """File-logger lines; a line cut short by a killed trainer (or any bad line) is skipped."""
    reader = MetricsReader(limits)
    for line in lines:
        reader.jsonl_line(line)
    return reader.records()


def _by_step(records: Iterable[StepRecord]) -> list[StepRecord]:
    """Records in step order; a step logged twice keeps its last record."""
    latest = {}
    for record in records:
        latest[record.step] = record
    return [latest[step] for step in sorted(latest)]


# --- what a metric may physically be -------------------------------------------------------

MAX_STEP = 10 ** 9
MAX_SECONDS = 1e7  # no step of a short trial takes four months
MAX_RECORD_CHARS = 1 << 20  # a step record of verl is a few KiB; longer lines are not records


@dataclass(frozen=True)
class MetricLimits:
    """Physical bounds of a trial's metrics on its cluster.

    ``max_tokens_per_s_per_gpu``: a forward pass costs at least 2 FLOPs per active parameter and
    token (Kaplan et al. 2020, "Scaling Laws", C_forward ~ 2N), so no GPU processes more than
    peak FLOP/s / (2 N) tokens per second -- GRPO's backward passes and rollout only lower it.
    ``max_memory_gb``: verl's ``max_memory_*_gb`` (``torch.cuda.max_memory_*`` / 2**30) cannot
    exceed the device's memory.
    """

    max_tokens_per_s_per_gpu: float = math.inf
    max_memory_gb: float = math.inf

    @classmethod
    def for_plan(cls, peak_flops: float, active_params: int, memory_bytes: float
                 ) -> "MetricLimits":
        return cls(max_tokens_per_s_per_gpu=peak_flops / (2.0 * max(active_params, 1)),
                   max_memory_gb=memory_bytes / 2 ** 30)

    def check(self, key: str, value: float) -> bool:
        """Whether ``value`` is a possible value of metric ``key`` (unknown keys: finite)."""
        if not math.isfinite(value):
            return False
        if key == THROUGHPUT:
            return 0.0 < value <= self.max_tokens_per_s_per_gpu
        if key == TOTAL_TOKENS:
            return value >= 0.0
        if key.startswith(TIMING_PREFIX) or key == "perf/time_per_step":
            return 0.0 <= value <= MAX_SECONDS
        if key.startswith("perf/mfu/"):
            return 0.0 <= value <= 1.0  # a fraction of the peak
        if MEMORY_KEY.search(key):
            return 0.0 <= value <= self.max_memory_gb
        if key.startswith(LENGTH_PREFIXES):  # tokens per sequence, or a share of sequences
            return 0.0 <= value <= (1.0 if key.endswith("clip_ratio") else MAX_TOKENS)
        return True


# verl's compute_data_metrics: response_length/{mean,max,min,clip_ratio}, prompt_length/...
LENGTH_PREFIXES = ("response_length/", "prompt_length/")
VALIDATED = (THROUGHPUT, TOTAL_TOKENS, TIMING_PREFIX, "perf/mfu/", "perf/time_per_step",
             *LENGTH_PREFIXES)


def _validated(key: str) -> bool:
    return key.startswith(VALIDATED) or bool(MEMORY_KEY.search(key))


class MetricsReader:
    """Step records from lines, one at a time (memory: one record per step).

    A line whose step is not a whole number in [0, 1e9], or whose measured metric (throughput,
    tokens, timings, MFU, memory) is not finite and within :class:`MetricLimits`, is skipped and
    counted in :attr:`bad_lines`; a non-finite value of any other key is dropped.
    """

    def __init__(self, limits: MetricLimits | None = None):
        self.limits = limits or MetricLimits()
        self.latest: dict[int, StepRecord] = {}
        self.bad_lines = 0

    def records(self) -> list[StepRecord]:
        return [self.latest[step] for step in sorted(self.latest)]

    def _accept(self, step, data: Mapping[str, object]) -> bool:
        if isinstance(step, bool) or not isinstance(step, (int, float)):
            self.bad_lines += 1
            return False
        if isinstance(step, float) and not (math.isfinite(step) and step.is_integer()):
            self.bad_lines += 1
            return False
        step = int(step)
        if not 0 <= step <= MAX_STEP:
            self.bad_lines += 1
            return False
        values = {}
        for key, value in data.items():
            if not isinstance(key, str) or not isinstance(value, (int, float)):
                continue
            try:
                number = float(value)  # bools count as 0/1, like the console
            except OverflowError:  # an integer beyond float's range
                number = math.inf
            if self.limits.check(key, number):
                values[key] = number
            elif _validated(key):
                self.bad_lines += 1
                return False
        earlier = self.latest.get(step)
        if earlier is not None:  # fully-async logs twice per version: merge
            values = {**earlier.data, **values}
        self.latest[step] = StepRecord(step, values)
        return True

    def console_line(self, line: str) -> bool:
        """Take one console line; False when it is no (good) step record."""
        if "step:" not in line or len(line) > MAX_RECORD_CHARS:
            return False
        record = parse_console_line(line)
        if record is None:
            return False
        return self._accept(record.step, record.data)

    def jsonl_line(self, line: str) -> bool:
        """Take one file-logger line; False when it is no (good) step record."""
        if not line.strip():
            return False
        if len(line) > MAX_RECORD_CHARS:
            self.bad_lines += 1
            return False
        try:
            item = json.loads(line)
            step, data = item["step"], item["data"]
        except (ValueError, KeyError, TypeError, RecursionError, OverflowError):
            self.bad_lines += 1  # cut short by a killed trainer, or not a record at all
            return False
        if not isinstance(data, dict):
            self.bad_lines += 1
            return False
        return self._accept(step, data)


def iter_blocks(path: Path, max_line_chars: int = MAX_RECORD_CHARS,
                chunk_bytes: int = 1 << 20):
    """The lines of ``path`` in blocks (one per chunk read; memory: one chunk and one line);
    a line longer than ``max_line_chars`` is cut to that length and the rest of it skipped."""
    with open(path, "rb") as handle:
        rest = b""
        skipping = False
        while True:
            chunk = handle.read(chunk_bytes)
            if not chunk:
                break
            parts = (rest + chunk).split(b"\n")
            rest = parts.pop()
            if skipping and parts:
                parts, skipping = parts[1:], False
            block = [part[:max_line_chars].decode("utf-8", errors="replace") for part in parts]
            if len(rest) > max_line_chars:
                if not skipping:
                    block.append(rest[:max_line_chars].decode("utf-8", errors="replace"))
                skipping, rest = True, b""
            if block:
                yield block
        if rest and not skipping:
            yield [rest.decode("utf-8", errors="replace")]


def iter_lines(path: Path, max_line_chars: int = MAX_RECORD_CHARS, chunk_bytes: int = 1 << 20):
    """The lines of ``path`` one by one (see :func:`iter_blocks`)."""
    for block in iter_blocks(path, max_line_chars, chunk_bytes):
        yield from block


def read_metrics_file(path: Path | None, limits: MetricLimits | None = None) -> MetricsReader:
    reader = MetricsReader(limits)
    if path is not None and Path(path).is_file():
        for line in iter_lines(Path(path)):
            reader.jsonl_line(line)
    return reader


def read_records(metrics_path: Path | None, log_path: Path | None,
                 limits: MetricLimits | None = None) -> tuple[list[StepRecord], str]:
    """Step records and where they came from: ``"file"``, ``"console"`` or ``"none"``."""
    records = read_metrics_file(metrics_path, limits).records()
    if records:
        return records, "file"
    reader = MetricsReader(limits)
    if log_path is not None and Path(log_path).is_file():
        for line in iter_lines(Path(log_path)):
            reader.console_line(line)
    records = reader.records()
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
    bad_lines: int = 0  # metric lines skipped as impossible (MetricsReader)
    async_metrics: Mapping[str, float] = field(default_factory=dict)  # fully_async/* medians

    @property
    def peak_memory_gb(self) -> float | None:
        return max(self.memory_gb.values()) if self.memory_gb else None

    def to_dict(self) -> dict:
        return {"steps_recorded": self.steps_recorded, "steady_steps": self.steady_steps,
                "source": self.source, "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
                "step_time_s": self.step_time_s, "mfu": self.mfu,
                "phase_times_s": dict(self.phase_times_s), "memory_gb": dict(self.memory_gb),
                "last_step": self.last_step, "bad_lines": self.bad_lines,
                **({"async_metrics": dict(self.async_metrics)} if self.async_metrics else {})}


def _median(values: list[float]) -> float | None:
    finite = [value for value in values if math.isfinite(value)]
    return float(statistics.median(finite)) if finite else None


def summarise(records: list[StepRecord], warmup_steps: int, n_gpus: int,
              source: str = "file", bad_lines: int = 0,
              limits: MetricLimits | None = None,
              tokens_from_step_time: bool = False) -> MetricsSummary:
    """Medians over the steps after the first ``warmup_steps`` (the last step is kept when a
    trial recorded no more than its warm-up), peak memory over every step.

    Tokens/s/GPU is verl's ``perf/throughput``; without it, or with ``tokens_from_step_time``
    (an asynchronous trial, see the module docstring), ``perf/total_num_tokens`` over the step
    time and ``n_gpus``.
    """
    if not records:
        return MetricsSummary(steps_recorded=0, steady_steps=0, source="none",
                              bad_lines=bad_lines)
    steady = records[warmup_steps:] or records[-1:]

    def column(key: str) -> list[float]:
        return [record.data[key] for record in steady if key in record.data]

    throughput = None if tokens_from_step_time else _median(column(THROUGHPUT))
    step_time = _median(column(STEP_TIME))
    if throughput is None and step_time and n_gpus:
        tokens = _median(column(TOTAL_TOKENS))
        throughput = tokens / (step_time * n_gpus) if tokens else None
        if throughput is not None and not (limits or MetricLimits()).check(THROUGHPUT,
                                                                            throughput):
            throughput = None
    timing_keys = sorted({key for record in steady for key in record.data
                          if key.startswith(TIMING_PREFIX)})
    # fully-async's parameter sync is timing_s/timing_s/param_sync: named param_sync here
    phases = {key[len(TIMING_PREFIX):].removeprefix(TIMING_PREFIX): value
              for key in timing_keys if (value := _median(column(key))) is not None}
    memory_keys = sorted({key for record in records for key in record.data
                          if MEMORY_KEY.search(key)})
    memory = {key: max(record.data[key] for record in records if key in record.data)
              for key in memory_keys}
    async_keys = sorted({key for record in steady for key in record.data
                         if key.startswith(ASYNC_PREFIX)})
    async_metrics = {key: value for key in async_keys
                     if (value := _median(column(key))) is not None}
    return MetricsSummary(steps_recorded=len(records), steady_steps=len(steady), source=source,
                          tokens_per_s_per_gpu=throughput, step_time_s=step_time,
                          mfu=_median(column(MFU)), phase_times_s=phases, memory_gb=memory,
                          last_step=records[-1].step, bad_lines=bad_lines,
                          async_metrics=async_metrics)
