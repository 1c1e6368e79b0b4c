"""A tuner killed with `kill -9` leaves a RUNNING trial and, here, a daemon that double-forked
and called setsid (as Ray's raylet does).  Issue 26: killed before the trial's first
heartbeat, the trial stayed RUNNING for good and the daemon survived; restarted within the
grace period, a tuner started new trials beside the leftovers.  Now a trial with no heartbeat
counts its start as its last one, and a tuner on the same host orphans a trial whose tuner
process is gone at once -- before its first new trial -- whatever the grace period.

Short settings keep this fast: heartbeats every second, and a grace period of 10 minutes that
nothing here may wait for."""

import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

optuna = pytest.importorskip("optuna", reason="needs the tune extra")
psutil = pytest.importorskip("psutil", reason="needs the tune extra")
from fixtures.processes import alive  # noqa: E402
from fixtures.tuning import (  # noqa: E402
    events,
    fake_trainer,
    kill_9_after_start,
    load_study,
    sqlite_url,
    tune_argv,
)

from planner.cli.main import main  # noqa: E402
from trials import study_state as attrs  # noqa: E402
from trials.orphans import TUNER_PROCESS, this_tuner, tuner_gone  # noqa: E402
from trials.storage import open_storage, resolve_storage  # noqa: E402

GRACE_S = 600


@pytest.fixture
def fake(tmp_path, monkeypatch):
    return fake_trainer(tmp_path, monkeypatch)


def rerun_orphans_at_once(tmp_path, fake, capsys, argv, left):
    """The same command again, at once: the orphan is failed, its daemon stopped before the
    first new trial starts, and the layout run again; no waiting for the grace period."""
    record = fake(step_sleep_s=0.02, watch_pids=left)
    before = len(events(record))
    start = time.monotonic()
    try:
        assert main(argv) == 0
        elapsed = time.monotonic() - start
        err = capsys.readouterr().err
        assert "trial #0 lost its tuner (its tuner, pid" in err and "is gone)" in err
        assert "all exited" in err and "running it again" in err
        assert elapsed < GRACE_S / 4
        assert not any(alive(pid) for pid in left)
        first_new = events(record)[before]
        assert first_new["event"] == "start" and first_new["watched_alive"] == []
    finally:
        for pid in left:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    study = load_study(sqlite_url(tmp_path))
    lost = study.trials[0]
    assert lost.state == optuna.trial.TrialState.FAIL
    assert lost.user_attrs[TUNER_PROCESS]["pid"] != os.getpid()
    retries = [t for t in study.trials if t.user_attrs.get(attrs.RETRY_OF) == 0]
    assert retries and retries[0].user_attrs[attrs.KEY] == lost.user_attrs[attrs.KEY]


def test_killed_before_the_first_heartbeat(tmp_path, fake, capsys):
    """The ~25 s window: the trial runs (its daemon is up, its processes.json written) but no
    heartbeat is stored yet -- the state is made exact by deleting the heartbeat rows after
    the kill.  Before: RUNNING for good, the daemon outliving every later tuner."""
    record = fake(step_sleep_s=0.3, spawn_double_fork=True)
    argv = tune_argv(tmp_path, "--heartbeat-interval", "1", "--grace-period", str(GRACE_S),
                     "--steps", "50", trials=2)
    left = kill_9_after_start(argv, record, after_s=1.5)["children"]
    assert len(left) == 1 and alive(left[0])
    with sqlite3.connect(tmp_path / "sweep" / "study.db") as db:
        db.execute("DELETE FROM trial_heartbeats")
    db.close()
    study = load_study(sqlite_url(tmp_path))
    assert study.trials[0].state == optuna.trial.TrialState.RUNNING
    rerun_orphans_at_once(tmp_path, fake, capsys, argv, left)


def test_killed_after_heartbeats(tmp_path, fake, capsys):
    """Killed later (heartbeats stored), and restarted well within the grace period."""
    record = fake(step_sleep_s=0.3, spawn_double_fork=True)
    argv = tune_argv(tmp_path, "--heartbeat-interval", "1", "--grace-period", str(GRACE_S),
                     "--steps", "50", trials=2)
    left = kill_9_after_start(argv, record, after_s=3.0)["children"]
    with sqlite3.connect(tmp_path / "sweep" / "study.db") as db:
        assert db.execute("SELECT COUNT(*) FROM trial_heartbeats").fetchone()[0] == 1
    db.close()
    rerun_orphans_at_once(tmp_path, fake, capsys, argv, left)


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_a_trial_without_heartbeat_counts_its_start(tmp_path, kind):
    """No heartbeat yet: the start time is the last heartbeat, so the trial goes stale after
    the grace period (Optuna's RDBStorage alone skips it for good)."""
    url = f"sqlite:///{tmp_path / 'study.db'}" if kind == "sqlite" else \
        f"journal:{tmp_path / 'journal.log'}"
    storage = open_storage(resolve_storage(url, tmp_path), heartbeat_interval=1, grace_period=1)
    study = optuna.create_study(storage=storage, study_name="s")
    silent = study.ask()  # RUNNING; no heartbeat thread ever ran for it
    beating = study.ask()
    time.sleep(1.3)
    storage.record_heartbeat(beating._trial_id)
    optuna.storages.fail_stale_trials(study)
    states = {t.number: t.state for t in study.get_trials()}
    assert states[silent.number] == optuna.trial.TrialState.FAIL
    assert states[beating.number] == optuna.trial.TrialState.RUNNING


def test_which_tuner_is_gone():
    me = this_tuner()
    assert not tuner_gone(me)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    created = psutil.Process(child.pid).create_time()
    child.wait()
    assert tuner_gone({**me, "pid": child.pid, "create_time": created})
    assert tuner_gone({**me, "create_time": me["create_time"] - 100})  # a reused pid
    assert not tuner_gone({**me, "host": "another-node", "pid": child.pid})  # not ours to judge
    assert not tuner_gone(None) and not tuner_gone({"host": me["host"]})
