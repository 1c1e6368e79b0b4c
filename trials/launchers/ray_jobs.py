"""Run a trial on an existing Ray cluster through the Ray Jobs API (how sweeps use many nodes).

verl already runs on Ray: submitted as a job, the trainer's driver runs on the head node and
its ``ray.init()`` joins the cluster, so the trial gets the cluster's GPUs.  The launcher
follows the job's logs into the trial's log file, and stops the job at the wall-clock or
no-progress limit (Ray sends SIGTERM, then SIGKILL, to the entrypoint's process group and the
job's actors die with its driver).

The entrypoint is a shell command line (that is what the Jobs API takes); it is built with
``shlex.quote`` from the argument list, never from user text.  By default the sweep directory is
assumed to be on a filesystem the cluster shares (the trial's directory and metrics file are
the same paths there); with ``shared_filesystem=False`` the job starts in its own directory on
the head node and the metrics come from the console log.
"""

from __future__ import annotations

import shlex
import time
import uuid
from typing import Callable, Mapping

from trials.launchers.base import Launcher, LaunchOutcome, LaunchRequest, Watchdog

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


class RayJobLauncher(Launcher):
    name = "ray"

    def __init__(self, address: str, *, shared_filesystem: bool = True, poll_s: float = 1.0,
                 stop_timeout_s: float = 60.0, client=None):
        self.address = address
        self.shares_filesystem = shared_filesystem
        self.poll_s = poll_s
        self.stop_timeout_s = stop_timeout_s
        self._client = client

    def describe(self) -> str:
        return f"ray ({self.address})"

    def client(self):
        if self._client is None:
            from ray.job_submission import JobSubmissionClient

            self._client = JobSubmissionClient(self.address)
        return self._client

    def entrypoint(self, request: LaunchRequest) -> str:
        command = shlex.join(request.argv)
        if not self.shares_filesystem:
            return f"exec {command}"
        workdir = shlex.quote(str(request.workdir))
        return f"mkdir -p {workdir} && cd {workdir} && exec {command}"

    def run(self, request: LaunchRequest,
            on_start: Callable[[dict], None] | None = None) -> LaunchOutcome:
        client = self.client()
        request.workdir.mkdir(parents=True, exist_ok=True)
        submission_id = f"plan-parallel-{request.name}-{uuid.uuid4().hex[:8]}"
        client.submit_job(entrypoint=self.entrypoint(request), submission_id=submission_id,
                          runtime_env={"env_vars": {k: str(v) for k, v in request.env.items()}},
                          metadata={"plan_parallel_trial": request.name})
        handle = {"launcher": self.name, "address": self.address,
                  "submission_id": submission_id}
        started = time.monotonic()
        stopped = None
        status = "PENDING"
        with open(request.log_path, "a", encoding="utf-8", errors="replace") as log:
            offset = 0
            try:
                if on_start:
                    on_start(handle)
                watchdog = Watchdog(request.wall_timeout_s, request.hang_timeout_s,
                                    [request.log_path, request.metrics_path],
                                    max_log_bytes=request.max_log_bytes)
                while True:
                    status = str(client.get_job_status(submission_id).value)
                    offset = self._follow(submission_id, log, offset)
                    if status in TERMINAL:
                        break
                    stopped = watchdog.check()
                    if stopped:
                        break
                    time.sleep(self.poll_s)
            finally:
                if status not in TERMINAL:
                    status = self._stop(submission_id)
                offset = self._follow(submission_id, log, offset)
        info = client.get_job_info(submission_id)
        code = info.driver_exit_code
        if code is None:
            code = {"SUCCEEDED": 0, "FAILED": 1}.get(status, -15)
        return LaunchOutcome(exit_code=code, stopped=stopped,
                             duration_s=time.monotonic() - started, handle=handle)

    def _follow(self, submission_id: str, log, offset: int) -> int:
        """Append the job's new log text to the trial's log; the new offset."""
        try:
            text = self.client().get_job_logs(submission_id)
        except Exception:  # the dashboard being briefly busy is no reason to stop a trial
            return offset
        if len(text) > offset:
            log.write(text[offset:])
            log.flush()
        return max(offset, len(text))

    def _stop(self, submission_id: str) -> str:
        """Stop the job and wait until Ray says it is over; its final status."""
        client = self.client()
        interrupted = False
        try:
            client.stop_job(submission_id)
        except KeyboardInterrupt:
            interrupted = True
        deadline = time.monotonic() + self.stop_timeout_s
        status = "RUNNING"
        while time.monotonic() < deadline:
            try:
                status = str(client.get_job_status(submission_id).value)
            except KeyboardInterrupt:
                interrupted = True
                continue
            if status in TERMINAL:
                break
            time.sleep(0.5)
        if interrupted:
            raise KeyboardInterrupt
        return status

    def abandon(self, handle: Mapping[str, object]) -> str:
        submission_id = str(handle.get("submission_id", ""))
        try:
            status = str(self.client().get_job_status(submission_id).value)
        except Exception as error:
            return f"could not ask Ray about job {submission_id}: {error}"
        if status in TERMINAL:
            return f"its Ray job {submission_id} had already ended ({status})"
        return f"stopped its Ray job {submission_id} ({self._stop(submission_id)})"
