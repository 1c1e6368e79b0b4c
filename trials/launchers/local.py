"""Run a trial as a local subprocess in its own process group (one node's GPUs)."""

from __future__ import annotations

import os
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Callable, Mapping

from trials import fate
from trials.gpu_monitor import GpuSampler, visible_devices
from trials.launchers.launcher import Launcher, LaunchOutcome, LaunchRequest, Watchdog
from trials.processes import (
    PROCESSES_FILE,
    TRIAL_MARK_ENV,
    ProcessTree,
    become_subreaper,
    exit_status,
    group_members,
    leftovers,
    read_tree_file,
    scope_prefix,
    start_group,
    stop_group,
    stop_leftovers,
    stop_scope,
)
from trials.storage import SECRET_ENV


class LocalLauncher(Launcher):
    """A subprocess per trial: argument list, new session, wall-clock and hang limits; the
    trainer is started through :mod:`trials.fate`, so it dies with the tuner (call
    :meth:`run` from the thread that lives as long as the tuner: the kernel ties the trainer to
    the thread that started it).

    Each trial carries a marker in its environment and writes its process tree to
    ``processes.json`` in its directory as it changes; where systemd's user manager runs, the
    trial runs in its own scope unit (a cgroup).  :meth:`abandon` uses all three to stop what a
    tuner killed with ``kill -9`` left running.  The tuner's storage secret
    (``PLAN_PARALLEL_STORAGE``) is not passed on to the trainer unless ``--trial-env`` sets it.

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
            on_start: Callable[[dict], None] | None = None,
            monitor: Callable[[], str | None] | None = None) -> LaunchOutcome:
        import psutil

        marker = f"{request.name}-{uuid.uuid4().hex[:12]}"
        env = {**{name: value for name, value in os.environ.items() if name not in SECRET_ENV},
               **request.env, TRIAL_MARK_ENV: marker}
        tree_file = request.workdir / PROCESSES_FILE
        unit = f"plan-parallel-{marker}"
        scope = scope_prefix(unit)
        request.workdir.mkdir(parents=True, exist_ok=True)
        sampler = GpuSampler(visible_devices(env, self.gpus), self.sample_interval_s,
                             nvml=self.nvml)
        started = time.monotonic()
        become_subreaper()
        stopped = None
        stats = None
        try:
            with open(request.log_path, "ab") as log:
                argv = (*scope, sys.executable, "-E", "-S", fate.__file__, str(os.getpid()),
                        "--", *request.argv)  # the trainer dies with this process (kill -9 too)
                process = start_group(argv, cwd=request.workdir, env=env, output=log)
                tree = ProcessTree(process.pid, adopt=True)
                tree.save(tree_file, marker)
                saved = len(tree.known)
                try:
                    handle = {"launcher": self.name, "host": socket.gethostname(),
                              "pgid": process.pid, "pid": process.pid,
                              "create_time": psutil.Process(process.pid).create_time(),
                              "marker": marker, "tree_file": str(tree_file),
                              "unit": unit if scope else None}
                    if on_start:
                        on_start(handle)
                    watchdog = Watchdog(request.wall_timeout_s, request.hang_timeout_s,
                                        [request.log_path, request.metrics_path],
                                        max_log_bytes=request.max_log_bytes,
                                        monitor=monitor)
                    sampler.start()
                    last_refresh = 0.0
                    while exit_status(process.pid) is None:
                        stopped = watchdog.check()
                        if stopped:
                            break
                        if time.monotonic() - last_refresh >= 1.0:
                            tree.refresh()
                            if len(tree.known) != saved:
                                tree.save(tree_file, marker)
                                saved = len(tree.known)
                            last_refresh = time.monotonic()
                        time.sleep(self.poll_s)
                finally:
                    # Always: the group and every process it spawned, stopped and reaped.
                    code = stop_group(process, tree, self.stop_grace_s)
                    stop_leftovers(leftovers({}, marker, tree.adopted_since or 0.0), 1.0)
                    if scope:
                        stop_scope(unit)
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
        """Stop what a dead tuner's trial left running: its scope unit, the processes of its
        ``processes.json``, those carrying its marker, and their descendants; then check that
        they exited."""
        host = str(handle.get("host", ""))
        pgid = int(handle.get("pgid", 0))
        if host != socket.gethostname():
            return (f"its trainer ran on {host} (process group {pgid}); stop it there if it "
                    f"still runs")
        not_before = float(handle.get("create_time", 0.0))
        known, marker = ({}, "")
        if handle.get("tree_file"):
            known, marker = read_tree_file(Path(str(handle["tree_file"])))
        marker = str(handle.get("marker") or marker)
        known.setdefault(int(handle.get("pid", pgid)), not_before)
        found = leftovers(known, marker, not_before)
        for process in group_members(pgid, not_before):
            if all(process.pid != other.pid for other in found):
                found.append(process)
        unit = handle.get("unit")
        scoped = bool(unit) and stop_scope(str(unit))
        if not found:
            return (f"its processes (group {pgid}) had already exited"
                    + (f"; stopped scope {unit}" if scoped else ""))
        count, survivors = stop_leftovers(found, self.stop_grace_s)
        if survivors:
            return (f"stopped {count - len(survivors)} of {count} leftover process(es); "
                    f"still running: {', '.join(map(str, survivors))}")
        return f"stopped {count} leftover process(es) of its trial (group {pgid}); all exited"
