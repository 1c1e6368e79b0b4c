"""Sizing the cluster: GPU counts and types swept, the best layout per count, the run's time,
GPU-hours and cost, the marked points, and bad input."""

import json
import math

import numpy as np
import pytest
from conftest import cluster

from planner.catalog.hardware import get_gpu
from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cli.main import main
from planner.cost.request import PlanRequest
from planner.errors import PlanInputError
from planner.output import sizing_json
from planner.plan import make_plan
from planner.search.space import SearchOptions, build_space
from planner.sizing.best_per_count import best_layout
from planner.sizing.counts import GpuCounts, auto_counts, parse_counts, skipped_ends
from planner.sizing.prices import parse_prices, read_prices
from planner.sizing.sweep import SizingRequest, SizingRow, knee, run_length, size_cluster

# Long responses make memory, not only time, depend on the GPU: Qwen3-30B-A3B needs 8 L40S,
# 4 H100 or H20, 2 H200 or B200.
LONG = GrpoWorkload(train_batch_size=128, rollout_n=8, prompt_length=2048,
                    response_length=16384, mini_batch_size=32)
SMALL_COUNTS = GpuCounts(counts=(1, 2, 4, 8, 16))


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def sweep(model="qwen3-30b", gpus=("h100",), counts=SMALL_COUNTS, workload=LONG, steps=50,
          prices=None, **kwargs):
    return size_cluster(SizingRequest(resolve_model(model), workload,
                                      tuple(get_gpu(g) for g in gpus), counts,
                                      run_length(workload, steps), gpus_per_node=8,
                                      prices=prices, **kwargs))


# --- the smallest count that fits, against a full plan per count ----------------------------

@pytest.mark.parametrize("model,gpu", [("qwen3-30b", "h100"), ("qwen3-30b", "h200"),
                                       ("llama3.1-70b", "h20")])
def test_smallest_fitting_count_agrees_with_per_count_plans(model, gpu):
    sizing = sweep(model, (gpu,))
    plans = {count: make_plan(PlanRequest(resolve_model(model), cluster(count, gpu), LONG))
             for count in SMALL_COUNTS.counts}
    for row in sizing.rows:
        assert row.fits == (len(plans[row.num_gpus].fitting) > 0), row.num_gpus
    fitting = [count for count, plan in plans.items() if len(plan.fitting)]
    summary = sizing.types[0]
    assert summary.smallest_fit == min(fitting)
    # "will not fit below N": the closest miss of the plan at the largest count below N
    below = max(count for count in SMALL_COUNTS.counts if count < min(fitting))
    closest = plans[below].candidates.iloc[0]
    blocked = sizing_json(sizing)["types"][0]["blocked_below"]
    assert blocked["num_gpus"] == below
    assert blocked["phase"] == str(closest["peak_phase"])
    assert blocked["peak_gib"] == pytest.approx(closest["peak_memory_gib"], abs=0.01)
    assert blocked["peak_gib"] > blocked["capacity_gib"]
    assert f"{blocked['phase']} needs" in blocked["reason"]


def test_smallest_fit_and_blocker_for_qwen3_30b_long_responses():
    sizing = sweep("qwen3-30b", ("l40s", "h100", "h20", "h200", "b200"))
    smallest = {summary.gpu: summary.smallest_fit for summary in sizing.types}
    assert smallest == {"L40S": 8, "H100-80GB": 4, "H20-96GB": 4, "H200": 2, "B200": 2}
    h100 = next(summary for summary in sizing.types if summary.gpu == "H100-80GB")
    assert h100.blocked_below.num_gpus == 2


def test_best_layout_is_the_plans_best_or_within_a_percent():
    model = resolve_model("qwen3-30b")
    for count in (8, 16):
        plan = make_plan(PlanRequest(model, cluster(count), LONG), tie_tolerance=0.0)
        result = best_layout(PlanRequest(model, cluster(count), LONG))
        best = float(plan.fitting["step_time_s"].iloc[0])
        # drawn from the same space with the same scores: never better, at most 1% worse
        assert best <= result.best["step_time_s"] <= best * 1.01
        # and it is one of the plan's layouts, scored the same
        same = plan.fitting[(plan.fitting["tp"] == result.best["tp"])
                            & (plan.fitting["pp"] == result.best["pp"])
                            & (plan.fitting["ep"] == result.best["ep"])
                            & (plan.fitting["cp"] == result.best["cp"])
                            & (plan.fitting["micro_batch"] == result.best["micro_batch"])
                            & (plan.fitting["step_time_s"] == result.best["step_time_s"])]
        assert len(same) >= 1


def test_explicit_rows_score_like_the_full_space():
    """The sweep's restricted spaces (knob, parallel and rollout rows) score a layout exactly as
    the full space does."""
    model, workload = resolve_model("qwen3-8b"), GrpoWorkload()
    plan = make_plan(PlanRequest(model, cluster(8), workload))
    row = plan.fitting.iloc[0]
    parallel = tuple(row[name].item() if hasattr(row[name], "item") else row[name]
                     for name in ("tp", "pp", "vpp", "cp", "ep", "etp", "first_stage_layers",
                                  "last_stage_layers", "account_embedding", "account_loss"))
    knobs = ((int(row["micro_batch"]), str(row["recompute"]), bool(row["param_offload"]),
              bool(row["optimizer_offload"]), bool(row["ref_param_offload"]),
              float(row["optimizer_cpu_fraction"])),)
    rollouts = ((int(row["rollout_tp"]), int(row["rollout_dp"]), int(row["rollout_ep"])),)
    options = SearchOptions(knob_rows=knobs, parallel_rows=(parallel,), rollout_rows=rollouts)
    assert len(build_space(model, cluster(8), workload, options)) == 1
    again = make_plan(PlanRequest(model, cluster(8), workload, options=options)).fitting.iloc[0]
    assert again["step_time_s"] == row["step_time_s"]
    assert again["peak_bytes"] == row["peak_bytes"]
    assert again["gpu_memory_utilization"] == row["gpu_memory_utilization"]


# --- more memory never needs more GPUs --------------------------------------------------------

@pytest.mark.parametrize("model", ["qwen3-30b", "llama3.1-70b", "qwen2.5-32b"])
def test_a_gpu_with_more_memory_never_needs_more_gpus(model):
    names = ("l40s", "a100", "h100", "h20", "h200", "b200", "b300")
    sizing = sweep(model, names, SMALL_COUNTS)
    smallest = {summary.gpu: summary.smallest_fit or math.inf for summary in sizing.types}
    gpus = [get_gpu(name) for name in names]
    for small in gpus:
        for large in gpus:
            more_memory = large.memory_bytes > small.memory_bytes
            # host RAM matters too (offload): compare parts with at least as much per GPU
            as_much_host = large.host_memory_per_gpu_bytes >= small.host_memory_per_gpu_bytes
            if more_memory and as_much_host:
                assert smallest[large.name] <= smallest[small.name], (large.name, small.name)


# --- run length, GPU-hours, cost --------------------------------------------------------------

def test_cost_is_gpu_hours_times_price_exactly(capsys):
    code, out, _ = run(capsys, "--model", "qwen3-30b", "--gpus", "1-16", "--gpu-type",
                       "h100,h200", "--price", "h100=2.49,h200=3.37", "--steps", "333",
                       "--train-batch-size", "128", "--rollout-n", "8", "--prompt-length", "2048",
                       "--response-length", "16384", "--mini-batch-size", "32",
                       "--format", "json")
    assert code == 0
    data = json.loads(out)
    price = {"H100-80GB": 2.49, "H200": 3.37}
    fitting = [row for row in data["rows"] if row["fits"]]
    assert len(fitting) >= 6
    for row in fitting:
        assert row["price_per_gpu_hour"] == price[row["gpu"]]
        assert row["cost"] == row["gpu_hours"] * price[row["gpu"]]
        assert row["gpu_hours"] == row["step_time_s"] * 333 * row["num_gpus"] / 3600
        assert row["run_time_s"] == row["step_time_s"] * 333
    for row in data["rows"]:
        if not row["fits"]:
            assert row["cost"] is None and row["gpu_hours"] is None and row["blocked"]
    cheapest = min(fitting, key=lambda row: (row["cost"], row["num_gpus"]))
    assert data["cheapest"] == {"gpu": cheapest["gpu"], "num_gpus": cheapest["num_gpus"]}
    fastest = min(fitting, key=lambda row: (row["run_time_s"], row["num_gpus"]))
    assert data["fastest"] == {"gpu": fastest["gpu"], "num_gpus": fastest["num_gpus"]}


def test_price_files_toml_and_json(tmp_path):
    toml = tmp_path / "prices.toml"
    toml.write_text('currency = "EUR "\n[prices]\nh100 = 2.5\n"H200" = 3\n')
    table = read_prices(toml)
    assert table.per_gpu_hour == (("H100-80GB", 2.5), ("H200", 3.0))
    assert table.currency == "EUR "
    flat = tmp_path / "prices.json"
    flat.write_text(json.dumps({"h20": 1.1, "b200": 5}))
    assert dict(read_prices(flat).per_gpu_hour) == {"H20-96GB": 1.1, "B200": 5.0}
    assert dict(parse_prices("h100=2.5, h20=1").per_gpu_hour) == {"H100-80GB": 2.5,
                                                                    "H20-96GB": 1.0}


def test_prices_from_a_file_price_the_sweep_and_choose_the_types(capsys, tmp_path):
    path = tmp_path / "prices.toml"
    path.write_text("h100 = 2.0\nh200 = 3.0\n")
    code, out, _ = run(capsys, "--model", "qwen3-8b", "--gpus", "8,16", "--prices", str(path),
                       "--format", "json")
    data = json.loads(out)
    assert code == 0
    assert {row["gpu"] for row in data["rows"]} == {"H100-80GB", "H200"}
    for row in data["rows"]:
        assert row["cost"] == row["gpu_hours"] * {"H100-80GB": 2.0, "H200": 3.0}[row["gpu"]]


def test_epochs_over_a_dataset_follow_verls_dataloader():
    workload = GrpoWorkload(train_batch_size=512)
    run_ = run_length(workload, epochs=3, dataset_prompts=17_398)
    assert run_.steps == 3 * (17_398 // 512)  # drop_last: 33 steps per epoch
    assert run_length(workload).steps == 100
    assert run_length(workload, steps=7).steps == 7
    with pytest.raises(PlanInputError, match="below one batch"):
        run_length(workload, epochs=1, dataset_prompts=511)
    with pytest.raises(PlanInputError, match="go together"):
        run_length(workload, epochs=1)
    with pytest.raises(PlanInputError, match="contradicts"):
        run_length(workload, steps=5, epochs=1, dataset_prompts=1000)


# --- marks ------------------------------------------------------------------------------------

def _row(count, step):
    return SizingRow(gpu="H100-80GB", num_gpus=count, num_nodes=max(count // 8, 1), valid=True,
                     fits=step is not None, step_time_s=step)


def test_knee_is_the_first_doubling_that_gains_too_little():
    rows = [_row(8, 100.0), _row(16, 52.0), _row(24, 40.0), _row(32, 30.0), _row(64, 24.0)]
    assert knee(rows, 1.5) == (32, 30.0 / 24.0)  # 8->16: 1.92x, 16->32: 1.73x, 32->64: 1.25x
    assert knee(rows, 1.8) == (16, 52.0 / 30.0)
    assert knee(rows, 1.1) == (None, None)
    assert knee([_row(8, None), _row(16, 50.0), _row(32, 45.0)], 1.5) == (16, 50.0 / 45.0)


def test_marks_on_a_sweep():
    sizing = sweep("qwen3-30b", ("h100", "h200"), GpuCounts(counts=(2, 4, 8, 16, 32)),
                   prices=parse_prices("h100=2.5,h200=3.5"))
    for summary in sizing.types:
        rows = [row for row in sizing.rows if row.gpu == summary.gpu and row.fits]
        fastest = min(rows, key=lambda row: (row.step_time_s, row.num_gpus))
        cheapest = min(rows, key=lambda row: (row.gpu_hours, row.num_gpus))
        assert summary.fastest == fastest.num_gpus and "fastest" in fastest.marks
        assert summary.cheapest == cheapest.num_gpus and "cheapest" in cheapest.marks
        smallest = min(row.num_gpus for row in rows)
        assert summary.smallest_fit == smallest
        marked = {row.num_gpus for row in sizing.rows
                  if row.gpu == summary.gpu and "smallest" in row.marks}
        assert marked == {smallest}
        if summary.knee is not None:
            step = {row.num_gpus: row.step_time_s for row in rows}
            assert step[summary.knee] / step[2 * summary.knee] < 1.5
            assert all(step[n] / step[2 * n] >= 1.5 for n in step
                       if n < summary.knee and 2 * n in step)
    assert sizing.cheapest.cost == min(row.cost for row in sizing.rows if row.fits)


def test_auto_doubles_until_each_type_passes_its_knee():
    sizing = sweep("qwen3-8b", ("h100",), GpuCounts(auto=True), workload=GrpoWorkload(),
                   min_scaling=1.9, auto_limit=256)
    counts = [row.num_gpus for row in sizing.rows]
    assert counts == list(auto_counts(8, 256))[:len(counts)]
    summary = sizing.types[0]
    if summary.knee is not None:
        assert counts[-1] == 2 * summary.knee  # stopped once the knee showed
    else:
        assert counts[-1] == 256


# --- counts and types -------------------------------------------------------------------------

def test_parse_counts():
    assert parse_counts("8-64", 8).counts == (8, 16, 24, 32, 40, 48, 56, 64)
    assert parse_counts("1-16", 8).counts == (1, 2, 4, 8, 16)
    assert parse_counts("12-40", 8).counts == (16, 24, 32, 40)
    assert parse_counts("64,8,16", 8).counts == (8, 16, 64)
    assert parse_counts("auto", 8).auto
    assert parse_counts("6-24", 6).counts == (6, 12, 18, 24)
    assert auto_counts(8, 128) == (1, 2, 4, 8, 16, 32, 64, 128)
    assert auto_counts(4, 16) == (1, 2, 4, 8, 16)


def test_a_range_says_which_of_its_ends_it_leaves_out():
    note = skipped_ends(parse_counts("8-20", 8), 8)
    assert note == ("--gpus 8-20: 20 is not whole nodes of 8 GPUs nor a part of one node, the "
                    "counts verl places; the sweep visits 8, 16")
    assert "3 and 1023 are" in skipped_ends(parse_counts("3-1023", 8), 8)
    assert skipped_ends(parse_counts("3-1023", 8), 8).endswith("visits 4, 8, 16, ..., 1016")
    for text in ("8-64", "1-16", "8,16", "auto", "16"):
        assert skipped_ends(parse_counts(text, 8), 8) is None


BAD_INPUTS = [
    (["--gpus", "64-8"], "runs backwards"),
    (["--gpus", "9-15"], "no count of whole nodes"),
    (["--gpus", "8-2000000"], "outside"),
    (["--gpus", "8-100000"], "at most 256"),
    (["--gpus", "8,12"], "12 GPUs is not whole nodes"),
    (["--gpus", "8,8"], "twice"),
    (["--gpus", "8-x"], "'x' is not a GPU count"),
    (["--gpus", "8-16", "--gpu-type", "h100,,h200"], "empty name"),
    (["--gpus", "8-16", "--gpu-type", "h100,h999"], "unknown GPU type"),
    (["--gpus", "8-16", "--gpu-type", "h100,H100-80GB"], "twice"),
    (["--gpus", "8-16", "--price", "h100=abc"], "not a number"),
    (["--gpus", "8-16", "--price", "h100=-1"], "above 0"),
    (["--gpus", "8-16", "--price", "h100=nan"], "above 0"),
    (["--gpus", "8-16", "--price", "h100"], "not GPU=PRICE"),
    (["--gpus", "8-16", "--price", "foo=2"], "unknown GPU type"),
    (["--gpus", "8-16", "--price", "h100=2,H100-80GB=3"], "priced twice"),
    (["--gpus", "8-16", "--prices", "/nonexistent/prices.toml"], "cannot read"),
    (["--gpus", "8-16", "--epochs", "2"], "go together"),
    (["--gpus", "8-16", "--steps", "5", "--epochs", "1", "--dataset-prompts", "5000"],
     "contradicts"),
    (["--gpus", "8-16", "--epochs", "1", "--dataset-prompts", "10"], "below one batch"),
    (["--gpus", "8-16", "--min-scaling", "1"], "outside"),
    (["--gpus", "8-16", "--price", "h100=2", "--prices", "p.toml"], "not allowed with"),
    (["--gpus", "8-16", "--write", "out"], "--write exports one layout"),
]


@pytest.mark.parametrize("extra,needle", BAD_INPUTS)
def test_bad_range_or_price_is_one_line_exit_2(capsys, extra, needle):
    code, out, err = run(capsys, "--model", "qwen3-8b", "--gpu-type", "h100", *extra)
    assert code == 2, err
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("plan-parallel: error:"), err
    assert needle in err, err


@pytest.mark.parametrize("content,suffix,needle", [
    ("h100 = ", ".toml", "not valid TOML"),
    ("h100 = 'cheap'", ".toml", "not a number"),
    ("[prices]\nh100 = 2\n[other]\nx = 1", ".toml", "unexpected keys"),
    ("currency = 5\nh100 = 2", ".toml", "currency"),
    ("{\"h100\": 2,", ".json", "not valid JSON"),
    ("[1, 2]", ".json", "expected a table"),
    ("{\"h100\": true}", ".json", "not a number"),
    ("{}", ".json", "no prices"),
    ("h100=2", ".txt", ".toml or .json"),
])
def test_bad_price_file_is_one_line_exit_2(capsys, tmp_path, content, suffix, needle):
    path = tmp_path / f"prices{suffix}"
    path.write_text(content)
    code, out, err = run(capsys, "--model", "qwen3-8b", "--gpus", "8-16", "--prices", str(path))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and needle in err, err


# --- output -------------------------------------------------------------------------------------

def test_table_marks_the_points_and_says_what_blocks(capsys):
    code, out, err = run(capsys, "--model", "qwen3-30b", "--gpus", "1-16", "--gpu-type",
                         "h100,h200", "--train-batch-size", "128", "--rollout-n", "8",
                         "--prompt-length", "2048", "--response-length", "16384",
                         "--mini-batch-size", "32", "--steps", "200")
    assert code == 0, err
    assert "run      200 steps" in out
    assert "prices   none given" in out and "cost" not in out.splitlines()[5]
    assert "will not fit below 4 GPUs of H100-80GB: at 2 GPUs" in out
    assert "will not fit below 2 GPUs of H200: at 1 GPUs" in out
    assert "fastest:" in out and "smallest" in out
    assert "no price for H100-80GB, H200" in out


def test_csv_has_one_row_per_type_and_count(capsys):
    code, out, _ = run(capsys, "--model", "qwen3-8b", "--gpus", "8,16", "--gpu-type",
                       "h100,h20", "--format", "csv")
    lines = out.strip().splitlines()
    assert code == 0 and len(lines) == 5 and lines[0].startswith("gpu,num_gpus,num_nodes")


def test_report_draws_the_sizing_figure(capsys, tmp_path):
    html_path, png_dir = tmp_path / "sizing.html", tmp_path / "png"
    code, out, err = run(capsys, "report", "--model", "qwen3-8b", "--gpus", "1-16",
                         "--gpu-type", "h100,h20", "--price", "h100=2.5,h20=1.1",
                         "--html", str(html_path), "--png-dir", str(png_dir))
    assert code == 0, err
    page = html_path.read_text()
    assert "Step time and cost against GPU count" in page
    assert "data:image/png;base64," in page and "H20-96GB" in page
    assert (png_dir / "sizing.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, _, err = run(capsys, "report", "--model", "qwen3-8b", "--gpus", "1-16",
                       "--gpu-type", "h100", "--html", str(html_path))
    assert code == 2 and "exists" in err


def test_single_count_plan_is_unchanged(capsys):
    """Without a range, a list or a sizing flag, `plan` ranks layouts as before."""
    code, out, _ = run(capsys, "--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100",
                       "--format", "json", "--top", "1")
    assert code == 0 and "candidates" in json.loads(out)


def test_sizing_rows_are_json_ready():
    sizing = sweep("qwen3-8b", ("h100",), GpuCounts(counts=(8,)), workload=GrpoWorkload())
    text = json.dumps(sizing_json(sizing))
    assert np.isfinite(json.loads(text)["rows"][0]["step_time_s"])
