"""The memory model against real verl jobs (benchmarks/memory_anchors.py): verl's own example
scripts launch, DeepSeek-V3's measured peak and host memory, and the OOM/no-OOM outcomes of a
published Qwen2.5-7B sweep."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import memory_anchors  # noqa: E402

RESULTS = {anchor.name: (anchor, memory_anchors.evaluate(anchor))
           for anchor in memory_anchors.anchors()}


def test_verl_example_jobs_fit_where_verl_runs_them():
    for anchor in memory_anchors.example_anchors():
        result = RESULTS[anchor.name][1]
        assert result["fits"], result


def test_deepseek_v3_peak_and_host_memory_near_the_measurement():
    [result] = [r for _, r in RESULTS.values() if "measured_gib" in r]
    # verl docs/perf/dpsk.md: 66 GB per GPU and about 1.5 TB of host memory per node
    assert abs(result["error"]) <= memory_anchors.TOLERANCE, result
    assert abs(result["host_error"]) <= memory_anchors.TOLERANCE, result


def test_sweep_outcomes_fit_or_oom_as_measured():
    outcomes = [(anchor, result) for anchor, result in RESULTS.values()
                if anchor.source == memory_anchors.OUTCOMES.name]
    assert len(outcomes) == 13
    wrong = [result for _, result in outcomes if not result["verdict_right"]]
    # the one miss errs on the safe side: predicted OOM (memory sized for the longest
    # responses), the real run's responses stayed shorter
    assert len(wrong) <= 1, wrong
    assert all(not r["fits"] and r["expect_fits"] for r in wrong)
    # the OOMs the sweep hit are all predicted, each in the phase that ran out
    for anchor, result in outcomes:
        if not anchor.expect_fits:
            assert not result["fits"], result


@pytest.mark.needs("verl")
@pytest.mark.parametrize("anchor", memory_anchors.example_anchors(), ids=lambda a: a.model)
def test_validate_reads_each_example_script_as_the_anchor_states_it(anchor):
    """The anchors restate the scripts by hand; validate must read the same layout and workload
    from the scripts themselves, and say they would launch."""
    from planner.diagnose.validate import JobInput, dry_run

    report = dry_run(JobInput(inputs=(str(ROOT / anchor.source),),
                              sets=("HOME=/tmp", "aime24_test_path=/tmp/aime-2024.parquet"),
                              model=anchor.model, gpu_type=anchor.gpu)).report
    assert report["would_launch"], report["findings"]
    assert report["cluster"]["num_gpus"] == anchor.gpus
    layout = anchor.layout.to_dict()
    assert {k: v for k, v in report["layout"].items() if k in layout} == layout
    workload = anchor.workload.to_dict()
    workload.pop("mean_response_length")  # a measured figure; no script states it
    workload.pop("lengths")  # nor the lengths over the run
    assert {k: report["workload"][k] for k in workload} == workload
