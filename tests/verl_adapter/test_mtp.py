"""MTP in the verl job: the CLI flags, the keys ``--write`` exports (verl 0.9.1's
``actor_rollout_ref.model.mtp``), validate reading them back from a launch script, and the
refusals."""

import json

import pytest

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.models import builtin_model
from planner.catalog.workload import GrpoWorkload
from planner.cli.main import main
from planner.search.layout import Layout
from planner.verl import config as verl_config
from planner.verl.export import job_overrides
from planner.verl.keys import PLAN_FILE, SCRIPT_FILE

MTP = "actor_rollout_ref.model.mtp"
PATHS = dict(model_path="/models/m", train_files="/data/train.parquet",
             val_files="/data/test.parquet")
MIMO = builtin_model("MiMo-7B")
CLUSTER = ClusterSpec(get_gpu("H100-80GB"), 8, 8)
LAYOUT = Layout(tp=2, pp=1, dp=4, micro_batch=2, rollout_tp=2, gpu_memory_utilization=0.6)


def mtp_overrides(**workload):
    overrides = job_overrides(MIMO, CLUSTER, GrpoWorkload(**workload), LAYOUT, **PATHS)
    return {item.split("=", 1)[0]: item.split("=", 1)[1] for item in overrides
            if item.startswith(f"{MTP}.")}, overrides


def test_export_writes_verls_mtp_keys():
    keys, _ = mtp_overrides(speculative="mtp", speculative_tokens=2, train_mtp=True)
    assert keys == {f"{MTP}.enable": "True", f"{MTP}.enable_rollout": "True",
                    f"{MTP}.enable_train": "True", f"{MTP}.num_speculative_tokens": "2"}
    # speculation alone: no enable_train; training alone: no rollout keys
    keys, _ = mtp_overrides(speculative="mtp")
    assert keys == {f"{MTP}.enable": "True", f"{MTP}.enable_rollout": "True",
                    f"{MTP}.num_speculative_tokens": "1"}
    keys, _ = mtp_overrides(train_mtp=True)
    assert keys == {f"{MTP}.enable": "True", f"{MTP}.enable_train": "True"}
    # SGLang drafts k steps of top-1 EAGLE: k steps, k + 1 draft tokens
    keys, _ = mtp_overrides(speculative="mtp", speculative_tokens=2, rollout_engine="sglang")
    assert keys == {f"{MTP}.enable": "True", f"{MTP}.enable_rollout": "True",
                    f"{MTP}.speculative_num_steps": "2",
                    f"{MTP}.speculative_num_draft_tokens": "3"}
    keys, overrides = mtp_overrides()
    assert keys == {} and not any(".mtp." in item for item in overrides)


@pytest.mark.needs("verl")
def test_exported_mtp_job_passes_verls_own_config_checks():
    _, overrides = mtp_overrides(speculative="mtp", speculative_tokens=2, train_mtp=True)
    config, unknown = verl_config.compose(overrides)
    assert unknown == []
    assert verl_config.verl_checks(config) == []
    plain = verl_config.to_plain(config)
    mtp = plain["actor_rollout_ref"]["model"]["mtp"]
    assert (mtp["enable"], mtp["enable_rollout"], mtp["enable_train"],
            mtp["num_speculative_tokens"]) == (True, True, True, 2)
    # the rollout follows the model's mtp section (rollout.yaml: ${oc.select:...model.mtp})
    assert plain["actor_rollout_ref"]["rollout"]["mtp"]["enable_rollout"] is True


def test_cli_refuses_mtp_by_name_in_one_line(capsys):
    argv = ["--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100"]
    for extra, words in ((["--speculative", "mtp"], "has no MTP layers"),
                         (["--train-mtp"], "has no MTP layers"),
                         (["--speculative", "draft"], "separate draft model"),
                         (["--acceptance-length", "1.5"], "needs --speculative mtp"),
                         (["--speculative-tokens", "0"], "--speculative-tokens")):
        assert main([*argv, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0] and "Traceback" not in err[0], extra


def test_the_plan_states_the_acceptance_assumption(capsys):
    argv = ["--model", "MiMo-7B", "--gpus", "8", "--gpu-type", "h100", "--top", "1"]
    assert main([*argv, "--speculative", "mtp"]) == 0
    out = capsys.readouterr().out
    assert "acceptance length 1.85 tokens/step (assumed: 85% per drafted token" in out
    assert main([*argv, "--speculative", "mtp", "--acceptance-length", "1.6", "--format",
                 "json"]) == 0
    workload = json.loads(capsys.readouterr().out)["workload"]
    assert (workload["speculative"], workload["speculative_tokens"],
            workload["acceptance_length"], workload["train_mtp"]) == ("mtp", 1, 1.6, False)


@pytest.mark.needs("verl")
def test_validate_reads_the_mtp_keys_back_from_the_launch_script(tmp_path, capsys):
    from planner.diagnose.validate import JobInput, dry_run

    argv = ["--model", "MiMo-7B", "--gpus", "8", "--gpu-type", "h100", "--top", "1"]
    assert main([*argv, "--speculative", "mtp", "--speculative-tokens", "2", "--train-mtp",
                 "--write", str(tmp_path / "on")]) == 0
    capsys.readouterr()
    script = (tmp_path / "on" / SCRIPT_FILE).read_text()
    assert f"{MTP}.num_speculative_tokens=2 \\" in script
    report = dry_run(JobInput(inputs=(str(tmp_path / "on" / SCRIPT_FILE),),
                              sets=("MODEL_PATH=/nowhere/MiMo-7B",), gpu_type="h100")).report
    workload = report["workload"]
    assert (workload["speculative"], workload["speculative_tokens"],
            workload["train_mtp"]) == ("mtp", 2, True)
    assert workload["acceptance_length"] == 2.5725  # the default for k = 2, stated
    planned = json.loads((tmp_path / "on" / PLAN_FILE).read_text())["prediction"]
    assert report["memory"]["time_s"]["generate"] == planned["time_s"]["generate"]


@pytest.mark.needs("verl")
def test_validate_refuses_a_script_that_enables_mtp_on_a_model_without_it(tmp_path, capsys):
    target = tmp_path / "job"
    assert main(["--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100", "--top", "1",
                 "--write", str(target), "--override", f"{MTP}.enable=True", "--override",
                 f"{MTP}.enable_rollout=True"]) == 0
    capsys.readouterr()
    assert main(["validate", str(target / SCRIPT_FILE), "--gpu-type", "h100", "--set",
                 "MODEL_PATH=/nowhere/Qwen3-8B"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mtp.enable_rollout" in err[0] and "no MTP layers" in err[0]
