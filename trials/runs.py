"""A verl run as the planner reads it: per-step metrics from the files users have.

Formats (verl 0.9.1 ``verl/utils/tracking.py``; the CSV layouts of the trackers verl logs to):

* ``jsonl`` -- verl's file logger (``trainer.logger=[...,file]``): one ``{"step": N, "data":
  {...}}`` line per step (orjson, NumPy scalars serialised as numbers);
* ``console`` -- verl's console logger: ``step:N - key:value - ...`` per step, numbers through
  ``pprint.pformat`` (NumPy 2 scalars as ``np.float64(1.5)``), Ray's ``(TaskRunner pid=...)``
  prefix and colours allowed (:func:`trials.metrics.parse_console_line`);
* ``wandb-csv`` -- a wandb export: ``run.history()`` written with ``to_csv`` (a ``_step``
  column, metric names as logged, ``_runtime``/``_timestamp`` beside them), or a panel's
  "Export CSV" (``Step``, ``<run> - <metric>``, and ``__MIN``/``__MAX`` columns, dropped);
* ``mlflow-csv`` -- MLflow's metric history in long form: the UI chart's "Download CSV"
  (``Run``, ``Run ID``, ``metric``, ``step``, ``timestamp``, ``value``) or the REST/SDK history
  (``key``, ``value``, ``timestamp``, ``step``); verl's MLflow adapter keeps ``/`` in keys;
* ``mlflow-dir`` -- an MLflow file-store run folder (``mlruns/<exp>/<run>/``): one file per
  metric under ``metrics/`` (``/`` in a key is a sub-folder), lines ``<timestamp> <value>
  <step>``.

A folder is searched (top level only) for one of these, in that order of preference.  What is
kept, per step (:data:`KEPT_PREFIXES`): ``response_length/*``, ``prompt_length/*``, every
``timing_s/*``, every ``perf/*`` and the memory keys (``*/perf/max_memory_*_gb``).  Every value
is checked (:class:`trials.metrics.MetricLimits`: finite, timings in 0..1e7 s, lengths in
0..2^24 tokens, ratios in 0..1); a bad line is skipped and counted, a bad CSV cell is an error
naming its column and row.  Sizes are bounded before reading (:data:`MAX_LOG_BYTES`,
:data:`MAX_CSV_BYTES`, :data:`MAX_STEPS`, :data:`MAX_COLUMNS`).
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import numpy as np

from planner.bounds import MAX_TOKENS, file_size, read_text, shown
from planner.catalog.lengths import ResponseLengths
from planner.errors import PlanInputError, ResourceLimitError
from trials.metrics import (
    MAX_RECORD_CHARS,
    MEMORY_KEY,
    MetricsReader,
    iter_blocks,
    parse_number,
)

if TYPE_CHECKING:
    import pandas as pd

FORMATS = ("jsonl", "console", "wandb-csv", "mlflow-csv", "mlflow-dir")
KEPT_PREFIXES = ("response_length/", "prompt_length/", "timing_s/", "perf/")
MAX_LOG_BYTES = 2 << 30  # a console log or JSONL, read as a stream (bounded memory)
MAX_CSV_BYTES = 256 << 20  # a CSV export, read whole
MAX_STEPS = 200_000  # steps kept (a verl run of this length logs ~1 GB of metrics)
MAX_COLUMNS = 20_000  # metric columns of a CSV export / metric files of an MLflow run
MAX_SEARCHED = 1000  # entries of a folder looked at
STEP_COLUMNS = ("_step", "step", "Step", "global_step", "trainer/global_step")
RESPONSE_MEAN = "response_length/mean"
STEP_TIME = "timing_s/step"
CONSOLE_SUFFIXES = (".log", ".txt", ".out", ".err")
FIELD = "run"


def kept(key: str) -> bool:
    return key.startswith(KEPT_PREFIXES) or bool(MEMORY_KEY.search(key))


@dataclass(frozen=True)
class RunRecord:
    """One verl run's per-step metrics: ``steps`` is indexed by the step (ascending, unique),
    one float column per kept key, NaN where a step did not log it."""

    path: str
    format: str  # one of FORMATS
    steps: "pd.DataFrame"
    bad_lines: int = 0  # lines (or records) skipped as impossible or unreadable

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"format {self.format!r} is not one of {FORMATS}")

    @property
    def name(self) -> str:
        return Path(self.path).name or self.path

    def has(self, key: str) -> bool:
        return key in self.steps.columns and bool(self.steps[key].notna().any())

    def series(self, key: str) -> "pd.Series":
        """``key`` per step, steps that did not log it left out."""
        return self.steps[key].dropna() if key in self.steps.columns else self.steps.iloc[:0, 0]

    def require(self, *keys: str) -> None:
        missing = [key for key in keys if not self.has(key)]
        if missing:
            raise PlanInputError(f"{FIELD} {self.path!r} ({self.format}) has no "
                                 f"{', '.join(missing)} in any step; verl logs them every step "
                                 f"(is it a verl GRPO run's metrics?)")

    def response_lengths(self, max_tokens: int | None = None) -> ResponseLengths:
        """The run's mean response length as a straight line over its steps (least squares of
        ``response_length/mean`` on the step), from the first logged step to the last.
        ``max_tokens``: the job's ``data.max_response_length``; without it, the longest response
        the run logged (``response_length/max``), a lower bound."""
        self.require(RESPONSE_MEAN)
        means = self.series(RESPONSE_MEAN)
        if max_tokens is None:
            longest = self.series("response_length/max")
            max_tokens = int(np.ceil(max(longest.max() if len(longest) else 0, means.max())))
        steps = means.index.to_numpy(dtype=float)
        values = means.to_numpy(dtype=float)
        if len(values) >= 2 and steps[-1] > steps[0]:
            slope, intercept = np.polyfit(steps, values, 1)
            start, end = intercept + slope * steps[0], intercept + slope * steps[-1]
        else:
            start = end = float(values.mean())
        top = float(means.max())
        if top > max_tokens:
            raise PlanInputError(f"{FIELD} {self.path!r}: response_length/mean reaches "
                                 f"{top:.0f} tokens, above the maximum response length "
                                 f"{max_tokens} (--response-length / data.max_response_length)")
        start, end = (float(min(max(value, 1.0), max_tokens)) for value in (start, end))
        first, last = int(means.index[0]), int(means.index[-1])
        return ResponseLengths(round(start, 1), round(end, 1), int(max_tokens), source="run",
                               basis=f"{self.name} ({self.format}), steps {first}-{last}")

    def response_cap(self) -> int | None:
        """The run's own ``data.max_response_length`` where its metrics show it: the longest
        response (``response_length/max``) of a run that cut some
        (``response_length/clip_ratio`` above 0, verl's ``compute_data_metrics``); None: no
        response was cut, or not logged."""
        clipped, longest = self.series("response_length/clip_ratio"), \
            self.series("response_length/max")
        if not len(clipped) or not len(longest) or float(clipped.max()) <= 0:
            return None
        return int(round(float(longest.max())))

    def windows(self, count: int = 3, warmup_steps: int = 1) -> list["RunWindow"]:
        """The steps after the first ``warmup_steps`` cut into up to ``count`` consecutive
        windows of (nearly) equal size, each reduced to its medians: measurements at different
        lengths of one run."""
        steady = self.steps.iloc[warmup_steps:] if len(self.steps) > warmup_steps \
            else self.steps.iloc[-1:]
        parts = np.array_split(np.arange(len(steady)), min(count, len(steady)))
        out = []
        for part in parts:
            frame = steady.iloc[part]
            medians = {key: float(value) for key, value in frame.median().items()
                       if np.isfinite(value)}
            out.append(RunWindow(int(frame.index[0]), int(frame.index[-1]), len(frame),
                                 medians))
        return out


@dataclass(frozen=True)
class RunWindow:
    """Consecutive steps of a run reduced to the median of each metric."""

    first_step: int
    last_step: int
    steps: int
    medians: dict


# --- the formats ---------------------------------------------------------------------------


def _limits():
    from trials.metrics import MetricLimits

    return MetricLimits()


def _frame(records: dict[int, dict], path: Path, kind: str, bad: int) -> RunRecord:
    import pandas as pd

    if not records:
        raise PlanInputError(f"{FIELD} {str(path)!r} holds no verl step records"
                             + (f" ({bad} unreadable or impossible line(s))" if bad else "")
                             + "; valid: verl's file-logger JSONL ({\"step\": N, \"data\": "
                               "{...}}), its console log (step:N - key:value - ...), a wandb or "
                               "MLflow CSV export, or an MLflow run folder")
    frame = pd.DataFrame.from_dict(records, orient="index").sort_index()
    frame = frame[[column for column in frame.columns if kept(str(column))]].astype(float)
    frame.index = frame.index.astype(int)
    frame.index.name = "step"
    if frame.shape[1] == 0:
        raise PlanInputError(f"{FIELD} {str(path)!r} ({kind}) logs none of verl's "
                             f"response_length/*, timing_s/* or perf/* metrics")
    return RunRecord(str(path), kind, frame, bad)


def _read_lines(path: Path, kind: str) -> RunRecord:
    file_size(path, FIELD, MAX_LOG_BYTES)
    reader = MetricsReader(_limits())
    take = reader.jsonl_line if kind == "jsonl" else reader.console_line
    for block in iter_blocks(path):
        for line in block:
            take(line)
        if len(reader.latest) > MAX_STEPS:
            raise _too_many_steps(path)
    records = {step: dict(record.data) for step, record in reader.latest.items()}
    return _frame(records, path, kind, reader.bad_lines)


def _cell(value: str, column: str, row: int, path: Path) -> float | None:
    """A CSV cell as a number; None when empty (a metric the step did not log)."""
    text = value.strip()
    if not text:
        return None
    number = parse_number(text)
    if number is None:
        raise PlanInputError(f"{FIELD} {str(path)!r}: column {shown(column)} row {row} holds "
                             f"{shown(text)}, not a number")
    return number


def _too_many_steps(path: Path) -> ResourceLimitError:
    return ResourceLimitError(f"{FIELD} {str(path)!r} logs more than {MAX_STEPS:,} steps; the "
                              f"bound is {MAX_STEPS:,}")


def _step_record(records: dict[int, dict], step: int, path: Path) -> dict:
    """The values of ``step`` (a new one while the run stays within :data:`MAX_STEPS`)."""
    if step not in records and len(records) >= MAX_STEPS:
        raise _too_many_steps(path)
    return records.setdefault(step, {})


def _rows(path: Path, header: list[str], rows) -> Iterable[tuple[int, list[str]]]:
    """The non-empty rows, numbered as lines of the file, each with the header's width."""
    try:
        for number, row in enumerate(rows, start=2):
            if not row:
                continue
            if len(row) != len(header):
                raise PlanInputError(f"{FIELD} {str(path)!r}: row {number} has {len(row)} "
                                     f"fields, the header {len(header)}")
            yield number, row
    except csv.Error as error:
        raise PlanInputError(f"{FIELD} {str(path)!r} is not valid CSV ({error})") from None


def _check_value(key: str, value: float, path: Path, where: str) -> None:
    if not _limits().check(key, value):
        raise PlanInputError(f"{FIELD} {str(path)!r}: {shown(key)} = {value!r} at {where} is "
                             f"not a possible value (finite; seconds 0..1e7, tokens "
                             f"0..{MAX_TOKENS:,}, ratios 0..1)")


def _step(value: float, path: Path, where: str) -> int:
    if not (np.isfinite(value) and float(value).is_integer() and 0 <= value <= 1e9):
        raise PlanInputError(f"{FIELD} {str(path)!r}: step {value!r} at {where} is not a whole "
                             f"number in 0..1,000,000,000")
    return int(value)


def _csv_rows(path: Path) -> tuple[list[str], Iterable[list[str]]]:
    file_size(path, FIELD, MAX_CSV_BYTES)
    text = read_text(path, FIELD, MAX_CSV_BYTES)
    first = text.split("\n", 1)[0]
    if len(first) > MAX_RECORD_CHARS * 4:
        raise ResourceLimitError(f"{FIELD} {str(path)!r}: header of {len(first):,} characters")
    csv.field_size_limit(MAX_RECORD_CHARS)
    rows = csv.reader(io.StringIO(text))
    try:
        header = next(rows)
    except StopIteration:
        raise PlanInputError(f"{FIELD} {str(path)!r} is empty") from None
    except csv.Error as error:
        raise PlanInputError(f"{FIELD} {str(path)!r} is not CSV ({error})") from None
    if len(header) > MAX_COLUMNS:
        raise ResourceLimitError(f"{FIELD} {str(path)!r} has {len(header):,} columns; the bound "
                                 f"is {MAX_COLUMNS:,}")
    return header, rows


_PANEL_RUN = re.compile(r"^(?P<run>.+?) - (?P<key>[^ ].*)$")


def _wide_key(column: str) -> tuple[str, str] | None:
    """``(run, key)`` of a wandb column: ``key`` as logged, or a panel's ``<run> - <key>``;
    None for ``__MIN``/``__MAX`` and wandb's own columns."""
    if column.endswith(("__MIN", "__MAX")) or column.startswith("_"):
        return None
    match = _PANEL_RUN.match(column)
    if match and kept(match.group("key")):
        return match.group("run"), match.group("key")
    return ("", column) if kept(column) else None


def _read_wide(path: Path, header: list[str], rows) -> RunRecord:
    step_column = next((name for name in STEP_COLUMNS if name in header), None)
    keys = {index: _wide_key(name) for index, name in enumerate(header)}
    keys = {index: pair for index, pair in keys.items() if pair is not None}
    runs = sorted({run for run, _ in keys.values()})
    if len(runs) > 1:
        raise PlanInputError(f"{FIELD} {str(path)!r} holds {len(runs)} runs ("
                             f"{', '.join(shown(run, 30) for run in runs[:3])}); export one run")
    records: dict[int, dict] = {}
    at = header.index(step_column)
    for number, row in _rows(path, header, rows):
        step_value = _cell(row[at], step_column, number, path)
        if step_value is None:  # a row of a metric logged without a step: not a step
            continue
        values = _step_record(records, _step(step_value, path, f"row {number}"), path)
        for index, (_, key) in keys.items():
            value = _cell(row[index], header[index], number, path)
            if value is not None:
                _check_value(key, value, path, f"row {number}")
                values[key] = value
    return _frame(records, path, "wandb-csv", 0)


def _read_long(path: Path, header: list[str], rows) -> RunRecord:
    lower = [name.strip().lower() for name in header]
    key_at = lower.index("metric") if "metric" in lower else lower.index("key")
    step_at, value_at = lower.index("step"), lower.index("value")
    run_at = lower.index("run id") if "run id" in lower else (
        lower.index("run_id") if "run_id" in lower else None)
    runs: set[str] = set()
    records: dict[int, dict] = {}
    for number, row in _rows(path, header, rows):
        if run_at is not None:
            runs.add(row[run_at])
            if len(runs) > 1:
                raise PlanInputError(f"{FIELD} {str(path)!r} holds more than one run "
                                     f"({', '.join(shown(r, 30) for r in sorted(runs))}); "
                                     f"export one run")
        key = row[key_at].strip()
        if not kept(key):
            continue
        step_value = _cell(row[step_at], header[step_at], number, path)
        value = _cell(row[value_at], header[value_at], number, path)
        if step_value is None or value is None:
            raise PlanInputError(f"{FIELD} {str(path)!r}: row {number} has no "
                                 f"{'step' if step_value is None else 'value'}")
        _check_value(key, value, path, f"row {number}")
        _step_record(records, _step(step_value, path, f"row {number}"), path)[key] = value
    return _frame(records, path, "mlflow-csv", 0)


def _read_csv(path: Path) -> RunRecord:
    header, rows = _csv_rows(path)
    lower = {name.strip().lower() for name in header}
    if {"step", "value"} <= lower and lower & {"metric", "key"}:
        return _read_long(path, header, rows)
    if any(name in header for name in STEP_COLUMNS):
        return _read_wide(path, header, rows)
    raise PlanInputError(f"{FIELD} {str(path)!r}: a CSV with neither a step column "
                         f"({', '.join(STEP_COLUMNS)}: a wandb export) nor metric/step/value "
                         f"columns (an MLflow export); header {shown(','.join(header[:6]))}")


def _read_mlflow_dir(folder: Path) -> RunRecord:
    metrics = folder / "metrics"
    records: dict[int, dict] = {}
    files = 0
    for item in sorted(metrics.rglob("*")):
        if not item.is_file():
            continue
        files += 1
        if files > MAX_COLUMNS:
            raise ResourceLimitError(f"{FIELD} {str(folder)!r} holds more than {MAX_COLUMNS:,} "
                                     f"metric files")
        key = item.relative_to(metrics).as_posix()
        if not kept(key):
            continue
        text = read_text(item, FIELD, MAX_CSV_BYTES)
        for number, line in enumerate(text.splitlines(), start=1):
            parts = line.split()
            if not parts:
                continue
            where = f"{key} line {number}"
            if len(parts) != 3:
                raise PlanInputError(f"{FIELD} {str(folder)!r}: {where} is not '<timestamp> "
                                     f"<value> <step>'")
            value = parse_number(parts[1])
            step_value = parse_number(parts[2])
            if value is None or step_value is None:
                raise PlanInputError(f"{FIELD} {str(folder)!r}: {where} holds "
                                     f"{shown(line)}, not numbers")
            _check_value(key, value, folder, where)
            _step_record(records, _step(step_value, folder, where), folder)[key] = value
    return _frame(records, folder, "mlflow-dir", 0)


def _sniff(path: Path) -> str:
    """``jsonl`` or ``console`` for a log file: JSON objects line by line, or anything else."""
    with open(path, "rb") as handle:
        head = handle.read(4096).lstrip()
    return "jsonl" if head.startswith(b"{") else "console"


def _in_folder(folder: Path) -> Path:
    """The one run file a folder holds (JSONL, then CSV, then a console log)."""
    if (folder / "metrics").is_dir() and (folder / "meta.yaml").is_file():
        return folder
    entries = []
    for index, item in enumerate(sorted(folder.iterdir())):
        if index >= MAX_SEARCHED:
            break
        if item.is_file():
            entries.append(item)
    for suffixes in ((".jsonl",), (".csv",), CONSOLE_SUFFIXES):
        found = [item for item in entries if item.suffix.lower() in suffixes]
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise PlanInputError(f"{FIELD} folder {str(folder)!r} holds {len(found)} "
                                 f"{'/'.join(suffixes)} files ("
                                 f"{', '.join(item.name for item in found[:3])}); pass one")
    raise PlanInputError(f"{FIELD} folder {str(folder)!r} holds no verl run (a file-logger "
                         f".jsonl, a wandb/MLflow .csv, a console .log, or an MLflow run folder)")


def read_run(path: str | Path) -> RunRecord:
    """The run at ``path``: a file in any of :data:`FORMATS`, or a folder holding one."""
    path = Path(path)
    if not path.exists():
        raise PlanInputError(f"{FIELD} {str(path)!r} does not exist")
    if path.is_dir():
        path = _in_folder(path)
        if path.is_dir():
            return _read_mlflow_dir(path)
    if path.suffix.lower() == ".csv":
        return _read_csv(path)
    if path.suffix.lower() == ".jsonl":
        return _read_lines(path, "jsonl")
    file_size(path, FIELD, MAX_LOG_BYTES)
    return _read_lines(path, _sniff(path))
