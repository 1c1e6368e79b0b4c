"""`plan-parallel validate`: reading launch scripts, verl's checks plus the ones it leaves to
run time, the memory verdict, and exit codes (0 would launch, 1 would not, 2 unreadable)."""

import json

import pytest
from fixtures.imports import imported_by

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.lengths import default_lengths
from planner.catalog.models import builtin_config_dict, builtin_model
from planner.catalog.workload import GrpoWorkload
from planner.cli.main import main
from planner.cost.request import PlanRequest
from planner.diagnose.validate import JobInput, dry_run
from planner.errors import PlanInputError
from planner.plan import estimate_layout
from planner.search.layout import Layout
from planner.verl.script import expand_override, parse_launch_script

A = "actor_rollout_ref"
M = f"{A}.actor.megatron"

# --- the shell reader ----------------------------------------------------------------------


def overrides(text, **env):
    return list(parse_launch_script(text, {"HOME": "/home/u", **env}, "t.sh").overrides)


def test_script_reading_follows_bash():
    text = r"""#!/bin/bash
set -xeuo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=1 # a comment with $NOT_SET
train="['$HOME/a.parquet', '$HOME/b.parquet']"
MODEL=${MODEL_PATH:-"$HOME/models/Qwen2-7B"}
len=$((1024 * 4))
half=$(( len / 3 ))
EXTRA="trainer.test_freq=5 trainer.save_freq=-1"
ray start --address=$HEAD_NODE_NOT_SET  # unset, but not the verl command's business
cat <<EOF > note.txt
python3 -m verl.trainer.main_ppo not=this
EOF
python3 -m verl.trainer.main_ppo --config-path=config \
    --config-name='ppo_megatron_trainer.yaml'\
    data.train_files="$train" \
    actor_rollout_ref.model.path=$MODEL \
    data.max_response_length=${len} data.x=$half \
    trainer.logger='["console","wandb"]' \
    $EXTRA \
    'literal=$NOT_EXPANDED' escaped=\$HOME \
    trainer.name="run-$(date +%s)" \
    trainer.total_epochs=15 "$@" 2>&1 | tee log.txt
"""
    command = parse_launch_script(text, {"HOME": "/home/u"}, "t.sh")
    assert command.config_path == "config"
    assert command.config_name == "ppo_megatron_trainer.yaml"
    assert list(command.overrides) == [
        "data.train_files=['/home/u/a.parquet', '/home/u/b.parquet']",
        "actor_rollout_ref.model.path=/home/u/models/Qwen2-7B",
        "data.max_response_length=4096", "data.x=1365",
        'trainer.logger=["console","wandb"]',
        "trainer.test_freq=5", "trainer.save_freq=-1",
        "literal=$NOT_EXPANDED", "escaped=$HOME",
        "trainer.name=run-$(date +%s)",
        "trainer.total_epochs=15"]
    assert any("$(date +%s)" in note and "not run" in note for note in command.notes)
    assert overrides(text, MODEL_PATH="/m")[1] == "actor_rollout_ref.model.path=/m"


def test_unset_variable_used_by_the_command_is_an_error_naming_it():
    text = "python3 -m verl.trainer.main_ppo \\\n  actor_rollout_ref.model.path=$MODEL_PATH\n"
    with pytest.raises(PlanInputError, match=r"line 1: \$MODEL_PATH is not set.*--set "
                                             r"MODEL_PATH=VALUE"):
        overrides(text)
    indirect = "P=${MODEL_PATH}/x\npython3 -m verl.trainer.main_ppo a.b=$P\n"
    with pytest.raises(PlanInputError, match=r"\$MODEL_PATH is not set"):
        overrides(indirect)
    assert overrides(indirect, MODEL_PATH="/m") == ["a.b=/m/x"]
    assert overrides("python3 -m verl.trainer.main_ppo a=${X:-}\n") == ["a="]
    assert overrides("python3 -m verl.trainer.main_ppo a=${X:=7} b=$X\n") == ["a=7", "b=7"]


@pytest.mark.parametrize("text,needle", [
    ("echo hello\n", "no `python3 -m verl.trainer.main_ppo` command"),
    ("python3 -m verl.trainer.main_ppo a=1\npython3 -m verl.trainer.main_ppo a=2\n",
     "2 times"),
    ("python3 -m verl.trainer.main_ppo a='unterminated\n", "unterminated single quote"),
])
def test_unreadable_scripts(text, needle):
    with pytest.raises(PlanInputError, match=needle):
        overrides(text)


def test_command_line_overrides_expand_shell_but_not_hydra_interpolations():
    env = {"DATA": "/d"}
    assert expand_override("data.train_files=$DATA/t.parquet", env) == \
        "data.train_files=/d/t.parquet"
    assert expand_override("data.val_files=${data.train_files}", env) == \
        "data.val_files=${data.train_files}"
    assert expand_override("a.b=${oc.env:HOME}", env) == "a.b=${oc.env:HOME}"
    with pytest.raises(PlanInputError, match=r"\$NOPE is not set"):
        expand_override("a=$NOPE", env)


# --- dry runs ------------------------------------------------------------------------------

COMMON = """    data.train_files=$HOME/data/gsm8k/train.parquet \\
    data.val_files=$HOME/data/gsm8k/test.parquet \\
    algorithm.adv_estimator=grpo \\
    algorithm.use_kl_in_reward=False \\
    actor_rollout_ref.actor.optim.lr=1e-6 \\
    actor_rollout_ref.actor.use_kl_loss=True \\
    actor_rollout_ref.actor.kl_loss_coef=0.001 \\
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \\
    actor_rollout_ref.rollout.name=vllm \\
    trainer.critic_warmup=0 \\
    trainer.logger=['console'] \\
    trainer.n_gpus_per_node=8 \\
"""

# Test copies of the layouts of verl's examples/grpo_trainer/*megatron*.sh (keys updated to
# verl 0.9.1: no rollout.mode=sync, no grad_offload; ppo_megatron_trainer is the old name).
QWEN2_7B = """set -x
export CUDA_DEVICE_MAX_CONNECTIONS=1 # For megatron communication/computation overlapping
python3 -m verl.trainer.main_ppo --config-path=config \\
    --config-name='ppo_megatron_trainer.yaml'\\
{common}    data.train_batch_size=1024 \\
    data.max_prompt_length=1024 \\
    data.max_response_length=1024 \\
    actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct \\
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \\
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2 \\
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 \\
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \\
    actor_rollout_ref.rollout.tensor_model_parallel_size={rollout_tp} \\
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \\
    actor_rollout_ref.rollout.n=5 \\
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \\
    actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=2 \\
    actor_rollout_ref.ref.megatron.tensor_model_parallel_size={ref_tp} \\
    trainer.nnodes=1 \\
    trainer.total_epochs=15 $@
"""

QWEN3_MOE_30B = """HF_MODEL_PATH=Qwen/Qwen3-30B-A3B
python3 -m verl.trainer.main_ppo model_engine=megatron \\
{common}    data.train_batch_size=64 \\
    data.max_prompt_length=1024 \\
    data.max_response_length=2048 \\
    actor_rollout_ref.model.path=$HF_MODEL_PATH \\
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \\
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2 \\
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4 \\
    actor_rollout_ref.actor.megatron.expert_model_parallel_size=4 \\
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \\
    actor_rollout_ref.rollout.tensor_model_parallel_size=4 \\
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \\
    actor_rollout_ref.rollout.n=5 \\
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \\
    trainer.nnodes=4 \\
    trainer.total_epochs=15 "$@"
"""

QWEN3_235B_UNEVEN = """NNODES=${{NNODES:-32}}
python3 -m verl.trainer.main_ppo model_engine=megatron \\
{common}    data.train_batch_size=256 \\
    data.max_prompt_length=2048 \\
    data.max_response_length=$((1024 * 4)) \\
    actor_rollout_ref.model.path=$HOME/models/Qwen3-235B-A22B \\
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 \\
    actor_rollout_ref.actor.megatron.param_offload=True \\
    actor_rollout_ref.actor.megatron.optimizer_offload=True \\
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4 \\
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=8 \\
    actor_rollout_ref.actor.megatron.expert_model_parallel_size=4 \\
    actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1 \\
    +actor_rollout_ref.actor.megatron.override_transformer_config.num_layers_in_first_pipeline_stage=5 \\
    +actor_rollout_ref.actor.megatron.override_transformer_config.num_layers_in_last_pipeline_stage=5 \\
{recompute}    actor_rollout_ref.rollout.tensor_model_parallel_size=8 \\
    actor_rollout_ref.rollout.gpu_memory_utilization=0.8 \\
    actor_rollout_ref.rollout.n=4 \\
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \\
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \\
    actor_rollout_ref.ref.megatron.param_offload=True \\
    trainer.nnodes=$NNODES "$@"
"""

DEEPSEEK_V3_DYNAMIC = """max_prompt_length=$((1024 * 2))
max_response_length=$((1024 * 4))
actor_ppo_max_token_len=$(((max_prompt_length + max_response_length) * 1))
infer_ppo_max_token_len=$(((max_prompt_length + max_response_length) * 3))
offload=True
MODEL_PATH=${{MODEL_PATH:-$HOME/models/DeepSeek-V3-0324}}
python3 -m verl.trainer.main_ppo \\
    --config-path=config \\
    --config-name='ppo_megatron_trainer.yaml' \\
{common}    data.max_prompt_length=${{max_prompt_length}} \\
    data.max_response_length=${{max_response_length}} \\
    data.train_batch_size=512 \\
    actor_rollout_ref.rollout.n=4 \\
    actor_rollout_ref.actor.use_dynamic_bsz=True \\
    actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True \\
    actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True \\
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=${{actor_ppo_max_token_len}} \\
    actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=${{infer_ppo_max_token_len}} \\
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=${{infer_ppo_max_token_len}} \\
    actor_rollout_ref.model.path="${{MODEL_PATH}}" \\
    actor_rollout_ref.actor.ppo_mini_batch_size=128 \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 \\
    actor_rollout_ref.actor.megatron.param_offload=${{offload}} \\
    actor_rollout_ref.actor.megatron.optimizer_offload=${{offload}} \\
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=16 \\
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1 \\
    actor_rollout_ref.actor.megatron.expert_model_parallel_size=16 \\
    actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1 \\
    +actor_rollout_ref.actor.megatron.override_transformer_config.num_layers_in_first_pipeline_stage=4 \\
    +actor_rollout_ref.actor.megatron.override_transformer_config.num_layers_in_last_pipeline_stage=1 \\
    actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full \\
    actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method=uniform \\
    actor_rollout_ref.actor.megatron.override_transformer_config.recompute_num_layers=1 \\
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \\
    actor_rollout_ref.rollout.tensor_model_parallel_size=32 \\
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1 \\
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1 \\
    actor_rollout_ref.ref.megatron.param_offload=${{offload}} \\
    trainer.nnodes=32 \\
    trainer.total_epochs=10 $@
"""


def write(tmp_path, template, name="run.sh", **values):
    path = tmp_path / name
    path.write_text(template.format(common=COMMON, **values))
    return path


def validate(*inputs, gpu="h100", model=None, sets=()):
    return dry_run(JobInput(inputs=tuple(str(item) for item in inputs if item != "--"),
                            sets=tuple(sets), model=model, gpu_type=gpu)).report


def errors(report):
    return [f for f in report["findings"] if f["level"] == "error"]


@pytest.mark.needs("verl")
def test_verl_example_qwen2_7b_tp2_pp2_would_launch_with_the_planners_memory(tmp_path):
    report = validate(write(tmp_path, QWEN2_7B, rollout_tp=2, ref_tp=2))
    # verl's example fills the GPU: vLLM's pool at 0.6 puts the nvidia-smi peak above the band
    [finding] = report["findings"]
    assert report["would_launch"] and finding["level"] == "warning"
    assert "nvidia-smi peak" in finding["message"] and "above the 70-85% band" in finding["message"]
    assert "in generate" in finding["message"] and "gpu_memory_utilization" in finding["message"]
    assert report["model"] == "Qwen2-7B"  # from the path's name: Qwen/Qwen2-7B-Instruct
    actor = report["modules"]["actor"]
    assert (actor["tp"], actor["pp"], actor["dp"], actor["micro_batch"]) == (2, 2, 2, 4)
    assert report["modules"]["rollout"]["tp"] == 2
    expected = estimate_layout(PlanRequest(builtin_model("Qwen2-7B"), ClusterSpec(get_gpu("H100-80GB"), 8, 8), GrpoWorkload(train_batch_size=1024, mini_batch_size=256, rollout_n=5)), Layout(tp=2, pp=2, dp=2, micro_batch=4, rollout_tp=2, gpu_memory_utilization=0.6))

    assert report["memory"]["peak_memory_gib"] == round(expected.row["peak_bytes"] / 2**30, 2)
    assert report["memory"]["peak_phase"] == "generate"
    assert report["modules"]["rollout"]["peak_memory_gib"] == report["memory"]["peak_memory_gib"]


@pytest.mark.needs("verl")
def test_verl_example_different_rollout_tp_is_fine(tmp_path):
    report = validate(write(tmp_path, QWEN2_7B, rollout_tp=4, ref_tp=2))
    assert report["would_launch"], report["findings"]
    assert report["modules"]["rollout"]["tp"] == 4 and report["modules"]["actor"]["tp"] == 2


@pytest.mark.needs("verl")
def test_mismatched_reference_tp_is_the_classic_error(tmp_path, capsys):
    path = write(tmp_path, QWEN2_7B, rollout_tp=2, ref_tp=4)
    report = validate(path)
    assert not report["would_launch"]
    [finding] = errors(report)
    assert finding["check"] == "reference_parallel_mismatch"
    assert f"{A}.ref.megatron.tensor_model_parallel_size=4" in finding["message"]
    assert f"{M}.tensor_model_parallel_size=2" in finding["message"]
    assert "tensor model parallel size mismatch" in finding["message"]
    assert main(["validate", str(path), "--gpu-type", "h100"]) == 1
    out = capsys.readouterr().out
    assert "would NOT launch: 1 error(s)" in out and "reference_parallel_mismatch" in out


@pytest.mark.needs("verl")
def test_verl_example_qwen3_moe_warns_about_implicit_expert_tp(tmp_path):
    report = validate(write(tmp_path, QWEN3_MOE_30B))
    assert report["would_launch"], errors(report)
    assert report["cluster"]["num_gpus"] == 32
    assert [f["check"] for f in report["findings"]] == ["expert_tensor_parallel", "memory"]
    assert "above the 70-85% band" in report["findings"][1]["message"]
    assert report["layout"]["etp"] == 4  # megatron-core's default: ETP = TP
    assert report["modules"]["actor"]["etp"] == 4


FULL_RECOMPUTE = """    actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full \\
    actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method=uniform \\
    actor_rollout_ref.actor.megatron.override_transformer_config.recompute_num_layers=1 \\
"""


@pytest.mark.needs("verl")
def test_verl_example_qwen3_235b_middle_stages_near_capacity_without_recompute(tmp_path):
    """5 | 14 x 6 | 5 layers: rank 1 holds 14 MoE layers with 7 micro-batches in flight, about
    94 GiB of the H20's 95.6 -- flagged; verl's example turns full recompute on."""
    report = validate(write(tmp_path, QWEN3_235B_UNEVEN, recompute=""), gpu="h20")
    [finding] = report["findings"]
    assert finding["check"] == "memory" and "above the 70-85% band" in finding["message"]
    assert "in update_actor (early middle pipeline stage)" in finding["message"]
    assert report["memory"]["peak_stage"] == "early middle"
    assert report["memory"]["memory_utilization"] > 0.92
    assert max(report["memory"]["memory_gib"], key=report["memory"]["memory_gib"].get) \
        == "update_actor"


@pytest.mark.needs("verl")
def test_verl_example_qwen3_235b_uneven_pipeline_on_h20(tmp_path):
    report = validate(write(tmp_path, QWEN3_235B_UNEVEN, recompute=FULL_RECOMPUTE), gpu="h20")
    assert report["would_launch"], report["findings"]
    assert report["model"] == "Qwen3-235B-A22B"
    assert (report["layout"]["first_stage_layers"], report["layout"]["last_stage_layers"]) == (5, 5)
    assert report["workload"]["response_length"] == 4096
    assert report["memory"]["fits"] and 0.70 <= report["memory"]["memory_utilization"] <= 0.85


@pytest.mark.needs("verl")
def test_verl_example_deepseek_v3_dynamic_batch_and_full_recompute(tmp_path):
    report = validate(write(tmp_path, DEEPSEEK_V3_DYNAMIC))
    assert report["would_launch"], errors(report)
    assert report["model"] == "DeepSeek-V3"  # DeepSeek-V3-0324 matched in the catalog
    assert report["layout"]["recompute"] == "full"
    assert report["modules"]["actor"]["micro_batch"] == "dynamic"
    # token budget 6144 per GPU for 6144-token sequences: one sequence per micro-batch
    assert report["layout"]["micro_batch"] == 1
    checks = {f["check"] for f in report["findings"]}
    assert "rollout_tp_across_nodes" in checks  # rollout TP 32 over 4 nodes
    assert checks <= {"rollout_tp_across_nodes", "memory"}


@pytest.mark.needs("verl")
def test_would_not_fit_names_the_phase(tmp_path):
    path = write(tmp_path, QWEN2_7B, rollout_tp=2, ref_tp=2)
    report = validate(path, "--", f"{M}.tensor_model_parallel_size=1",
                      f"{A}.ref.megatron.tensor_model_parallel_size=1",
                      f"{A}.rollout.gpu_memory_utilization=0.9")
    assert not report["would_launch"]
    [finding] = errors(report)
    assert finding["check"] == "memory" and "will not fit" in finding["message"]
    assert f"in {report['memory']['peak_phase']}" in finding["message"]
    assert report["memory"]["peak_memory_gib"] > 79.6


@pytest.mark.needs("verl")
def test_underused_gpus_warn_but_launch(tmp_path):
    path = write(tmp_path, QWEN2_7B, rollout_tp=2, ref_tp=2)
    report = validate(path, "--", f"{A}.rollout.gpu_memory_utilization=0.3")
    assert report["would_launch"]
    [finding] = report["findings"]
    assert finding["level"] == "warning" and "below the 70-85% band" in finding["message"]


@pytest.mark.needs("verl")
def test_keys_verl_does_not_know_are_all_reported(tmp_path):
    path = write(tmp_path, QWEN2_7B, rollout_tp=2, ref_tp=2)
    report = validate(path, "--", f"{M}.grad_offload=True", "trainer.nnodez=2",
                      f"+{M}.foo=1", f"{A}.rollout.mode=sync")
    messages = [f["message"] for f in errors(report)]
    assert any(f"no key {M}.grad_offload" in m and "param_offload" in m for m in messages)
    assert any("no key trainer.nnodez" in m for m in messages)
    assert any(f"no key {M}.foo" in m and "McoreEngineConfig" in m for m in messages)
    assert any("Rollout mode 'sync' has been removed" in m for m in messages)
    assert not any("unexpected keyword argument 'foo'" in m for m in messages)  # deduplicated


@pytest.mark.needs("verl")
def test_rollout_expert_parallel_must_be_tp_times_dp(tmp_path):
    path = write(tmp_path, QWEN3_MOE_30B)
    report = validate(path, "--", f"{A}.rollout.expert_parallel_size=8",
                      f"{M}.expert_tensor_parallel_size=1")
    checks = {f["check"]: f["message"] for f in errors(report)}
    assert "rollout_ep" in checks and "TP*DP = 4" in checks["rollout_ep"]
    assert f"{A}.rollout.expert_parallel_size=8" in checks["rollout_ep"]
    assert "verl_rollout_config" in checks  # verl's own assertion, too


@pytest.mark.needs("verl")
def test_model_shape_and_batch_rules_name_keys(tmp_path):
    path = write(tmp_path, QWEN2_7B, rollout_tp=2, ref_tp=2)
    report = validate(path, "--", f"{M}.tensor_model_parallel_size=8",
                      f"{A}.ref.megatron.tensor_model_parallel_size=8",
                      f"{M}.pipeline_model_parallel_size=1",
                      f"{A}.ref.megatron.pipeline_model_parallel_size=1",
                      f"{A}.actor.ppo_micro_batch_size_per_gpu=3")
    checks = {f["check"]: f["message"] for f in errors(report)}
    assert "num_attention_heads 28" in checks["tp_divides_heads"]
    assert "valid TP: 1, 2, 4, 7, 14, 28" in checks["tp_divides_heads"]
    assert f"{M}.tensor_model_parallel_size=8" in checks["tp_divides_heads"]
    assert "micro_batch_divides_mini_batch" in checks
    assert report["memory"] is None


@pytest.mark.needs("verl")
def test_pipeline_that_does_not_divide_the_layers_suggests_the_uneven_split(tmp_path):
    path = write(tmp_path, QWEN2_7B, rollout_tp=2, ref_tp=2)
    report = validate(path, "--", f"{M}.pipeline_model_parallel_size=8",
                      f"{A}.ref.megatron.pipeline_model_parallel_size=8",
                      f"{M}.tensor_model_parallel_size=1",
                      f"{A}.ref.megatron.tensor_model_parallel_size=1")
    [finding] = [f for f in errors(report) if f["check"] == "pipeline_split"]
    assert "28 layers, not divisible by" in finding["message"]
    assert "num_layers_in_first_pipeline_stage=2" in finding["message"]
    assert "num_layers_in_last_pipeline_stage=2" in finding["message"]


@pytest.mark.needs("verl")
def test_full_recompute_needs_a_method(tmp_path):
    path = write(tmp_path, QWEN2_7B, rollout_tp=2, ref_tp=2)
    report = validate(path, "--", f"{M}.override_transformer_config.recompute_granularity=full")
    messages = [f["message"] for f in errors(report) if f["check"] == "recompute"]
    assert any("needs recompute_method uniform or block" in m for m in messages)
    assert any("recompute_num_layers >= 1" in m for m in messages)


BASE = ["algorithm.adv_estimator=grpo", f"{A}.model.path=Qwen/Qwen3-8B",
        f"{A}.rollout.name=vllm", f"{A}.actor.ppo_micro_batch_size_per_gpu=4",
        f"{A}.rollout.log_prob_micro_batch_size_per_gpu=4",
        f"{A}.ref.log_prob_micro_batch_size_per_gpu=4", f"{A}.actor.use_kl_loss=True",
        f"{A}.rollout.n=5", f"{A}.actor.ppo_mini_batch_size=256"]


@pytest.mark.needs("verl")
def test_overrides_alone_and_the_backend_choice():
    report = validate("model_engine=megatron", *BASE)
    assert report["input"] == "overrides" and report["model"] == "Qwen3-8B"
    # verl's defaults otherwise: TP1, no offload, rollout TP2 at 0.5 of the GPU
    assert report["layout"]["tp"] == 1 and report["layout"]["rollout_tp"] == 2
    [finding] = errors(report)
    assert "will not fit" in finding["message"] and "in generate" in finding["message"]
    fits = validate("model_engine=megatron", *BASE, f"{M}.param_offload=True",
                    f"{M}.optimizer_offload=True", f"{A}.ref.megatron.param_offload=True",
                    f"{A}.rollout.gpu_memory_utilization=0.7",
                    f"{A}.actor.ppo_micro_batch_size_per_gpu=2")  # the last override wins
    assert fits["layout"]["micro_batch"] == 2
    assert fits["would_launch"], fits["findings"]
    fsdp = validate(*BASE)
    assert not fsdp["would_launch"]
    assert any(f["check"] == "backend" and "model_engine=dp" in f["message"]
               for f in fsdp["findings"])


@pytest.mark.needs("verl")
def test_model_from_the_model_paths_config_json(tmp_path):
    model_dir = tmp_path / "my-model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(builtin_config_dict("Qwen2.5-7B")))
    path = write(tmp_path, QWEN2_7B, rollout_tp=2, ref_tp=2)
    report = validate(path, "--", f"{A}.model.path={model_dir}")
    assert report["model"] == "my-model"
    assert any(str(model_dir / "config.json") in note for note in report["notes"])
    assert report["would_launch"]


@pytest.mark.needs("verl")
def test_set_feeds_script_variables_and_yaml_environment(tmp_path):
    text = QWEN2_7B.replace("Qwen/Qwen2-7B-Instruct", "$MODEL_DIR")
    path = write(tmp_path, text, rollout_tp=2, ref_tp=2)
    with pytest.raises(PlanInputError, match=r"\$MODEL_DIR is not set"):
        validate(path)
    report = validate(path, sets=["MODEL_DIR=/somewhere/Qwen2.5-7B-Instruct"])
    assert report["model"] == "Qwen2.5-7B"


@pytest.mark.needs("verl")
@pytest.mark.parametrize("argv,needle", [
    (["validate", "/no/such/run.sh"], "is not a file"),
    (["validate"], "needs a launch script"),
    (["validate", "--", "trainer.logger=[console"], "not valid Hydra syntax"),
    (["validate", "--set", "NOEQUALS", "--", "a=b"], "--set 'NOEQUALS' is not VAR=VALUE"),
    (["validate", "--", "model_engine=megatron", *BASE, f"{A}.model.path=/x/unknown-llm"],
     "cannot tell the model"),
    (["validate", "--model", "qwen9", "--", "model_engine=megatron", *BASE],
     "unknown model 'qwen9'"),
])
def test_broken_inputs_exit_2_on_one_line(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and "Traceback" not in err[0]


@pytest.mark.needs("verl")
def test_script_errors_exit_2(tmp_path, capsys):
    path = tmp_path / "run.sh"
    path.write_text("python3 -m verl.trainer.main_ppo --config-path=nowhere a.b=1\n")
    assert main(["validate", str(path)]) == 2
    assert "relative path" in capsys.readouterr().err
    path.write_text("echo nothing to see\n")
    assert main(["validate", str(path)]) == 2
    assert "no `python3 -m verl.trainer.main_ppo` command" in capsys.readouterr().err
    yaml_path = tmp_path / "job.yaml"
    yaml_path.write_text("a: [unclosed\n")
    assert main(["validate", str(yaml_path)]) == 2


@pytest.mark.needs("verl")
def test_json_report_contract(tmp_path, capsys):
    path = write(tmp_path, QWEN2_7B, rollout_tp=2, ref_tp=2)
    assert main(["validate", str(path), "--gpu-type", "h100", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"source", "input", "verl", "would_launch", "findings", "modules", "memory", "model",
            "cluster", "workload", "layout", "overrides", "notes"} <= set(report)
    assert report["verl"] == {"installed": "0.9.1", "targeted": "0.9.1"}
    assert set(report["modules"]) == {"actor", "reference", "rollout"}
    assert set(report["modules"]["actor"]) == {"tp", "pp", "vpp", "cp", "ep", "etp", "dp",
                                               "micro_batch", "offload", "peak_memory_gib",
                                               "memory_utilization"}


def test_validate_help_stays_light():
    heavy, output = imported_by(["validate", "--help"], (
        "torch", "verl", "hydra", "omegaconf", "transformers", "pandas", "numpy", "megatron"))
    assert heavy == [], output
    assert "--set VAR=VALUE" in output


@pytest.mark.needs("verl")
def test_run_time_batch_and_rollout_rules(tmp_path):
    path = write(tmp_path, QWEN2_7B, rollout_tp=2, ref_tp=2)
    report = validate(path, "--", f"{A}.rollout.log_prob_micro_batch_size_per_gpu=3")
    [finding] = errors(report)
    assert finding["check"] == "log_prob_micro_batch"
    assert "=3 does not divide the 2560 sequences each of the 2 DP ranks" in finding["message"]
    nodes = validate(path, "--", "trainer.nnodes=3", f"{A}.rollout.tensor_model_parallel_size=4",
                     f"{A}.rollout.data_parallel_size=3")
    [spans] = [f for f in errors(nodes) if f["check"] == "rollout_nodes"]
    assert "TP*DP*PP = 4*3*1 = 12 GPUs" in spans["message"] and "(8)" in spans["message"]
    dynamic = validate(write(tmp_path, DEEPSEEK_V3_DYNAMIC, name="ds.sh"), "--",
                       f"{A}.actor.ppo_max_token_len_per_gpu=4096")
    [budget] = errors(dynamic)
    assert budget["check"] == "token_budget"
    assert f"{A}.actor.ppo_max_token_len_per_gpu=4096" in budget["message"]
    assert "longest sequence 6144" in budget["message"]


@pytest.mark.needs("verl")
def test_yaml_input_with_environment_and_unknown_keys(tmp_path):
    from planner.verl.files import write_job
    from planner.verl.library import Entry, plan_entry

    job, _ = plan_entry(Entry("Qwen2.5-7B", "H100-80GB", 8))
    write_job(job, tmp_path)
    model_dir = tmp_path / "weights"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(builtin_config_dict("Qwen2.5-7B")))
    report = validate(tmp_path / "grpo.yaml", sets=[f"MODEL_PATH={model_dir}"])
    assert report["input"] == "yaml" and report["would_launch"], report["findings"]
    assert report["model"] == "weights"  # read from $MODEL_PATH's config.json
    with open(tmp_path / "grpo.yaml", "a") as handle:
        handle.write("  nnodez: 2\n")  # under trainer:, the last mapping in the file
    broken = validate(tmp_path / "grpo.yaml")
    assert [f["message"] for f in errors(broken)] == ["verl 0.9.1 has no key trainer.nnodez"]


OVERLAP = "+actor_rollout_ref.actor.megatron.override_ddp_config.overlap_grad_reduce=True"


@pytest.mark.needs("verl")
def test_overlap_grad_reduce_from_the_job_hides_the_update_gradient_reduce(tmp_path):
    """verl leaves the DDP overlap off; the job turning it on through override_ddp_config
    reaches the workload and shortens the predicted update, and nothing else."""
    script = write(tmp_path, QWEN2_7B, rollout_tp=2, ref_tp=2)
    exposed, hidden = validate(script), validate(script, OVERLAP)
    assert exposed["workload"]["overlap_grad_reduce"] is False
    assert hidden["workload"]["overlap_grad_reduce"] is True
    assert hidden["would_launch"], errors(hidden)
    plain_time, overlap_time = exposed["memory"]["time_s"], hidden["memory"]["time_s"]
    assert overlap_time["update_actor"] < plain_time["update_actor"]
    assert {k: v for k, v in overlap_time.items() if k != "update_actor"} == \
        {k: v for k, v in plain_time.items() if k != "update_actor"}
    # the same numbers as the planner's own estimate with --overlap-grad-reduce
    # verl states no mean response length: the job is timed over Qwen2-7B's kind's published
    # lengths, as a plan with none given
    workload = GrpoWorkload(train_batch_size=1024, mini_batch_size=256, rollout_n=5,
                            overlap_grad_reduce=True, lengths=default_lengths(1024, "Qwen2-7B"))
    expected = estimate_layout(PlanRequest(builtin_model("Qwen2-7B"), ClusterSpec(get_gpu("H100-80GB"), 8, 8), workload), Layout(tp=2, pp=2, dp=2, micro_batch=4, rollout_tp=2, gpu_memory_utilization=0.6))
    assert overlap_time["update_actor"] == round(float(expected.row["time_update_actor_s"]), 3)
    # a Hydra YAML says it the same way
    yaml_path = tmp_path / "job.yaml"
    yaml_path.write_text("defaults:\n  - ppo_trainer\n  - override model_engine: megatron\n"
                         "  - _self_\nhydra:\n  searchpath: [pkg://verl.trainer.config]\n"
                         "actor_rollout_ref:\n  actor:\n    megatron:\n"
                         "      override_ddp_config:\n        overlap_grad_reduce: true\n")
    from_yaml = validate(yaml_path, *[item for item in hidden["overrides"]
                                      if "overlap_grad_reduce" not in item])
    assert from_yaml["workload"]["overlap_grad_reduce"] is True
    assert from_yaml["memory"]["time_s"] == overlap_time


@pytest.mark.needs("verl")
def test_dynamic_batches_on_an_interleaved_pipeline_need_a_sequence_per_micro_batch(capsys):
    """use_dynamic_bsz with PP 4 VPP 3 and one sequence per DP rank: verl rounds the packed
    micro-batches up to 4 and raises ('Requested 4 non-empty micro-batches, but a rank has only
    1'); validate skipped the interleaving rule for every dynamic job and said it would
    launch."""
    pipeline = [f"{A}.{module}.megatron.{key}={value}" for module in ("actor", "ref")
                for key, value in (("tensor_model_parallel_size", 1),
                                   ("pipeline_model_parallel_size", 4),
                                   ("virtual_pipeline_model_parallel_size", 3))]
    argv = ["validate", "--gpu-type", "h100", "--format", "json",
            "configs/Qwen3-8B_8xH100-80GB/run_grpo.sh", "--", *pipeline,
            "data.train_batch_size=2", f"{A}.actor.ppo_mini_batch_size=2", f"{A}.rollout.n=1"]
    assert main(argv) == 1
    report = json.loads(capsys.readouterr().out)
    assert [f["check"] for f in errors(report)] == ["interleaved_microbatches"]
    assert "1 sequences per mini-batch" in errors(report)[0]["message"]


@pytest.mark.needs("verl")
@pytest.mark.parametrize("overrides,level,needle", [
    (["data.max_prompt_length=36864", "data.max_response_length=8192"], "warning",
     "= 45056 exceeds Qwen3-8B's max_position_embeddings 40960"),
    ([f"{A}.rollout.max_model_len=65536"], "error",
     "max_model_len=65536 exceeds Qwen3-8B's max_position_embeddings 40960"),
])
def test_a_sequence_beyond_the_models_context_is_named(capsys, overrides, level, needle):
    """verl's rollout server caps max_model_len at max_position_embeddings (and raises above
    it); validate used to pass both jobs without a word."""
    budgets = [f"{A}.{key}=65536" for key in ("actor.ppo_max_token_len_per_gpu",
                                               "rollout.log_prob_max_token_len_per_gpu",
                                               "ref.log_prob_max_token_len_per_gpu")]
    main(["validate", "--gpu-type", "h100", "--format", "json",
          "configs/Qwen3-8B_8xH100-80GB/run_grpo.sh", "--", *budgets, *overrides])
    report = json.loads(capsys.readouterr().out)
    [finding] = [f for f in report["findings"] if f["check"] == "context_length"]
    assert finding["level"] == level and needle in finding["message"]
