"""The Ray launcher against a real local Ray head (CPU only), through `plan-parallel tune`."""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from fixtures.tuning import (
    FAKE_ENV,
    load_study,
    sqlite_url,
    top_candidates,
    tune_argv,
    write_config,
)

from planner.cli.main import main
from trials import study_state as attrs
from trials.processes import ProcessTree

pytestmark = pytest.mark.needs("tune", "ray")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# Ray state a user's earlier Ray jobs leave (~/.ray/auth_token turns token authentication on
# for every client) or set in the environment: the test runs without any of it.
RAY_ENV = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


@pytest.fixture(scope="module")
def ray_head():
    """``ray start --head --block`` in its own process group, with its own HOME and temp dir
    (nothing of the user's ~/.ray is read); everything it started is stopped by pid afterwards
    (never ``ray stop``, which would stop other users' Ray too)."""
    ray = Path(sys.executable).with_name("ray")
    temp = tempfile.mkdtemp(prefix="pp-ray-", dir="/tmp")  # Ray's socket paths must be short
    home = Path(temp) / "home"
    home.mkdir()
    dashboard = free_port()
    isolation = pytest.MonkeyPatch()
    isolation.setenv("HOME", str(home))  # the clients in this process: no ~/.ray either
    for name in RAY_ENV:
        isolation.delenv(name, raising=False)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    log = open(Path(temp) / "head.log", "wb")
    head = subprocess.Popen(
        [str(ray), "start", "--head", "--block", "--num-cpus=2", "--num-gpus=0",
         f"--port={free_port()}", f"--dashboard-port={dashboard}",
         "--dashboard-host=127.0.0.1", "--include-dashboard=true", f"--temp-dir={temp}",
         "--disable-usage-stats"], stdout=log, stderr=subprocess.STDOUT, env=env,
        start_new_session=True)

    tree = ProcessTree(head.pid)
    address = f"http://127.0.0.1:{dashboard}"
    try:
        from ray.job_submission import JobSubmissionClient

        deadline = time.monotonic() + 120
        while True:
            try:
                JobSubmissionClient(address).list_jobs()
                break
            except Exception:
                if head.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("the Ray head did not start: "
                                + (Path(temp) / "head.log").read_text()[-2000:])
                time.sleep(0.5)
        yield address
    finally:
        tree.refresh()
        try:
            os.killpg(head.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            head.wait(timeout=3)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        tree.kill_all(3.0)
        log.close()
        isolation.undo()


def test_trials_through_the_ray_jobs_api(tmp_path, ray_head, capsys):
    from ray.job_submission import JobSubmissionClient

    argv = tune_argv(tmp_path, "--launcher", "ray", "--ray-address", ray_head, "--top-k", "2",
                     "--hang-timeout", "10s", trials=3)
    first = top_candidates(argv, 1)[0]  # the predicted best runs first: it hangs
    config = write_config(tmp_path / "fake.json", step_sleep_s=0.05,
                          throughput={"base": 800.0, "factors": {"micro_batch": {"8": 1.25}}},
                          rules=[{"match": dict(first.params), "behaviour": "hang",
                                  "at_step": 2}])
    argv += ["--trial-env", f"{FAKE_ENV}={config}"]
    assert main(argv) == 0, capsys.readouterr().err
    study = load_study(sqlite_url(tmp_path))
    done = [t for t in study.get_trials() if attrs.CATEGORY in t.user_attrs]
    assert len(done) == 3
    client = JobSubmissionClient(ray_head)
    hung = [t for t in done if t.user_attrs[attrs.CATEGORY] == "hang"]
    assert len(hung) == 1 and hung[0].user_attrs[attrs.KEY] == first.key
    launch = hung[0].user_attrs[attrs.LAUNCH]
    assert launch["launcher"] == "ray" and launch["address"] == ray_head
    assert str(client.get_job_status(launch["submission_id"]).value) == "STOPPED"
    ok = [t for t in done if t.user_attrs[attrs.CATEGORY] == "ok"]
    assert len(ok) == 2
    for trial in ok:
        measured = trial.user_attrs[attrs.MEASURED]
        assert measured["source"] == "file"  # the head shares this filesystem
        expected = 800.0 * (1.25 if trial.user_attrs[attrs.LAYOUT]["micro_batch"] == 8 else 1)
        assert trial.values[0] == pytest.approx(expected)
        job = trial.user_attrs[attrs.LAUNCH]["submission_id"]
        assert str(client.get_job_status(job).value) == "SUCCEEDED"
        assert "step:3 - " in Path(trial.user_attrs[attrs.LOG]).read_text()

    # Without a shared filesystem the metrics come from the job's console log.
    config = write_config(tmp_path / "fake2.json", step_sleep_s=0.05)
    argv = tune_argv(tmp_path, "--launcher", "ray", "--ray-address", ray_head,
                     "--no-shared-fs", "--trial-env", f"{FAKE_ENV}={config}", trials=1,
                     sweep="sweep2")
    assert main(argv) == 0
    trial = next(t for t in load_study(sqlite_url(tmp_path, "sweep2")).get_trials()
                 if attrs.CATEGORY in t.user_attrs)
    assert trial.user_attrs[attrs.CATEGORY] == "ok"
    assert trial.user_attrs[attrs.MEASURED]["source"] == "console"
