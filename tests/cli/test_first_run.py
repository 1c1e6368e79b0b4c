"""The stumbles of a first run (issue 15): estimate's rollout, pipes, --no-offload, plan.json,
the benchmarks in a clean clone."""

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cli.main import main
from planner.cost.request import PlanRequest
from planner.plan import estimate_layout, make_plan
from planner.search.layout import Layout

REPO = Path(__file__).resolve().parents[2]
ROLLOUT = ("rollout_tp", "rollout_dp", "rollout_ep", "gpu_memory_utilization")


def test_estimate_without_rollout_flags_picks_the_rollout_the_plan_picks():
    model, cluster = resolve_model("qwen3-8b"), ClusterSpec(get_gpu("h100"), 8, 8)
    workload = GrpoWorkload()
    plan = make_plan(PlanRequest(model, cluster, workload))
    for record in plan.fitting.head(3).to_dict("records"):
        planned = Layout.from_row(record)
        bare = replace(planned, rollout_tp=1, rollout_dp=1, rollout_ep=1,
                       gpu_memory_utilization=0.6)
        estimate = estimate_layout(PlanRequest(model, cluster, workload), bare, pick_utilization=True, choose_rollout_layout=True)
        assert [getattr(estimate.layout, f) for f in ROLLOUT] == \
            [getattr(planned, f) for f in ROLLOUT]
        assert estimate.row["step_time_s"] == pytest.approx(record["step_time_s"])


def test_estimate_cli_chooses_the_rollout_and_exits_1_when_it_does_not_fit(capsys):
    base = ["estimate", "--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100"]
    assert main(base + ["--pp", "2", "--micro-batch", "2", "--optimizer-offload"]) == 0
    captured = capsys.readouterr()
    assert "chosen as the plan would" in captured.err
    assert "rollout TP2 DP1 EP1 at gpu_memory_utilization 0.40" in captured.out
    assert "fits: yes" in captured.out
    # TP1 without offload: the actor alone overflows the update; the answer is "no"
    assert main(base) == 1
    assert "fits: NO" in capsys.readouterr().out
    # pinned rollout flags are kept
    assert main(base + ["--pp", "2", "--micro-batch", "2", "--optimizer-offload",
                        "--rollout-tp", "1", "--gpu-memory-utilization", "0.5"]) == 0
    assert "rollout TP1 DP1 EP1 at gpu_memory_utilization 0.50" in capsys.readouterr().out


def test_where_no_rollout_fits_the_chosen_one_holds_its_weights(capsys):
    """Qwen3-Next-80B on TP1 DP16: no rollout fits beside the actor.  The chooser took the
    first option, TP1 DP1 EP1, whose 148 GiB of weights no GPU holds; it now takes a miss whose
    weights fit under the band's top (TP1 DP4 EP4: 40 GiB)."""
    argv = ["estimate", "--model", "Qwen3-Next-80B-A3B", "--gpus", "16", "--gpu-type", "h100",
            "--format", "json"]
    assert main(argv) == 1
    data = json.loads(capsys.readouterr().out)
    assert not data["fits"] and data["breakdown_gib"]["weights"] > 100
    assert data["breakdown_gib"]["rollout_weights"] <= 0.85 * data["cluster"]["gpu_memory_gib"]
    assert data["layout"]["rollout_tp"] * data["layout"]["rollout_ep"] > 1


def test_json_into_a_closed_pipe_ends_quietly():
    process = subprocess.Popen(
        [sys.executable, "-m", "planner", "--model", "qwen3-30b", "--gpus", "16", "--gpu-type",
         "h100", "--format", "json", "--top", "3000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    process.stdout.read(200)  # `| head -c 200`
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=300) in (0, 141)
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr


def test_no_offload_leaves_every_offload_out(capsys, tmp_path):
    args = ["--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100", "--no-offload"]
    assert main(args + ["--format", "json", "--top", "200"]) == 0
    candidates = json.loads(capsys.readouterr().out)["candidates"]
    assert candidates
    for candidate in candidates:
        layout = candidate["layout"]
        assert not (layout["param_offload"] or layout["optimizer_offload"]
                    or layout["ref_param_offload"] or layout["optimizer_cpu_fraction"])
    assert main(args + ["--write", str(tmp_path / "job")]) == 0
    capsys.readouterr()
    script = (tmp_path / "job" / "run_grpo.sh").read_text()
    assert "actor_rollout_ref.ref.megatron.param_offload=False" in script
    assert main(args + ["--ref-param-offload"]) == 2
    assert "--no-offload contradicts" in capsys.readouterr().err


def test_plan_json_states_the_mean_response_length(capsys, tmp_path):
    assert main(["--model", "qwen2.5-0.5b", "--gpus", "8", "--gpu-type", "h100", "--write",
                 str(tmp_path)]) == 0
    capsys.readouterr()
    workload = json.loads((tmp_path / "plan.json").read_text())["workload"]
    # no lengths given: the published math runs' band (585->1347 uncut tokens, cut at the 1024
    # maximum as exponential lengths are, mean (1 - exp(-1024 / mean))), timed over the run;
    # its middle node is the mean plan.json records
    assert workload["lengths"]["source"] == "default"
    assert (workload["lengths"]["start_tokens"], workload["lengths"]["end_tokens"]) == (483, 717)
    assert workload["mean_response_length"] == 600
    assert GrpoWorkload(response_length=4096).mean_response_length == 2048
    assert GrpoWorkload(mean_response_length=300).mean_response_length == 300
    assert GrpoWorkload() == GrpoWorkload(mean_response_length=512)


def test_benchmarks_run_in_a_clean_clone_without_shared(tmp_path):
    """A clone has no ../shared: the benchmarks read the in-repo copy of the data."""
    clone = tmp_path / "plan-parallel"
    for part in ("planner", "benchmarks"):
        shutil.copytree(REPO / part, clone / part,
                        ignore=shutil.ignore_patterns("__pycache__"))
    assert not (tmp_path / "shared").exists()
    env = {k: v for k, v in os.environ.items() if k != "PLAN_PARALLEL_REFERENCE_DIR"}
    env["PYTHONPATH"] = str(clone)
    for command in (["benchmarks/calibration_data.py"], ["benchmarks/accuracy.py", "--help"],
                    ["benchmarks/calibrate.py", "--help"]):
        result = subprocess.run([sys.executable, *command], cwd=clone, env=env,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr
    result = subprocess.run([sys.executable, "benchmarks/calibration_data.py"], cwd=clone,
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.stdout.startswith("255 cases")
