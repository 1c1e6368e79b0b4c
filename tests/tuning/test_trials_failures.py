"""Failure categories from logs, exit status and the launcher's stop reason."""

import pytest

from trials.failures import Category, classify, describe_exit

TORCH_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has "
             "a total capacity of 79.19 GiB of which 1.06 GiB is free. Including non-PyTorch "
             "memory, this process has 78.12 GiB memory in use. Of the allocated memory 75.31 "
             "GiB is allocated by PyTorch, and 1.52 GiB is reserved by PyTorch but unallocated.")


def ray_oom(method: str, frame: str) -> list[str]:
    return ["(TaskRunner pid=1) step:1 - perf/throughput:np.float64(10.0)",
            "(TaskRunner pid=1) Traceback (most recent call last):",
            f"(TaskRunner pid=1) ray.exceptions.RayTaskError(OutOfMemoryError): "
            f"ray::WorkerDict.{method}() (pid=42, ip=10.0.0.1)",
            f'(TaskRunner pid=1)   File "/site-packages/verl/workers/engine_workers.py", '
            f'line 1, in {frame}', f"(TaskRunner pid=1) {TORCH_OOM}"]


def run(lines, *, exit_code=1, stopped=None, steps=1, expected=3):
    return classify(lines, exit_code=exit_code, stopped=stopped, steps_recorded=steps,
                    steps_expected=expected, timeouts=(600.0, 120.0))


@pytest.mark.parametrize("method,frame,phase", [
    ("actor_rollout_update_actor", "train_mini_batch", "update_actor"),
    ("actor_rollout_compute_log_prob", "compute_log_prob", "old_log_prob"),
    ("actor_rollout_compute_ref_log_prob", "compute_ref_log_prob", "ref"),
    ("actor_rollout_update_weights", "update_weights", "weight_sync"),
])
def test_pytorch_oom_and_the_phase_it_happened_in(method, frame, phase):
    result = run(ray_oom(method, frame))
    assert result.category is Category.OOM and result.oom_phase == phase
    assert result.reason.startswith(f"oom in {phase}: torch.OutOfMemoryError: CUDA out of memory")
    assert any("Tried to allocate 2.00 GiB" in line for line in result.evidence)
    assert any(frame in line for line in result.evidence)
    assert not any(line.startswith("(TaskRunner") for line in result.evidence)


def test_megatron_optimizer_step_oom_is_the_update_phase():
    lines = ['  File "/site-packages/megatron/core/optimizer/distrib_optimizer.py", line 2372, '
             'in step_with_ready_grads', "    self._copy_main_params_to_model_params()",
             "RuntimeError: CUDA error: out of memory"]
    result = run(lines)
    assert result.category is Category.OOM and result.oom_phase == "update_actor"


@pytest.mark.parametrize("message", [
    "ValueError: No available memory for the cache blocks. Try increasing "
    "`gpu_memory_utilization` when initializing the engine.",
    "ValueError: To serve at least one request with the models's max seq len (8192), (2.63 GiB "
    "KV cache is needed, which is larger than the available KV cache memory (1.64 GiB). Based "
    "on the available memory, the estimated maximum model length is 5088.",
    "ValueError: Free memory on device (6.9/80.0 GiB) on startup is less than desired GPU "
    "memory utilization (0.9, 72.0 GiB).",
])
def test_vllm_memory_errors_are_generation_ooms(message):
    result = run([f"(EngineCore_DP0 pid=245) ERROR 08-19 04:02:11 [core.py:1346] {message}"])
    assert result.category is Category.OOM and result.oom_phase == "generate"
    assert result.signature == "vllm_kv_cache"


@pytest.mark.parametrize("line,signature", [
    ("[rank0]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 0] Watchdog caught "
     "collective operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=131072000, "
     "NumelOut=131072000, Timeout(ms)=600000) ran for 600081 milliseconds before timing out.",
     "collective_timeout"),
    ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled "
     "system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5", "nccl_error"),
    ("ncclSystemError: System call (e.g. socket, malloc) or external library call failed",
     "nccl_error"),
])
def test_nccl_errors(line, signature):
    result = run(["step:1 - a:1", line, "terminate called after throwing an instance of "
                  "'c10::DistBackendError'"], exit_code=-6)
    assert result.category is Category.NCCL and result.signature == signature
    assert line.strip()[:60] in result.evidence[-1]


@pytest.mark.parametrize("lines", [
    ["Could not override 'actor_rollout_ref.actor.megatron.grad_offload'.",
     "To append to your config use +actor_rollout_ref.actor.megatron.grad_offload=True",
     "Key 'grad_offload' is not in struct"],
    ["AssertionError: real_train_batch_size (6) must be divisible by minimal possible batch "
     "size (4)"],
    ["ValueError: [actor_rollout_ref.ref] Please set at least one of "
     "'actor_rollout_ref.ref.log_prob_micro_batch_size' or "
     "'actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu'."],
    ["hydra.errors.InstantiationException: Error in call to target "
     "'verl.workers.config.actor.McoreActorConfig'"],
])
def test_configuration_errors(lines):
    result = run(lines, steps=0)
    assert result.category is Category.CONFIG
    assert result.evidence[-1] in lines


def test_launcher_stops_hang_and_timeout():
    lines = ["step:1 - a:1", "still warming up"]
    hang = run(lines, exit_code=-15, stopped="hang")
    assert hang.category is Category.HANG and "no progress for 120 s" in hang.reason
    assert hang.evidence == tuple(lines)
    timeout = run(lines, exit_code=-9, stopped="timeout")
    assert timeout.category is Category.TIMEOUT and "600 s" in timeout.reason


def test_an_error_in_the_log_wins_over_the_launchers_stop():
    assert run(ray_oom("x", "train_mini_batch"), stopped="hang").category is Category.OOM


def test_crashes():
    segv = run(["Fatal Python error: Segmentation fault"], exit_code=-11)
    assert segv.category is Category.CRASH and segv.reason.startswith("killed by SIGSEGV")
    assert run(["boom"], exit_code=3).reason.startswith("exit status 3 after 1 of 3 steps")
    assert run([], exit_code=0, steps=1).category is Category.CRASH  # exited before the end
    assert describe_exit(137) == "exit status 137 (SIGKILL)"
    assert describe_exit(None) == "no exit status"


def test_all_steps_recorded_is_ok_however_it_ended():
    result = run(["step:3 - a:1"], exit_code=-15, stopped="hang", steps=3)
    assert result.category is Category.OK and "then hang" in result.reason


# --- issue 17: a printed OOM is not an OOM; issue 15: the cause, not only the exit status ---


def test_an_exit_0_run_that_printed_an_oom_line_is_not_an_oom():
    lines = ray_oom("actor_rollout_update_actor", "train_mini_batch")
    assert run(lines, exit_code=0, steps=3).category is Category.OK
    cut_short = run(lines, exit_code=0, steps=2)  # exited 0 early: a crash, not an OOM
    assert cut_short.category is Category.CRASH and cut_short.oom_phase is None
    assert cut_short.reason.startswith("exit status 0 after 2 of 3 steps")
    # what kills a run is an OOM: the same lines with exit 1, or after the launcher stopped it
    assert run(lines, exit_code=1).category is Category.OOM
    assert run(lines, exit_code=-9, stopped="hang").category is Category.OOM


def test_the_figures_of_pytorchs_oom_message():
    from trials.failures import oom_numbers
    from trials.study_state import need_ratio

    numbers = run(ray_oom("actor_rollout_update_actor", "train_mini_batch")).oom_numbers
    assert numbers == {"requested_gib": 2.0, "total_gib": 79.19, "free_gib": 1.06,
                       "in_use_gib": 78.12}
    # issue 15's message: needed 79.11 - 8.85 + 13.91 = 84.17 GiB of a 79.11 GiB GPU
    issue = oom_numbers("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 13.91 GiB."
                        " GPU 0 has 79.11 GiB total, 8.85 GiB free, this process has 70.25 GiB "
                        "in use")
    assert issue["in_use_gib"] == 70.25
    assert need_ratio(issue) == pytest.approx(84.17 / 79.11)
    assert oom_numbers("No available memory for the cache blocks") is None
    assert oom_numbers("Tried to allocate 512.00 MiB. GPU 0 has a total capacity of 23.6 GiB "
                       "of which 100.00 MiB is free.")["requested_gib"] == 0.5


def test_a_crash_names_the_last_error_line_of_its_log():
    lines = ["(TaskRunner pid=9) Traceback (most recent call last):",
             "(TaskRunner pid=9)     from verl.experimental.transfer_queue import Client",
             "(TaskRunner pid=9) ModuleNotFoundError: No module named 'transfer_queue'",
             "ray.exceptions.RayTaskError(ModuleNotFoundError): ray::TaskRunner.run() (pid=9)",
             "INFO worker shutting down"]
    result = run(lines, steps=0)
    assert result.category is Category.CRASH
    assert result.reason == ("exit status 1 after 0 of 3 steps: ModuleNotFoundError: No module "
                             "named 'transfer_queue'")
    other_pid = run([line.replace("pid=9", "pid=10") for line in lines], steps=0)
    assert other_pid.cause == result.cause == \
        "crash: ModuleNotFoundError: No module named 'transfer_queue'"
    assert run(["nothing useful"], steps=0).reason == "exit status 1 after 0 of 3 steps"


def test_a_log_over_its_limit_is_a_failure_with_that_reason():
    result = classify(["spam"] * 3, exit_code=-15, stopped="log_limit", steps_recorded=1,
                      steps_expected=3, log_limit_bytes=256 << 20)
    assert result.category is Category.CRASH
    assert result.reason == "its log outgrew --max-log-bytes (256 MiB) after 1 of 3 steps"


def test_every_signature_pattern_contains_a_prefilter_word():
    """logscan skips log blocks without any SIGNATURE_WORDS: each pattern must have one."""
    from trials.failures import SIGNATURE_WORDS, SIGNATURES

    def top_level(pattern: str) -> list[str]:
        parts, depth, start = [], 0, 0
        for index, char in enumerate(pattern):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if char == "|" and depth == 0:
                parts.append(pattern[start:index])
                start = index + 1
        return [*parts, pattern[start:]]

    for signature in SIGNATURES:
        for alternative in top_level(signature.pattern.pattern):
            text = alternative.replace("\\", "")
            assert any(word in text for word in SIGNATURE_WORDS), alternative
