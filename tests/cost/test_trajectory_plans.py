"""Plans over the run: the fitted default lengths, the step time at the start and end of the
trajectory, ranking by the expected step time, sizing's integral, the fastest layout inside the
band, and the lines every answer prints about what it rests on."""

import json

import numpy as np
import pytest

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.lengths import ResponseLengths, default_lengths
from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cli.main import main
from planner.cost.request import PlanRequest
from planner.cost.timing import step_columns
from planner.cost.trajectory import (
    END_COLUMN,
    START_COLUMN,
    columns_over_run,
    step_columns_over_run,
    workload_at,
)
from planner.plan import PlanReads, make_plan
from planner.ranking import fastest_in_band
from planner.search.layout import Layout

MODEL = "qwen3-8b"
H100 = ClusterSpec(get_gpu("h100"), 8, 8)
PLAN = ["plan", "--model", MODEL, "--gpus", "8", "--gpu-type", "h100", "--top", "3",
        "--response-length", "8192"]


def _plan(lengths: ResponseLengths, tolerance: float = 0.0):
    workload = GrpoWorkload(response_length=lengths.max_tokens, lengths=lengths)
    return make_plan(PlanRequest(resolve_model(MODEL), H100, workload), tie_tolerance=tolerance)


# --- 1. the fitted default, stated under every answer -----------------------------------------

def test_no_lengths_given_is_the_fitted_default_for_the_kind_not_half_the_max(capsys):
    assert main(PLAN + ["--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    expected = default_lengths(8192, "Qwen3-8B")  # a thinking model: math-reasoning
    assert data["lengths"]["source"] == "default"
    assert data["lengths"]["kind"] == "math-reasoning"
    assert data["lengths"]["start_tokens"] == expected.start_tokens == round(0.688 * 8192)
    assert data["lengths"]["end_tokens"] == expected.end_tokens == round(0.79 * 8192)
    assert data["workload"]["mean_response_length"] == round(expected.mean_tokens) != 8192 // 2
    assert data["calibration"]["summary"].startswith("calibration: the shipped one")


@pytest.mark.parametrize("command", [
    PLAN,
    ["estimate", "--model", MODEL, "--gpus", "8", "--gpu-type", "h100", "--tp", "2",
     "--response-length", "8192"],
    ["plan", "--model", MODEL, "--gpus", "8,16", "--gpu-type", "h100", "--steps", "10",
     "--response-length", "8192"],
])
def test_every_answer_prints_its_lengths_and_its_calibration(command, capsys):
    assert main(command) in (0, 1)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assumed = [line for line in lines if line.startswith("assumed mean response 69%->79% of max")]
    assert len(assumed) == 1
    assert "published math RL of models that think before answering" in assumed[0]
    assert "pass --lengths-from RUN, --response-lengths or --mean-response-length" in assumed[0]
    assert sum(line.startswith("calibration: the shipped one") for line in lines) == 1


def test_a_fixed_mean_is_given_and_timed_once(capsys):
    assert main(PLAN + ["--format", "json", "--mean-response-length", "3000"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["lengths"]["source"] == "given"
    assert data["lengths"]["start_tokens"] == data["lengths"]["end_tokens"] == 3000
    band = data["candidates"][0]["step_time_over_run_s"]
    assert band["start"] == band["end"] == band["expected"]


# --- 2. the band, evaluated only where lengths move --------------------------------------------

def test_the_time_model_runs_once_per_node_and_once_for_a_fixed_mean():
    model = resolve_model(MODEL)
    calls = []

    def evaluate(request):
        calls.append(request.workload.mean_response_length)
        return {"step_time_s": np.array([1.0 * request.workload.mean_response_length])}

    moving = GrpoWorkload(response_length=8192, lengths=ResponseLengths(1000, 3000, 8192))
    expected, nodes = columns_over_run(PlanRequest(model, H100, moving), evaluate)
    assert calls == [1000, 2000, 3000]
    assert expected["step_time_s"][0] == pytest.approx(2000.0)  # linear: the midpoint
    calls.clear()
    fixed = GrpoWorkload(response_length=8192, lengths=ResponseLengths.fixed(2500, 8192))
    columns_over_run(PlanRequest(model, H100, fixed), evaluate)
    assert calls == [2500]


def test_step_time_over_the_run_is_simpsons_rule_over_three_fixed_lengths():
    model = resolve_model(MODEL)
    lengths = ResponseLengths(1000, 7000, 8192)
    workload = GrpoWorkload(response_length=8192, lengths=lengths)
    cols = Layout(tp=2, dp=4, micro_batch=2, rollout_tp=2).to_columns()
    request = PlanRequest(model, H100, workload)
    over = step_columns_over_run(request, lambda at: step_columns(at, cols))
    at = [float(step_columns(PlanRequest(model, H100, workload_at(workload, mean)),
                             cols)["step_time_s"][0]) for mean in (1000, 4000, 7000)]
    assert over[START_COLUMN][0] == pytest.approx(at[0])
    assert over[END_COLUMN][0] == pytest.approx(at[2])
    assert over["step_time_s"][0] == pytest.approx((at[0] + 4 * at[1] + at[2]) / 6)
    phases = sum(over[f"time_{phase}_s"] for phase in
                 ("generate", "old_log_prob", "ref", "update_actor", "weight_sync"))
    assert phases[0] == pytest.approx(over["step_time_s"][0])  # the phases still add up


def test_table_and_json_show_start_and_end_around_the_expected_time(capsys):
    assert main(PLAN + ["--response-lengths", "20%:90%"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("#"))
    assert header.index("step s") < header.index("start") < header.index("end")
    assert main(PLAN + ["--response-lengths", "20%:90%", "--format", "json"]) == 0
    for candidate in json.loads(capsys.readouterr().out)["candidates"]:
        band = candidate["step_time_over_run_s"]
        assert band["start"] < band["expected"] < band["end"]
        assert band["expected"] == candidate["step_time_s"]


# --- 3. ranking by the expected time ----------------------------------------------------------

def test_ranking_follows_the_expected_time_where_the_first_steps_would_rank_otherwise():
    plan = _plan(ResponseLengths(0.1 * 8192, 8192, 8192))
    frame = plan.fitting[~plan.fitting["flag_memory_tight"]]
    expected, start = frame["step_time_s"].to_numpy(), frame[START_COLUMN].to_numpy()
    assert np.all(np.diff(expected) >= -1e-9)  # ranked by the expected time
    assert start.argmin() != 0  # the fastest first step is not the fastest run
    assert expected[start.argmin()] > expected[0]


def test_shrinking_lengths_rank_the_same_expected_times():
    growing = _plan(ResponseLengths(0.1 * 8192, 8192, 8192))
    shrinking = _plan(ResponseLengths(8192, 0.1 * 8192, 8192))
    first, second = growing.candidate(0, fitting=True), shrinking.candidate(0, fitting=True)
    assert first.step_time_s == pytest.approx(second.step_time_s)
    assert first.step_time_start_s == pytest.approx(second.step_time_end_s)


# --- 4. sizing integrates over the run --------------------------------------------------------

def test_sizing_multiplies_the_steps_by_the_expected_step_time(capsys):
    assert main(["plan", "--model", MODEL, "--gpus", "8", "--gpu-type", "h100", "--steps",
                 "100", "--response-length", "8192", "--response-lengths", "10%:100%",
                 "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    row = next(row for row in data["rows"] if row["fits"])
    assert row["step_time_start_s"] < row["step_time_s"] < row["step_time_end_s"]
    assert row["run_time_s"] == pytest.approx(100 * row["step_time_s"])
    # not the step time at the run's mean length: growth is not linear in time
    at_mean = _plan(ResponseLengths.fixed(0.55 * 8192, 8192)).candidate(0, fitting=True)
    assert row["step_time_s"] != pytest.approx(at_mean.step_time_s, rel=1e-3)
    assert data["lengths"]["start_tokens"] == pytest.approx(819.2)


# --- 5. the fastest inside the band (issue 26) ------------------------------------------------

def test_fastest_in_band_is_the_least_expected_time_inside_the_band():
    cols = {"tp": np.ones(4), "fits": np.array([True, True, True, False]),
            "step_time_s": np.array([5.0, 3.0, 4.0, 1.0]),
            "memory_utilization": np.array([0.8, 0.9, 0.75, 0.8])}
    assert fastest_in_band(cols) == 2  # 3.0 s is above the band's top, 1.0 s does not fit
    cols["memory_utilization"] = np.array([0.5, 0.9, 0.95, 0.8])
    assert fastest_in_band(cols) == 0  # none inside: the fastest below the top
    assert fastest_in_band({**cols, "fits": np.zeros(4, dtype=bool)}) is None


def test_plan_names_the_fastest_in_band_above_the_table_and_in_json(capsys):
    assert main(PLAN + ["--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    fastest = data["fastest_in_band"]
    assert fastest["band_position"] == "inside"
    ranked = make_plan(PlanRequest(resolve_model(MODEL), H100, GrpoWorkload(
        response_length=8192, lengths=default_lengths(8192, MODEL))))
    inside = ranked.fitting[(ranked.fitting["memory_utilization"] >= 0.70)
                            & (ranked.fitting["memory_utilization"] <= 0.85)]
    assert fastest["step_time_s"] == pytest.approx(inside["step_time_s"].min(), abs=1e-3)
    assert fastest["rank"] == int(inside["rank"].iloc[int(inside["step_time_s"].argmin())])
    assert main(PLAN) == 0
    lines = capsys.readouterr().out.splitlines()
    table = next(i for i, line in enumerate(lines) if line.startswith("#"))
    line = next(line for line in lines[:table] if line.startswith("fastest"))
    assert f"#{fastest['rank']} is the predicted fastest inside the 70-85% band" in line
    if fastest["rank"] != 1:
        assert f"is the simplest of the {data['ranking']['ties']:,} within the model's " \
               f"error" in line


# --- 6. which calibration, and the installed releases ------------------------------------------

def test_a_release_the_calibration_was_not_measured_with_is_one_note(capsys, monkeypatch):
    import planner.cost.provenance as provenance

    monkeypatch.setattr(provenance, "installed_version",
                        lambda name: {"verl": "0.9.1"}.get(name))
    assert main(PLAN) == 0
    captured = capsys.readouterr()
    notes = [line for line in captured.err.splitlines() if "installed verl 0.9.1" in line]
    assert len(notes) == 1 and notes[0].startswith("note: installed verl 0.9.1 is not a release")
    assert "(verl v0.4-v0.5)" in notes[0]
    assert main(PLAN + ["--format", "json"]) == 0
    captured = capsys.readouterr()
    assert "installed verl" not in captured.err  # JSON carries it instead
    data = json.loads(captured.out)
    assert [text for text in data["calibration"]["version_notes"] if "verl 0.9.1" in text]
    monkeypatch.setattr(provenance, "installed_version",
                        lambda name: {"verl": "0.5.0"}.get(name))  # a calibrated release
    assert main(PLAN) == 0
    assert "installed verl" not in capsys.readouterr().err


def test_a_pretraining_step_has_no_note_on_the_rl_constants(capsys, monkeypatch):
    """The note says 'generation and weight-sync times carry that gap': a pretraining step has
    neither, and no RL constant enters its time."""
    import planner.cost.provenance as provenance

    monkeypatch.setattr(provenance, "installed_version",
                        lambda name: {"verl": "0.9.1"}.get(name))
    pretrain = ["plan", "--model", MODEL, "--gpus", "8", "--gpu-type", "h100", "--top", "3",
                "--workload", "pretrain", "--seq-len", "4096", "--global-batch", "64"]
    assert main(pretrain) == 0
    assert "installed verl" not in capsys.readouterr().err
    assert main(pretrain + ["--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["calibration"]["version_notes"] == []


def test_a_given_calibration_is_named_in_the_line(tmp_path, capsys):
    from planner.cost.efficiency import shipped_calibration

    path = tmp_path / "mine.json"
    path.write_text(json.dumps(shipped_calibration()))
    assert main(PLAN + ["--calibration", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if line.startswith(f"calibration: {path}: ")]


# --- what a sizing sweep's many plans share (cached, the same numbers) -------------------------

def test_workload_at_is_made_once_per_workload_and_length_and_equals_a_fresh_copy():
    from dataclasses import replace

    workload = GrpoWorkload(response_length=8192, lengths=default_lengths(8192, "Qwen3-8B"))
    first = workload_at(workload, 3000.4)
    assert workload_at(replace(workload), 3000.2) is first  # equal workload, same rounded length
    assert first == replace(workload, mean_response_length=3000)
    assert workload_at(workload, 9000.0).mean_response_length == 8192  # at most the maximum
    assert workload_at(workload, 0.2).mean_response_length == 1


def test_a_plan_without_fill_columns_ranks_and_prices_the_same_layouts():
    request = PlanRequest(resolve_model(MODEL), H100, GrpoWorkload(
        response_length=8192, lengths=default_lengths(8192, "Qwen3-8B")))
    full = make_plan(request, tie_tolerance=0.0)
    bare = make_plan(request, tie_tolerance=0.0, actors=full.actors,
                     reads=PlanReads(fill=False))
    fill = [name for name in full.columns if name.endswith("_fill")]
    assert len(fill) == 4 and np.isfinite(full.columns["time_generate_s_fill"][0])
    assert all(np.isnan(bare.columns[name]).all() for name in fill)
    for name in full.columns:
        if name not in fill:
            np.testing.assert_array_equal(bare.columns[name], full.columns[name], err_msg=name)
