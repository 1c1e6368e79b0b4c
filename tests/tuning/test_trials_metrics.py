"""Reading what a verl trial measured: file logger JSONL, console lines, warm-up, medians."""

import json

import pytest

from trials.metrics import (
    parse_console,
    parse_console_line,
    parse_jsonl,
    parse_number,
    read_records,
    strip_log_prefix,
    summarise,
)

# verl's console logger through Ray, NumPy 2 reprs (verl/utils/logger/aggregate_logger.py)
CONSOLE = """\
(TaskRunner pid=2841) [validate_config] All configuration checks passed successfully!
(TaskRunner pid=2841) step:1 - timing_s/gen:np.float64(20.0) - timing_s/step:np.float64(40.0) - perf/throughput:np.float64(500.0) - perf/mfu/actor:np.float64(0.2) - actor/perf/max_memory_allocated_gb:np.float64(61.5) - training/global_step:1
(TaskRunner pid=2841) step:2 - timing_s/gen:np.float64(10.0) - timing_s/step:np.float64(20.0) - perf/throughput:np.float64(1000.0) - perf/mfu/actor:np.float64(0.4) - actor/perf/max_memory_allocated_gb:np.float64(60.1) - b:np.float32(2.25) - c:np.int64(3) - e:True - big:1e-07
\x1b[36m(TaskRunner pid=2841, ip=10.0.0.5)\x1b[0m step:3 - timing_s/gen:np.float64(12.0) - timing_s/step:np.float64(24.0) - perf/throughput:np.float64(900.0) - perf/mfu/actor:np.float64(0.36)
(TaskRunner pid=2841) step:4 - timing_s/gen:np.float64(11.0) - timing_s/step:np.float64(22.0) - perf/throughput:np.float64(950.0) - perf/mfu/actor:np.float64(0.38) - actor/perf/max_memory_reserved_gb:np.float64(70.0) [repeated 2x across cluster]
(WorkerDict pid=3000) some worker chatter: step:9 is not at the start
"""


def test_numbers_as_the_console_prints_them():
    assert parse_number("np.float64(1.5)") == 1.5
    assert parse_number("np.float32(2.25)") == 2.25
    assert parse_number("np.int64(3)") == 3.0
    assert parse_number("True") == 1.0 and parse_number("False") == 0.0
    assert parse_number("1e-07") == 1e-07
    assert parse_number("np.float64(nan)") != parse_number("np.float64(nan)")  # nan
    assert parse_number("tensor(1.0)") is None


def test_console_lines_with_ray_prefixes():
    assert strip_log_prefix("(TaskRunner pid=1, ip=10.0.0.1) step:1 - a:1") == "step:1 - a:1"
    records = parse_console(CONSOLE.splitlines())
    assert [r.step for r in records] == [1, 2, 3, 4]
    assert records[1].data["perf/throughput"] == 1000.0
    assert records[1].data["b"] == 2.25 and records[1].data["c"] == 3.0
    assert records[1].data["e"] == 1.0 and records[1].data["big"] == 1e-07
    assert records[3].data["actor/perf/max_memory_reserved_gb"] == 70.0
    assert parse_console_line("(WorkerDict pid=3) chatter step:9 - a:1") is None


def test_jsonl_skips_a_line_cut_short_and_keeps_the_last_record_of_a_step():
    lines = [json.dumps({"step": 1, "data": {"perf/throughput": 1.0}}),
             json.dumps({"step": 2, "data": {"perf/throughput": 2.0, "flag": True}}),
             json.dumps({"step": 2, "data": {"perf/throughput": 3.0}}),
             '{"step":3,"data":{"perf/thr']
    records = parse_jsonl(lines)
    assert [(r.step, r.data["perf/throughput"]) for r in records] == [(1, 1.0), (2, 3.0)]


def test_summary_drops_warmup_and_takes_medians():
    summary = summarise(parse_console(CONSOLE.splitlines()), warmup_steps=1, n_gpus=8,
                        source="console")
    assert summary.steps_recorded == 4 and summary.steady_steps == 3
    assert summary.tokens_per_s_per_gpu == 950.0  # median of 1000, 900, 950 (not step 1's 500)
    assert summary.step_time_s == 22.0
    assert summary.phase_times_s == {"gen": 11.0, "step": 22.0}
    assert summary.mfu == pytest.approx(0.38)
    # peak memory over every step, warm-up included
    assert summary.memory_gb == {"actor/perf/max_memory_allocated_gb": 61.5,
                                 "actor/perf/max_memory_reserved_gb": 70.0}
    assert summary.peak_memory_gb == 70.0


def test_throughput_from_tokens_when_verl_does_not_say():
    records = parse_jsonl([json.dumps({"step": s, "data": {"timing_s/step": 10.0,
                                                           "perf/total_num_tokens": 16000}})
                           for s in (1, 2, 3)])
    assert summarise(records, 1, n_gpus=8).tokens_per_s_per_gpu == 200.0


def test_a_trial_that_recorded_only_its_warmup_keeps_its_last_step():
    records = parse_console(CONSOLE.splitlines()[:2])
    summary = summarise(records, warmup_steps=1, n_gpus=8)
    assert summary.steady_steps == 1 and summary.tokens_per_s_per_gpu == 500.0
    assert summarise([], 1, 8).tokens_per_s_per_gpu is None


def test_file_first_console_as_fallback(tmp_path):
    log = tmp_path / "trainer.log"
    log.write_text(CONSOLE)
    metrics = tmp_path / "metrics.jsonl"
    records, source = read_records(metrics, log)
    assert source == "console" and len(records) == 4
    metrics.write_text(json.dumps({"step": 1, "data": {"perf/throughput": 7.0}}) + "\n")
    records, source = read_records(metrics, log)
    assert source == "file" and records[0].data["perf/throughput"] == 7.0
    assert read_records(None, tmp_path / "missing.log") == ([], "none")


# --- bad metric lines: skipped and counted, never a crash, never the best (issue 17) ---------

GOOD = {"perf/throughput": 1000.0, "timing_s/step": 20.0, "perf/mfu/actor": 0.3,
        "actor/perf/max_memory_allocated_gb": 60.0}


def test_impossible_metric_lines_are_skipped_and_counted():
    from trials.metrics import MetricLimits, MetricsReader

    limits = MetricLimits.for_plan(989e12, 7_600_000_000, 80 * 2 ** 30)  # ~65,000 tok/s/GPU
    assert 60_000 < limits.max_tokens_per_s_per_gpu < 70_000
    nested = "[" * 100_000 + "]" * 100_000
    lines = [json.dumps({"step": 1, "data": GOOD}),
             '{"step": Infinity, "data": {"perf/throughput": 5.0}}',  # Python's json reads it
             '{"step": NaN, "data": {}}', '{"step": 1e400, "data": {}}',
             '{"step": 2.5, "data": {}}', '{"step": -1, "data": {}}', '{"step": true, "data": {}}',
             json.dumps({"step": 2, "data": {**GOOD, "perf/throughput": 1e308}}),
             json.dumps({"step": 2, "data": {**GOOD, "perf/throughput": -5000.0}}),
             json.dumps({"step": 2, "data": {**GOOD, "perf/mfu/actor": 3.0}}),
             json.dumps({"step": 2, "data": {**GOOD, "timing_s/step": -1.0}}),
             json.dumps({"step": 2, "data": {**GOOD, "actor/perf/max_memory_allocated_gb": 9e9}}),
             '{"step": 2, "data": {"perf/throughput": ' + "9" * 400 + "}}",  # an int beyond float
             '{"step": 2, "data": ' + nested + "}", nested, "x" * (2 << 20),
             json.dumps({"step": 3, "data": {**GOOD, "actor/pg_loss": float("nan")}}),
             '{"step":4,"data":{"perf/thr']  # cut short by a killed trainer
    reader = MetricsReader(limits)
    for line in lines:
        reader.jsonl_line(line)
    records = reader.records()
    assert [r.step for r in records] == [1, 3]
    assert records[1].data["perf/throughput"] == 1000.0 and "actor/pg_loss" not in records[1].data
    assert reader.bad_lines == len(lines) - 2
    summary = summarise(records, 0, 8, bad_lines=reader.bad_lines, limits=limits)
    assert summary.tokens_per_s_per_gpu == 1000.0 and summary.to_dict()["bad_lines"] == 16


def test_console_lines_with_absurd_values_are_skipped():
    from trials.metrics import MetricLimits

    lines = ["(TaskRunner pid=1) step:1 - perf/throughput:np.float64(800.0)",
             "(TaskRunner pid=1) step:2 - perf/throughput:np.float64(inf)",
             "(TaskRunner pid=1) step:3 - perf/throughput:1e308",
             "(TaskRunner pid=1) step:" + "9" * 5000 + " - perf/throughput:1.0",
             "(TaskRunner pid=1) step:4 - perf/throughput:np.float64(900.0)"]
    records = parse_console(lines, MetricLimits(max_tokens_per_s_per_gpu=1e5))
    assert [(r.step, r.data["perf/throughput"]) for r in records] == [(1, 800.0), (4, 900.0)]


MEMORY_PROBE = """
import resource, sys
from trials.logscan import scan_log
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
scan = scan_log(sys.argv[1])
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(after - before, scan.size_bytes, [r.step for r in scan.records], scan.error_line,
      len(scan.lines), max(map(len, scan.lines)), sep="|")
"""


def test_a_huge_log_is_read_in_bounded_memory(tmp_path):
    """64 MiB of log (with a 5 MiB line without end) raises the peak memory of the process that
    scans it by well under 32 MiB (it held 2.4x the file before)."""
    import os
    import subprocess
    import sys

    log = tmp_path / "trainer.log"
    chatter = ("(WorkerDict pid=7) INFO some worker chatter that repeats " * 3 + "\n") * 4000
    with open(log, "w") as handle:
        handle.write("(TaskRunner pid=1) step:1 - perf/throughput:np.float64(500.0)\n")
        while handle.tell() < 64 << 20:
            handle.write(chatter)
        handle.write("y" * (5 << 20) + "\n")
        handle.write("(TaskRunner pid=1) step:2 - perf/throughput:np.float64(700.0)\n")
        handle.write("ModuleNotFoundError: No module named 'transfer_queue'\n")
    done = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(log)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": os.getcwd()}, check=True)
    rise_kib, size, steps, error, kept, longest = done.stdout.strip().split("|")
    assert int(size) > 69 << 20 and int(rise_kib) < 32 << 10, rise_kib
    assert steps == "[1, 2]"
    assert error == "ModuleNotFoundError: No module named 'transfer_queue'"
    assert int(kept) <= 200 and int(longest) <= 2000
