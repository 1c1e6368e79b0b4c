"""Issue 17 and 15 against `plan-parallel tune` with adversarial fake trainers: processes that
outlive a `kill -9` of the tuner, logs that never stop, absurd metrics, secrets, writers
without --force, and a study that stops with the cause when every trial fails alike."""

import json
import os
import signal
import stat
import time
from pathlib import Path

import pytest

pytest.importorskip("optuna", reason="needs the tune extra: pip install 'plan-parallel[tune]'")
psutil = pytest.importorskip("psutil", reason="needs the tune extra")
from fixtures.processes import alive, wait_for  # noqa: E402
from fixtures.tuning import (
    events,
    fake_trainer,
    kill_9_after_start,
    load_study,
    sqlite_url,
    tune_argv,
)

from planner.cli.main import main
from trials import study_state as attrs


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Configure the fake trainer: ``fake(**config)`` -> the events file."""
    return fake_trainer(tmp_path, monkeypatch)


def measured(study):
    return [t for t in study.get_trials() if attrs.CATEGORY in t.user_attrs]


def test_nothing_a_trial_spawned_survives_kill_9_of_the_tuner_and_a_rerun(tmp_path, fake,
                                                                          capsys):
    """A child in the trainer's group, a daemon in its own session, and a daemon that forked
    twice and called setsid (re-parented away from everything): after `kill -9` of the tuner
    (the trainer dies with it) the rerun stops all three and checks they exited."""
    record = fake(step_sleep_s=0.3, spawn_child=True, spawn_daemon=True,
                  spawn_double_fork=True)
    argv = tune_argv(tmp_path, "--heartbeat-interval", "1", "--grace-period", "3", "--steps",
                     "20", trials=2)
    lost = kill_9_after_start(argv, record, 1.5)  # the tuner records the tree once a second
    left = lost["children"]  # child, daemon, double-forked daemon
    assert len(left) == 3 and all(alive(pid) for pid in left)
    double = psutil.Process(left[2])
    # a session of its own (its parent made it and exited), parented outside the trial
    assert os.getsid(double.pid) != os.getsid(left[0]) and double.ppid() not in left
    tree = json.loads((tmp_path / "sweep" / "trials").glob("0000-*/processes.json")
                      .__next__().read_text())
    assert {pid for pid, _ in tree["processes"]} >= set(left) and tree["marker"]
    time.sleep(3.5)  # the grace period passes without heartbeats
    fake(step_sleep_s=0.02, spawn_child=True, spawn_daemon=True, spawn_double_fork=True)
    try:
        assert main(argv) == 0
        err = capsys.readouterr().err
        assert "lost its tuner" in err and "all exited" in err
        assert wait_for(lambda: not any(alive(pid) for pid in left), timeout=5)
        for event in events(record):  # and nothing of the later trials either
            assert not any(alive(pid) for pid in event.get("children", []))
    finally:
        for pid in left:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_log_that_outgrows_max_log_bytes_fails_the_trial_with_that_reason(tmp_path, fake,
                                                                            capsys):
    fake(rules=[{"match": {}, "behaviour": "spam", "at_step": 2}])
    argv = tune_argv(tmp_path, "--max-log-bytes", str(4 << 20), "--fail-fast", "0", trials=1)
    assert main(argv) == 1  # no trial succeeded
    trial = measured(load_study(sqlite_url(tmp_path)))[0]
    assert trial.user_attrs[attrs.CATEGORY] == "crash"
    assert trial.user_attrs[attrs.REASON] == \
        "its log outgrew --max-log-bytes (4 MiB) after 1 of 3 steps"
    size = os.path.getsize(trial.user_attrs[attrs.LOG])
    assert 4 << 20 < size < 64 << 20  # stopped soon after (it would write on forever)
    assert "its log outgrew --max-log-bytes" in capsys.readouterr().err


def test_absurd_metrics_are_skipped_counted_and_never_the_best(tmp_path, fake):
    bad = ['{"step": Infinity, "data": {"perf/throughput": 1.0}}',
           '{"step": STEP, "data": {"perf/throughput": 1e308}}',
           '{"step": STEP, "data": {"perf/throughput": -5000}}',
           '{"step": STEP, "data": ' + "[" * 50_000 + "]" * 50_000 + "}"]
    fake(throughput={"base": 900.0}, rules=[{"match": {}, "behaviour": "bad_metrics",
                                             "lines": bad}])
    assert main(tune_argv(tmp_path, trials=2)) == 0
    for trial in measured(load_study(sqlite_url(tmp_path))):
        assert trial.user_attrs[attrs.CATEGORY] == "ok"
        assert trial.values[0] == pytest.approx(900.0)
        assert trial.user_attrs[attrs.MEASURED]["bad_lines"] == 12  # 4 bad lines x 3 steps


def test_the_study_stops_when_its_first_trials_fail_with_one_cause(tmp_path, fake, capsys):
    fake(rules=[{"match": {}, "behaviour": "import_error"}])
    assert main(tune_argv(tmp_path, trials=10)) == 1
    out, err = capsys.readouterr()
    assert len(measured(load_study(sqlite_url(tmp_path)))) == 3
    assert ("the first 3 trials all failed with one cause: exit status 1 after 0 of 3 steps: "
            "ModuleNotFoundError: No module named 'transfer_queue'") in out
    # each failed trial's line says the cause, not only the exit status
    assert err.count("crash: exit status 1 after 0 of 3 steps: ModuleNotFoundError: No module "
                     "named 'transfer_queue'") == 3
    # different causes do not stop it; neither do OOMs
    fake(rules=[{"match": {"micro_batch": 8}, "behaviour": "oom", "at_step": 1}])
    assert main(tune_argv(tmp_path, trials=4, sweep="sweep2")) == 0


def test_tune_write_refuses_to_replace_a_job_without_force(tmp_path, fake, capsys):
    fake()
    out = tmp_path / "out"
    out.mkdir()
    (out / "run_grpo.sh").write_text("#!/bin/bash\n# my own job\n")
    assert main(tune_argv(tmp_path, "--write", str(out), trials=1)) == 2
    err = capsys.readouterr().err
    assert "already holds a job (run_grpo.sh)" in err and "--force" in err
    assert (out / "run_grpo.sh").read_text() == "#!/bin/bash\n# my own job\n"
    assert main(tune_argv(tmp_path, "--write", str(out), "--force", trials=1)) == 0
    assert "my own job" not in (out / "run_grpo.sh").read_text()
    # what this study wrote is its own to update when it resumes
    assert main(tune_argv(tmp_path, "--write", str(out), trials=2)) == 0
    # another study's job is not
    assert main(tune_argv(tmp_path, "--write", str(out), trials=1, study="other",
                          sweep="sweep-other")) == 2
    assert "study 'study''s best layout" in capsys.readouterr().err


def test_secrets_stay_out_of_the_trainer_and_its_files(tmp_path, fake, monkeypatch):
    record = fake(record_env=["PLAN_PARALLEL_STORAGE", "WANDB_API_KEY"])
    storage = sqlite_url(tmp_path)
    monkeypatch.setenv("PLAN_PARALLEL_STORAGE", storage)  # instead of --storage on argv
    assert main(tune_argv(tmp_path, "--trial-env", "WANDB_API_KEY=k3y", trials=1)) == 0
    start = next(e for e in events(record) if e["event"] == "start")
    assert start["env"] == {"PLAN_PARALLEL_STORAGE": None, "WANDB_API_KEY": "k3y"}
    trial = measured(load_study(storage))[0]  # the study went where the variable said
    workdir = os.path.dirname(trial.user_attrs[attrs.LOG])
    for name in ("command.sh", "result.json"):
        mode = stat.S_IMODE(os.stat(os.path.join(workdir, name)).st_mode)
        assert mode == 0o600, (name, oct(mode))
    assert "WANDB_API_KEY=k3y" in open(os.path.join(workdir, "command.sh")).read()
    # asked for explicitly, the trainer gets it
    assert main(tune_argv(tmp_path, "--trial-env", f"PLAN_PARALLEL_STORAGE={storage}",
                          trials=2)) == 0
    last = [e for e in events(record) if e["event"] == "start"][-1]
    assert last["env"]["PLAN_PARALLEL_STORAGE"] == storage


@pytest.mark.parametrize("url,secret", [
    ("postgresql://plan:s3/cr?et@127.0.0.1:1/db", "s3/cr?et"),
    ("postgresql://plan@127.0.0.1:1/db?password=s3cret&sslmode=disable", "s3cret"),
    ("postgresql://plan:p@ss@127.0.0.1:1/db", "p@ss"),
    ("mysql+pymysql://plan:s%2F3cret@127.0.0.1:1/db", "s/3cret"),
])
def test_storage_passwords_are_never_printed(tmp_path, fake, capsys, url, secret):
    fake()
    assert main(tune_argv(tmp_path, "--storage", url, trials=1)) == 2
    err = capsys.readouterr().err
    assert "cannot open storage" in err and "***" in err
    assert secret not in err and secret.replace("/", "%2F") not in err, err


def test_mask_url_through_sqlalchemys_parser():
    from trials.storage import mask_url, resolve_storage, url_secrets

    assert mask_url("postgresql://u:pa/ss@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert mask_url("x postgresql://u@h/db?password=s3cret&sslmode=require y") == \
        "x postgresql://u@h/db?password=***&sslmode=require y"
    assert "ss@h" not in mask_url("postgresql://u:p@ss@h/db")
    assert mask_url("error: password authentication failed (s3cret)", ("s3cret",)) == \
        "error: password authentication failed (***)"
    assert url_secrets("postgresql://u:pa/ss@h/db?password=q1w2") == ("pa/ss", "q1w2")
    spec = resolve_storage("postgresql://u:pa/ss@h/db", Path("."))
    assert "pa/ss" not in repr(spec) and "pa/ss" not in spec.display
    assert spec.mask("FATAL: bad password pa/ss") == "FATAL: bad password ***"


def test_storage_password_from_a_file(tmp_path, fake, capsys):
    fake()
    secret_file = tmp_path / "pw"
    secret_file.write_text("s3/cr@t\n")
    argv = tune_argv(tmp_path, "--storage", "postgresql://plan@127.0.0.1:1/db",
                     "--storage-password-file", str(secret_file), trials=1)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "cannot open storage postgresql://plan:***@127.0.0.1:1/db" in err
    assert "s3/cr@t" not in err
    assert main(tune_argv(tmp_path, "--storage-password-file", str(secret_file), trials=1)) == 2
    assert "needs a database --storage URL" in capsys.readouterr().err
