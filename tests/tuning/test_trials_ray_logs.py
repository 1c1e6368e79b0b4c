"""The Ray launcher's log following, against a fake Jobs client (no Ray): each character of
the job's log reaches the trial's log once, however many polls it takes."""

import asyncio
from types import SimpleNamespace

from trials.launchers.launcher import LaunchRequest
from trials.launchers.ray_jobs import RayJobLauncher
from trials.metrics import parse_console_line

STEPS = 40
# verl's console lines, with worker chatter between them; non-ASCII text on purpose
CHUNKS = [f"(TaskRunner pid=1) step:{step} - timing_s/step:np.float64(2.0) - "
          f"perf/throughput:np.float64({500 + step}.0)\n(WorkerDict pid=2) chatter é {step}\n"
          * 1 for step in range(1, STEPS + 1)]
FULL_LOG = "".join(CHUNKS)


class FakeJobs:
    """A job whose log grows by one chunk per status poll and that succeeds after the last.

    ``stream``: offer ``tail_job_logs``; ``break_after``: the stream fails after that many
    chunks (a dashboard restart).  Counts what ``get_job_logs`` sent (whole-log fetches)."""

    def __init__(self, stream=True, break_after=None):
        self.polls = 0
        self.fetched_chars = 0
        self.fetches = 0
        self.break_after = break_after
        if not stream:
            self.tail_job_logs = None

    def submit_job(self, *, entrypoint, submission_id, runtime_env, metadata):
        self.submission_id = submission_id

    def visible(self) -> int:
        return min(self.polls, len(CHUNKS))

    def get_job_status(self, submission_id):
        self.polls += 1
        return SimpleNamespace(value="SUCCEEDED" if self.polls > len(CHUNKS) else "RUNNING")

    def get_job_logs(self, submission_id):
        text = "".join(CHUNKS[:self.visible()])
        self.fetches += 1
        self.fetched_chars += len(text)
        return text

    async def tail_job_logs(self, submission_id):
        sent = 0
        while True:
            while sent < self.visible():
                if sent == self.break_after:
                    raise RuntimeError("connection closed unexpectedly")
                yield CHUNKS[sent]
                sent += 1
            if self.polls > len(CHUNKS):
                return
            await asyncio.sleep(0.001)

    def get_job_info(self, submission_id):
        return SimpleNamespace(driver_exit_code=0 if self.polls > len(CHUNKS) else None)

    def stop_job(self, submission_id):
        self.polls = len(CHUNKS) + 1


def run(tmp_path, client, max_log_bytes=None):
    request = LaunchRequest(argv=("python3", "-m", "verl.trainer.main_ppo"),
                            workdir=tmp_path / "trial", log_path=tmp_path / "trial.log",
                            metrics_path=None, wall_timeout_s=600, hang_timeout_s=600,
                            max_log_bytes=max_log_bytes)
    outcome = RayJobLauncher("http://head:8265", poll_s=0.001, client=client).run(request)
    return outcome, request.log_path.read_text(encoding="utf-8")


def step_lines(text):
    return [line for line in text.splitlines() if parse_console_line(line) is not None]


def test_a_streamed_log_arrives_once_and_is_never_refetched(tmp_path):
    client = FakeJobs()
    outcome, text = run(tmp_path, client)
    assert outcome.exit_code == 0 and outcome.stopped is None
    assert text == FULL_LOG
    assert len(step_lines(text)) == STEPS  # no metric line twice
    assert client.fetches == 0  # the whole log was never fetched
    assert client.polls == STEPS + 1


def test_without_a_stream_each_poll_appends_only_the_new_part(tmp_path):
    client = FakeJobs(stream=False)
    outcome, text = run(tmp_path, client)
    assert outcome.exit_code == 0
    assert text == FULL_LOG and len(step_lines(text)) == STEPS
    assert client.fetches >= STEPS  # one fetch per poll, and the end's


def test_a_broken_stream_hands_over_to_polls_without_repeating_text(tmp_path):
    client = FakeJobs(break_after=STEPS // 3)
    outcome, text = run(tmp_path, client)
    assert outcome.exit_code == 0
    assert text == FULL_LOG and len(step_lines(text)) == STEPS
    assert client.fetches >= 1  # the polls took over after the break


def test_polling_stops_fetching_past_the_log_limit(tmp_path):
    """A log past --max-log-bytes is not fetched again: the watchdog stops the trial."""
    client = FakeJobs(stream=False)
    limit = len(CHUNKS[0]) * 3
    outcome, text = run(tmp_path, client, max_log_bytes=limit)
    assert outcome.stopped == "log_limit"
    assert limit < len(text.encode()) < len(FULL_LOG)
    assert FULL_LOG.startswith(text)
    # fetches of at most the limit plus one chunk each, then none
    assert client.fetched_chars <= client.fetches * (limit + 2 * len(CHUNKS[0]))
