"""The local launcher: process groups, timeouts, hangs, interrupts — and nothing left behind."""

import _thread
import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

psutil = pytest.importorskip("psutil", reason="needs the tune extra: pip install 'plan-parallel[tune]'")
from fixtures.processes import alive  # noqa: E402

import trials.gpu_monitor as gpu_monitor
from planner.units import GIB
from trials.gpu_monitor import GpuSampler, open_nvml, visible_devices
from trials.launchers.launcher import LaunchRequest, Watchdog
from trials.launchers.local import LocalLauncher
from trials.processes import ProcessTree, start_group

# A trainer stand-in that leaves a child in its process group and a daemon in its own session
# (as Ray's workers do), writes their pids, then prints forever, goes silent, or exits.
SCRIPT = r"""
import json, os, signal, subprocess, sys, time
mode, pids_file = sys.argv[1], sys.argv[2]
if "ignore-term" in mode:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
sleeper = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"]
child = subprocess.Popen(sleeper)
daemon = subprocess.Popen(sleeper, start_new_session=True)
json.dump({"main": os.getpid(), "child": child.pid, "daemon": daemon.pid}, open(pids_file, "w"))
print("started", flush=True)
if mode.startswith("print"):
    while True:
        print("working", flush=True)
        time.sleep(0.1)
if mode.startswith("silent"):
    time.sleep(600)
print("done", flush=True)
"""



def request(tmp_path: Path, mode: str, wall: float = 30.0, hang: float = 30.0) -> LaunchRequest:
    script = tmp_path / "trainer.py"
    script.write_text(SCRIPT)
    return LaunchRequest(argv=(sys.executable, str(script), mode, str(tmp_path / "pids.json")),
                         workdir=tmp_path / "work", log_path=tmp_path / "work" / "trainer.log",
                         metrics_path=tmp_path / "work" / "metrics.jsonl",
                         wall_timeout_s=wall, hang_timeout_s=hang, env={"TRIAL_MARK": "x"})


def pids(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "pids.json").read_text())


def launcher(**kwargs) -> LocalLauncher:
    return LocalLauncher(gpus=kwargs.pop("gpus", 0), stop_grace_s=kwargs.pop("stop_grace_s", 1.0),
                         poll_s=0.05, **kwargs)


def test_a_finished_command_leaves_nothing_behind(tmp_path):
    started = []
    outcome = launcher().run(request(tmp_path, "exit"), on_start=started.append)
    assert outcome.exit_code == 0 and outcome.stopped is None
    assert "started" in (tmp_path / "work" / "trainer.log").read_text()
    handle = started[0]
    assert handle["launcher"] == "local" and handle["pgid"] == pids(tmp_path)["main"]
    # the command exited by itself, but its child and its daemon were still running
    assert not any(alive(pid) for pid in pids(tmp_path).values())


def test_wall_clock_timeout_kills_the_whole_tree(tmp_path):
    begin = time.monotonic()
    outcome = launcher().run(request(tmp_path, "print", wall=1.5))
    assert outcome.stopped == "timeout" and outcome.exit_code == -15
    assert 1.5 <= time.monotonic() - begin < 10
    assert (tmp_path / "work" / "trainer.log").read_text().count("working") > 5
    assert not any(alive(pid) for pid in pids(tmp_path).values())


def test_no_progress_is_a_hang_and_sigterm_is_not_required_to_work(tmp_path):
    begin = time.monotonic()
    outcome = launcher().run(request(tmp_path, "silent-ignore-term", hang=1.0))
    assert outcome.stopped == "hang"
    assert outcome.exit_code == -9  # SIGTERM ignored: SIGKILL after the grace period
    assert time.monotonic() - begin < 10
    assert not any(alive(pid) for pid in pids(tmp_path).values())


def test_keyboard_interrupt_still_reaps_everything(tmp_path):
    timer = threading.Timer(1.0, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            launcher().run(request(tmp_path, "print"))
    finally:
        timer.cancel()
    assert not any(alive(pid) for pid in pids(tmp_path).values())


def test_abandon_stops_what_a_dead_tuner_left_running(tmp_path):
    req = request(tmp_path, "silent")
    req.workdir.mkdir(parents=True)
    with open(req.log_path, "ab") as log:
        process = start_group(req.argv, cwd=req.workdir, env=dict(os.environ), output=log)
    try:
        deadline = time.monotonic() + 10
        while not (tmp_path / "pids.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        handle = {"launcher": "local", "host": __import__("socket").gethostname(),
                  "pgid": process.pid, "pid": process.pid,
                  "create_time": psutil.Process(process.pid).create_time()}
        message = launcher().abandon(handle)
        # the trainer, its child, and its daemon (another session, still its descendant)
        assert "stopped 3 leftover process(es)" in message and "all exited" in message
        assert not any(alive(pid) for pid in pids(tmp_path).values())
        assert "already exited" in launcher().abandon(handle)
        assert "ran on elsewhere" in launcher().abandon({**handle, "host": "elsewhere"})
    finally:
        process.kill()
        process.wait()
        for pid in pids(tmp_path).values():
            if alive(pid):
                psutil.Process(pid).kill()


def test_watchdog_progress_is_file_growth(tmp_path):
    now = [0.0]
    log = tmp_path / "log"
    dog = Watchdog(10.0, 3.0, [log, None], clock=lambda: now[0])
    now[0] = 2.0
    assert dog.check() is None
    log.write_text("progress")
    now[0] = 4.0
    assert dog.check() is None  # grew: the hang clock restarts
    now[0] = 6.9
    assert dog.check() is None
    now[0] = 7.1
    assert dog.check() == "hang"
    dog = Watchdog(5.0, 100.0, [log], clock=lambda: now[0])
    now[0] += 5.0
    assert dog.check() == "timeout"


class FakeNvml:
    """NVML with two GPUs: memory used is ``baseline`` until ``busy`` samples have been read."""

    class Info:
        def __init__(self, used):
            self.used = used
            self.gpu = used // GIB  # utilisation: just something per sample

    def __init__(self, busy_reads=6, fail_init=False):
        self.reads = 0
        self.busy_reads = busy_reads
        self.fail_init = fail_init
        self.shutdowns = 0

    def nvmlInit(self):
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetMemoryInfo(self, handle):
        self.reads += 1
        busy = 2 < self.reads <= 2 + self.busy_reads
        return self.Info((40 + 10 * handle) * GIB if busy else 1 * GIB)

    def nvmlDeviceGetUtilizationRates(self, handle):
        return self.Info(80 * GIB if handle == 0 else 20 * GIB)


def test_gpu_sampling_peak_and_mean_utilisation(tmp_path):
    nvml = FakeNvml()
    req = request(tmp_path, "exit")
    req = LaunchRequest(**{**req.__dict__, "env": {"CUDA_VISIBLE_DEVICES": "0,1"}})
    outcome = launcher(nvml=nvml, sample_interval_s=0.05).run(req)
    gpu = outcome.gpu
    assert gpu is not None and gpu.devices == ("0", "1")
    assert gpu.peak_used_gib == (40.0, 50.0) and gpu.peak_gib == 50.0
    assert gpu.mean_utilization == pytest.approx(50.0)
    assert nvml.shutdowns == 1


def test_waiting_for_free_gpus_gives_up_after_its_timeout():
    nvml = FakeNvml(busy_reads=10 ** 6)
    sampler = GpuSampler(["0", "1"], nvml=nvml)
    begin = time.monotonic()
    assert sampler.wait_until_free(0.3, poll_s=0.05) is False
    assert time.monotonic() - begin < 2
    assert GpuSampler(["0"], nvml=FakeNvml(busy_reads=0)).wait_until_free(0.3) is True


def test_no_nvml_is_said_once_and_is_not_an_error(monkeypatch, capsys):
    monkeypatch.setattr(gpu_monitor, "_NOTED", False)
    assert open_nvml(FakeNvml(fail_init=True)) is None
    sampler = GpuSampler(["0"], nvml=FakeNvml(fail_init=True))
    assert not sampler.available and sampler.start().stop() is None
    assert sampler.wait_until_free(0.1) is True
    err = capsys.readouterr().err
    assert err.count("NVML is not available") == 1


def test_visible_devices():
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "2,3"}, 8) == ["2", "3"]
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "GPU-abc"}, 8) == ["GPU-abc"]
    env = {key: value for key, value in os.environ.items() if key != "CUDA_VISIBLE_DEVICES"}
    assert visible_devices(env, 2) in (["0", "1"], os.environ.get("CUDA_VISIBLE_DEVICES",
                                                                  "").split(","))


def test_process_tree_remembers_processes_that_left_the_group(tmp_path):
    req = request(tmp_path, "silent")
    req.workdir.mkdir(parents=True)
    with open(req.log_path, "ab") as log:
        process = start_group(req.argv, cwd=req.workdir, env=dict(os.environ), output=log)
    tree = ProcessTree(process.pid)
    try:
        deadline = time.monotonic() + 10
        while not (tmp_path / "pids.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        tree.refresh()
        daemon = pids(tmp_path)["daemon"]
        assert daemon in tree.known and os.getpgid(daemon) != process.pid
        process.kill()
        process.wait()
        tree.kill_all(1.0)
        assert not any(alive(pid) for pid in pids(tmp_path).values())
    finally:
        for pid in pids(tmp_path).values():
            if alive(pid):
                psutil.Process(pid).kill()
