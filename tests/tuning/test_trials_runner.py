"""One trial end to end with the fake trainer: the exported job, metrics, every category."""

import json
import os
import sys

import pytest

psutil = pytest.importorskip("psutil", reason="needs the tune extra: pip install 'plan-parallel[tune]'")
from fixtures.tuning import FAKE_ENV, FAKE_TRAINER, events, write_config

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cost.request import PlanRequest
from planner.plan import make_plan
from planner.search.space import SearchOptions
from trials.candidates import CandidateSet, layout_key
from trials.launchers.local import LocalLauncher
from trials.runner import run_trial
from trials.trial_job import TrialJobs


@pytest.fixture(scope="module")
def setting():
    model = resolve_model("qwen2.5-0.5b")
    cluster = ClusterSpec(get_gpu("h100"), 2, 2)
    workload = GrpoWorkload(train_batch_size=8, rollout_n=2, prompt_length=64,
                            response_length=64, mini_batch_size=4)
    plan = make_plan(PlanRequest(model, cluster, workload, options=SearchOptions(offload=(False,))))
    return plan, CandidateSet.from_plan(plan)


def jobs(plan, steps=3, wall=30.0, hang=30.0, env=None) -> TrialJobs:
    return TrialJobs(model=plan.model, cluster=plan.cluster, workload=plan.workload,
                     trainer_command=(sys.executable, str(FAKE_TRAINER)),
                     model_path="/models/m", train_files="/data/t.parquet",
                     val_files="/data/v.parquet", steps=steps, wall_timeout_s=wall,
                     hang_timeout_s=hang, study_name="s", overrides=("actor_rollout_ref.actor."
                                                                     "optim.lr=2e-6",),
                     env=env or {})


def trial(tmp_path, setting, config, *, index=0, steps=3, wall=30.0, hang=30.0,
          shares_filesystem=True):
    plan, candidates = setting
    candidate = candidates[index]
    config.setdefault("record", str(tmp_path / "events.jsonl"))
    path = write_config(tmp_path / "fake.json", **config)
    request = jobs(plan, steps, wall, hang, env={FAKE_ENV: str(path)}).request(
        tmp_path / "sweep", 7, candidate, shares_filesystem, os.environ)
    launcher = LocalLauncher(gpus=0, stop_grace_s=1.0, poll_s=0.05)
    return run_trial(request, launcher, steps=steps, warmup_steps=1, n_gpus=2), candidate


def test_a_successful_trial_reads_the_exported_job_and_its_metrics(tmp_path, setting):
    factors = {"throughput": {"base": 1000.0, "factors": {"tp": {"2": 1.5}}}}
    result, candidate = trial(tmp_path, setting, {**factors, "step_sleep_s": 0.02})
    assert result.ok and result.category.value == "ok"
    expected = 1000.0 * (1.5 if candidate.layout.tp == 2 else 1.0)
    assert result.summary.tokens_per_s_per_gpu == pytest.approx(expected)  # warm-up dropped
    assert result.summary.source == "file" and result.summary.steady_steps == 2
    assert set(result.summary.phase_times_s) >= {"gen", "old_log_prob", "ref", "update_actor",
                                                  "update_weights", "step"}
    assert result.summary.mfu == pytest.approx(expected / 5000)
    assert result.peak_memory_gib == result.summary.memory_gb[
        "actor/perf/max_memory_reserved_gb"]
    # the fake trainer saw the planned layout through verl's own keys
    start = events(tmp_path / "events.jsonl")[0]
    assert layout_key(start["layout"]) == candidate.key
    argv = start["argv"]
    assert "model_engine=megatron" in argv and "trainer.total_training_steps=3" in argv
    assert "trainer.val_before_train=False" in argv and "trainer.save_freq=-1" in argv
    assert "trainer.resume_mode=disable" in argv and "data.train_max_samples=24" in argv
    assert "trainer.logger=[console,file]" in argv and "trainer.experiment_name=s-0007" in argv
    assert "actor_rollout_ref.actor.optim.lr=2e-6" in argv  # the user's override kept
    assert any(a.startswith("+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH=")
               for a in argv)
    workdir = result.request.workdir
    assert workdir.name == f"0007-{candidate.key}"
    assert {"command.sh", "trainer.log", "metrics.jsonl", "result.json"} <= {
        p.name for p in workdir.iterdir()}
    saved = json.loads((workdir / "result.json").read_text())
    assert saved["category"] == "ok" and saved["measured"]["tokens_per_s_per_gpu"] == expected


def test_console_fallback_when_the_metrics_file_is_missing(tmp_path, setting):
    result, _ = trial(tmp_path, setting, {"console_only": True, "step_sleep_s": 0.01})
    assert result.ok and result.summary.source == "console"
    assert result.summary.tokens_per_s_per_gpu == pytest.approx(1000.0)
    # a launcher without a shared filesystem asks for the console logger only
    result, _ = trial(tmp_path, setting, {"step_sleep_s": 0.01}, shares_filesystem=False)
    assert result.ok and result.summary.source == "console"
    assert "trainer.logger=[console]" in result.request.argv


@pytest.mark.parametrize("rule,category,phase,evidence", [
    ({"behaviour": "oom", "phase": "ref", "at_step": 2}, "oom", "ref",
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
    ({"behaviour": "optimizer_oom", "at_step": 1}, "oom", "update_actor", "distrib_optimizer"),
    ({"behaviour": "vllm_oom"}, "oom", "generate", "No available memory for the cache blocks"),
    ({"behaviour": "nccl", "at_step": 2}, "nccl", None,
     "Watchdog caught collective operation timeout"),
    ({"behaviour": "config_error"}, "config", None, "Could not override"),
    ({"behaviour": "config_error", "kind": "verl"}, "config", None, "must be divisible by"),
    ({"behaviour": "crash", "at_step": 2}, "crash", None, "Segmentation fault"),
])
def test_every_failure_category(tmp_path, setting, rule, category, phase, evidence):
    result, _ = trial(tmp_path, setting, {"rules": [{"match": {}, **rule}],
                                          "step_sleep_s": 0.01})
    assert result.category.value == category and not result.ok
    assert result.classification.oom_phase == phase
    assert any(evidence in line for line in result.classification.evidence), \
        result.classification.evidence
    if category == "crash":
        assert result.outcome.exit_code == -11 and "SIGSEGV" in result.classification.reason


def test_hang_and_timeout_leave_no_process_behind(tmp_path, setting):
    config = {"rules": [{"match": {}, "behaviour": "hang", "at_step": 2}], "spawn_child": True,
              "spawn_daemon": True, "ignore_sigterm": True, "step_sleep_s": 0.01}
    result, _ = trial(tmp_path, setting, config, hang=1.0)
    assert result.category.value == "hang" and result.summary.steps_recorded == 1
    start = events(tmp_path / "events.jsonl")[0]
    for pid in [start["pid"], *start["children"]]:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"

    (tmp_path / "events.jsonl").unlink()
    config = {"rules": [{"match": {}, "behaviour": "slow"}], "step_sleep_s": 0.3,
              "spawn_daemon": True}
    result, _ = trial(tmp_path, setting, config, steps=50, wall=1.5, hang=30.0)
    assert result.category.value == "timeout" and 1 <= result.summary.steps_recorded < 50
    start = events(tmp_path / "events.jsonl")[0]
    for pid in [start["pid"], *start["children"]]:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"


def test_the_trial_job_composes_and_validates_in_verls_own_config(tmp_path, setting):
    """The short horizon uses keys verl 0.9.1 has (Hydra would refuse unknown ones)."""
    import warnings

    hydra = pytest.importorskip("hydra")
    verl = pytest.importorskip("verl")
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    plan, candidates = setting
    request = jobs(plan, steps=4).request(tmp_path / "sweep", 3, candidates[0], True, os.environ)
    overrides = list(request.argv[2:])  # after `python fake_verl_trainer.py`
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with hydra.initialize_config_dir(config_dir=config_dir, version_base=None):
            cfg = hydra.compose(config_name="ppo_trainer", overrides=overrides)
        validate_config(cfg, use_reference_policy=need_reference_policy(cfg),
                        use_critic=need_critic(cfg))
    assert cfg.trainer.total_training_steps == 4 and list(cfg.trainer.logger) == ["console",
                                                                                 "file"]
    assert cfg.trainer.val_before_train is False and cfg.trainer.resume_mode == "disable"
    assert cfg.data.train_max_samples == 8 * 4
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH == \
        str(request.metrics_path)
    assert cfg.actor_rollout_ref.actor.megatron.tensor_model_parallel_size == \
        candidates[0].layout.tp
