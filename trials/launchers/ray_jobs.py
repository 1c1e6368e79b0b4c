"""Run a trial on an existing Ray cluster through the Ray Jobs API (how sweeps use many nodes).

verl already runs on Ray: submitted as a job, the trainer's driver runs on the head node and
its ``ray.init()`` joins the cluster, so the trial gets the cluster's GPUs.  The launcher
follows the job's logs into the trial's log file, and stops the job at the wall-clock or
no-progress limit (Ray sends SIGTERM, then SIGKILL, to the entrypoint's process group and the
job's actors die with its driver).

The job's log is streamed, not re-fetched: Ray's ``tail_job_logs`` websocket sends each chunk
once, and a daemon thread appends it to the trial's log (:class:`LogFollower`).  Where the
client has no stream or the stream breaks, the launcher falls back to ``get_job_logs`` (the
whole log, Ray's only other log call) on each poll and appends only the part past what the
trial's log already holds; it stops fetching once the log is past ``max_log_bytes`` (the
watchdog then stops the trial), so a runaway log is never held in memory poll after poll.

The entrypoint is a shell command line (that is what the Jobs API takes); it is built with
``shlex.quote`` from the argument list, never from user text.  By default the sweep directory is
assumed to be on a filesystem the cluster shares (the trial's directory and metrics file are
the same paths there); with ``shared_filesystem=False`` the job starts in its own directory on
the head node and the metrics come from the console log.
"""

from __future__ import annotations

import asyncio
import shlex
import threading
import time
import uuid
from typing import Callable, Mapping

from trials.launchers.launcher import Launcher, LaunchOutcome, LaunchRequest, Watchdog

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


class LogFollower:
    """A Ray job's log, appended to the trial's log file exactly once per character.

    Text arrives with its position in the job's log (a stream chunk after the chunks before
    it, a whole-log fetch at 0); :meth:`_append` writes only what lies past ``written``, so a
    stream and fetches after it never repeat or skip text."""

    def __init__(self, client, submission_id: str, log, max_bytes: int | None = None):
        self.client, self.submission_id, self.log = client, submission_id, log
        self.max_bytes = max_bytes
        self.written = 0  # characters of the job's log now in the trial's log
        self.written_bytes = 0  # the same, as UTF-8 bytes in the file (what the limit counts)
        self._lock = threading.Lock()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._stream_ok = False  # the stream ran to its end (the job is over)

    def start(self) -> None:
        """Stream in a daemon thread when the client can (Ray's ``tail_job_logs``)."""
        if callable(getattr(self.client, "tail_job_logs", None)):
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name=f"ray-log-{self.submission_id}")
            self._thread.start()

    @property
    def streaming(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        try:
            asyncio.run(self._tail())
        except BaseException:  # noqa: BLE001 - a broken stream: the polls take over
            return

    async def _tail(self) -> None:
        self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
        position = 0
        async for chunk in self.client.tail_job_logs(self.submission_id):
            position = self._append(chunk, position)
        self._stream_ok = True

    def _append(self, text: str, position: int) -> int:
        """Write the part of ``text`` (starting at ``position`` of the job's log) not yet
        written; the position after ``text``."""
        with self._lock:
            new = text[max(self.written - position, 0):]
            if new and not self._closed and position <= self.written:
                self.log.write(new)
                self.log.flush()
                self.written += len(new)
                self.written_bytes += len(new.encode("utf-8", errors="replace"))
        return position + len(text)

    def poll(self) -> None:
        """While no stream runs: fetch the whole log and append its new part (skipped once
        the log is past ``max_bytes``: the watchdog stops the trial on it)."""
        if self.streaming or (self.max_bytes is not None and self.written_bytes > self.max_bytes):
            return
        try:
            text = self.client.get_job_logs(self.submission_id)
        except Exception:  # the dashboard being briefly busy is no reason to stop a trial
            return
        self._append(text, 0)

    def finish(self, drain_s: float) -> None:
        """The job is over: let the stream drain (it ends with the job), else stop it and
        fetch what it did not deliver; nothing is written after this returns."""
        if self._thread is not None:
            self._thread.join(drain_s)
            if self._thread.is_alive() and self._loop is not None and self._task is not None:
                self._loop.call_soon_threadsafe(self._task.cancel)
                self._thread.join(drain_s)
        if not self._stream_ok:
            if self._thread is not None and self._thread.is_alive():
                with self._lock:  # a stream that would not stop: fetch and write nothing more
                    self._closed = True
                return
            self.poll()
        with self._lock:
            self._closed = True


class RayJobLauncher(Launcher):
    name = "ray"

    def __init__(self, address: str, *, shared_filesystem: bool = True, poll_s: float = 1.0,
                 stop_timeout_s: float = 60.0, drain_s: float = 10.0, client=None):
        self.address = address
        self.drain_s = drain_s  # how long the log stream may take to deliver its end
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
            on_start: Callable[[dict], None] | None = None,
            monitor: Callable[[], str | None] | None = None) -> LaunchOutcome:
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
            follower = LogFollower(client, submission_id, log, request.max_log_bytes)
            try:
                if on_start:
                    on_start(handle)
                watchdog = Watchdog(request.wall_timeout_s, request.hang_timeout_s,
                                    [request.log_path, request.metrics_path],
                                    max_log_bytes=request.max_log_bytes, monitor=monitor)
                follower.start()
                while True:
                    status = str(client.get_job_status(submission_id).value)
                    if status in TERMINAL:
                        break
                    follower.poll()
                    stopped = watchdog.check()
                    if stopped:
                        break
                    time.sleep(self.poll_s)
            finally:
                if status not in TERMINAL:
                    status = self._stop(submission_id)
                follower.finish(self.drain_s)
        info = client.get_job_info(submission_id)
        code = info.driver_exit_code
        if code is None:
            code = {"SUCCEEDED": 0, "FAILED": 1}.get(status, -15)
        return LaunchOutcome(exit_code=code, stopped=stopped,
                             duration_s=time.monotonic() - started, handle=handle)

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
