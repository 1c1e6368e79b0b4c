"""The asynchronous modes over the run (issue 23): each split's step time at the run's first and
last step and expected over it, ranked by the expectation, in the tables and the JSON, with the
lengths line under every answer (planner/cost/trajectory.py steady_state_over_run,
planner/placement.py split_candidate)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.lengths import ResponseLengths
from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cli.main import main
from planner.cost.request import PlanRequest
from planner.cost.trajectory import NODES, WEIGHTS
from planner.modes import get_mode
from planner.placement import AsyncOptions

MODEL = resolve_model("qwen2.5-7b")
H100x32 = ClusterSpec(get_gpu("h100"), 32, 8)
# the trajectory of the modes guide's example (docs/guide/modes.md): 544 -> 1344 of 2048 tokens
LENGTHS = ResponseLengths(start_tokens=544, end_tokens=1344, max_tokens=2048)
WORK = GrpoWorkload(train_batch_size=128, rollout_n=8, prompt_length=1024, response_length=2048,
                    mini_batch_size=32, lengths=LENGTHS)
CLI = ["--model", "qwen2.5-7b", "--gpus", "32", "--gpu-type", "h100", "--train-batch-size",
       "128", "--rollout-n", "8", "--mini-batch-size", "32", "--response-length", "2048",
       "--response-lengths", "544:1344"]


def _fixed(mean: float) -> GrpoWorkload:
    return replace(WORK, lengths=None, mean_response_length=round(mean))


@pytest.fixture(scope="module")
def fully_async():
    return get_mode("fully-async").plan(PlanRequest(MODEL, H100x32, WORK))


def test_each_split_carries_its_band_and_the_expected_step_between(fully_async):
    for candidate in fully_async.candidates:
        assert candidate.step_time_start_s < candidate.step_time_s < candidate.step_time_end_s


def test_the_expected_step_is_simpsons_rule_over_the_steady_states_at_three_fixed_lengths(
        fully_async):
    """Each split's step at the run's first, middle and last step is what the same trainer and
    rollout layouts give with that mean length fixed (``estimate --mode`` with the layout
    pinned); the run's step is their Simpson mean -- not the steady state of the pools'
    expected times, which is faster when the bottleneck moves between the pools."""
    mode = get_mode("fully-async")
    for candidate in fully_async.candidates[:2]:
        splits = AsyncOptions(trainer_gpus=(candidate.placement.trainer_gpus,))
        at_nodes = []
        for fraction in NODES:
            request = PlanRequest(MODEL, H100x32, _fixed(LENGTHS.at(fraction)))
            estimate = mode.with_settings(splits).estimate(request, candidate.layout, True)
            at_nodes.append(estimate.candidate.step_time_s)
        assert candidate.step_time_start_s == pytest.approx(at_nodes[0], rel=1e-9)
        assert candidate.step_time_end_s == pytest.approx(at_nodes[-1], rel=1e-9)
        simpson = sum(weight * step for weight, step in zip(WEIGHTS, at_nodes))
        assert candidate.step_time_s == pytest.approx(simpson, rel=1e-9)
        times = candidate.times
        assert candidate.step_time_s >= max(times.generate, times.train) + times.param_sync


def test_splits_rank_by_the_expected_step_where_the_first_steps_rank_otherwise():
    """24 trainer GPUs are fastest at the first step (short responses, the trainer pool sets the
    pace) but the 8-GPU rollout pool falls behind as the responses grow (544 -> 1600 tokens;
    up to the guide's 1344 the 24-GPU trainer pool, host-bound on its micro-batches, still wins
    over the run): over the run the even split wins."""
    growing = replace(WORK, lengths=ResponseLengths(start_tokens=544, end_tokens=1600,
                                                    max_tokens=2048))
    plan = get_mode("fully-async").plan(PlanRequest(MODEL, H100x32, growing))
    ranked = [c for c in plan.candidates if c.fits]
    assert [c.step_time_s for c in ranked] == sorted(c.step_time_s for c in ranked)
    first_step_best = min(ranked, key=lambda c: c.step_time_start_s)
    assert first_step_best is not ranked[0]
    assert ranked[0].placement.trainer_gpus == 16
    assert first_step_best.placement.trainer_gpus == 24
    assert first_step_best.step_time_end_s > ranked[0].step_time_end_s


def test_one_fixed_mean_has_one_step_and_the_pools_steady_state():
    plan = get_mode("one-step-off").plan(PlanRequest(MODEL, H100x32, _fixed(944)))
    for candidate in plan.candidates:
        times = candidate.times
        assert candidate.step_time_start_s == candidate.step_time_s == candidate.step_time_end_s
        assert candidate.step_time_s == pytest.approx(
            max(times.generate, times.train) + times.param_sync, rel=1e-9)


@pytest.mark.parametrize("mode", ["one-step-off", "fully-async", "best"])
def test_mode_json_carries_start_end_expected_and_the_lengths(mode, capsys):
    assert main(["plan", *CLI, "--mode", mode, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["lengths"]["start_tokens"] == 544 and data["lengths"]["end_tokens"] == 1344
    assert len(data["candidates"]) == 3  # the three modes' best; the three whole-node splits
    for candidate in data["candidates"]:
        band = candidate["step_time_over_run_s"]
        assert band["start"] < band["expected"] == candidate["step_time_s"] < band["end"]


@pytest.mark.parametrize("mode", ["one-step-off", "fully-async", "best"])
def test_mode_tables_show_start_and_end_and_the_assumed_lengths_line(mode, capsys):
    # no lengths given: the fitted default trajectory, stated under the table
    command = [part for part in CLI if part not in ("--response-lengths", "544:1344")]
    assert main(["plan", *command, "--mode", mode]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "step s" in line)
    assert header.split().index("start") == header.split().index("s") + 1  # after "step s"
    assert "end" in header.split()
    assert "start, end: at its first and last step" in out
    assert any(line.startswith("assumed mean response ") for line in out.splitlines())


def test_estimate_mode_shows_the_band(capsys):
    assert main(["estimate", *CLI, "--tp", "1", "--pp", "2", "--mode", "fully-async",
                 "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for split in [data, *data["splits"]]:
        band = split["step_time_over_run_s"]
        assert band["start"] < band["expected"] == split["step_time_s"] < band["end"]
