"""`plan-parallel tune --mode one-step-off|fully-async|best`: the split and the staleness
threshold as trial parameters, each trial the mode's job, the async trainers' metrics, resume."""

import json
import sys
from collections import Counter

import pytest

pytest.importorskip("optuna", reason="needs the tune extra: pip install 'plan-parallel[tune]'")
from fixtures.tuning import events, fake_trainer, load_study, sqlite_url, tune_argv

from planner.catalog.hardware import get_gpu
from planner.cli.main import main
from planner.verl.keys import MODE_ENTRY
from trials import study_state as attrs
from trials.candidates import STALENESS_GRID, candidate_key, study_fields
from trials.metrics import parse_jsonl, summarise
from trials.preflight import DoctorInputs, run_checks
from trials.trial_job import mode_command

# 4 GPUs in one node: splits of 1, 2 and 3 trainer GPUs
FOUR = ("--gpus", "4")
# The hidden function: 2 trainer GPUs and a staleness threshold of 0.3 are fast.
HIDDEN = {"base": 1000.0, "factors": {"trainer_gpus": {"2": 1.2, "3": 0.9},
                                      "staleness_threshold": {"0.3": 1.1, "0.5": 1.05}}}


def hidden(trainer_gpus: int, staleness: float | None) -> float:
    return (1000.0 * {2: 1.2, 3: 0.9}.get(trainer_gpus, 1.0)
            * {0.3: 1.1, 0.5: 1.05}.get(staleness, 1.0))


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Configure the fake trainer: ``fake(**config)`` -> the events file."""
    return fake_trainer(tmp_path, monkeypatch, throughput=HIDDEN)


def measured(study):
    return sorted((t for t in study.get_trials() if attrs.CATEGORY in t.user_attrs),
                  key=lambda t: t.number)


def override(argv, key):
    return next(item.split("=", 1)[1] for item in argv if item.split("=", 1)[0] == key)


def test_fully_async_study_tunes_split_and_staleness_and_resumes(tmp_path, fake, capsys):
    record = fake()
    argv = tune_argv(tmp_path, *FOUR, "--mode", "fully-async", "--write", str(tmp_path / "out"),
                     "--top-k", "2", "--seed", "3", trials=4)
    assert main(argv) == 0, capsys.readouterr().err
    study = load_study(sqlite_url(tmp_path))
    assert study.user_attrs[attrs.STUDY]["mode"] == "fully-async"
    assert study.user_attrs[attrs.STUDY]["staleness_grid"] == list(STALENESS_GRID)
    first = measured(study)
    assert len(first) == 4
    for trial in first:
        # the split and the threshold are Optuna parameters, the pools a user attribute
        trainer, staleness = trial.params["trainer_gpus"], trial.params["staleness_threshold"]
        assert trainer in (1, 2, 3) and staleness in STALENESS_GRID
        placement = trial.user_attrs[attrs.PLACEMENT]
        assert placement["mode"] == "fully-async" and placement["colocated"] is False
        assert placement["trainer_gpus"] + placement["rollout_gpus"] == 4
        assert placement["staleness_threshold"] == staleness
        assert trial.user_attrs[attrs.KEY].startswith(f"t{trainer}-s{staleness:.2f}-")
        predicted = trial.user_attrs[attrs.PREDICTED]
        assert predicted["mode"] == "fully-async" and predicted["step_time_s"] > 0
        assert predicted["staleness"]["max_versions_behind"] == 1 + (staleness > 0)
        # tokens/s/GPU of both pools, from the aggregated records after the warm-up version
        got = trial.user_attrs[attrs.MEASURED]
        assert trial.values[0] == pytest.approx(hidden(trainer, staleness))
        assert got["steps_recorded"] == 3 and got["steady_steps"] == 2
        assert got["async_metrics"]["fully_async/trainer/idle_ratio"] == pytest.approx(0.3)
        assert got["phase_times_s"]["param_sync"] > 0
    starts = [e for e in events(record) if e["event"] == "start"]
    assert [(e["layout"]["mode"], e["layout"]["trainer_gpus"], e["layout"]["staleness_threshold"])
            for e in starts] == [("fully-async", t.params["trainer_gpus"],
                                  t.params["staleness_threshold"]) for t in first]
    for event, trial in zip(starts, first):  # the trial ran the split's job
        trainer = trial.params["trainer_gpus"]
        assert override(event["argv"], "trainer.n_gpus_per_node") == str(trainer)
        assert override(event["argv"], "rollout.n_gpus_per_node") == str(4 - trainer)
        assert float(override(event["argv"], "async_training.staleness_threshold")) == \
            trial.params["staleness_threshold"]
        assert override(event["argv"], "actor_rollout_ref.hybrid_engine") == "False"

    # the best trial written back as the fully-async job of its split and threshold
    best = max(first, key=lambda t: t.values[0])
    tuned = json.loads((tmp_path / "out" / "tuned.json").read_text())
    assert tuned["trial"] == best.number and tuned["placement"]["mode"] == "fully-async"
    script = (tmp_path / "out" / "run_grpo.sh").read_text()
    assert f"python3 -m {MODE_ENTRY['fully-async']} \\" in script
    trainer = best.params["trainer_gpus"]
    assert f'GPUS_PER_NODE="${{GPUS_PER_NODE:-{trainer}}}"' in script
    assert f"rollout.n_gpus_per_node={4 - trainer}" in script
    assert f"async_training.staleness_threshold={best.params['staleness_threshold']:g}" in script
    assert "total_training_steps" not in script
    frame = (tmp_path / "out" / "trials.csv").read_text().splitlines()
    assert frame[0].startswith("trial,state,category,layout_key,mode,trainer_gpus,rollout_gpus,"
                               "staleness_threshold,tp,")

    # resumed: the same command with more trials continues the study, nothing runs twice
    argv[argv.index("--trials") + 1] = "7"
    assert main(argv) == 0, capsys.readouterr().err
    study = load_study(sqlite_url(tmp_path))
    done = measured(study)
    assert len(done) == 7 and [t.number for t in done[:4]] == [t.number for t in first]
    keys = Counter(t.user_attrs[attrs.KEY] for t in done)
    assert set(keys.values()) == {1}
    assert len([e for e in events(record) if e["event"] == "start"]) == 7
    for trial in done:
        assert trial.values[0] == pytest.approx(hidden(trial.params["trainer_gpus"],
                                                       trial.params["staleness_threshold"]))
    # another grid is another search space: refused, named
    assert main([*argv, "--staleness-grid", "0,0.2"]) == 2
    assert "mode fully-async with staleness grid [0.0, 0.1, 0.3, 0.5]" in capsys.readouterr().err


def test_best_mode_searches_all_modes_in_one_study(tmp_path, fake, capsys):
    # one-step-off's verl perf/throughput counts the trainer pool only; the study must not
    fake(throughput={"base": 1000.0, "factors": {"mode": {"one-step-off": 1.5, "sync": 0.5}}})
    argv = tune_argv(tmp_path, "--mode", "best", "--staleness-grid", "0,0.5", "--write",
                     str(tmp_path / "out"), "--top-k", "3", "--seed", "1", trials=4)
    assert main(argv) == 0, capsys.readouterr().err
    study = load_study(sqlite_url(tmp_path))
    done = measured(study)
    assert len(done) == 4
    modes = {t.params["mode"] for t in done}
    assert "one-step-off" in modes and "fully-async" in modes
    for trial in done:
        mode = trial.params["mode"]
        assert set(study_fields("best")) <= set(trial.params)
        assert trial.user_attrs[attrs.KEY] == candidate_key(trial.params, study_fields("best"))
        assert trial.values[0] == pytest.approx({"one-step-off": 1500.0, "sync": 500.0}
                                                .get(mode, 1000.0))
        if mode == "sync":
            assert trial.params["trainer_gpus"] == 2 and trial.params["staleness_threshold"] == 0
        else:
            assert trial.params["trainer_gpus"] == 1  # 2 GPUs: one split, 1 + 1
            assert trial.params["staleness_threshold"] in ((0.0, 0.5) if mode == "fully-async"
                                                           else (0.0,))
    best = max(done, key=lambda t: t.values[0])
    assert best.params["mode"] == "one-step-off"
    script = (tmp_path / "out" / "run_grpo.sh").read_text()
    assert f"python3 -m {MODE_ENTRY['one-step-off']} \\" in script
    assert "rollout.n_gpus_per_node=1" in script and "async_training" not in script


def test_the_trainer_command_runs_the_modes_entry_module():
    sync = ("srun", "--ntasks=1", "python3", "-m", "verl.trainer.main_ppo")
    assert mode_command(sync, "fully-async")[-1] == \
        "verl.experimental.fully_async_policy.fully_async_main"
    assert mode_command(sync, "one-step-off")[-1] == "verl.experimental.one_step_off_policy.main_ppo"
    assert mode_command(sync, "sync") == sync
    wrapper = ("bash", "run_verl.sh")  # names no module: runs as given
    assert mode_command(wrapper, "fully-async") == wrapper


# verl 0.9.1 FullyAsyncTrainer's file-logger lines: the rollouter's record and the aggregated
# trainer record at each parameter version (trigger 2: version 1 aggregates one local step)
FULLY_ASYNC_LINES = [
    '{"step":1,"data":{"fully_async/rollouter/idle_ratio":0.2}}',
    '{"step":1,"data":{"timing_s/step":9.0,"timing_s/gen":1.0,"perf/total_num_tokens":4000,'
    '"perf/time_per_step":9.0,"perf/throughput":111.1}}',
    '{"step":2,"data":{"fully_async/rollouter/idle_ratio":0.1}}',
    '{"step":2,"data":{"timing_s/step":10.0,"timing_s/gen":2.0,"timing_s/timing_s/param_sync":0.5,'
    '"perf/total_num_tokens":8000,"perf/time_per_step":10.0,"perf/throughput":200.0,'
    '"fully_async/trainer/idle_ratio":0.2}}',
    '{"step":3,"data":{"fully_async/rollouter/idle_ratio":0.3}}',
    '{"step":3,"data":{"timing_s/step":12.0,"timing_s/gen":2.0,"timing_s/timing_s/param_sync":0.5,'
    '"perf/total_num_tokens":8000,"perf/time_per_step":12.0,"perf/throughput":166.7,'
    '"fully_async/trainer/idle_ratio":0.1667}}',
]


def test_fully_async_records_merge_per_version_and_count_every_gpu():
    records = parse_jsonl(FULLY_ASYNC_LINES)
    assert [r.step for r in records] == [1, 2, 3]
    assert records[1].data["fully_async/rollouter/idle_ratio"] == 0.1  # both records kept
    assert records[1].data["timing_s/step"] == 10.0
    summary = summarise(records, warmup_steps=1, n_gpus=4, tokens_from_step_time=True)
    assert summary.step_time_s == 11.0  # median of the steady versions
    assert summary.tokens_per_s_per_gpu == pytest.approx(8000 / (11.0 * 4))
    assert summary.phase_times_s["param_sync"] == 0.5
    assert summary.async_metrics["fully_async/rollouter/idle_ratio"] == pytest.approx(0.2)
    # a sync trial keeps verl's perf/throughput
    assert summarise(records, 1, 4).tokens_per_s_per_gpu == pytest.approx((200.0 + 166.7) / 2)


@pytest.mark.parametrize("extra, message", [
    (("--staleness-grid", "0,0.1"), "--staleness-grid is fully-async's"),
    (("--trainer-gpus", "1"), "--trainer-gpus 1 sizes the trainer pool"),
    (("--mode", "fully-async", "--staleness-grid", "0,x"), "'x' is not a number"),
    (("--mode", "fully-async", "--gpus", "16", "--gpus-per-node", "8", "--trainer-gpus", "4"),
     "not whole nodes of 8"),
])
def test_bad_mode_flags_are_one_line_usage_errors(tmp_path, fake, capsys, extra, message):
    fake()
    assert main(tune_argv(tmp_path, *extra)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "events.jsonl").exists()


def test_doctor_imports_the_async_entry_modules_a_mode_study_runs(tmp_path):
    entry = MODE_ENTRY["fully-async"]
    seen = []

    def probe(python, modules, **_):
        seen.extend(modules)
        return {**{name: {"ok": name != entry} for name in modules},
                entry: {"ok": False, "error": "ModuleNotFoundError: No module named 'x'"},
                "cuda": {"ok": True, "count": 8, "name": "NVIDIA H100 80GB HBM3"}}

    checks = run_checks(DoctorInputs(
        trainer_command=(sys.executable, "-m", "verl.trainer.main_ppo"), launcher="local",
        rollout_engine="vllm", gpu_name="H100-80GB", nvml_names=("H100",), gpus_needed=1,
        model_path=None, data_files=(), verl_version="0.9.1", entry_modules=(entry,)),
        probe=probe, detect=lambda: None)
    assert entry in seen
    verl = next(check for check in checks if check.name == "verl")
    assert verl.status == "fail" and verl.detail.startswith(f"{entry}: ModuleNotFoundError")


def test_a_memory_margin_leaves_the_rollout_pools_kv_cache_alone(tmp_path, fake, capsys):
    """vLLM sizes its KV cache to gpu_memory_utilization (0.90 alone on a GPU): a 15% margin
    must still leave splits to try (it protects the trainer and vLLM's non-KV memory)."""
    fake()
    argv = tune_argv(tmp_path, *FOUR, "--mode", "fully-async", "--memory-margin", "0.15",
                     trials=1)
    assert main(argv) == 0, capsys.readouterr().err
    trial = measured(load_study(sqlite_url(tmp_path)))[0]
    predicted = trial.user_attrs[attrs.PREDICTED]
    capacity_gib = get_gpu("h100").memory_bytes / 2**30  # tune_argv's cluster
    assert predicted["peak_gib"] * 1.15 > capacity_gib  # the pool's peak would have failed it
    assert max(predicted["memory_gib"].values()) * 1.15 <= capacity_gib
