"""`plan-parallel fix` and `plan-parallel diff` on verl launch scripts written here."""

import json

import pytest

from planner.cli.main import main
from planner.diagnose.fix import chain_name

pytestmark = pytest.mark.needs("verl")

SCRIPT = """set -x
export CUDA_DEVICE_MAX_CONNECTIONS=1
python3 -m verl.trainer.main_ppo model_engine=megatron \\
    data.train_files=/data/gsm8k/train.parquet \\
    data.val_files=/data/gsm8k/test.parquet \\
    algorithm.adv_estimator=grpo \\
    actor_rollout_ref.actor.use_kl_loss=True \\
    actor_rollout_ref.actor.kl_loss_type={kl} \\
    actor_rollout_ref.rollout.name=vllm \\
    trainer.n_gpus_per_node=8 \\
    trainer.nnodes=1 \\
    data.train_batch_size=1024 \\
    data.max_prompt_length=1024 \\
    data.max_response_length=1024 \\
    actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct \\
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro} \\
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size={tp} \\
    actor_rollout_ref.ref.megatron.tensor_model_parallel_size={tp} \\
    actor_rollout_ref.rollout.n=5 \\
    actor_rollout_ref.rollout.gpu_memory_utilization={util} \\
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \\
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro} \\
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro}
"""


def script(tmp_path, name="run.sh", kl="low_var_kl", micro=8, tp=1, util=0.6):
    path = tmp_path / name
    path.write_text(SCRIPT.format(kl=kl, micro=micro, tp=tp, util=util))
    return str(path)


def test_fix_lists_fitting_mitigations_and_writes_a_job_that_validates(tmp_path, capsys):
    too_big = script(tmp_path, micro=8, tp=1)
    out = tmp_path / "fixed"
    assert main(["fix", too_big, "--gpu-type", "h100", "--format", "json",
                 "--write", str(out)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert not result["current"]["fits"] and result["current"]["peak_memory_gib"] > 79.6
    best = result["mitigations"][0]
    assert best["fits"] and best["peak_memory_gib"] < 79.6
    assert all(o.lstrip("+").startswith("actor_rollout_ref.") for o in best["overrides"])
    # the chain is cheaper than any single change that is not enough alone
    assert not any(m["fits"] for m in result["mitigations"][1:])
    assert main(["validate", str(out / "run_grpo.sh"), "--gpu-type", "h100"]) == 0


def test_a_chain_that_changes_a_setting_twice_names_it_once(tmp_path, capsys):
    # the greedy chain halves the micro-batch twice (16 -> 8, then 8 -> 4): one change, 16 -> 4
    assert main(["fix", script(tmp_path, micro=16), "--gpu-type", "h100", "--format",
                 "json"]) == 0
    chain = json.loads(capsys.readouterr().out)["mitigations"][0]
    assert chain["fits"] and chain["change"].startswith("micro-batch 16 -> 4 + "), chain["change"]
    assert chain["change"].count("micro-batch") == 1


def test_chain_name_joins_the_steps_of_one_setting():
    assert chain_name(["recompute none -> selective", "reference offload",
                       "recompute selective -> full"]) == "recompute none -> full + reference offload"
    assert chain_name(["token budget 8192 -> 4096 per GPU", "token budget 4096 -> 2048 per GPU",
                       "TP 1 -> 2", "PP 1 -> 2"]) == \
        "token budget 8192 -> 2048 per GPU + TP 1 -> 2 + PP 1 -> 2"


def test_fix_orders_single_mitigations_by_step_time(tmp_path, capsys):
    tight = script(tmp_path, micro=4, tp=2, util=0.6)
    # under the fill-the-GPU band more single changes are enough alone
    assert main(["fix", tight, "--gpu-type", "h100", "--format", "json",
                 "--memory-band", "0.70-0.95"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert not result["current"]["fits"] and not result["in_band"]
    assert all(m["fits"] for m in result["mitigations"])  # single changes are enough here
    times = [m["step_time_s"] for m in result["mitigations"]]
    assert len(times) >= 3 and times == sorted(times)


def test_diff_rates_risk_and_predicts_both_sides(tmp_path, capsys):
    a = script(tmp_path, "a.sh", micro=4, tp=2, kl="low_var_kl")
    b = script(tmp_path, "b.sh", micro=2, tp=4, kl="kl")
    assert main(["diff", a, b, "--gpu-type", "h100", "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    risks = {c["key"]: c["risk"] for c in result["changes"]}
    assert risks["actor_rollout_ref.actor.megatron.tensor_model_parallel_size"] == "high"
    assert risks["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == "medium"
    assert risks["actor_rollout_ref.actor.kl_loss_type"] == "low"
    assert [c["risk"] for c in result["changes"]] == sorted(
        (c["risk"] for c in result["changes"]), key=["high", "medium", "low"].index)

    tp = next(c for c in result["changes"] if c["key"].endswith("actor.megatron."
                                                                "tensor_model_parallel_size"))
    assert "1, 2, 4, 7" not in tp["safe_range"] and "4" in tp["safe_range"]
    assert result["before"]["peak_memory_gib"] != result["after"]["peak_memory_gib"]
    assert result["before"]["tokens_per_s_per_gpu"] > 0


def test_diff_names_the_rule_a_changed_job_breaks(tmp_path, capsys):
    """It said 'not estimated (the layout breaks a rule)', never which rule."""
    a = script(tmp_path, "a.sh", micro=4, tp=2)
    b = script(tmp_path, "b.sh", micro=4, tp=3)
    assert main(["diff", a, b, "--gpu-type", "h100", "--format", "json"]) == 0
    errors = json.loads(capsys.readouterr().out)["after"]["errors"]
    assert errors and "model_parallel_size (3)" in errors[0]
    assert main(["diff", a, b, "--gpu-type", "h100"]) == 0
    after = next(line for line in capsys.readouterr().out.splitlines()
                 if line.startswith("after:"))
    assert after.startswith(f"after:  not estimated: {errors[0]}")


def test_diff_of_identical_jobs(tmp_path, capsys):
    a = script(tmp_path, "a.sh", micro=4, tp=2)
    assert main(["diff", a, a, "--gpu-type", "h100"]) == 0
    assert "no setting differs" in capsys.readouterr().out


def _fix(path, *extra):
    from planner.diagnose.fix import fix_job
    from planner.diagnose.validate import JobInput
    from planner.policy import MemoryPolicy

    band = extra[0] if extra else "0.70-0.85"
    return fix_job(JobInput(inputs=(path,), gpu_type="h100", policy=MemoryPolicy.parse(band)),
                   top=50)


@pytest.mark.parametrize("settings,band,direction", [
    (dict(micro=4, tp=2, util=0.6), "0.70-0.85", "down"),   # does not fit: update_actor
    (dict(micro=1, tp=2, util=0.8), "0.70-0.85", "down"),   # the rollout pool sets the peak
    (dict(micro=1, tp=2, util=0.3), "0.88-0.95", "up"),     # GPUs underused
    (dict(micro=1, tp=2, util=0.6), "0.50-0.60", "down"),   # a tighter band of the user's
])
def test_no_listed_mitigation_leaves_the_judged_peak_unchanged(tmp_path, settings, band,
                                                               direction):
    """fix judges the nvidia-smi peak (vLLM's whole pool included) and lists a change only when
    it moves that peak the needed way -- never recompute for a peak set by the rollout pool."""
    from planner.diagnose.fix import MIN_MOVE_BYTES
    from planner.units import GIB

    result = _fix(script(tmp_path, **settings), band)
    now = result.data["current"]
    assert not result.data["in_band"] and result.data["mitigations"]
    for m in result.data["mitigations"]:
        moved = (now["peak_memory_gib"] - m["peak_memory_gib"]) if direction == "down" \
            else (m["peak_memory_gib"] - now["peak_memory_gib"])
        assert moved >= MIN_MOVE_BYTES / GIB - 0.01, m


def test_pool_peak_is_fixed_first_by_the_pool_or_what_stays_resident(tmp_path, capsys):
    path = script(tmp_path, micro=1, tp=2, util=0.8)
    result = _fix(path)
    now = result.data["current"]
    assert now["peak_phase"] == "generate" and now["band_position"] == "above"
    changes = result.data["mitigations"]
    assert changes[0]["kind"] in ("rollout", "offload")
    assert not any(m["change"].startswith("recompute") or m["change"].startswith("micro-batch")
                   for m in changes)  # they do not touch the pool
    lowered = [m for m in changes if m["change"].startswith("gpu_memory_utilization")]
    assert lowered and all(m["generate_s"] >= now["generate_s"] for m in lowered)
    assert all(m["kv_cache_tokens_per_gpu"] < now["kv_cache_tokens_per_gpu"] for m in lowered)
    assert main(["fix", path, "--gpu-type", "h100"]) == 0
    text = capsys.readouterr().out
    assert "nvidia-smi peak" in text and "above the 70-85% band" in text
    assert f"generate {now['generate_s']:.1f} -> " in text


def test_fix_and_validate_judge_the_same_quantity(tmp_path):
    """validate warns about exactly the jobs fix wants to change, with the same number."""
    for util in (0.3, 0.5, 0.8):
        result = _fix(script(tmp_path, micro=1, tp=2, util=util))
        report = result.report
        band_warnings = [f for f in report["findings"] if f["check"] == "memory"
                         and ("band" in f["message"] or "will not fit" in f["message"])]
        assert report["memory"]["peak_memory_gib"] == result.data["current"]["peak_memory_gib"]
        assert report["memory"]["memory_band"]["position"] == \
            result.data["current"]["band_position"]
        assert bool(band_warnings) == (not result.data["in_band"]), util


def test_fix_of_a_job_with_dp_1_lists_mitigations(capsys):
    """verl's Qwen3-235B example (TP4 PP8 EP4 on 32 GPUs: DP 1) is above the band: a larger
    TP, PP or CP would need GPUs from an odd DP, which has none, and is left out -- not a
    crash on the layout's 'DP 0'."""
    from pathlib import Path

    example = Path(__file__).parents[1] / "verl_examples" / "run_qwen3-235b_megatron_96gb.sh"
    assert main(["fix", str(example), "--gpu-type", "h20", "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["current"]["peak_memory_gib"] > 0.85 * 95.6
    assert result["mitigations"]
    names = " ".join(m["change"] for m in result["mitigations"])
    assert "TP 4 -> 8" not in names and "PP 8 -> 16" not in names


def test_a_mini_batch_that_does_not_divide_the_batch_is_padded_not_refused(tmp_path, capsys):
    """verl 0.9.1's trainer pads a step to whole mini-batches (trainer/ppo/v1/trainer_base.py
    _balance_batch -> upsample_batch_to_divisible_size): train 1024 with mini-batch 384 runs
    ceil(1024/384) = 3 optimizer steps.  The plan times it so, validate warns; only the legacy
    trainer (trainer.use_v1=False), which does not pad, is refused."""
    plan = ["estimate", "--model", "qwen2.5-7b", "--gpus", "8", "--gpu-type", "h100", "--tp",
            "2", "--pp", "1", "--micro-batch", "4", "--no-dynamic-batch", "--format", "json"]
    times = {}
    for mini in (384, 512):
        assert main([*plan, "--mini-batch-size", str(mini)]) == 0
        times[mini] = json.loads(capsys.readouterr().out)["time_s"]["update_actor"]
    # 3 optimizer steps of 384 prompts against 2 of 512: the update's weight-sized work
    # (optimizer, gradient reduction) runs once more over the same 1024 prompts
    assert times[384] > times[512]
    job = script(tmp_path, micro=4, tp=2, util=0.3)
    mini = ["--", "actor_rollout_ref.actor.ppo_mini_batch_size=384"]
    assert main(["validate", job, "--gpu-type", "h100", *mini]) == 0
    out = capsys.readouterr().out
    assert "[mini_batch_padding]" in out and "verl pads the last mini-batch" in out
    assert main(["validate", job, "--gpu-type", "h100", *mini, "trainer.use_v1=False"]) == 1
    assert "legacy trainer (trainer.use_v1=False) does not pad" in capsys.readouterr().out


@pytest.mark.parametrize("key", [
    "actor_rollout_ref.actor.megatron.context_parallel_size",
    "actor_rollout_ref.ref.megatron.context_parallel_size",
    "actor_rollout_ref.actor.megatron.override_transformer_config"
    ".account_for_embedding_in_pipeline_split",
    "actor_rollout_ref.actor.megatron.override_transformer_config"
    ".account_for_loss_in_pipeline_split",
    "actor_rollout_ref.actor.megatron.override_transformer_config"
    ".pipeline_model_parallel_layout"])
def test_diff_rates_context_parallel_and_the_stage_split_high(key):
    """verl's CP key is ``context_parallel_size`` (no ``_model_``), and the stage split is set
    three ways besides the first/last stage layers: each is a parallel layout change (high), as
    the module says -- not 'bookkeeping or a setting the planner does not model'."""
    from planner.diagnose.diff import classify

    assert classify(key)[0] == "high"
