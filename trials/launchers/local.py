"""Run a trial as a local subprocess in its own process group (one node's GPUs)."""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import Callable, Mapping

from trials import fate
from trials.gpu_monitor import GpuSampler, visible_devices
from trials.launchers.base import Launcher, LaunchOutcome, LaunchRequest, Watchdog
from trials.processes import (
    ProcessTree,
    become_subreaper,
    exit_status,
    group_members,
    kill_processes,
    start_group,
    stop_group,
)


class LocalLauncher(Launcher):
    """A subprocess per trial: argument list, new session, wall-clock and hang limits; the
    trainer is started through :mod:`trials.fate`, so it dies with the tuner (call
    :meth:`run` from the thread that lives as long as the tuner: the kernel ties the trainer to
    the thread that started it).

    ``gpus``: how many local GPUs a trial uses (sampled through NVML unless
    ``CUDA_VISIBLE_DEVICES`` names them); ``stop_grace_s``: SIGTERM-to-SIGKILL delay;
    ``gpu_free_timeout_s``: how long to wait for the GPUs' memory to come back after a trial.
    """

    name = "local"
    shares_filesystem = True

    def __init__(self, gpus: int, *, stop_grace_s: float = 15.0, poll_s: float = 0.2,
                 sample_interval_s: float = 0.5, gpu_free_timeout_s: float = 60.0,
                 nvml=None):
        self.gpus = gpus
        self.stop_grace_s = stop_grace_s
        self.poll_s = poll_s
        self.sample_interval_s = sample_interval_s
        self.gpu_free_timeout_s = gpu_free_timeout_s
        self.nvml = nvml

    def run(self, request: LaunchRequest,
            on_start: Callable[[dict], None] | None = None) -> LaunchOutcome:
        import psutil

        env = {**os.environ, **request.env}
        request.workdir.mkdir(parents=True, exist_ok=True)
        sampler = GpuSampler(visible_devices(env, self.gpus), self.sample_interval_s,
                             nvml=self.nvml)
        started = time.monotonic()
        become_subreaper()
        stopped = None
        stats = None
        try:
            with open(request.log_path, "ab") as log:
                argv = (sys.executable, "-E", "-S", fate.__file__, str(os.getpid()), "--",
                        *request.argv)  # the trainer dies with this process (kill -9 too)
                process = start_group(argv, cwd=request.workdir, env=env, output=log)
                tree = ProcessTree(process.pid, adopt=True)
                try:
                    handle = {"launcher": self.name, "host": socket.gethostname(),
                              "pgid": process.pid, "pid": process.pid,
                              "create_time": psutil.Process(process.pid).create_time()}
                    if on_start:
                        on_start(handle)
                    watchdog = Watchdog(request.wall_timeout_s, request.hang_timeout_s,
                                        [request.log_path, request.metrics_path])
                    sampler.start()
                    last_refresh = 0.0
                    while exit_status(process.pid) is None:
                        stopped = watchdog.check()
                        if stopped:
                            break
                        if time.monotonic() - last_refresh >= 1.0:
                            tree.refresh()
                            last_refresh = time.monotonic()
                        time.sleep(self.poll_s)
                finally:
                    # Always: the group and every process it spawned, stopped and reaped.
                    code = stop_group(process, tree, self.stop_grace_s)
            stats = sampler.stop()
            if not sampler.wait_until_free(self.gpu_free_timeout_s):
                print(f"warning: GPU memory of {request.name} not back to its level before "
                      f"the trial after {self.gpu_free_timeout_s:g} s", file=sys.stderr)
        finally:
            sampler.stop()
            sampler.close()
        return LaunchOutcome(exit_code=code, stopped=stopped,
                             duration_s=time.monotonic() - started, gpu=stats, handle=handle)

    def abandon(self, handle: Mapping[str, object]) -> str:
        host = str(handle.get("host", ""))
        pgid = int(handle.get("pgid", 0))
        if host != socket.gethostname():
            return (f"its trainer ran on {host} (process group {pgid}); stop it there if it "
                    f"still runs")
        members = group_members(pgid, float(handle.get("create_time", 0.0)))
        if not members:
            return f"its process group {pgid} had already exited"
        count = kill_processes(members, self.stop_grace_s)
        return f"stopped {count} leftover process(es) of its process group {pgid}"
