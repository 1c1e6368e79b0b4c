"""Progress of a study: a live table on a terminal, plain lines elsewhere."""

import io
import time

import pytest

from trials.progress import LiveProgress, PlainProgress, Row, Status, format_duration, make_progress


def test_status_line_and_eta():
    status = Status(target=10, measured=4, best_value=1234.5, best_trial=3,
                    mean_trial_s=60.0)
    line = status.line()
    assert line.startswith("trial 5 of 10 | elapsed 0:00:00")
    assert "best 1,234.5 tok/s/GPU (#3)" in line and line.endswith("eta 0:06:00")
    status.deadline = time.monotonic() + 90  # --timeout ends sooner than the trials would
    assert 85 <= status.eta_s <= 90
    assert Status(target=3).line().endswith("best -- | eta --")
    assert format_duration(3725) == "1:02:05"


def test_plain_lines_for_logs():
    stream = io.StringIO()
    progress = make_progress(stream)
    assert isinstance(progress, PlainProgress)
    status = Status(target=2)
    progress.started(status, 7, "tp2-pp1")
    status.measured, status.best_value, status.best_trial = 1, 900.0, 7
    progress.finished(status, Row(7, "tp2-pp1", "ok", 900.0, 1000.0, 61.0))
    progress.finished(status, Row(8, "tp1-pp2", "oom", None, 800.0, 5.0, "oom in generate: x"))
    progress.finished(status, Row(9, "tp1-pp4", "nccl", None, 800.0, 5.0, "nccl: Watchdog"))
    progress.finished(status, Row(10, "tp4-pp1", "hang", None, 800.0, 5.0,
                                  "no progress for 600 s after 1 of 5 steps"))
    lines = stream.getvalue().splitlines()
    assert lines[0] == "[trial 1 of 2 | elapsed 0:00:00 | best -- | eta --] trial #7 started: " \
                       "tp2-pp1"
    assert lines[1].endswith("trial #7 tp2-pp1 0:01:01 900.0 tok/s/GPU (predicted 1,000.0)")
    # a finished trial's line counts the trials done, not the next trial's number
    assert lines[1].startswith("[1 of 2 done | elapsed ")
    # the category once: a reason read from the log starts with it already
    assert lines[2].endswith("trial #8 tp1-pp2 0:00:05 oom in generate: x")
    assert lines[3].endswith("trial #9 tp1-pp4 0:00:05 nccl: Watchdog")
    assert lines[4].endswith("trial #10 tp4-pp1 0:00:05 hang: no progress for 600 s after 1 of "
                             "5 steps")


@pytest.mark.needs("tune")
def test_live_table_on_a_terminal():
    from rich.console import Console

    console = Console(file=io.StringIO(), force_terminal=True, width=200)
    progress = LiveProgress(console=console)
    status = Status(target=4)
    status.running = "#0 tp2-pp1"
    progress.started(status, 0, "tp2-pp1")
    status.measured, status.best_value, status.best_trial, status.running = 1, 950.0, 0, ""
    progress.finished(status, Row(0, "tp2-pp1", "ok", 950.0, 1000.0, 30.0))
    progress.note("new best: trial #0")
    progress.close()
    text = console.file.getvalue()
    assert "plan-parallel tune" in text and "tok/s/GPU" in text and "950.0" in text
    assert "trial 2 of 4" in text and "running #0 tp2-pp1" in text and "new best" in text
