"""Issue 15: `plan-parallel doctor` (and `tune` before its first trial) says, one line per
check, whether this machine can run verl trials -- and how to fix what it cannot."""

import sys
from types import SimpleNamespace

import pytest
from fixtures.tuning import job_files, tune_argv

from planner.cli.main import main
from trials.preflight import DoctorInputs, probe_trainer, run_checks, split_files

PYTHON = sys.executable


def inputs(tmp_path, **changes) -> DoctorInputs:
    files = job_files(tmp_path)
    base = dict(trainer_command=(PYTHON, "-m", "verl.trainer.main_ppo"), launcher="local",
                rollout_engine="vllm", gpu_name="H100-80GB", nvml_names=("H100",),
                gpus_needed=8, model_path=files[1],
                data_files=(("--train-files", files[3]), ("--val-files", files[5])),
                verl_version="0.9.1")
    return DoctorInputs(**{**base, **changes})


def healthy_probe(python, modules, **_):
    return {**{name: {"ok": True, "version": "0.9.1"} for name in modules},
            "cuda": {"ok": True, "count": 8, "name": "NVIDIA H100 80GB HBM3"}}


def h100s(count=8):
    return lambda: SimpleNamespace(name="NVIDIA H100 80GB HBM3", count=count)


def by_name(checks):
    return {check.name: check for check in checks}


def test_a_ready_machine_passes_every_check(tmp_path):
    checks = by_name(run_checks(inputs(tmp_path), probe=healthy_probe, detect=h100s()))
    assert {name: c.status for name, c in checks.items()} == {
        "verl": "ok", "vllm": "ok", "cuda": "ok", "gpus": "ok", "model": "ok",
        "train-files": "ok", "val-files": "ok", "ray": "skip"}
    assert "8 x NVIDIA H100 80GB HBM3" in checks["gpus"].detail
    assert "model_type qwen2" in checks["model"].detail


def test_each_failure_names_its_fix_on_one_line(tmp_path):
    def broken(python, modules, **_):
        return {"verl.trainer.main_ppo": {"ok": False,
                                          "error": "ModuleNotFoundError: No module named "
                                                   "'transfer_queue'"},
                "sglang": {"ok": False, "error": "ModuleNotFoundError: No module named 'sglang'"},
                "cuda": {"ok": False, "error": "torch.cuda.is_available() is False"}}

    setup = inputs(tmp_path, rollout_engine="sglang",
                   data_files=(("--train-files", f"[{tmp_path}/data/train.parquet,"
                                                 f"{tmp_path}/nope.parquet]"),
                               ("--val-files", None)))
    (tmp_path / "models" / "qwen2.5-0.5b" / "config.json").write_text("{not json")
    checks = by_name(run_checks(
        setup, probe=broken, detect=lambda: SimpleNamespace(name="NVIDIA A100-SXM4-80GB", count=8)))
    assert all(c.status == "fail" for name, c in checks.items() if name != "ray")
    assert "No module named 'transfer_queue'" in checks["verl"].detail
    assert "fix: install verl==0.9.1" in checks["verl"].detail
    assert "pip install 'verl[sglang]==0.9.1'" in checks["sglang"].detail
    assert "the plan is for H100-80GB" in checks["gpus"].detail and "--gpu-type" in \
        checks["gpus"].detail
    assert "is not JSON" in checks["model"].detail
    assert "nope.parquet does not exist" in checks["train-files"].detail
    assert "pass --val-files" in checks["val-files"].detail
    for check in checks.values():
        assert "\n" not in check.line()
    too_few = by_name(run_checks(inputs(tmp_path), probe=healthy_probe, detect=h100s(4)))
    assert "--gpus-per-node 4" in too_few["gpus"].detail
    no_driver = by_name(run_checks(inputs(tmp_path), probe=healthy_probe, detect=lambda: None))
    assert no_driver["gpus"].status == "fail" and "nvidia-smi" in no_driver["gpus"].detail


def test_checks_that_do_not_apply_are_skipped_with_the_reason(tmp_path):
    wrapped = by_name(run_checks(inputs(tmp_path, trainer_command=("srun", "python3", "-m",
                                                                  "verl.trainer.main_ppo")),
                                 probe=healthy_probe, detect=h100s()))
    assert wrapped["verl"].status == "skip" and "srun" in wrapped["verl"].detail
    assert wrapped["gpus"].status == "skip"
    hub = by_name(run_checks(inputs(tmp_path, model_path="Qwen/Qwen3-8B"),
                             probe=healthy_probe, detect=h100s()))
    assert hub["model"].status == "skip" and "Hugging Face Hub" in hub["model"].detail
    missing = by_name(run_checks(inputs(tmp_path, model_path="/models/none"),
                                 probe=healthy_probe, detect=h100s()))
    assert missing["model"].status == "fail" and "hf download" in missing["model"].detail

    class Unreachable:
        def __init__(self, address):
            pass

        def list_jobs(self):
            raise ConnectionError("Failed to connect to Ray at address: http://u:pw@h:1")

    ray = by_name(run_checks(inputs(tmp_path, launcher="ray", ray_address="http://u:pw@h:1"),
                             probe=healthy_probe, ray_client=Unreachable))
    assert ray["ray"].status == "fail" and "pw" not in ray["ray"].detail
    assert ray["verl"].status == "skip" and "Ray cluster" in ray["verl"].detail


def test_the_probe_imports_in_the_trainers_own_python():
    found = probe_trainer(PYTHON, ["json", "no_such_module_xyz"])
    assert found["json"]["ok"] is True
    assert found["no_such_module_xyz"] == {"ok": False, "error": "ModuleNotFoundError: No "
                                           "module named 'no_such_module_xyz'"}
    assert "cuda" in found


def test_verl_data_file_lists():
    assert split_files("[a.parquet, 'b.parquet']") == ["a.parquet", "b.parquet"]
    assert split_files("/data/train.parquet") == ["/data/train.parquet"]


def test_doctor_command(tmp_path, capsys):
    files = job_files(tmp_path)
    code = main(["doctor", "--gpu-type", "h100", "--gpus", "8", *files,
                 "--trainer-command", f"{PYTHON} -m verl.trainer.main_ppo"])
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert [line.split()[1] for line in lines] == ["verl:", "vllm:", "cuda:", "gpus:", "model:",
                                                   "train-files:", "val-files:", "ray:"]
    assert all(line.split()[0] in ("ok", "fail", "skip") for line in lines)
    ok = {line.split()[1] for line in lines if line.startswith("ok")}
    assert {"model:", "train-files:", "val-files:"} <= ok
    assert code == (0 if all(not line.startswith("fail") for line in lines) else 1)


def test_tune_runs_the_checks_before_its_first_trial(tmp_path, capsys):
    pytest.importorskip("optuna", reason="plan-parallel[tune] is not installed")
    argv = tune_argv(tmp_path, trials=1)
    argv[argv.index("--model-path") + 1] = str(tmp_path / "missing-model")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"fail  model: {tmp_path / 'missing-model'} does not exist" in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("plan-parallel: error: 1 check(s) failed before the first trial; "
                           "model:") and "--skip-checks" in last
    assert not (tmp_path / "sweep" / "trials").exists()  # no trial ran
