"""Reading a verl run (trials/runs.py) in the formats users have, written by
tests/fixtures/verl_runs.py from the published timings of grpo_runs.csv row 62."""

from __future__ import annotations

import numpy as np
import pytest
from fixtures.verl_runs import (
    concat_dict_to_str,
    run_records,
    write_console,
    write_jsonl,
    write_mlflow_chart,
    write_mlflow_dir,
    write_wandb_history,
    write_wandb_panel,
)

from planner.errors import PlanInputError, ResourceLimitError
from trials import runs
from trials.runs import read_run

KEYS = ["response_length/mean", "response_length/max", "response_length/clip_ratio",
        "prompt_length/mean", "timing_s/step", "timing_s/gen", "timing_s/update_actor",
        "timing_s/old_log_prob", "timing_s/update_weights", "perf/mfu/actor",
        "perf/max_memory_allocated_gb"]
STEPS = 12


@pytest.fixture
def records():
    # mean response 1000 -> 2000 tokens over 12 steps (a doubling), published timings
    return run_records(62, steps=STEPS, growth=2.0, mean=1000 * 2 ** 0.5)


WRITERS = {
    "jsonl": lambda path, records: write_jsonl(path / "run.jsonl", records),
    "console": lambda path, records: write_console(path / "trainer.log", records),
    "wandb-csv": lambda path, records: write_wandb_history(path / "history.csv", records),
    "wandb-panel": lambda path, records: write_wandb_panel(path / "panel.csv", records, KEYS),
    "mlflow-csv": lambda path, records: write_mlflow_chart(path / "metrics.csv", records, KEYS),
    "mlflow-dir": lambda path, records: write_mlflow_dir(path / "mlruns" / "0" / "3f2a9c",
                                                         records),
}


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_lengths_and_timings_are_read_from_every_format(kind, records, tmp_path):
    run = read_run(WRITERS[kind](tmp_path, records))
    assert run.format == kind.replace("wandb-panel", "wandb-csv")
    assert list(run.steps.index) == list(range(1, STEPS + 1))
    lengths = run.response_lengths(8192)
    assert (lengths.start_tokens, lengths.end_tokens) == pytest.approx((1000, 2000), abs=0.2)
    assert lengths.source == "run" and "steps 1-12" in lengths.basis
    assert run.series("timing_s/update_actor").iloc[0] == pytest.approx(167.0)
    assert run.series("timing_s/gen").iloc[0] == pytest.approx(161.0 - 3.1)
    assert run.series("perf/max_memory_allocated_gb").iloc[-1] == pytest.approx(52.3)
    if kind not in ("wandb-panel", "mlflow-csv"):  # those export the chosen keys only
        assert run.has("timing_s/agent_loop/generate_sequences/max")  # np.float64 in verl
        assert not any(name.startswith(("actor/", "critic/", "training/"))
                       for name in run.steps.columns)


def test_the_console_format_is_verls_own():
    verl_logger = pytest.importorskip("verl.utils.logger.aggregate_logger")
    for step, data in run_records(62, steps=2):
        assert concat_dict_to_str(data, step) == verl_logger.concat_dict_to_str(data, step)
    line = concat_dict_to_str(run_records(62, steps=1)[0][1], 1)
    assert "timing_s/agent_loop/generate_sequences/max:np.float64(" in line


def test_a_folder_is_searched_for_its_one_run(records, tmp_path):
    write_jsonl(tmp_path / "qwen_dapo.jsonl", records)
    write_console(tmp_path / "trainer.log", records)
    assert read_run(tmp_path).format == "jsonl"  # the exact file logger first
    write_jsonl(tmp_path / "other.jsonl", records)
    with pytest.raises(PlanInputError, match="holds 2 .jsonl files"):
        read_run(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(PlanInputError, match="holds no verl run"):
        read_run(empty)


def test_windows_are_medians_of_consecutive_steps(records, tmp_path):
    run = read_run(write_jsonl(tmp_path / "run.jsonl", records))
    windows = run.windows(3, warmup_steps=1)
    assert [(w.first_step, w.last_step) for w in windows] == [(2, 5), (6, 9), (10, 12)]
    means = [w.medians["response_length/mean"] for w in windows]
    assert means == sorted(means)


# --- bad and partial logs ---------------------------------------------------------------------


def test_a_cut_line_and_an_impossible_value_are_skipped_and_counted(records, tmp_path):
    path = write_jsonl(tmp_path / "run.jsonl", records)
    text = path.read_text().splitlines()
    text[3] = text[3][:40]  # killed mid-write
    text[5] = text[5].replace('"timing_s/step":', '"timing_s/step":-', 1)  # negative seconds
    path.write_text("\n".join(text) + "\n")
    run = read_run(path)
    assert run.bad_lines == 2 and len(run.steps) == STEPS - 2


@pytest.mark.parametrize("name, text, message", [
    ("run.jsonl", "", "holds no verl step records"),
    ("run.jsonl", '{"step": 1, "data": {"actor/loss": 0.1}}\n', "logs none of verl's"),
    ("run.log", "hello\n", "holds no verl step records"),
    ("run.csv", "", "is empty"),
    ("run.csv", "a,b\n1,2\n", "neither a step column"),
    ("run.csv", "_step,timing_s/step\n1,abc\n", "row 2 holds 'abc', not a number"),
    ("run.csv", "_step,timing_s/step\n1,nan\n", "not a possible value"),
    ("run.csv", "_step,timing_s/step\n1,inf\n", "not a possible value"),
    ("run.csv", "_step,response_length/mean\n1,-4\n", "not a possible value"),
    ("run.csv", "_step,timing_s/step\n1.5,3\n", "step 1.5 at row 2 is not a whole number"),
    ("run.csv", "_step,timing_s/step\n1,2,3\n", "row 2 has 3 fields"),
    ("run.csv", "Step,a - timing_s/step,b - timing_s/step\n1,2,3\n", "holds 2 runs"),
    ("run.csv", "Run,Run ID,metric,step,timestamp,value\nx,1,timing_s/step,1,0,2\n"
                "y,2,timing_s/step,1,0,2\n", "more than one run"),
    ("run.csv", "key,value,timestamp,step\ntiming_s/step,,0,1\n", "row 2 has no value"),
])
def test_bad_logs_are_one_line_errors(name, text, message, tmp_path):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(PlanInputError) as error:
        read_run(path)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_run_without_verls_lengths_says_which_key(records, tmp_path):
    stripped = [(step, {k: v for k, v in data.items() if not k.startswith("response_length")})
                for step, data in records]
    run = read_run(write_jsonl(tmp_path / "run.jsonl", stripped))
    with pytest.raises(PlanInputError, match="has no response_length/mean in any step"):
        run.response_lengths(8192)


def test_lengths_beyond_the_maximum_are_refused(records, tmp_path):
    run = read_run(write_jsonl(tmp_path / "run.jsonl", records))
    with pytest.raises(PlanInputError, match="above the maximum response length 1024"):
        run.response_lengths(1024)
    assert run.response_lengths().max_tokens == 8192  # the run's own response_length/max


def test_sizes_are_bounded_before_reading(records, tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "run.jsonl", records)
    monkeypatch.setattr(runs, "MAX_LOG_BYTES", 100)
    with pytest.raises(ResourceLimitError, match="the bound is 100 bytes"):
        read_run(path)
    monkeypatch.setattr(runs, "MAX_LOG_BYTES", 1 << 30)
    monkeypatch.setattr(runs, "MAX_STEPS", 5)
    with pytest.raises(ResourceLimitError, match="more than 5 steps"):
        read_run(path)
    csv_path = write_wandb_history(tmp_path / "h.csv", records)
    with pytest.raises(ResourceLimitError, match="more than 5 steps"):
        read_run(csv_path)


def test_a_console_log_with_colours_and_numpy_scalars(records, tmp_path):
    path = write_console(tmp_path / "trainer.log", records)
    text = path.read_text().replace("step:3 -", "\x1b[36mstep:3 -")
    path.write_text(text)
    run = read_run(path)
    assert len(run.steps) == STEPS and np.isfinite(run.steps["timing_s/step"]).all()
