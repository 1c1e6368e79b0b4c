"""A calibration fit starts from the calibration it is given and keeps what it does not fit (the
RL constants), a user's file that lacks an RL constant takes the shipped one (with a note), a
calibration file's RL constants are bounded on read, and a phase's time parts add up to its
time (pipeline P2P booked as communication)."""

import json

import pytest
from conftest import cluster

from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cli.main import main
from planner.cost.calibration import Measurement, Problem, fit, mape, predict
from planner.cost.columns import TIME_PARTS, breakdown_column, time_column
from planner.cost.efficiency import (
    RL_BY_GPU,
    RL_SHARED,
    CostModel,
    shipped_calibration,
    shipped_cost_model,
    with_shipped_rl_constants,
)
from planner.cost.memory import estimate_memory
from planner.cost.request import PlanRequest
from planner.cost.timing import grpo_step
from planner.phases import PHASES
from planner.search.layout import Layout

MODEL = resolve_model("qwen2.5-7b")
CLUSTER = cluster(8)
H100 = CLUSTER.gpu
WORKLOAD = GrpoWorkload(train_batch_size=128, rollout_n=4, prompt_length=1024,
                        response_length=1024, mini_batch_size=32)
LAYOUTS = [Layout(tp=2, dp=4, micro_batch=2, sequence_parallel=True, rollout_tp=2),
           Layout(tp=4, dp=2, micro_batch=4, sequence_parallel=True, rollout_tp=4),
           Layout(tp=1, dp=8, micro_batch=1, rollout_tp=1)]


def _measurements(calibration) -> list[Measurement]:
    """The layouts as a cluster that behaves exactly like ``calibration`` measures them."""
    probes = [Measurement(MODEL, CLUSTER, WORKLOAD, layout, 1.0) for layout in LAYOUTS]
    truth = predict(probes, CostModel.load(calibration))
    return [Measurement(MODEL, CLUSTER, WORKLOAD, layout, float(value))
            for layout, value in zip(LAYOUTS, truth)]


def _rl_constants(cost: CostModel) -> dict:
    efficiency = cost.efficiency(H100, "bf16")
    return {name: getattr(efficiency, name) for name in RL_SHARED + RL_BY_GPU}


def test_a_fit_starts_from_the_initial_calibrations_rl_constants():
    start = shipped_calibration()
    problem = Problem(_measurements(start), CostModel.load(start))
    x0, _, _ = problem.start(start)
    assert _rl_constants(CostModel.fixed(problem.efficiency(x0, problem.measurements[0]))) \
        == _rl_constants(shipped_cost_model())
    # without an initial calibration (the published pretraining tables): the built-in defaults
    assert Problem(problem.measurements).efficiency(x0, problem.measurements[0]).host_layer_s \
        == 5e-3


@pytest.mark.needs("tune")  # the fit needs scipy
def test_a_fit_on_what_the_calibration_predicts_keeps_it_and_its_rl_constants():
    start = shipped_calibration()
    measurements = _measurements(start)
    measured = [m.tokens_per_s_per_gpu for m in measurements]
    fitted = fit(measurements, initial=start, measurement_sigma=0.05)
    # before and after are judged with the same RL constants: a cluster that is exactly the
    # starting calibration stays (within the fit's tolerance) exactly predicted
    assert mape(predict(measurements, CostModel.load(start)), measured) == pytest.approx(0)
    assert mape(predict(measurements, CostModel.load(fitted)), measured) < 1e-3
    # the file written carries the RL constants unchanged, shared and per GPU
    assert _rl_constants(CostModel.load(fitted)) == _rl_constants(shipped_cost_model())
    assert {name: fitted["shared"][name] for name in RL_SHARED} == \
        {name: start["shared"][name] for name in RL_SHARED}
    for key, entry in fitted["by_gpu"].items():
        assert entry["decode_hbm"] == shipped_cost_model().efficiency_of(key).decode_hbm, key
    assert fitted["rl_fit"] == start["rl_fit"]
    assert fitted["provenance"] == {"rl": start["provenance"]["rl"]}


@pytest.mark.needs("tune")  # the fit needs scipy
def test_a_fit_without_an_initial_calibration_holds_the_training_constants_alone():
    fitted = fit(_measurements(shipped_calibration()))
    assert not set(fitted["shared"]) & set(RL_SHARED)
    assert not any(set(entry) & set(RL_BY_GPU) for entry in fitted["by_gpu"].values())


def test_a_user_file_without_rl_constants_takes_the_shipped_ones():
    partial = {"shared": {"host_layer_s": 0.006}, "by_gpu": {"H100-80GB/bf16": {"gemm": 0.7}}}
    filled, names = with_shipped_rl_constants(partial)
    assert names == tuple(sorted(set(RL_SHARED + RL_BY_GPU) - {"host_layer_s"}))
    assert partial == {"shared": {"host_layer_s": 0.006},
                       "by_gpu": {"H100-80GB/bf16": {"gemm": 0.7}}}  # not changed
    cost = CostModel.load(partial, "mine.json", fill_from_shipped=True)
    assert cost.filled_from_shipped == names
    expected = {**_rl_constants(shipped_cost_model()), "host_layer_s": 0.006}
    assert _rl_constants(cost) == expected
    assert cost.efficiency(H100, "bf16").gemm == 0.7
    assert CostModel.load(partial).filled_from_shipped == ()  # only when asked
    assert with_shipped_rl_constants(shipped_calibration())[1] == ()


def test_the_cli_notes_the_filled_rl_constants_once(tmp_path, capsys):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"shared": {"step_fixed_s": 2.0},
                                "by_gpu": {"H100-80GB/bf16": {"gemm": 0.7}}}))
    assert main(["estimate", "--model", "qwen2.5-7b", "--gpus", "8", "--gpu-type", "h100",
                 "--tp", "2", "--rollout-tp", "2", "--calibration", str(path)]) == 0
    err = capsys.readouterr().err
    assert err.count(f"note: {path} has no ") == 1
    line = next(x for x in err.splitlines() if x.startswith(f"note: {path} has no "))
    assert "host_layer_s" in line and "decode_hbm" in line and "step_fixed_s" not in line


def test_time_parts_add_up_to_the_phase_time_with_pipeline_p2p():
    model = resolve_model("qwen3-8b")
    gpus = cluster(16)
    workload = GrpoWorkload()
    cols = Layout(tp=1, pp=2, vpp=2, dp=8, micro_batch=1, log_prob_micro_batch=1,
                  rollout_tp=2).to_columns()
    request = PlanRequest(model, gpus, workload)
    memory = estimate_memory(request, cols, pick_utilization=True)
    cols.update(gpu_memory_utilization=memory["gpu_memory_utilization"])
    out = grpo_step(request, cols, memory)
    for phase in PHASES:
        parts = sum(float(out[breakdown_column(phase, part)][0]) for part in TIME_PARTS)
        assert parts == pytest.approx(float(out[time_column(phase)][0]), rel=1e-9), phase
    # TP1 CP1 EP1: the log-prob's only communication is the P2P between the two stages
    assert float(out[breakdown_column("old_log_prob", "comm_s")][0]) > 0


@pytest.mark.needs("tune")  # the fit needs scipy
def test_a_study_of_one_gpu_type_leaves_the_other_parts_as_they_were():
    """An H100 bf16 study refits H100 bf16; the parts it did not measure keep the initial
    calibration's figures (H100 fp8, the A100, the B200), and a part that borrows from the
    refitted one (H200 from the H100) follows it."""
    start = shipped_calibration()
    measurements = [Measurement(m.model, m.cluster, m.workload, m.layout,
                                m.tokens_per_s_per_gpu * 0.8) for m in _measurements(start)]
    fitted = fit(measurements, initial=start, measurement_sigma=0.05)
    for key in ("H100-80GB/fp8", "A100-80GB/bf16", "B200/bf16", "GB200/bf16"):
        assert fitted["by_gpu"][key] == {**start["by_gpu"][key],
                                         **{k: fitted["by_gpu"][key][k] for k in RL_BY_GPU}}, key
        assert fitted["by_gpu"][key]["gemm"] == start["by_gpu"][key]["gemm"], key
    assert fitted["by_gpu"]["H100-80GB/bf16"]["gemm"] != start["by_gpu"]["H100-80GB/bf16"]["gemm"]
    assert fitted["by_gpu"]["H200/bf16"] == {"gemm": fitted["by_gpu"]["H100-80GB/bf16"]["gemm"],
                                            "donor": "H100-80GB/bf16",
                                            **{k: fitted["by_gpu"]["H200/bf16"][k]
                                               for k in fitted["by_gpu"]["H200/bf16"]
                                               if k not in ("gemm", "donor")}}
    assert set(start["by_gpu"]) <= set(fitted["by_gpu"])


def test_filled_rl_constants_carry_the_shipped_rl_fit_and_provenance():
    """An old file (training constants only) filled with the shipped RL constants also says where
    they came from; a file that has its own RL constants is left as it is."""
    start = shipped_calibration()
    old = {"shared": {k: v for k, v in start["shared"].items() if k not in RL_SHARED},
           "by_gpu": {"H100-80GB/bf16": {"gemm": 0.6}}}
    filled, names = with_shipped_rl_constants(old)
    assert names and filled["rl_fit"] == start["rl_fit"]
    assert filled["provenance"]["rl"] == start["provenance"]["rl"]
    same, none = with_shipped_rl_constants(start)
    assert none == () and same["rl_fit"] == start["rl_fit"]
