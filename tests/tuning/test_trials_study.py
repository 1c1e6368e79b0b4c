"""`plan-parallel tune` end to end with the fake trainer: studies, storage, resume, kill -9."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter

import pandas as pd
import pytest

pytest.importorskip("optuna", reason="needs the tune extra: pip install 'plan-parallel[tune]'")
psutil = pytest.importorskip("psutil", reason="needs the tune extra: pip install 'plan-parallel[tune]'")
from fixtures.processes import alive, wait_for  # noqa: E402
from fixtures.tuning import (
    events,
    fake_trainer,
    kill_9_after_start,
    layout_key_of,
    load_study,
    sqlite_url,
    tune_argv,
)

from planner.cli.main import main
from trials import study_state as attrs

POSTGRES_ENV = "PLAN_PARALLEL_TEST_POSTGRES_URL"
# The hidden function: TP 2 and big micro-batches are fast, full recompute is slow.
HIDDEN = {"base": 1000.0, "factors": {"tp": {"2": 1.3}, "micro_batch": {"8": 1.2, "4": 1.1},
                                      "recompute": {"full": 0.8}}}



@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Configure the fake trainer: ``fake(**config)`` -> the events file."""
    return fake_trainer(tmp_path, monkeypatch, throughput=HIDDEN)


def measured(study):
    return [t for t in study.get_trials() if attrs.CATEGORY in t.user_attrs]


def test_a_full_study(tmp_path, fake, capsys):
    record = fake(rules=[{"match": {"tp": 2, "micro_batch": 8, "recompute": "none"},
                          "behaviour": "oom", "phase": "update_actor", "at_step": 2}])
    # spread first trials and --ucb-width 1: the study reaches the fast TP2 micro-batch-8
    # layouts (whose OOM and relief this test follows) early, instead of exploring first
    code = main(tune_argv(tmp_path, "--write", str(tmp_path / "out"), "--top-k", "3",
                          "--first-trials", "spread", "--ucb-width", "1", "--seed", "1",
                          trials=8))
    out, err = capsys.readouterr()
    assert code == 0, err
    study = load_study(sqlite_url(tmp_path))
    done = measured(study)
    assert len(done) == 8 and "8 trials measured" in out
    keys = [t.user_attrs[attrs.KEY] for t in done]
    assert len(set(keys)) == 8  # no layout twice
    # every launch is a measured trial, and each layout was launched once
    starts = Counter(layout_key_of(e) for e in events(record) if e["event"] == "start")
    assert sorted(starts) == sorted(keys) and set(starts.values()) == {1}

    # the predicted top 3 ran first (enqueued); later trials come from the sampler
    ranks = [t.user_attrs[attrs.LAYOUT]["rank"] for t in sorted(done, key=lambda t: t.number)]
    assert ranks[:3] == sorted(ranks[:3]) and ranks[0] == 1

    # what Optuna stores for the dashboard
    for trial in done:
        user = trial.user_attrs
        assert user[attrs.PREDICTED]["tokens_per_s_per_gpu"] > 0
        assert set(user[attrs.PREDICTED]["memory_gib"]) == {"generate", "old_log_prob", "ref",
                                                             "update_actor", "weight_sync"}
        assert os.path.exists(user[attrs.LOG]) and user[attrs.LAUNCH]["launcher"] == "local"
        assert user[attrs.LAYOUT]["tp"] in (1, 2) and user[attrs.CATEGORY] in ("ok", "oom")
    oom = [t for t in done if t.user_attrs[attrs.CATEGORY] == "oom"]
    assert len(oom) == 1 and oom[0].state.name == "FAIL"
    assert oom[0].user_attrs[attrs.OOM_PHASE] == "update_actor"
    assert any("CUDA out of memory" in line for line in oom[0].user_attrs[attrs.EVIDENCE])
    # the next trial relieves the failing phase: a neighbour predicted to need less there
    limit = oom[0].user_attrs[attrs.PREDICTED]["memory_gib"]["update_actor"]
    relief = next(t for t in done if t.number == oom[0].number + 1)
    assert relief.user_attrs[attrs.RELIEVES] == oom[0].number
    assert relief.user_attrs[attrs.PREDICTED]["memory_gib"]["update_actor"] < limit

    # the measured values follow the hidden function, warm-up dropped
    for trial in done:
        if trial.user_attrs[attrs.CATEGORY] == "ok":
            layout = trial.user_attrs[attrs.LAYOUT]
            expected = (1000.0 * {2: 1.3}.get(layout["tp"], 1.0)
                        * {8: 1.2, 4: 1.1}.get(layout["micro_batch"], 1.0)
                        * (0.8 if layout["recompute"] == "full" else 1.0))
            assert trial.values[0] == pytest.approx(expected)

    # trials.csv (every trial) next to the study and in --write
    for directory in (tmp_path / "sweep", tmp_path / "out"):
        frame = pd.read_csv(directory / "trials.csv")
        assert len(frame) == len(study.get_trials())
        assert {"tokens_per_s_per_gpu", "predicted_tokens_per_s_per_gpu", "category",
                "log_path", "tp", "micro_batch", "time_gen_s"} <= set(frame.columns)
        assert (frame["category"] == "ok").sum() == 7 and (frame["category"] == "oom").sum() == 1

    # the written-back job is the best measured layout
    best = max((t for t in done if t.user_attrs[attrs.CATEGORY] == "ok"),
               key=lambda t: t.values[0])
    tuned = json.loads((tmp_path / "out" / "tuned.json").read_text())
    assert tuned["trial"] == best.number and tuned["layout_key"] == best.user_attrs[attrs.KEY]
    plan_json = json.loads((tmp_path / "out" / "plan.json").read_text())
    written = plan_json["layout"]
    for field in ("tp", "pp", "cp", "micro_batch", "recompute", "rollout_tp",
                  "gpu_memory_utilization"):
        assert written[field] == best.user_attrs[attrs.LAYOUT][field]
    script = (tmp_path / "out" / "run_grpo.sh").read_text()
    assert (f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu="
            f"{best.user_attrs[attrs.LAYOUT]['micro_batch']}") in script
    assert "total_training_steps" not in script  # the trial's short horizon is not exported
    assert f"best: trial #{best.number}" in out
    assert "trial 1 of 8" in err and "new best" in err  # plain progress lines (not a tty)


def test_resume_runs_only_what_is_missing(tmp_path, fake, capsys):
    record = fake()
    assert main(tune_argv(tmp_path, trials=3)) == 0
    assert main(tune_argv(tmp_path, trials=5)) == 0
    out = capsys.readouterr().out
    study = load_study(sqlite_url(tmp_path))
    assert len(measured(study)) == 5 and "5 trials measured" in out
    starts = Counter(layout_key_of(e) for e in events(record) if e["event"] == "start")
    assert len(starts) == 5 and set(starts.values()) == {1}
    assert main(tune_argv(tmp_path, trials=5)) == 0  # nothing left to do: runs nothing
    assert len([e for e in events(record) if e["event"] == "start"]) == 5


def test_a_second_study_in_the_sweep_folder_does_not_read_the_first_ones_trials(tmp_path, fake,
                                                                            capsys):
    """Two studies in one --sweep-dir run trial #0 on the same layout: the second one's
    trainer fails before verl's file logger opens, so the first one's metrics.jsonl and
    trainer.log must not be what the second study measures and classifies."""
    fake()
    assert main(tune_argv(tmp_path, trials=1, study="first")) == 0
    fake(rules=[{"match": {}, "behaviour": "config_error"}])
    main(tune_argv(tmp_path, "--fail-fast", "0", trials=1, study="second"))
    capsys.readouterr()
    url = sqlite_url(tmp_path)
    first, second = measured(load_study(url, "first")), measured(load_study(url, "second"))
    assert first[0].user_attrs[attrs.CATEGORY] == "ok"
    assert second[0].user_attrs[attrs.CATEGORY] == "config"
    assert second[0].state.name == "FAIL"
    assert first[0].user_attrs[attrs.LOG] != second[0].user_attrs[attrs.LOG]
    assert "step:" in open(first[0].user_attrs[attrs.LOG]).read()  # the first log is kept


def test_time_limits_shorter_than_the_predicted_steps_are_named_before_the_trials(
        tmp_path, fake, capsys):
    """Every layout's step is predicted at ~4.6 s or more (Qwen2.5-0.5B, the tiny batch): a 1 s
    hang timeout stops each trial of a real verl job before its first step ends, and 3 steps
    do not fit in 10 s; tune says so before the first trial."""
    fake()
    assert main(tune_argv(tmp_path, "--hang-timeout", "1s", "--trial-timeout", "10s",
                          trials=1)) == 0
    err = capsys.readouterr().err
    assert "longer than --hang-timeout 1 s" in err and "pass --hang-timeout above" in err
    assert "3 steps of the fastest layout are predicted to take" in err
    assert "longer than --trial-timeout 10 s" in err
    assert err.index("--hang-timeout 1 s") < err.index("trial #0 started")
    fake()
    assert main(tune_argv(tmp_path, trials=2)) == 0  # 5 s and 60 s: long enough, no note
    assert "--hang-timeout" not in capsys.readouterr().err


def test_resuming_with_other_settings_is_refused(tmp_path, fake, capsys):
    fake()
    assert main(tune_argv(tmp_path, trials=1)) == 0
    argv = tune_argv(tmp_path, trials=2)
    argv[argv.index("--rollout-n") + 1] = "4"
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("plan-parallel: error: study 'study'") and "other layouts" in err


def test_early_stop_without_improvement(tmp_path, fake, capsys):
    fake(throughput={"base": 1000.0})  # every layout alike: nothing improves on the first
    assert main(tune_argv(tmp_path, "--patience", "2", trials=10)) == 0
    out = capsys.readouterr().out
    assert len(measured(load_study(sqlite_url(tmp_path)))) == 3
    assert "no improvement in the last 2 trials" in out


def test_multi_objective_with_peak_memory(tmp_path, fake):
    fake()
    assert main(tune_argv(tmp_path, "--multi-objective", trials=3)) == 0
    study = load_study(sqlite_url(tmp_path))
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]
    for trial in measured(study):
        layout = trial.user_attrs[attrs.LAYOUT]
        assert trial.values[1] == pytest.approx(12.0 + 5.0 * layout["micro_batch"] / layout["tp"])


def test_journal_storage(tmp_path, fake):
    fake()
    journal = tmp_path / "study.journal"
    assert main(tune_argv(tmp_path, "--storage", f"journal:{journal}", trials=2)) == 0
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    study = optuna.load_study(study_name="study",
                              storage=JournalStorage(JournalFileBackend(str(journal))))
    assert len(measured(study)) == 2
    assert json.loads((tmp_path / "sweep" / "sweep.json").read_text())["storage_kind"] == \
        "journal"


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_journal_heartbeats_fail_and_retry_a_stale_trial(tmp_path):
    import optuna

    from trials.storage import open_storage, resolve_storage

    retried = []
    storage = open_storage(resolve_storage(f"journal:{tmp_path / 'j.log'}", tmp_path),
                           heartbeat_interval=1, grace_period=2,
                           stale_callback=lambda study, trial: retried.append(trial.number))
    study = optuna.create_study(study_name="s", storage=storage)
    trial = study.ask()
    storage.record_heartbeat(trial._trial_id)
    optuna.storages.fail_stale_trials(study)
    assert study.get_trials()[0].state.name == "RUNNING" and not retried
    time.sleep(2.2)
    optuna.storages.fail_stale_trials(study)
    assert study.get_trials()[0].state.name == "FAIL" and retried == [0]


def tuner_process(tmp_path, *extra, trials, storage=None, study="study"):
    argv = tune_argv(tmp_path, "--heartbeat-interval", "1", "--grace-period", "3", *extra,
                     trials=trials, study=study)
    if storage:
        argv += ["--storage", storage]
    return subprocess.Popen([sys.executable, "-m", "planner", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)



def test_kill_9_of_the_tuner_mid_trial_then_resume(tmp_path, fake, capsys):
    record = fake(step_sleep_s=0.3, spawn_child=True)
    argv = tune_argv(tmp_path, "--heartbeat-interval", "1", "--grace-period", "3",
                     "--steps", "4", trials=3)
    lost_run = kill_9_after_start(argv, record, 0.5)
    # the trainer dies with its tuner; what it spawned in its process group lives on
    assert wait_for(lambda: not alive(lost_run["pid"]), timeout=5)
    orphan = lost_run["children"][0]
    assert alive(orphan)
    time.sleep(3.5)  # the grace period passes without heartbeats

    assert main(argv) == 0
    err = capsys.readouterr().err
    assert not alive(orphan)  # the new tuner stopped what the dead one left running
    assert "lost its tuner" in err and "running it again" in err
    study = load_study(sqlite_url(tmp_path))
    lost = study.get_trials()[0]
    assert lost.state.name == "FAIL" and attrs.CATEGORY not in lost.user_attrs
    done = measured(study)
    assert len(done) == 3 and all(t.user_attrs[attrs.CATEGORY] == "ok" for t in done)
    retry = [t for t in done if t.user_attrs.get(attrs.RETRY_OF) == lost.number]
    assert len(retry) == 1 and retry[0].user_attrs[attrs.KEY] == lost.user_attrs[attrs.KEY]
    for event in events(record):  # (every trial's own child ends with its trial)
        for child in event.get("children", []):
            assert not alive(child)
    # no finished trial lost or run twice: every layout finished exactly once
    ends = Counter(layout_key_of(e) for e in events(record) if e["event"] == "end")
    assert sorted(ends) == sorted(t.user_attrs[attrs.KEY] for t in done)
    assert set(ends.values()) == {1}


def test_sigterm_stops_the_running_trial_and_the_study_resumes(tmp_path, fake, capsys):
    record = fake(step_sleep_s=0.3, spawn_child=True, spawn_daemon=True)
    tuner = tuner_process(tmp_path, "--steps", "20", trials=2)
    try:
        assert wait_for(lambda: any(e["event"] == "start" for e in events(record)))
        time.sleep(0.5)
        tuner.send_signal(signal.SIGTERM)
        out, err = tuner.communicate(timeout=60)
    finally:
        if tuner.poll() is None:
            tuner.kill()
            tuner.wait()
    assert tuner.returncode == 130 and "Run the same command to resume" in err
    run = next(e for e in events(record) if e["event"] == "start")
    assert not any(alive(pid) for pid in [run["pid"], *run["children"]])
    study = load_study(sqlite_url(tmp_path))
    interrupted = study.get_trials()[0]
    assert interrupted.state.name == "FAIL" and interrupted.user_attrs[attrs.SKIPPED] == \
        "interrupted" and attrs.CATEGORY not in interrupted.user_attrs
    assert main(tune_argv(tmp_path, "--steps", "2", trials=2)) == 0
    keys = [t.user_attrs[attrs.KEY] for t in measured(load_study(sqlite_url(tmp_path)))]
    assert interrupted.user_attrs[attrs.KEY] in keys and len(keys) == 2


def postgres_url():
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(f"no PostgreSQL server (set {POSTGRES_ENV}; .ci/run starts one)")
    return url


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_two_tuners_share_one_study(tmp_path, fake, backend):
    storage = postgres_url() if backend == "postgresql" else sqlite_url(tmp_path)
    study_name = f"shared-{uuid.uuid4().hex[:8]}"
    record = fake(step_sleep_s=0.3)
    tuners = [tuner_process(tmp_path, trials=6, storage=storage, study=study_name)
              for _ in range(2)]
    try:
        results = [tuner.communicate(timeout=120) for tuner in tuners]
    finally:
        for tuner in tuners:
            if tuner.poll() is None:
                tuner.kill()
                tuner.wait()
    for tuner, (out, err) in zip(tuners, results):
        assert tuner.returncode == 0, err
    study = load_study(storage, study_name)
    try:
        done = measured(study)
        assert len(done) == 6
        assert len({t.user_attrs[attrs.KEY] for t in done}) == 6
        # both tuners ran trials, and never the same layout at the same time
        runs = {}
        for event in events(record):
            runs.setdefault((layout_key_of(event), event["pid"]), {})[event["event"]] = \
                event["time"]
        assert len({pid for _, pid in runs}) == 6
        by_layout = Counter(key for key, _ in runs)
        assert set(by_layout.values()) == {1}
        assert len({t.user_attrs[attrs.TUNER] for t in done}) == 2
    finally:
        import optuna

        optuna.delete_study(study_name=study_name, storage=storage)


def test_input_errors_are_one_line(tmp_path, fake, capsys, monkeypatch):
    fake()
    cases = [
        (["--storage", "not a url"], "is not a storage URL"),
        (["--storage", "postgresql://plan:s3cret@127.0.0.1:1/nowhere"], "cannot open storage"),
        (["--timeout", "soon"], "--timeout 'soon' is not a duration"),
        (["--trial-env", "NOEQUALS"], "is not NAME=VALUE"),
        (["--launcher", "ray", "--ray-address", "http://127.0.0.1:1"],
         "cannot reach the Ray cluster"),
        (["--warmup-steps", "3"], "--warmup-steps 3 must be between"),
        (["--override", "bad override"], "is not KEY=VALUE"),
        (["--trainer-command", "no-such-trainer --flag"], "'no-such-trainer' is not an executable"),
    ]
    for extra, message in cases:
        assert main(tune_argv(tmp_path, *extra, trials=1)) == 2, extra
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
        assert "s3cret" not in err
    argv = tune_argv(tmp_path, trials=1)
    at = argv.index("--model-path")
    del argv[at:at + 2]
    monkeypatch.delenv("MODEL_PATH", raising=False)
    assert main(argv) == 2 and "--model-path" in capsys.readouterr().err


def test_mask_url():
    from trials.storage import mask_url

    assert mask_url("postgresql://plan:s3cret@db:5432/x") == "postgresql://plan:***@db:5432/x"
    assert mask_url("error at mysql+pymysql://u:p%40ss@h/d now") == \
        "error at mysql+pymysql://u:***@h/d now"
    assert mask_url("postgresql://plan@db/x") == "postgresql://plan@db/x"
    assert mask_url("sqlite:////tmp/a:b@c.db") == "sqlite:////tmp/a:b@c.db"
