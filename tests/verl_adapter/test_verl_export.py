"""Export: a planned layout as a verl 0.9.1 GRPO job (Megatron backend).

Every exported config is composed with verl's real Hydra config on the CPU and put through
verl's own ``validate_config`` and config dataclass checks; the YAML composes to the same
config as the launch command; the script runs through verl's Hydra entry point.
"""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import planner
from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.models import builtin_model
from planner.catalog.workload import GrpoWorkload, PretrainWorkload
from planner.cli.main import main
from planner.cost.request import PlanRequest
from planner.errors import PlanInputError
from planner.plan import make_plan
from planner.search.layout import Layout, applicable_modules
from planner.verl import config as verl_config
from planner.verl.export import job_from_plan, job_overrides
from planner.verl.files import (
    render_config,
    render_plan_json,
    render_script,
    write_job,
    write_plan_job,
)
from planner.verl.job import layout_of, read_job
from planner.verl.keys import CONFIG_FILE, PLAN_FILE, SCRIPT_FILE, VERL_VERSION
from planner.verl.script import parse_launch_script

MEGATRON = "actor_rollout_ref.actor.megatron"
TRANSFORMER = f"{MEGATRON}.override_transformer_config"
PATHS = dict(model_path="/models/m", train_files="/data/train.parquet",
             val_files="/data/test.parquet")
VALUES = {"MODEL_PATH": "/models/m", "TRAIN_FILES": "/data/train.parquet",
          "VAL_FILES": "/data/test.parquet"}


def cluster(gpus, gpu="H100-80GB"):
    return ClusterSpec(get_gpu(gpu), gpus, min(8, gpus))


# Layouts that exercise every export branch: even/uneven pipelines, VPP, CP, EP/ETP,
# each recompute mode, offloads, rollout expert parallelism.
CASES = {
    "dense_tp_pp": ("Qwen2.5-7B", 8, Layout(tp=2, pp=2, dp=2, micro_batch=4, rollout_tp=2,
                                            gpu_memory_utilization=0.6)),
    "dense_vpp_cp_selective": ("Qwen3-8B", 16, Layout(tp=2, pp=2, vpp=3, cp=2, dp=2,
                                                      micro_batch=2, recompute="selective",
                                                      rollout_tp=4, param_offload=True)),
    "moe_etp_selective": ("Qwen3-30B-A3B", 16, Layout(tp=2, pp=2, ep=4, etp=2, dp=4,
                                                      micro_batch=2, recompute="selective",
                                                      rollout_tp=2, rollout_dp=4, rollout_ep=8,
                                                      optimizer_offload=True,
                                                      gpu_memory_utilization=0.7)),
    "moe_uneven_full": ("DeepSeek-V3", 256, Layout(tp=1, pp=16, ep=16, etp=1, dp=16,
                                                   first_stage_layers=3, last_stage_layers=2,
                                                   micro_batch=1, recompute="full",
                                                   param_offload=True, optimizer_offload=True,
                                                   ref_param_offload=True, rollout_tp=8,
                                                   rollout_dp=4, rollout_ep=32,
                                                   gpu_memory_utilization=0.6)),
}


def test_a_model_with_expert_biases_keeps_add_bias_linear():
    """gpt-oss's linear layers carry biases (Megatron-Bridge's GPTOSSProvider sets
    add_bias_linear=True): the export never writes add_bias_linear=False, which would build a
    model without the checkpoint's biases."""
    layout = Layout(tp=1, pp=1, ep=4, etp=2, dp=8, micro_batch=4, rollout_dp=8, rollout_ep=8,
                    gpu_memory_utilization=0.5)
    overrides = job_overrides(builtin_model("gpt-oss-20b"), cluster(8), GrpoWorkload(), layout,
                              **PATHS)
    assert not [o for o in overrides if "add_bias_linear" in o]


@pytest.mark.parametrize("case,text", [
    ("dense_tp_pp", ", layers per stage 14/14"),  # Qwen2.5-7B, 28 layers over PP 2
    ("moe_uneven_full", ", layers per stage 3/4/../2"),  # DeepSeek-V3: 61 = 3 + 14 x 4 + 2
])
def test_script_header_names_the_layers_of_each_stage(case, text):
    """The header used to read 'stages 0/../0 layers' for an even split (the unset uneven-stage
    settings), and 'stages 16/../0' where only the first stage was set."""
    from planner.verl.export import ExportedJob
    from planner.verl.files import stages_text

    name, gpus, layout = CASES[case]
    job = ExportedJob(builtin_model(name), cluster(gpus), GrpoWorkload(), layout, {})
    assert stages_text(job).startswith(text)
    first = dataclasses.replace(layout, first_stage_layers=12, last_stage_layers=0, pp=4)
    job = ExportedJob(builtin_model("Qwen3-8B"), cluster(16), GrpoWorkload(), first, {})
    assert stages_text(job) == ", layers per stage 12/8/../8"  # 36 - 12 = 24 over 3 stages


def overrides_for(case, **extra):
    name, gpus, layout = CASES[case]
    return job_overrides(builtin_model(name), cluster(gpus), GrpoWorkload(), layout, **PATHS,
                         **extra)


def as_dict(overrides):
    return {item.lstrip("+").split("=", 1)[0]: item.split("=", 1)[1] for item in overrides}


def test_overrides_select_megatron_and_set_every_layout_value():
    overrides = overrides_for("moe_etp_selective")
    values = as_dict(overrides)
    assert overrides[0] == "model_engine=megatron"
    assert values["algorithm.adv_estimator"] == "grpo"
    assert values[f"{MEGATRON}.tensor_model_parallel_size"] == "2"
    assert values[f"{MEGATRON}.pipeline_model_parallel_size"] == "2"
    assert values[f"{MEGATRON}.virtual_pipeline_model_parallel_size"] == "null"
    assert values[f"{MEGATRON}.expert_model_parallel_size"] == "4"
    assert values[f"{MEGATRON}.expert_tensor_parallel_size"] == "2"  # explicit, never the TP default
    assert values[f"{MEGATRON}.optimizer_offload"] == "True"
    assert values[f"{TRANSFORMER}.recompute_granularity"] == "selective"
    assert values[f"{TRANSFORMER}.recompute_modules"] == "[core_attn,layernorm,moe_act]"
    assert f"+{TRANSFORMER}.moe_grouped_gemm=True" in overrides  # moe_act needs grouped GEMM
    assert f"+{TRANSFORMER}.add_bias_linear=False" in overrides  # MoE with ETP > 1
    assert values["actor_rollout_ref.rollout.expert_parallel_size"] == "8"
    assert values["actor_rollout_ref.rollout.data_parallel_size"] == "4"
    assert values["actor_rollout_ref.rollout.gpu_memory_utilization"] == "0.7"
    assert values["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"] == "2"
    assert values["actor_rollout_ref.model.path"] == "'/models/m'"  # always Hydra-quoted
    assert values["trainer.nnodes"] == "2" and values["trainer.n_gpus_per_node"] == "8"
    assert not any("grad_offload" in item for item in overrides)
    # the reference follows the actor's parallel sizes through verl's interpolation
    assert not any(item.startswith("actor_rollout_ref.ref.megatron.tensor") for item in overrides)


def test_uneven_pipeline_stages_only_when_uneven():
    values = as_dict(overrides_for("moe_uneven_full"))
    # DeepSeek-V3: 61 layers over 16 stages -> 14 middle stages of 4, first 3, last 2
    assert values[f"{TRANSFORMER}.num_layers_in_first_pipeline_stage"] == "3"
    assert values[f"{TRANSFORMER}.num_layers_in_last_pipeline_stage"] == "2"
    assert values[f"{TRANSFORMER}.recompute_granularity"] == "full"
    assert values[f"{TRANSFORMER}.recompute_method"] == "uniform"
    assert values[f"{TRANSFORMER}.recompute_num_layers"] == "1"
    even = as_dict(overrides_for("dense_tp_pp"))  # 28 layers over 2 stages
    assert not any("pipeline_stage" in key for key in even)
    assert not any("recompute" in key for key in even)


def test_extra_overrides_replace_in_place_and_append():
    base = overrides_for("dense_tp_pp")
    overrides = overrides_for("dense_tp_pp", extra=["trainer.total_epochs=2",
                                                    "+trainer.new_key=1"])
    assert len(overrides) == len(base) + 1
    assert overrides.index("trainer.total_epochs=2") == base.index("trainer.total_epochs=15")
    assert overrides[-1] == "+trainer.new_key=1"
    with pytest.raises(PlanInputError, match="not KEY=VALUE"):
        overrides_for("dense_tp_pp", extra=["trainer.total_epochs"])


def test_unexportable_workloads_are_input_errors():
    name, gpus, layout = CASES["dense_tp_pp"]
    with pytest.raises(PlanInputError, match="bf16 or fp16"):
        job_overrides(builtin_model(name), cluster(gpus), GrpoWorkload(precision="fp8"), layout,
                      **PATHS)
    with pytest.raises(PlanInputError, match="GRPO workload"):
        job_overrides(builtin_model(name), cluster(gpus), PretrainWorkload(), layout, **PATHS)


@pytest.mark.needs("verl")
@pytest.mark.parametrize("case", sorted(CASES))
def test_exported_config_passes_verls_own_validation(case):
    name, gpus, layout = CASES[case]
    config, unknown = verl_config.compose(overrides_for(case))
    assert unknown == []
    assert verl_config.added_keys(config, verl_config.base_config()) == []
    assert verl_config.verl_checks(config) == []  # validate_config + actor/rollout/ref dataclasses
    plain = verl_config.to_plain(config)
    assert plain["model_engine"] == "megatron"
    assert plain["actor_rollout_ref"]["actor"]["strategy"] == "megatron"
    job, problems = read_job(plain)
    assert problems == []
    read_back = layout_of(job, builtin_model(name).is_moe)
    skip = {"first_stage_layers", "last_stage_layers", "sequence_parallel"}
    # the export writes only the recompute modules the model has (none of MoE on a dense model)
    model = builtin_model(name)
    expected = dataclasses.replace(layout, recompute_modules=applicable_modules(
        layout.recompute_modules, model.is_moe, model.is_mla))
    assert {k: v for k, v in read_back.to_dict().items() if k not in skip} == \
        {k: v for k, v in expected.to_dict().items() if k not in skip}
    assert (read_back.first_stage_layers, read_back.last_stage_layers) == \
        (layout.first_stage_layers, layout.last_stage_layers)
    assert read_back.sequence_parallel == (layout.tp > 1)
    ref = plain["actor_rollout_ref"]["ref"]["megatron"]
    assert ref["tensor_model_parallel_size"] == layout.tp  # interpolated from the actor
    assert ref["param_offload"] == layout.ref_param_offload


@pytest.fixture(scope="module")
def qwen3_30b_job():
    plan = make_plan(PlanRequest(builtin_model("Qwen3-30B-A3B"), cluster(16), GrpoWorkload()))
    return plan, job_from_plan(plan, 1)


@pytest.mark.needs("verl")
def test_yaml_composes_to_the_same_config_as_the_launch_command(qwen3_30b_job, tmp_path,
                                                                monkeypatch):
    _, job = qwen3_30b_job
    write_job(job, tmp_path)
    for name, value in VALUES.items():
        monkeypatch.setenv(name, value)
    from_yaml, unknown = verl_config.compose([], tmp_path, CONFIG_FILE[:-5])
    assert unknown == []
    from_overrides, _ = verl_config.compose(job.overrides(VALUES))
    assert verl_config.to_plain(from_yaml) == verl_config.to_plain(from_overrides)
    assert verl_config.verl_checks(from_yaml) == []


def test_script_overrides_read_back_exactly(qwen3_30b_job):
    _, job = qwen3_30b_job
    command = parse_launch_script(render_script(job), {"HOME": "/home/u"}, source=SCRIPT_FILE)
    defaults = {"MODEL_PATH": "/home/u/models/Qwen3-30B-A3B",
                "TRAIN_FILES": "/home/u/data/gsm8k/train.parquet",
                "VAL_FILES": "/home/u/data/gsm8k/test.parquet"}
    assert list(command.overrides) == job.overrides(defaults)
    moved = parse_launch_script(render_script(job), {"HOME": "/h", "MODEL_PATH": "/m",
                                                     "NNODES": "4"}, source=SCRIPT_FILE)
    values = as_dict(moved.overrides)
    assert values["actor_rollout_ref.model.path"] == "'/m'" and values["trainer.nnodes"] == "4"


def test_files_are_deterministic_and_plan_json_holds_layout_and_predictions(qwen3_30b_job):
    plan, job = qwen3_30b_job
    again = job_from_plan(plan, 1)
    assert render_script(job) == render_script(again)
    assert render_config(job) == render_config(again)
    assert render_plan_json(job) == render_plan_json(again)
    data = json.loads(render_plan_json(job))
    best = plan.candidates.iloc[0]
    assert data["verl_version"] == VERL_VERSION == "0.9.1"
    assert data["planner_version"] == planner.__version__
    assert data["layout"]["tp"] == int(best["tp"]) and data["layout"]["ep"] == int(best["ep"])
    assert data["layout"]["first_stage_layers"] == int(best["first_stage_layers"])
    assert data["prediction"]["peak_memory_gib"] == round(float(best["peak_bytes"]) / 2**30, 2)
    assert data["prediction"]["tokens_per_s_per_gpu"] > 0
    assert data["overrides"][0] == "model_engine=megatron"
    assert "actor_rollout_ref.model.path='${MODEL_PATH}'" in data["overrides"]
    script = render_script(job)
    assert script.startswith("#!/usr/bin/env bash\n")
    assert "python3 -m verl.trainer.main_ppo \\\n    model_engine=megatron \\" in script
    assert 'MODEL_PATH="${MODEL_PATH:-$HOME/models/Qwen3-30B-A3B}"' in script
    assert 'NNODES="${NNODES:-2}"' in script
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in script
    assert script.rstrip().endswith('"$@"')


def test_write_never_overwrites_without_force(qwen3_30b_job, tmp_path):
    plan, _ = qwen3_30b_job
    written = write_plan_job(plan, rank=2, directory=tmp_path / "job", model_path="/m/q")
    assert [path.name for path in written] == [SCRIPT_FILE, CONFIG_FILE, PLAN_FILE]
    assert os.access(written[0], os.X_OK)
    assert json.loads(written[2].read_text())["rank"] == 2
    written[1].write_text("# mine\n")
    with pytest.raises(PlanInputError, match="--force"):
        write_plan_job(plan, rank=1, directory=tmp_path / "job")
    assert written[1].read_text() == "# mine\n"
    write_plan_job(plan, rank=1, directory=tmp_path / "job", force=True)
    assert written[1].read_text() != "# mine\n"
    fitting = int(plan.candidates["fits"].sum())
    with pytest.raises(PlanInputError, match="outside"):
        write_plan_job(plan, rank=fitting + 1, directory=tmp_path / "other")


def test_cli_write_and_refusal(tmp_path, capsys):
    target = tmp_path / "out"
    argv = ["--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h20", "--top", "1", "--write",
            str(target), "--model-path", "/models/Qwen3-8B", "--override",
            "trainer.total_epochs=3"]
    assert main(argv) == 0
    capsys.readouterr()
    script = (target / SCRIPT_FILE).read_text()
    assert 'MODEL_PATH="${MODEL_PATH:-/models/Qwen3-8B}"' in script
    assert "trainer.total_epochs=3 \\" in script
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--force" in err[0] and "Traceback" not in err[0]


@pytest.mark.needs("verl")
def test_overlap_grad_reduce_is_written_and_read_back(tmp_path, capsys):
    """--overlap-grad-reduce goes into the job as the override_ddp_config key verl reads, and
    validate reads it back from both files; off, nothing is written (verl's default)."""
    from planner.diagnose.validate import JobInput, dry_run

    key = f"{MEGATRON}.override_ddp_config.overlap_grad_reduce"
    argv = ["--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h20", "--top", "1"]
    assert main([*argv, "--overlap-grad-reduce", "--write", str(tmp_path / "on")]) == 0
    assert main([*argv, "--write", str(tmp_path / "off")]) == 0
    capsys.readouterr()
    assert f"+{key}=True \\" in (tmp_path / "on" / SCRIPT_FILE).read_text()
    assert "overlap_grad_reduce" not in (tmp_path / "off" / SCRIPT_FILE).read_text()
    assert "overlap_grad_reduce: true" in (tmp_path / "on" / CONFIG_FILE).read_text()
    env = {"MODEL_PATH": "/nowhere/Qwen3-8B"}
    for name in (SCRIPT_FILE, CONFIG_FILE):
        reports = {state: dry_run(JobInput(inputs=(str(tmp_path / state / name),),
                                           sets=tuple(f"{k}={v}" for k, v in env.items()),
                                           gpu_type="h20")).report
                   for state in ("on", "off")}
        assert reports["on"]["workload"]["overlap_grad_reduce"] is True, name
        assert reports["off"]["workload"]["overlap_grad_reduce"] is False, name
        assert reports["on"]["layout"] == reports["off"]["layout"]  # the same layout ranks 1
        assert reports["on"]["memory"]["time_s"]["update_actor"] < \
            reports["off"]["memory"]["time_s"]["update_actor"]
        planned = json.loads((tmp_path / "on" / PLAN_FILE).read_text())["prediction"]
        assert reports["on"]["memory"]["time_s"]["update_actor"] == \
            planned["time_s"]["update_actor"]


# Spaces, a comma, '=', brackets, double quotes, '$', a backslash and non-ASCII text: all
# break Hydra's parser when unquoted, none inside '...'
AWKWARD_PATHS = {"MODEL_PATH": "/data/my models, v2/a=b/Qwen3 é 模型 [x] \"q\" $HOME \\n",
                 "TRAIN_FILES": "/data/trän, 1=2/train.parquet",
                 "VAL_FILES": "/data/v a l/test=1,2.parquet"}
PATH_KEYS = {"MODEL_PATH": "actor_rollout_ref.model.path", "TRAIN_FILES": "data.train_files",
             "VAL_FILES": "data.val_files"}


def run_script_arguments(directory, tmp_path, **env):
    """``bash run_grpo.sh`` with a ``python3`` that writes its arguments (NUL-separated)
    instead of starting verl: the overrides exactly as bash builds them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "python3"
    fake.write_text('#!/bin/sh\nprintf \'%s\\0\' "$@" > "$ARGS_OUT"\n')
    fake.chmod(0o755)
    out = tmp_path / "args"
    out.unlink(missing_ok=True)
    result = subprocess.run(["bash", str(directory / SCRIPT_FILE)], capture_output=True,
                            text=True, timeout=60,
                            env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                                 "HOME": str(tmp_path), "ARGS_OUT": str(out), **env})
    arguments = out.read_text(encoding="utf-8").split("\0")[:-1] if out.exists() else None
    return result, arguments


@pytest.mark.needs("verl")
def test_script_hands_hydra_awkward_paths_exactly(qwen3_30b_job, tmp_path):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    _, job = qwen3_30b_job
    write_job(job, tmp_path / "job")
    result, arguments = run_script_arguments(tmp_path / "job", tmp_path, **AWKWARD_PATHS)
    assert result.returncode == 0, result.stderr[-2000:]
    assert arguments[:2] == ["-m", "verl.trainer.main_ppo"]
    parsed = {item.key_or_group: item.value()
              for item in OverridesParser.create().parse_overrides(arguments[2:])}
    for name, key in PATH_KEYS.items():
        assert parsed[key] == AWKWARD_PATHS[name]
    # validate reads the script as bash runs it
    command = parse_launch_script(render_script(job), {"HOME": str(tmp_path), **AWKWARD_PATHS},
                                  source=SCRIPT_FILE)
    assert list(command.overrides) == arguments[2:]
    assert list(command.overrides) == job.overrides(AWKWARD_PATHS)


@pytest.mark.parametrize("path", ["/data/it's/model", "/data/model\\"])
def test_script_refuses_a_path_hydra_cannot_quote(qwen3_30b_job, tmp_path, path):
    _, job = qwen3_30b_job
    write_job(job, tmp_path / "job")
    result, arguments = run_script_arguments(tmp_path / "job", tmp_path, MODEL_PATH=path)
    assert result.returncode == 2 and arguments is None  # verl never started
    [message] = [line for line in result.stderr.splitlines() if not line.startswith("+")]
    assert f"path '{path}' holds a single quote or ends with a backslash" in message


def _venv_path():
    return f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


@pytest.mark.needs("verl")
def test_script_and_yaml_run_through_verls_hydra_entry_point(qwen3_30b_job, tmp_path):
    """`bash run_grpo.sh --cfg job` and `main_ppo --config-path --config-name --cfg job` make
    verl's real entry point compose and print the job's config (Hydra stops there)."""
    _, job = qwen3_30b_job
    write_job(job, tmp_path)
    env = {**os.environ, "PATH": _venv_path(), "MODEL_PATH": "/x/model", "HOME": str(tmp_path)}
    from_script = subprocess.run(["bash", str(tmp_path / SCRIPT_FILE), "--cfg", "job"],
                                 capture_output=True, text=True, env=env, timeout=300)
    assert from_script.returncode == 0, from_script.stderr[-2000:]
    from_yaml = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo",
                                f"--config-path={tmp_path}", "--config-name=grpo", "--cfg", "job"],
                               capture_output=True, text=True, env=env, timeout=300)
    assert from_yaml.returncode == 0, from_yaml.stderr[-2000:]
    import yaml

    for output in (from_script.stdout, from_yaml.stdout):
        config = yaml.safe_load(output)
        megatron = config["actor_rollout_ref"]["actor"]["megatron"]
        assert config["model_engine"] == "megatron"
        assert megatron["expert_model_parallel_size"] == job.layout.ep
        assert megatron["pipeline_model_parallel_size"] == job.layout.pp
        assert config["actor_rollout_ref"]["rollout"]["gpu_memory_utilization"] == \
            job.layout.gpu_memory_utilization
        assert config["trainer"]["nnodes"] == 2
    assert yaml.safe_load(from_script.stdout)["actor_rollout_ref"]["model"]["path"] == "/x/model"
