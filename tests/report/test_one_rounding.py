"""Text outputs round once: a figure the JSON reports at two decimals prints at one decimal
from its exact value (73.551 s is "73.6 s" in ``plan`` and ``explain`` alike, not 73.55 ->
"73.5"), and the JSON keeps its two decimals (planner/output.py ``Summary``)."""

import json
from dataclasses import replace

import pytest

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cost.request import PlanRequest
from planner.diagnose.fix import FixResult, fix_text
from planner.modes.sync import explain_text
from planner.output import fix_summary_json, layout_summary_json
from planner.plan import make_plan
from planner.policy import DEFAULT_POLICY
from planner.search.space import SearchOptions
from planner.units import GIB

GENERATE_S = 73.551  # just above the .55 boundary: two decimals 73.55, one decimal 73.6


@pytest.fixture(scope="module")
def candidate():
    plan = make_plan(PlanRequest(resolve_model("qwen3-8b"), ClusterSpec(get_gpu("h100"), 8, 8),
                                 GrpoWorkload(), options=SearchOptions()))
    best = plan.candidate(0, fitting=True)
    times = replace(best.times, seconds=replace(best.times.seconds, generate=GENERATE_S))
    return replace(best, times=times, step_time_s=GENERATE_S + 10.0)


def test_explain_text_prints_the_exact_phase_time_once_rounded(candidate):
    chosen = layout_summary_json(candidate)
    assert json.loads(json.dumps(chosen))["time_s"]["generate"] == 73.55  # the JSON: unchanged
    assert chosen["step_time_s"] == 83.55
    text = explain_text({"model": "m", "gpus": 8, "gpu_type": "H100", "chosen": chosen,
                         "links": [], "flags": [], "rules_of_thumb": []})
    assert f"generate {GENERATE_S:.1f} s" == "generate 73.6 s"  # what `plan` prints
    assert "generate 73.6 s" in text and "83.6 s per step" in text


def test_fix_text_prints_exact_time_and_memory_once_rounded(candidate):
    now = fix_summary_json(candidate, DEFAULT_POLICY)
    assert now["generate_s"] == 73.55 and now["step_time_s"] == 83.55
    assert now["peak_memory_gib"] == round(candidate.memory.peak_bytes / GIB, 2)
    text = fix_text(FixResult(data={"current": now, "in_band": True}, mitigations=(), job=None),
                    DEFAULT_POLICY)
    assert "generate 73.6 s, 83.6 s per step" in text
    assert f"{candidate.memory.peak_bytes / GIB:.1f} GiB" in text


def test_plan_text_rounds_the_step_time_once(candidate):
    from planner.output import seconds
    from planner.report.text import band_text

    step = replace(candidate, step_time_s=73.5504, step_time_start_s=None)
    assert f"{seconds(step.step_time_s):.1f}" == "73.5"  # three decimals, then one: 73.55 -> 73.5
    assert band_text(step) == "73.6 s"


def test_explain_best_text_rounds_the_step_time_once():
    from planner.diagnose.explain_modes import explain_best_text
    from planner.output import Summary

    entry = {"mode": "sync", "fits": True, "step_time_s": 73.55, "speedup_vs_sync": 1.0,
             "placement": {"colocated": True}}
    shown = {"mode": "best", "model": "m", "gpus": 8, "gpu_type": "H100", "winner": "sync",
             "step_time_s": 73.55, "speedup_vs_sync": 1.0, "sync_step_time_s": 73.55,
             "modes": [Summary(entry, {**entry, "step_time_s": 73.5504})], "caveat": "c"}
    text = explain_best_text(Summary(shown, {**shown, "step_time_s": 73.5504,
                                             "sync_step_time_s": 73.5504}))
    assert "sync wins, 73.6 s per step; no other mode is faster" in text
    assert "- sync: 73.6 s per step" in text
    # another mode wins: the baseline's time in the speed-up, rounded once too
    won = {**shown, "winner": "one-step-off", "step_time_s": 60.0, "speedup_vs_sync": 1.23}
    text = explain_best_text(Summary(won, {**won, "sync_step_time_s": 73.5504}))
    assert "a 1.23x speed-up over sync (73.6 s)" in text
