"""``estimate --mode`` and ``explain --mode`` (planner/placement.py estimate_split,
planner/diagnose/explain_modes.py): one layout on separate pools, and the chosen split or mode
in words.  Small cases only (Qwen2.5-7B, 16-24 GPUs): the mode search of a large cluster takes
tens of seconds."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cli.main import main
from planner.cost.request import PlanRequest
from planner.modes import get_mode
from planner.output import candidate_json
from planner.placement import AsyncOptions
from planner.search.layout import Layout
from planner.search.space import SearchOptions

GRPO = ["--train-batch-size", "128", "--rollout-n", "8", "--mini-batch-size", "32",
        "--response-length", "2048", "--gpu-type", "h100", "--model", "qwen2.5-7b"]
WORK = GrpoWorkload(train_batch_size=128, rollout_n=8, prompt_length=1024, response_length=2048,
                    mini_batch_size=32)
MODEL = resolve_model("qwen2.5-7b")
H100 = get_gpu("h100")


def plan_mode(request, mode):
    """The mode's plan, its candidates in their JSON contract."""
    plan = get_mode(mode).plan(request)
    return SimpleNamespace(best=candidate_json(plan.best))


def estimate_split(request, mode, layout, pin_rollout, async_options):
    """The mode's estimate, its candidate in its JSON contract."""
    estimate = get_mode(mode, async_options).estimate(request, layout, pin_rollout)
    return SimpleNamespace(candidate=candidate_json(estimate.candidate))


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys, *argv: str) -> tuple[int, dict]:
    code, out, _ = run(capsys, *argv, "--format", "json")
    return code, json.loads(out)


def test_estimate_mode_sync_is_todays_estimate(capsys):
    layout = ["estimate", *GRPO, "--gpus", "16", "--tp", "2", "--micro-batch", "2"]
    today = run(capsys, *layout, "--format", "json")
    assert run(capsys, *layout, "--format", "json", "--mode", "sync") == today
    assert today[0] == 0 and json.loads(today[1])["valid"]
    assert run(capsys, *layout, "--mode", "sync") == run(capsys, *layout)


def test_estimate_one_step_off_on_a_given_split(capsys):
    # micro-batches of 4: with 1 sequence each the trainer's time is the host's floor per
    # micro-batch (host_layer_s), the same at every length, and the band would be flat
    code, data = run_json(capsys, "estimate", *GRPO, "--gpus", "16", "--tp", "2", "--pp", "2",
                          "--micro-batch", "4", "--mode", "one-step-off", "--trainer-gpus", "8")
    assert code == 0 and data["valid"] and data["fits"]
    assert data["mode"] == "one-step-off"
    assert data["placement"] == {"trainer_gpus": 8, "rollout_gpus": 8, "colocated": False,
                                 "trainer_nodes": 1, "rollout_nodes": 1}
    lay = data["layout"]
    assert (lay["tp"], lay["pp"], lay["dp"]) == (2, 2, 2)  # DP of the 8-GPU trainer pool
    times = data["time_s"]
    # the default lengths move over the run: the steady state max(G, T) + S holds at each step,
    # and the expected step is at least that of the pools' expected times (planner.cost.
    # trajectory.steady_state_over_run); with one mean length it is exactly that
    assert data["step_time_s"] >= max(times["generate"], times["train"]) \
        + times["param_sync"] - 2e-3
    band = data["step_time_over_run_s"]
    assert band["start"] < band["expected"] == data["step_time_s"] < band["end"]
    code, fixed = run_json(capsys, "estimate", *GRPO, "--gpus", "16", "--tp", "2", "--pp", "2",
                           "--micro-batch", "4", "--mode", "one-step-off", "--trainer-gpus", "8",
                           "--mean-response-length", "1024")
    fixed_times = fixed["time_s"]
    assert fixed["step_time_s"] == pytest.approx(
        max(fixed_times["generate"], fixed_times["train"]) + fixed_times["param_sync"], abs=2e-3)
    assert times["param_sync"] == pytest.approx(data["param_sync_s"]["total"], abs=1e-3)
    trainer, rollout = data["pools"]["trainer"], data["pools"]["rollout"]
    assert trainer["time_s"]["update_actor"] > 0 and trainer["gpus"] == rollout["gpus"] == 8
    assert 0 < trainer["peak_memory_gib"] < 79.7 and 0 < rollout["peak_memory_gib"] < 79.7
    assert data["bottleneck"] in ("trainer", "rollout")
    assert data["staleness"]["max_versions_behind"] == 1
    assert [s["trainer_gpus"] for s in data["splits"]] == [8]


def test_estimate_reproduces_the_plans_split_candidate():
    """The plan's best split, its layout estimated on the same split with the same rollout,
    is the same candidate: plan and estimate share one evaluation of a layout."""
    cluster = ClusterSpec(H100, 16, 8)
    for mode in ("one-step-off", "fully-async"):
        best = dict(plan_mode(PlanRequest(MODEL, cluster, WORK), mode).best)
        best.pop("rank")
        layout = Layout(**best["layout"])
        request = PlanRequest(MODEL, cluster, WORK, options=SearchOptions(
            gpu_memory_utilization=layout.gpu_memory_utilization))
        estimate = estimate_split(request, mode, layout, pin_rollout=True,
                                  async_options=AsyncOptions(trainer_gpus=(8,)))
        assert estimate.candidate == best


def test_estimate_without_trainer_gpus_reports_the_fastest_split(capsys):
    args = ["estimate", *GRPO, "--gpus", "24", "--tp", "2", "--pp", "2", "--mode",
            "fully-async"]
    each = {}
    for gpus in (8, 16):
        code, data = run_json(capsys, *args, "--trainer-gpus", str(gpus))
        assert code == 0 and data["fits"]
        each[gpus] = data
    code, out, err = run(capsys, *args, "--format", "json")
    chosen = json.loads(out)
    fastest = min(each, key=lambda gpus: each[gpus]["step_time_s"])
    assert code == 0
    assert chosen["placement"] == each[fastest]["placement"]
    assert chosen["step_time_s"] == each[fastest]["step_time_s"]
    assert sorted(s["step_time_s"] for s in chosen["splits"]) == sorted(
        each[gpus]["step_time_s"] for gpus in each)
    assert f"{fastest} trainer + {24 - fastest} rollout GPUs is the fastest of the 2" in err
    assert "chosen as the plan would" in err  # no rollout flag: the rollout pool's best


def test_estimate_layout_must_divide_the_trainer_pool(capsys):
    """TP4 x PP4 divides the 16-GPU cluster but not an 8-GPU trainer pool."""
    args = ["estimate", *GRPO, "--gpus", "16", "--tp", "4", "--pp", "4"]
    assert run_json(capsys, *args)[1]["valid"]
    code, out, err = run(capsys, *args, "--mode", "one-step-off", "--trainer-gpus", "8",
                         "--format", "json")
    data = json.loads(out)
    assert code == 1 and data["valid"] is False
    assert data["layout"]["dp"] == 1
    assert any(v["rule"] == "world_size" and "trainer pool of 8 GPUs" in v["message"]
               for v in data["violations"])
    assert "invalid layout [world_size]: trainer pool of 8 GPUs" in err


def test_explain_one_step_off_names_bottleneck_and_neighbours(capsys):
    args = ["explain", *GRPO, "--gpus", "24", "--mode", "one-step-off"]
    code, data = run_json(capsys, *args)
    assert code == 0
    chosen = data["chosen"]
    pool = data["bottleneck"]["pool"]
    assert pool == chosen["bottleneck"]
    assert data["bottleneck"]["busy_s"] >= data["bottleneck"]["other_pool_busy_s"]
    assert data["param_sync"]["share_of_step"] == pytest.approx(
        chosen["time_s"]["param_sync"] / chosen["step_time_s"], abs=1e-3)
    trainer_gpus = chosen["placement"]["trainer_gpus"]
    assert [n["trainer_gpus"] for n in data["neighbours"]] == [trainer_gpus - 8,
                                                              trainer_gpus + 8]
    scored = [n for n in data["neighbours"] if "step_time_s" in n]
    assert scored and all(n["step_time_s"] >= chosen["step_time_s"] for n in scored)
    assert "change the algorithm" in data["caveat"]
    code, text, _ = run(capsys, *args)
    assert f"bottleneck: the {pool} pool" in text
    assert "one node less for the trainer" in text and "one node more for the trainer" in text
    assert "x slower" in text and "staleness" in text and "change the algorithm" in text


def test_explain_best_names_the_winner_and_its_speedup(capsys):
    code, data = run_json(capsys, "explain", *GRPO, "--gpus", "16", "--mode", "best")
    assert code == 0
    steps = {m["mode"]: m["step_time_s"] for m in data["modes"]}
    assert data["winner"] == min(steps, key=steps.get)
    assert data["speedup_vs_sync"] == pytest.approx(steps["sync"] / steps[data["winner"]],
                                                    abs=1e-3)
    code, text, _ = run(capsys, "explain", *GRPO, "--gpus", "16", "--mode", "best")
    assert f"{data['winner']} wins" in text and "speed-up over sync" in text
    assert "change the algorithm" in text


@pytest.mark.parametrize("argv, message", [
    (["estimate", "--tp", "2", "--mode", "one-step-off", "--trainer-gpus", "16"],
     "--trainer-gpus 16 leaves no rollout GPU of --gpus 16; valid: 1..15"),
    (["estimate", "--tp", "2", "--mode", "one-step-off", "--trainer-gpus", "12"],
     "trainer pool of 12 GPUs is not whole nodes of 8"),
    (["estimate", "--tp", "2", "--mode", "best"], "--mode best compares"),
    (["estimate", "--tp", "2", "--trainer-gpus", "8"], "--trainer-gpus 8 sizes the trainer"),
    (["explain", "--mode", "fully-async", "--trainer-gpus", "4"], "not whole nodes"),
    (["explain", "--trainer-gpus", "8"], "sync colocates"),
    # fully-async's async_training flags are never silently dropped by another mode
    (["estimate", "--tp", "2", "--mode", "one-step-off", "--staleness-threshold", "0.5"],
     "--staleness-threshold: fully-async's async_training settings; --mode one-step-off"),
    (["plan", "--no-partial-rollout"], "--no-partial-rollout: fully-async's"),
    (["explain", "--trigger-parameter-sync-step", "2"], "--trigger-parameter-sync-step"),
])
def test_bad_mode_input_is_one_line_and_exit_2(capsys, argv, message):
    code, out, err = run(capsys, *argv, *GRPO, "--gpus", "16")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err


@pytest.mark.parametrize("command", ["plan", "estimate", "explain"])
def test_a_split_mode_on_one_gpu_is_one_line_and_exit_2(capsys, command):
    """One GPU cannot hold two pools: plan said 'splits 0 tried, 0 fit ... no split fits in GPU
    memory' (exit 1), estimate exited 1 printing nothing."""
    layout = ["--tp", "1"] if command == "estimate" else []
    code, out, err = run(capsys, command, *GRPO, "--model", "qwen3-0.6b", "--gpus", "1",
                         "--mode", "one-step-off", *layout)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        "plan-parallel: error: --mode one-step-off splits the GPUs into a trainer and a rollout "
        "pool of at least one GPU each; --gpus 1 has one (--mode sync colocates them)"]


def test_best_on_one_gpu_lists_the_split_modes_as_no_fit(capsys):
    """--mode best where a split mode has no plan crashed on the table's start/end columns
    (KeyError: 'start') whenever the lengths move over the run (the default)."""
    code, out, err = run(capsys, "plan", *GRPO, "--model", "qwen3-0.6b", "--gpus", "1",
                         "--mode", "best")
    assert code == 0 and "Traceback" not in err
    rows = {line.split()[0]: line for line in out.splitlines()
            if line.split()[:1] in (["sync"], ["one-step-off"], ["fully-async"])}
    assert set(rows) == {"sync", "one-step-off", "fully-async"}
    assert "no fit" in rows["one-step-off"] and "no fit" in rows["fully-async"]
    assert "no fit" not in rows["sync"]
