"""Defects a user hit (bug hunt 6): each test failed before its fix."""

import json

import pytest

from planner.catalog.models import builtin_config_dict
from planner.cli.main import main


def _local_model(tmp_path):
    """A model directory holding Qwen3-8B's config.json under another name."""
    model = tmp_path / "my-qwen3"
    model.mkdir()
    config = {k: v for k, v in builtin_config_dict("Qwen3-8B").items() if not k.startswith("_")}
    (model / "config.json").write_text(json.dumps(config))
    return model


def test_a_job_planned_from_a_local_model_directory_launches_from_it(tmp_path, capsys):
    """plan --model DIR --write: the script's MODEL_PATH defaulted to $HOME/models/<DIR's name>,
    not DIR whose config.json was planned, so a launch pointed verl at a path that need not
    exist.  DIR is the default now (a --model-path or $MODEL_PATH wins)."""
    model = _local_model(tmp_path)
    job = tmp_path / "job"
    assert main(["plan", "--model", str(model), "--gpus", "8", "--gpu-type", "h100", "--top", "1",
                 "--write", str(job)]) == 0
    script = (job / "run_grpo.sh").read_text()
    assert f'MODEL_PATH="${{MODEL_PATH:-{model}}}"' in script
    # a config.json path: its folder
    assert main(["plan", "--model", str(model / "config.json"), "--gpus", "8", "--gpu-type",
                 "h100", "--top", "1", "--write", str(job), "--force"]) == 0
    assert f'MODEL_PATH="${{MODEL_PATH:-{model}}}"' in (job / "run_grpo.sh").read_text()
    # --model-path still wins
    assert main(["plan", "--model", str(model), "--gpus", "8", "--gpu-type", "h100", "--top", "1",
                 "--write", str(job), "--force", "--model-path", "/data/ckpt"]) == 0
    assert 'MODEL_PATH="${MODEL_PATH:-/data/ckpt}"' in (job / "run_grpo.sh").read_text()


@pytest.mark.needs("verl")
def test_the_check_a_job_from_a_local_model_names_passes(tmp_path, capsys):
    """The check the script's header names (`plan-parallel validate run_grpo.sh`) could not
    read the model of a job planned from a local directory (exit 2)."""
    model = _local_model(tmp_path)
    job = tmp_path / "job"
    assert main(["plan", "--model", str(model), "--gpus", "8", "--gpu-type", "h100", "--top", "1",
                 "--write", str(job)]) == 0
    capsys.readouterr()
    assert main(["validate", str(job / "run_grpo.sh"), "--gpu-type", "h100"]) == 0
    assert "my-qwen3 on 8 x H100-80GB" in capsys.readouterr().out


def test_head_and_width_refusals_name_the_valid_sizes():
    """The TP, rollout-TP and ETP refusals named the bad value and the rule, not a valid one
    (a 28-head, 7-KV-head model at TP 4: 'num_query_groups (KV heads) 7 is neither a multiple
    nor a divisor of tensor_model_parallel_size 4', nothing to pick instead)."""
    import dataclasses

    from planner.catalog.hardware import ClusterSpec, get_gpu
    from planner.catalog.models import resolve_model
    from planner.catalog.workload import GrpoWorkload
    from planner.search.rules import explain

    def broken(model, **values):
        layout = {"tp": 1, "pp": 1, "vpp": 1, "cp": 1, "ep": 1, "etp": 1, "dp": 1,
                  "micro_batch": 1, "rollout_tp": 1, "rollout_dp": 1, "rollout_ep": 1, **values}
        return dict(explain(model, ClusterSpec(get_gpu("h100"), 8, 8), GrpoWorkload(), layout))

    odd = dataclasses.replace(resolve_model("qwen3-8b"), num_attention_heads=28,
                              num_query_groups=7)
    tp = broken(odd, tp=4, rollout_tp=4)
    # megatron-core and vLLM: TP divides the 28 heads, and the 7 KV heads divide TP or TP them
    assert tp["tp_divides_query_groups"].endswith("; valid TP: 1, 7, 14, 28")
    assert tp["rollout_tp_kv_heads"].endswith("; valid rollout TP: 1, 7, 14, 28")
    assert broken(odd, rollout_tp=3)["rollout_tp_divides_heads"].endswith(
        "; valid rollout TP: 1, 7, 14, 28")
    assert broken(resolve_model("qwen3-8b"), tp=5)["tp_divides_ffn"].endswith(
        "; valid TP: 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64 ...")  # divisors of 12288
    assert broken(resolve_model("qwen3-30b"), ep=1, etp=5)["etp_divides_moe_ffn"].endswith(
        "; valid ETP: 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64 ...")  # divisors of 768


def test_report_of_a_plan_file_says_it_is_not_a_sweep_folder(tmp_path, capsys):
    """`plan-parallel report job/plan.json` (the file plan --write writes) said "sweep folder
    'job/plan.json' does not exist" of a file that exists; it names what it is and what report
    takes."""
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    assert main(["report", str(plan)]) == 2
    out, err = capsys.readouterr()
    assert err.strip() == (
        f"plan-parallel: error: {str(plan)!r} is a file, not a sweep folder; valid: the folder "
        f"`plan-parallel tune` wrote (--write or --sweep-dir), or --model and --gpus for a plan "
        f"report")
