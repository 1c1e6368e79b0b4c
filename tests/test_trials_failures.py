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
