"""A plan's frame is built on first use (planner.plan.RankedRows): the text table reads a few
columns and the rows it shows without it, and every read gives what the whole frame gives."""

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload, PretrainWorkload
from planner.cost.request import PlanRequest
from planner.plan import make_plan
from planner.policy import FILL_POLICY
from planner.report.text import plan_table

REQUESTS = {
    "qwen3-8b x 8": lambda: PlanRequest(resolve_model("qwen3-8b"),
                                        ClusterSpec(get_gpu("h100"), 8, 8), GrpoWorkload()),
    "qwen3-30b x 16": lambda: PlanRequest(resolve_model("qwen3-30b"),
                                          ClusterSpec(get_gpu("h100"), 16, 8), GrpoWorkload()),
    "pretrain 70b x 64": lambda: PlanRequest(
        resolve_model("llama3.1-70b"), ClusterSpec(get_gpu("h100"), 64, 8),
        PretrainWorkload(seq_len=8192, global_batch=128)),
}


def _reads(plan):
    """What the text table and the JSON read of a plan, frame or not."""
    return {"kept": plan.kept, "fitting": plan.fitting_count, "ties": plan.ties,
            "top": plan.top(7, fitting=True), "all_top": plan.top(3),
            "fastest": plan.fastest_in_band,
            "first": plan.candidate(0, fitting=True) if plan.fitting_count else None,
            "step": plan.has_column("step_time_s"),
            "utilization": plan.column("memory_utilization", fitting=True).tolist(),
            "peak_gib": plan.column("peak_memory_gib").tolist()}


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_the_lazy_reads_equal_the_frames(name):
    request = REQUESTS[name]()
    lazy = make_plan(request)
    built = make_plan(request)
    frame = built.candidates  # the whole frame first: every read goes through it
    assert built.ranked is None and lazy.ranked is not None
    assert _reads(lazy) == _reads(built)
    assert "candidates" not in lazy.__dict__  # none of those reads built it
    # a few ranked rows as a frame are those rows of the whole frame, dtypes and all
    positions = np.array([0, 2, len(frame) - 1])
    part = make_plan(request).ranked.frame(positions)
    pd.testing.assert_frame_equal(part, frame.iloc[positions].reset_index(drop=True))
    pd.testing.assert_frame_equal(lazy.candidates, frame)
    assert lazy.ranked is None


def test_the_text_table_builds_no_frame():
    request = REQUESTS["qwen3-30b x 16"]()
    plan = make_plan(request)
    fill = make_plan(replace(request, policy=FILL_POLICY),
                     tie_tolerance=0.0, actors=plan.actors, keep=1)
    text = plan_table(plan, 5, fill)
    assert "candidates" not in plan.__dict__ and "candidates" not in fill.__dict__
    # the same table from plans whose frames are built
    again = make_plan(request)
    again_fill = make_plan(replace(request, policy=FILL_POLICY),
                           tie_tolerance=0.0, actors=again.actors, keep=1)
    assert len(again.candidates) == plan.kept and len(again_fill.candidates) == 1
    assert plan_table(again, 5, again_fill) == text
