"""The host's floor on an RL trainer's micro-batch (``Efficiency.host_layer_s``,
:func:`planner.cost.timing.host_layer_s`): a micro-batch takes at least the host's time to
prepare and launch it, per layer on the stage; hand-worked numbers with and without pipeline
parallelism, and the cases where GPU work hides it."""

import dataclasses

import pytest
from conftest import cluster

from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload, PretrainWorkload
from planner.cost.efficiency import RL_SHARED, CostModel, Efficiency, prior
from planner.cost.memory import estimate_memory
from planner.cost.request import PlanRequest
from planner.cost.timing import (
    FORWARD_ONLY_HOST_SHARE,
    grpo_step,
    log_prob_phase_s,
    pretrain_step,
    update_phase_s,
)
from planner.search.layout import Layout

MODEL = resolve_model("qwen2.5-7b")  # 28 layers
# 64 prompts x 8 = 512 sequences per step; mini-batches of 16 prompts = 128 sequences, so 4
# optimizer steps; short sequences (64 + 64 tokens), so one sequence's GPU time is a few ms
WORKLOAD = GrpoWorkload(train_batch_size=64, rollout_n=8, mini_batch_size=16,
                        prompt_length=64, response_length=64, mean_response_length=64)


def _request(host_s: float, workload=WORKLOAD) -> PlanRequest:
    efficiency = dataclasses.replace(Efficiency(), host_layer_s=host_s)
    return PlanRequest(MODEL, cluster(8), workload, cost=CostModel.fixed(efficiency))


def _cols(**values):
    values = {"sequence_parallel": values.get("tp", 1) > 1, **values}
    return Layout(**values).to_columns()


def _total(phase, cols, host_s: float) -> float:
    return float(phase(_request(host_s), cols)["total_s"][0])


def test_host_bound_micro_batches_take_the_host_time_per_layer():
    # DP 8: 128 / 8 = 16 sequences per rank per mini-batch, one per micro-batch -> 16
    # micro-batches; 4 optimizer steps -> 64.  At 10 and 20 ms per layer the 28-layer floor
    # (0.28 s, 0.56 s) is far above one 128-token sequence's GPU time, so each micro-batch
    # takes the floor: 64 x 28 x 10 ms = 17.92 s between the two
    cols = _cols(tp=1, dp=8, micro_batch=1, log_prob_micro_batch=1)
    assert _total(update_phase_s, cols, 0.02) - _total(update_phase_s, cols, 0.01) == \
        pytest.approx(64 * 28 * 0.01)
    # log-prob: 512 / 8 = 64 forward-only micro-batches at half the floor: 64 x 28 x 5 ms
    assert FORWARD_ONLY_HOST_SHARE == 0.5
    assert _total(log_prob_phase_s, cols, 0.02) - _total(log_prob_phase_s, cols, 0.01) == \
        pytest.approx(64 * 28 * 0.01 * 0.5)


def test_pipeline_stages_pay_the_floor_at_once_for_their_own_layers():
    # PP 2, DP 4: 14 layers per stage; 128 / 4 = 32 micro-batches per optimizer step, and the
    # 1F1B schedule runs m + (pp - 1) = 33 slots of the floor: 4 x 33 x 14 x 10 ms = 18.48 s --
    # one stage's layers, not the model's 28, and not summed over the two stages
    cols = _cols(tp=1, pp=2, dp=4, micro_batch=1, log_prob_micro_batch=1)
    assert _total(update_phase_s, cols, 0.02) - _total(update_phase_s, cols, 0.01) == \
        pytest.approx(4 * 33 * 14 * 0.01)


def test_gpu_work_above_the_floor_hides_it():
    # 16 sequences x 128 tokens per rank per mini-batch packed in one 2048-token dynamic
    # micro-batch: at 0.01 ms per layer the floor (0.28 ms) is below its GPU time
    cols = _cols(tp=1, dp=8, dynamic_batch=True, max_token_len=2048)
    assert _total(update_phase_s, cols, 1e-5) == _total(update_phase_s, cols, 0.0)
    # fewer, larger micro-batches pay the floor fewer times: 4 x 1 x 28 x 10 ms
    assert _total(update_phase_s, cols, 0.02) - _total(update_phase_s, cols, 0.01) == \
        pytest.approx(4 * 1 * 28 * 0.01)


def test_the_step_books_it_as_latency_of_the_training_phases():
    cols = _cols(tp=1, dp=8, micro_batch=1, log_prob_micro_batch=1)
    request, base = _request(0.01), _request(0.0)
    memory = estimate_memory(request, cols)
    out, gpu = grpo_step(request, cols, memory), grpo_step(base, cols, memory)
    for phase in ("update_actor", "old_log_prob", "ref"):
        added = float(out[f"time_{phase}_s"][0] - gpu[f"time_{phase}_s"][0])
        assert float(out[f"breakdown_{phase}_latency_s"][0]) == pytest.approx(added)
        assert added > 0


def test_a_plain_megatron_step_has_no_host_floor():
    workload = PretrainWorkload(seq_len=128, global_batch=64)
    cols = _cols(tp=1, dp=8, micro_batch=1)
    times = [float(pretrain_step(_request(host, workload), cols)["step_time_s"][0])
             for host in (0.0, 0.02)]
    assert times[0] == times[1]


def test_it_is_one_shared_rl_constant_with_a_prior():
    assert "host_layer_s" in RL_SHARED
    centre, sigma, (low, high) = prior("host_layer_s")
    assert low < centre < high and sigma > 0
    assert low <= CostModel.load().shared.host_layer_s <= high


def test_an_rl_only_refit_starts_from_the_training_fit_as_it_stands():
    """``benchmarks/calibrate.py --rl-only`` keeps the file's training constants, per-GPU GEMM
    efficiencies, fit error and ranking uncertainty, and leaves every RL constant to the fit."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from calibrate import training_part

    from planner.cost.efficiency import RL_PRIORS, SHARED, shipped_calibration

    shipped = shipped_calibration()
    part = training_part(shipped)
    assert set(part["shared"]) == set(SHARED)
    assert part["shared"] == \
        {k: shipped["shared"][k] for k in SHARED}
    for key, entry in part["by_gpu"].items():
        assert entry["gemm"] == shipped["by_gpu"][key]["gemm"]
        assert not set(entry) & (set(RL_PRIORS) | {"rl_donor"})
    assert part["fit"] == shipped["fit"]
    assert part["ranking_uncertainty"] == shipped["ranking_uncertainty"]
    assert "rl_fit" not in part and "provenance" not in part
