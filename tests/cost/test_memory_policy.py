"""The memory policy (issue 14): one band, read by the plan's rollout-pool choice, the ranking,
the text and HTML outputs; two named memory quantities."""

import numpy as np
import pytest
from conftest import cluster

from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cli.main import main
from planner.cost.columns import memory_column, working_set_column
from planner.cost.memory import estimate_memory, kv_tokens_per_sequence
from planner.cost.request import PlanRequest
from planner.errors import PlanInputError
from planner.phases import PHASES
from planner.plan import estimate_layout, make_plan
from planner.policy import DEFAULT_POLICY, FILL_POLICY, PEAK_NAME, WORKING_SET_NAME, MemoryPolicy
from planner.search.layout import Layout

QWEN3_30B = resolve_model("qwen3-30b")
QWEN3_8B = resolve_model("qwen3-8b")


@pytest.fixture(scope="module")
def plans():
    return {policy: make_plan(PlanRequest(QWEN3_30B, cluster(16), GrpoWorkload(), policy=policy), tie_tolerance=0.0)
            for policy in (DEFAULT_POLICY, FILL_POLICY)}


def test_policy_parses_fractions_and_percent_and_rejects_non_bands():
    assert MemoryPolicy.parse("0.70-0.85") == DEFAULT_POLICY == MemoryPolicy.parse("70-85")
    assert MemoryPolicy.parse("0.70-0.95") == FILL_POLICY and FILL_POLICY.fills_gpu
    assert not DEFAULT_POLICY.fills_gpu
    for bad in ("0.9-0.8", "85", "a-b", "0.5-1.2"):
        with pytest.raises(PlanInputError, match="--memory-band"):
            MemoryPolicy.parse(bad)
    assert [DEFAULT_POLICY.position(x) for x in (0.69, 0.70, 0.85, 0.86)] == \
        ["below", "inside", "inside", "above"]


def test_bad_band_is_one_line_exit_2(capsys):
    assert main(["--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100",
                 "--memory-band", "0.9-0.8"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--memory-band" in err and "\n" not in err and "Traceback" not in err


def test_picked_rollout_pool_keeps_the_peak_inside_the_band(plans):
    """The planner's gpu_memory_utilization keeps resident state + vLLM's pool below the band's
    top; the best layout sits inside the band; filling the GPU is an explicit option."""
    band, fill = plans[DEFAULT_POLICY], plans[FILL_POLICY]
    capacity = cluster(16).gpu.memory_bytes
    top = band.fitting.head(200)
    assert (top["mem_generate_bytes"] <= DEFAULT_POLICY.high * capacity + 1).all()
    assert (top["memory_utilization"] <= DEFAULT_POLICY.high + 1e-9).all()
    assert DEFAULT_POLICY.position(band.fitting.iloc[0]["memory_utilization"]) == "inside"
    # the fill plan uses memory the band keeps free, and is no slower
    assert fill.fitting.iloc[0]["memory_utilization"] > DEFAULT_POLICY.high
    assert fill.fitting.iloc[0]["step_time_s"] <= band.fitting.iloc[0]["step_time_s"]
    in_band = band.fitting[band.fitting["memory_utilization"] <= DEFAULT_POLICY.high]
    assert band.fitting.iloc[0]["step_time_s"] == in_band["step_time_s"].min()


def test_headroom_costs_kv_cache_and_generation_time():
    """A layout whose resident state leaves less than the whole batch's KV cache under the
    band: the band's pool is smaller, holds fewer KV tokens, and generates slower than the
    same layout filling the GPU (the fill columns price exactly that)."""
    layout = Layout(tp=1, pp=1, dp=8, micro_batch=2, rollout_tp=1, rollout_dp=1,
                    optimizer_offload=True, ref_param_offload=True)
    workload = GrpoWorkload(max_num_seqs=1024)
    band = estimate_layout(PlanRequest(QWEN3_8B, cluster(8), workload), layout, pick_utilization=True).row
    fill = estimate_layout(PlanRequest(QWEN3_8B, cluster(8), workload, policy=FILL_POLICY), layout, pick_utilization=True).row
    capacity = cluster(8).gpu.memory_bytes
    assert band["mem_generate_bytes"] <= DEFAULT_POLICY.high * capacity
    assert fill["gpu_memory_utilization"] > band["gpu_memory_utilization"]
    assert fill["kv_cache_tokens_per_gpu"] > band["kv_cache_tokens_per_gpu"]
    assert fill["time_generate_s"] < band["time_generate_s"]
    # the band's row prices the fill alternative with the same numbers
    assert band["gpu_memory_utilization_fill"] == fill["gpu_memory_utilization"]
    assert band["kv_cache_tokens_per_gpu_fill"] == fill["kv_cache_tokens_per_gpu"]
    assert band["time_generate_s_fill"] == pytest.approx(fill["time_generate_s"])
    assert band["peak_bytes_fill"] == pytest.approx(fill["peak_bytes"])


def test_working_set_is_below_the_nvidia_smi_peak_and_excludes_the_unused_pool():
    layout = Layout(tp=2, dp=4, micro_batch=2, rollout_tp=2, gpu_memory_utilization=0.6,
                    sequence_parallel=True)
    cols = layout.to_columns()
    out = estimate_memory(PlanRequest(QWEN3_8B, cluster(8), GrpoWorkload()), cols)
    for phase in PHASES:
        assert 0 < out[working_set_column(phase)][0] < out[memory_column(phase)][0]
    # generate: the nvidia-smi peak holds the whole pool, the working set the KV in use
    unused_kv = out["kv_cache_bytes"][0] - (
        min(out["rollout_concurrent_seqs"][0], out["rollout_seqs_per_rank"][0])
        * kv_tokens_per_sequence(GrpoWorkload())
        * out["kv_cache_bytes"][0] / out["kv_cache_tokens_per_gpu"][0])
    gap = out[memory_column("generate")][0] - out[working_set_column("generate")][0]
    assert gap == pytest.approx(unused_kv + 1.6 * 2**30, rel=0.02)  # + CUDA context, NCCL
    # a larger pool moves the nvidia-smi peak, not the working set, once the batch fits
    bigger = estimate_memory(PlanRequest(QWEN3_8B, cluster(8), GrpoWorkload()), Layout(**{**layout.to_dict(), "gpu_memory_utilization": 0.7})
                             .to_columns())
    assert bigger["mem_generate_bytes"][0] > out["mem_generate_bytes"][0]
    assert bigger[working_set_column("generate")][0] == \
        pytest.approx(out[working_set_column("generate")][0])


def test_plan_table_names_both_quantities_and_prices_the_headroom(capsys):
    assert main(["--model", "qwen3-30b", "--gpus", "16", "--gpu-type", "h100", "--top", "3"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines()
                  if line.startswith("#") and line.split()[1:2] == ["TP"])
    assert PEAK_NAME in header and WORKING_SET_NAME in header
    assert "memory band 70-85%" in out and "inside the band" in out
    assert "filling the GPU (--memory-band 0.70-0.95), the best layout would be" in out
    assert "cost of the headroom, same layout:" in out


def test_json_carries_the_band_and_both_quantities(capsys):
    import json

    assert main(["--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100", "--top", "2",
                 "--format", "json", "--memory-band", "0.6-0.8"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["memory_band"] == {"low": 0.6, "high": 0.8, "judges": PEAK_NAME}
    best = data["candidates"][0]
    assert best["band_position"] == "inside" and best["memory_utilization"] <= 0.8
    assert set(best["working_set_gib"]) == set(PHASES)
    assert all(best["working_set_gib"][p] <= best["memory_gib"][p] for p in PHASES)
    assert best["fill_gpu"]["gpu_memory_utilization"] >= best["layout"]["gpu_memory_utilization"]


def test_pareto_plot_shades_the_band_and_table_fits_the_page(plans):
    pytest.importorskip("matplotlib")
    from planner.report import plots
    from planner.report.html import candidate_table

    plan = plans[DEFAULT_POLICY]
    figure = plots.pareto_figure(plan.candidates, capacity_gib=79.6, band=(0.70, 0.85))
    labels = figure.axes[0].get_legend_handles_labels()[1]
    assert "memory band 70-85%" in labels
    assert figure.axes[0].get_xlabel().startswith(PEAK_NAME)
    spans = [p for p in figure.axes[0].patches if p.get_label() == "memory band 70-85%"]
    assert len(spans) == 1
    span = spans[0]  # a Rectangle in data x-coordinates
    assert span.get_x() == pytest.approx(0.70 * 79.6)
    assert span.get_x() + span.get_width() == pytest.approx(0.85 * 79.6)
    table = candidate_table(plan.candidates, plan.cluster.gpu.memory_bytes)
    assert table.count("<th>") == 10 and f"<th>{PEAK_NAME}</th>" in table
    assert f"<th>{WORKING_SET_NAME}</th>" in table
    # fitting candidates spread below the band's top now that the pool respects it
    fitting = plan.fitting
    assert (fitting["memory_utilization"] < 0.70).sum() > 0
    assert np.isfinite(fitting["step_time_s"].head(10)).all()
