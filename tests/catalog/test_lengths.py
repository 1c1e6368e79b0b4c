"""Response lengths as a distribution (planner/catalog/lengths.py), the default fitted to the
published runs (benchmarks/fit_lengths.py), the step-time band over a trajectory
(planner/cost/trajectory.py) and the plan/estimate flags that take them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import cluster

from planner.catalog.lengths import (
    DIRECT_KIND,
    REASONING_KIND,
    ResponseLengths,
    default_lengths,
    job_kind,
    length_defaults,
    parse_response_lengths,
    truncated_mean_tokens,
    uncut_mean_tokens,
)
from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cli.main import main
from planner.cost.request import PlanRequest
from planner.cost.trajectory import (
    expected_over_run,
    node_lengths,
    step_time_band,
    workload_at,
)
from planner.errors import PlanInputError
from planner.plan import estimate_layout
from planner.search.layout import Layout

ROOT = Path(__file__).resolve().parents[2]


# --- --response-lengths ------------------------------------------------------------------------


@pytest.mark.parametrize("text, start, end, p90", [
    ("1500", 1500, 1500, 0), ("1500,3000", 1500, 1500, 3000), ("1500:6000", 1500, 6000, 0),
    ("25%", 2048, 2048, 0), ("10%:50%", 819.2, 4096, 0), (" 6000 : 1500 ", 6000, 1500, 0)])
def test_the_three_ways_to_give_lengths(text, start, end, p90):
    lengths = parse_response_lengths(text, 8192)
    assert (lengths.start_tokens, lengths.end_tokens, lengths.p90_tokens) == \
        pytest.approx((start, end, p90))
    assert lengths.source == "given" and lengths.max_tokens == 8192
    assert lengths.mean_tokens == pytest.approx((start + end) / 2)


@pytest.mark.parametrize("text, message", [
    ("abc", "is not a number"), ("0", "outside 1..8192"), ("9000", "outside 1..8192"),
    ("150%", "outside 1..8192"), ("1:2:3", "is not valid"), ("1,2,3", "is not valid"),
    ("1:2,3", "is not valid"), ("-5", "is not a number"), ("nan", "is not a number"),
    ("inf", "is not a number"), ("1e3", "is not a number"), ("5000,100", "below the mean"),
    ("", "is empty"), ("x" * 100, "the bound is 64"), ("1\n2", "control characters")])
def test_bad_lengths_are_one_line_errors(text, message):
    with pytest.raises(PlanInputError) as error:
        parse_response_lengths(text, 8192)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_kind_of_job_gives_its_published_default():
    lengths = parse_response_lengths("math-reasoning", 4096, "Llama-3.1-8B")
    assert lengths.source == "default" and lengths.kind == REASONING_KIND


def test_lengths_check_themselves():
    with pytest.raises(PlanInputError, match="outside 1..1024"):
        ResponseLengths(2000, 2000, 1024)
    with pytest.raises(PlanInputError, match="p90"):
        ResponseLengths(500, 900, 1024, p90_tokens=600)
    with pytest.raises(PlanInputError, match="not one of"):
        ResponseLengths(500, 900, 1024, source="guess")


# --- the documented default ----------------------------------------------------------------------


@pytest.mark.parametrize("name, kind", [
    ("Qwen3-30B-A3B", REASONING_KIND), ("Qwen3-235B-A22B", REASONING_KIND),
    ("DeepSeek-R1-Distill-Qwen-7B", REASONING_KIND), ("QwQ-32B", REASONING_KIND),
    ("Qwen3-30B-A3B-Thinking-2507", REASONING_KIND), ("Qwen3-8B-Base", DIRECT_KIND),
    ("Qwen3-30B-A3B-Instruct-2507", DIRECT_KIND), ("Llama-3.1-8B", DIRECT_KIND),
    ("DeepSeek-V3", DIRECT_KIND), ("Qwen2.5-Math-7B", DIRECT_KIND)])
def test_the_kind_of_job_follows_whether_the_model_thinks(name, kind):
    assert job_kind(name) == kind


def test_the_default_is_the_published_runs_band_and_says_so():
    thinking = default_lengths(4096, "Qwen3-32B")
    # Qwen3 runs of NeMo RL answer at ~69-79% of the cap (grpo_runs.csv rows 5-33, 49, 50)
    assert 0.6 * 4096 < thinking.start_tokens <= thinking.end_tokens < 0.85 * 4096
    direct = default_lengths(4096, "Llama-3.1-8B")
    # instruct and base models answer in a few hundred to ~1.5k tokens whatever the cap
    assert 300 < direct.start_tokens < direct.end_tokens < 1600
    # under a maximum near or below them, the published means are cut as exponential lengths
    # are, E[min(L, M)] = mean (1 - exp(-M / mean)): not every response at the maximum (100%)
    short = default_lengths(512, "Qwen2.5-7B")
    assert (short.start_tokens, short.end_tokens) == (round(585 * (1 - np.exp(-512 / 585))),
                                                      round(1347 * (1 - np.exp(-512 / 1347))))
    assert (short.start_tokens, short.end_tokens) == (341, 426)  # 67% -> 83% of the maximum
    assert "their 585->1347 tokens cut at this maximum" in short.sentence()
    assert "cut at" not in default_lengths(16384, "Qwen2.5-7B").sentence()
    sentence = thinking.sentence()
    assert sentence.startswith("assumed mean response 69%->79% of max")
    assert "published" in sentence and "grpo_runs.csv" in sentence
    assert "--lengths-from RUN" in sentence and "--mean-response-length" in sentence


@pytest.mark.parametrize("cut, maximum, uncut", [
    (544, 1336, 613.52), (774, 1336, 1101.55), (860, 3896, 869.87), (3283, 3896, 11044.84),
    (1, 8192, 1.0)])
def test_the_uncut_mean_is_the_one_whose_exponential_cut_is_the_published_mean(cut, maximum,
                                                                                uncut):
    assert uncut_mean_tokens(cut, maximum) == pytest.approx(uncut, abs=0.01)
    assert truncated_mean_tokens(uncut_mean_tokens(cut, maximum), maximum) == pytest.approx(cut)


@pytest.mark.parametrize("cut", [1336, 1400, 0])
def test_a_mean_at_or_above_its_maximum_has_no_uncut_mean(cut):
    assert uncut_mean_tokens(cut, 1336) is None


def test_the_fit_takes_uncut_means_in_tokens_and_counts_saturated_runs():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fit_lengths

    # answers of ~500-900 tokens under maxima of 1336 to 8192, and one run at its maximum
    rows = [{"mean": mean, "max": maximum, "row_id": i, "model": "m"} for i, (mean, maximum)
            in enumerate([(544, 1336), (774, 1336), (860, 3896), (600, 8192), (900, 8192),
                          (1336, 1336)])]
    entry = fit_lengths.fit_kind(rows)
    assert entry["scale"] == "tokens" and entry["saturated"] == 1 and entry["runs"] == 5
    uncut = [uncut_mean_tokens(row["mean"], row["max"]) for row in rows[:-1]]
    assert entry["start"] == round(float(np.percentile(uncut, 10)))
    assert entry["end"] == round(float(np.percentile(uncut, 90)))
    # the stored math band is of uncut means: above the published (cut) means' 544 -> 1344
    stored = length_defaults()["kinds"][DIRECT_KIND]
    assert stored["start"] > 544 and stored["end"] > 1344 and stored["saturated"] == 0


def test_the_stored_default_is_what_the_fit_script_computes_from_the_shared_data():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fit_lengths

    rows = fit_lengths.published_lengths()
    assert len(rows) >= 50 and {row["kind"] for row in rows} == {REASONING_KIND, DIRECT_KIND}
    assert fit_lengths.fit(rows) == length_defaults()
    stored = json.loads((ROOT / "planner/catalog/response_lengths.json").read_text())
    assert stored["source"].startswith("benchmarks/fit_lengths.py")
    assert all(entry["rows"] for entry in stored["kinds"].values())


# --- the band over a trajectory ------------------------------------------------------------------


def test_simpsons_rule_is_exact_for_a_cubic_in_the_length():
    lengths = ResponseLengths(1000, 5000, 8192)

    def cubic(mean):
        return 3.0 + 2e-3 * mean + 4e-7 * mean ** 2 + 1e-11 * mean ** 3

    exact = np.mean([cubic(lengths.at(s)) for s in np.linspace(0, 1, 200_001)])
    assert expected_over_run([cubic(m) for m in node_lengths(lengths)]) == \
        pytest.approx(exact, rel=1e-6)


def _step_time(workload, mean):
    layout = Layout(tp=2, pp=1, dp=4, micro_batch=2, sequence_parallel=True,
                    rollout_tp=2, gpu_memory_utilization=0.5)
    request = PlanRequest(resolve_model("qwen3-8b"), cluster(8), workload_at(workload, mean))
    return estimate_layout(request, layout).candidate.step_time_s


def test_the_band_is_ordered_for_growing_lengths_with_the_real_time_model():
    workload = GrpoWorkload(train_batch_size=128, rollout_n=8, mini_batch_size=32,
                            prompt_length=1024, response_length=8192)
    lengths = ResponseLengths(1500, 6000, 8192)
    band = step_time_band(lengths, lambda mean: _step_time(workload, mean))
    assert band.start_s < band.expected_s < band.end_s
    assert band.low_s == band.start_s and band.high_s == band.end_s
    # a mean over the run, not the time at the mean length: close, not equal
    assert band.expected_s == pytest.approx(_step_time(workload, lengths.mean_tokens), rel=0.1)
    shrinking = step_time_band(ResponseLengths(6000, 1500, 8192),
                               lambda mean: _step_time(workload, mean))
    assert shrinking.end_s < shrinking.expected_s < shrinking.start_s


def test_constant_lengths_call_the_time_model_once():
    calls = []
    band = step_time_band(ResponseLengths(700, 700, 1024), lambda mean: calls.append(mean) or 9.0)
    assert calls == [700] and band.start_s == band.end_s == band.expected_s == 9.0


# --- the flags ------------------------------------------------------------------------------------

PLAN = ["plan", "--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100", "--top", "1",
        "--format", "json", "--response-length", "8192"]


def test_plan_times_the_given_trajectory_over_the_run_and_says_so(capsys):
    assert main(PLAN + ["--response-lengths", "1500:6000"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["workload"]["mean_response_length"] == 3750  # the trajectory's middle node
    assert data["lengths"] == {"start_tokens": 1500.0, "end_tokens": 6000.0, "max_tokens": 8192,
                               "p90_tokens": 0.0, "source": "given",
                               "basis": "--response-lengths", "kind": "", "mean_tokens": 3750.0}
    band = data["candidates"][0]["step_time_over_run_s"]
    assert band["start"] < band["expected"] < band["end"]  # longer responses, longer steps
    assert band["expected"] == data["candidates"][0]["step_time_s"]
    text = [arg for arg in PLAN if arg not in ("--format", "json")]
    assert main(text + ["--response-lengths", "1500:6000"]) == 0
    out = capsys.readouterr().out
    assert "mean response 1500->6000 tokens, linear over the run, 18%->73% of max (given)" in out


def test_two_length_flags_are_a_usage_error(capsys):
    assert main(PLAN + ["--response-lengths", "2000", "--mean-response-length", "900"]) == 2
    assert "both set the response lengths" in capsys.readouterr().err


def test_lengths_from_a_run_log(tmp_path, capsys):
    from fixtures.verl_runs import run_records, write_jsonl

    run = write_jsonl(tmp_path / "run.jsonl", run_records(62, steps=10, growth=2.0, mean=1500))
    assert main(PLAN + ["--lengths-from", str(run)]) == 0
    out, err = capsys.readouterr()
    workload = json.loads(out)["workload"]
    assert workload["mean_response_length"] == pytest.approx(1591, abs=2)  # the line's midpoint
    assert workload["mean_prompt_length"] == 200  # prompt_length/mean of the run
    lengths = json.loads(out)["lengths"]
    assert lengths["source"] == "run" and "run.jsonl (jsonl), steps 1-10" in lengths["basis"]
    # the run's mean prompt times the step: the header says so, as it says the responses'
    text = [arg for arg in PLAN if arg not in ("--format", "json")]
    assert main(text + ["--lengths-from", str(run)]) == 0
    assert " (mean 200) + response " in capsys.readouterr().out


def test_lengths_from_a_run_with_a_smaller_maximum_says_the_means_may_grow(tmp_path, capsys):
    from fixtures.verl_runs import run_records, write_jsonl

    # the run (row 62) cut responses at 8192 tokens (clip_ratio > 0, response_length/max 8192)
    run = write_jsonl(tmp_path / "run.jsonl", run_records(62, steps=10, mean=1500))
    text = [arg for arg in PLAN if arg not in ("--format", "json", "--response-length", "8192")]
    assert main(text + ["--response-length", "16384", "--lengths-from", str(run)]) == 0
    err = capsys.readouterr().err
    assert "note: --lengths-from: the run's means were measured with responses cut at 8192 " \
           "tokens" in err and "under --response-length 16384 they may grow" in err
    assert main(text + ["--response-length", "8192", "--lengths-from", str(run)]) == 0
    assert "may grow" not in capsys.readouterr().err  # the run's own maximum: nothing to say


def test_lengths_from_a_run_with_a_larger_maximum_cut_its_means_at_this_one(tmp_path, capsys):
    """Row 62's run cut responses at 8192 tokens; planned at --response-length 2048, its longer
    responses are cut at 2048, so its means shrink: uncut at the run's cap, cut at this maximum
    as exponential lengths are (the model the published default uses), and the basis says so --
    not the run's means taken unchanged."""
    from fixtures.verl_runs import run_records, write_jsonl

    from trials.runs import read_run

    run = write_jsonl(tmp_path / "run.jsonl", run_records(62, steps=10, growth=2.0, mean=1500))
    measured = read_run(str(run)).response_lengths(8192)
    text = [arg for arg in PLAN if arg not in ("--response-length", "8192")]
    for maximum in (4096, 2048):  # the run's means (up to 2121) below it, and above it
        assert main(text + ["--response-length", str(maximum), "--lengths-from", str(run)]) == 0
        lengths = json.loads(capsys.readouterr().out)["lengths"]
        for name in ("start_tokens", "end_tokens"):
            cut = truncated_mean_tokens(uncut_mean_tokens(measured.__dict__[name], 8192),
                                        maximum)
            assert lengths[name] == pytest.approx(cut, abs=0.1)
            assert lengths[name] < measured.__dict__[name]
        assert lengths["max_tokens"] == maximum
        assert f"cut at this maximum ({maximum} tokens)" in lengths["basis"]
