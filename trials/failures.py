"""Why a trial failed, from its exit status, what the launcher did, and its log.

Categories, in the order they are decided:

1. ``ok`` — the trial recorded every training step it was asked for (however it exited: verl's
   Ray teardown can hang after the last step, which costs nothing to the measurement);
2. ``oom`` — PyTorch's ``OutOfMemoryError`` ("CUDA out of memory. Tried to allocate ..."),
   vLLM's KV-cache errors ("No available memory for the cache blocks", "... KV cache is needed,
   which is larger than the available KV cache memory", "Free memory on device ... is less than
   desired GPU memory utilization"), Megatron's optimizer-step OOM (PyTorch's error raised inside
   ``distrib_optimizer``); the GRPO phase it happened in is read from the traceback;
3. ``nccl`` — NCCL errors (``DistBackendError``, ``ncclSystemError``, ...) and collective
   timeouts (``Watchdog caught collective operation timeout``);
4. ``config`` — Hydra override errors ("Could not override", "Key ... is not in struct") and
   verl's validation assertions ("must be divisible by", "Please set at least one of", ...);
5. ``hang`` — the launcher stopped a trial that made no progress for the hang timeout;
6. ``timeout`` — the launcher stopped a trial at the wall-clock limit;
7. ``pruned`` — the study stopped a trial that was running well because it trailed the
   study's best at equal steps (``tune --pruner``, :mod:`trials.pruning`); what it measured
   until then is kept;
8. ``crash`` — anything else: killed by a signal, a non-zero exit, an exit before the last
   step, or a log that outgrew ``--max-log-bytes``.  The reason ends with the last line of the
   log that reads like an error (``ModuleNotFoundError: No module named 'vllm'``), the cause a
   user needs.

An error in the log wins over what the launcher did: a trainer that hung after an OOM in one
worker failed because of the OOM.  But an error line is not a failure by itself: a run that
exited 0 was not killed by the "CUDA out of memory" it printed (vLLM's profiler and
PyTorch's allocator retries print and recover), so an exit-0 run is never an OOM.  Each failure
keeps the log lines that show it, and a ``cause``: the category and its telling line with the
numbers left out, so trials failing for one reason can be recognised (the study stops when its
first trials all fail with one cause).
"""

from __future__ import annotations

import enum
import re
import signal as signals
from dataclasses import dataclass

from trials.metrics import strip_log_prefix


class Category(str, enum.Enum):
    OK = "ok"
    OOM = "oom"
    NCCL = "nccl"
    CONFIG = "config"
    HANG = "hang"
    TIMEOUT = "timeout"
    PRUNED = "pruned"
    CRASH = "crash"

    def __str__(self) -> str:  # "oom", not "Category.OOM", in messages and CSV files
        return self.value


@dataclass(frozen=True)
class Signature:
    category: Category
    name: str
    pattern: re.Pattern


def _signature(category: Category, name: str, *alternatives: str) -> Signature:
    return Signature(category, name, re.compile("|".join(alternatives)))


# Checked in this order; the first that matches any line decides (the most telling line
# first: PyTorch's message before the Ray error that wraps it).
SIGNATURES = (
    _signature(Category.OOM, "vllm_kv_cache",
               r"No available memory for the cache blocks",
               r"KV cache is needed, which is larger than the available KV cache memory",
               r"larger than the maximum number of tokens that can be stored in KV cache",
               r"Free memory on device .* is less than desired GPU memory utilization"),
    _signature(Category.OOM, "cuda_oom",
               r"CUDA out of memory", r"CUDA error: out of memory",
               r"CUBLAS_STATUS_ALLOC_FAILED", r"cudaErrorMemoryAllocation"),
    _signature(Category.OOM, "oom_error", r"\bOutOfMemoryError\b"),
    _signature(Category.NCCL, "collective_timeout",
               r"Watchdog caught collective operation timeout",
               r"Some NCCL operations have failed or timed out",
               r"ProcessGroupNCCL.*[Tt]imeout", r"NCCL timeout"),
    _signature(Category.NCCL, "nccl_error",
               r"NCCL error", r"\bDistBackendError\b", r"\bnccl(Internal|System|UnhandledCuda|"
               r"Remote|InvalidUsage|InvalidArgument)Error\b",
               r"NCCL communicator was aborted"),
    _signature(Category.CONFIG, "hydra",
               r"Could not override '", r"Could not append to config",
               r"Key '[^']*' is not in struct", r"ConfigCompositionException",
               r"Error merging override", r"Error parsing override", r"mismatched input",
               r"Missing mandatory value", r"\bConfig(Attribute|Key|Type)Error\b",
               r"Cannot find primary config", r"Could not find '"),
    _signature(Category.CONFIG, "verl_validation",
               r"InstantiationException", r"must be divisible by", r"is not divisible by",
               r"should be divisible by", r"must be >= ",
               r"Please set at least one of", r"You have set both",
               r"not implemented pipeline_model_parallel_size",
               r"has been removed\. Please set",
               r"must be equal to tensor_model_parallel_size",
               r"dtype \w+ not supported",
               r"Total number of attention heads \(\d+\) must be divisible"),
)

# Where an OOM happened: markers of each GRPO phase in tracebacks and Ray task names, checked
# nearest-first going up from the error line.
PHASE_MARKERS = (
    ("ref", re.compile(r"compute_ref_log_prob|_compute_ref_log_prob|\bref_policy\b")),
    ("old_log_prob", re.compile(r"compute_log_prob|_compute_old_log_prob|old_log_prob")),
    ("weight_sync", re.compile(r"update_weights|checkpoint_engine|per_tensor_param|"
                               r"sync_weights|update_weights_bucket")),
    ("update_actor", re.compile(r"update_actor|train_mini_batch|train_batch|distrib_optimizer|"
                                r"optimizer\.step|step_with_ready_grads|\bbackward\b")),
    ("generate", re.compile(r"generate_sequences|\bvllm\b|EngineCore|sglang|agent_loop|"
                            r"cache blocks|KV cache|gpu_memory_utilization")),
)
ANY_SIGNATURE = re.compile("|".join(f"(?:{s.pattern.pattern})" for s in SIGNATURES))
# Every match of a SIGNATURES pattern contains one of these words (tests check each pattern):
# a block of log text without any of them is skipped with a few substring searches instead of
# a regex alternation tried at every position.
SIGNATURE_WORDS = ("cache", "Free memory", "out of memory", "CUBLAS", "cudaError",
                   "OutOfMemory", "NCCL", "nccl", "Watchdog", "DistBackend", "Could not",
                   "Key '", "Config", "override", "mismatched input", "Missing mandatory",
                   "Cannot find", "Instantiation", "divisible", "must be", "Please set",
                   "You have set both", "not implemented", "has been removed", "dtype",
                   "Total number")
ERROR_WORDS = ("rror", "ERROR", "Exception", "[E")
# A line that reads like an error: Python's "SomeError: message" (the innermost exception of a
# traceback is printed last), a fatal signal, CUDA's and NCCL's error lines.  Ray's wrappers
# of an error restate it and are no better.
ERROR_LINE = re.compile(r"\b[A-Z]\w*(?:Error|Exception)\b(?:\([^)]*\))?: \S|Fatal Python error|"
                        r"\bCUDA error\b|\bNCCL error\b|^\s*ERROR\b|\[E\d")
NOT_A_CAUSE = re.compile(r"ray\.exceptions\.|RayTaskError|RayActorError|ActorDiedError|"
                         r"HYDRA_FULL_ERROR")
PHASE_SEARCH_LINES = 80  # how far above the error line to look for the phase
CONTEXT_BEFORE = 8  # evidence lines kept above the matching line
TAIL_LINES = 15  # evidence of a crash: the end of the log
MAX_LINE_CHARS = 400
REASON_CHARS = 160


@dataclass(frozen=True)
class Classification:
    category: Category
    reason: str  # one line, for people
    evidence: tuple[str, ...] = ()  # the log lines that show it
    signature: str = ""  # which SIGNATURES entry matched, if any
    oom_phase: str | None = None  # GRPO phase of an OOM, when the log says
    cause: str = ""  # category and telling line without numbers (same cause, same text)
    oom_numbers: dict | None = None  # what PyTorch's OOM message says (oom_numbers())

    def to_dict(self) -> dict:
        return {"category": self.category.value, "reason": self.reason,
                "evidence": list(self.evidence), "signature": self.signature,
                "oom_phase": self.oom_phase, "cause": self.cause,
                "oom_numbers": self.oom_numbers}


def mentions(text: str, words: tuple[str, ...]) -> bool:
    return any(word in text for word in words)


def is_error_line(line: str) -> bool:
    return (mentions(line, ERROR_WORDS) and bool(ERROR_LINE.search(line))
            and not NOT_A_CAUSE.search(line))


def cause_of(category: "Category", line: str) -> str:
    """``category: line`` with numbers, hex ids and paths' digits replaced, so one cause on
    two layouts (or two pids) reads the same."""
    text = re.sub(r"0x[0-9a-fA-F]+|\d+(?:\.\d+)?", "N", strip_log_prefix(line)).strip()
    return f"{category.value}: {text[:REASON_CHARS]}"


_GIB_UNITS = {"KiB": 2 ** -20, "MiB": 2 ** -10, "GiB": 1.0, "TiB": 1024.0}
_OOM_NUMBERS = (
    ("requested_gib", re.compile(r"Tried to allocate ([\d.]+) ([KMGT]iB)")),
    ("total_gib", re.compile(r"total capacity of ([\d.]+) ([KMGT]iB)|([\d.]+) ([KMGT]iB) total")),
    ("free_gib", re.compile(r"of which ([\d.]+) ([KMGT]iB) is free|([\d.]+) ([KMGT]iB) free")),
    ("in_use_gib", re.compile(r"this process has ([\d.]+) ([KMGT]iB)(?: memory)? in use")),
)


def oom_numbers(line: str) -> dict | None:
    """The figures of PyTorch's ``OutOfMemoryError`` message, in GiB: ``requested_gib``,
    ``total_gib``, ``free_gib`` and (when printed) ``in_use_gib``; None without the first
    three."""
    found = {}
    for name, pattern in _OOM_NUMBERS:
        match = pattern.search(line)
        if match:
            groups = [g for g in match.groups() if g is not None]
            found[name] = float(groups[0]) * _GIB_UNITS[groups[1]]
    if not {"requested_gib", "total_gib", "free_gib"} <= set(found):
        return None
    return found


def _clip(line: str) -> str:
    line = strip_log_prefix(line)
    return line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS] + " ..."


def oom_phase(lines: list[str], index: int) -> str | None:
    """The GRPO phase named nearest above ``lines[index]`` (the error line itself first)."""
    for position in range(index, max(index - PHASE_SEARCH_LINES, -1), -1):
        for phase, marker in PHASE_MARKERS:
            if marker.search(lines[position]):
                return phase
    return None


def describe_exit(exit_code: int | None) -> str:
    if exit_code is None:
        return "no exit status"
    if exit_code < 0:
        try:
            name = signals.Signals(-exit_code).name
        except ValueError:
            name = f"signal {-exit_code}"
        return f"killed by {name}"
    if exit_code > 128:  # a shell (or Ray's entrypoint shell) reporting a signal
        try:
            return f"exit status {exit_code} ({signals.Signals(exit_code - 128).name})"
        except ValueError:
            pass
    return f"exit status {exit_code}"


def find_signature(lines: list[str], skip_oom: bool = False) -> tuple[Signature, int] | None:
    for signature in SIGNATURES:
        if skip_oom and signature.category is Category.OOM:
            continue
        for index, line in enumerate(lines):
            if signature.pattern.search(line):
                return signature, index
    return None


def last_error_line(lines: list[str]) -> str | None:
    return next((line for line in reversed(lines) if is_error_line(line)), None)


def classify(lines: list[str], *, exit_code: int | None, stopped: str | None,
             steps_recorded: int, steps_expected: int,
             timeouts: tuple[float, float] | None = None, error_line: str | None = None,
             log_limit_bytes: int | None = None) -> Classification:
    """The category of a trial from its log ``lines``, exit status and the launcher's stop
    reason (``"hang"``, ``"timeout"``, ``"log_limit"``, ``"pruned"`` or None); ``timeouts``
    = (wall, hang) seconds, for the reason text; ``error_line``: the log's last error line
    when ``lines`` is not the whole log (:mod:`trials.logscan`)."""
    if steps_expected and steps_recorded >= steps_expected:
        note = f"; then {stopped}" if stopped else ""
        return Classification(Category.OK, f"{steps_recorded} steps recorded{note}")
    if stopped == "pruned":  # stopped by the study while it ran: no failure of the layout
        return Classification(Category.PRUNED, f"pruned after {steps_recorded} of "
                                               f"{steps_expected} steps: it trailed the "
                                               f"study's best at equal steps")
    exited_cleanly = exit_code == 0 and stopped is None
    found = find_signature(lines, skip_oom=exited_cleanly)
    if found:
        signature, index = found
        evidence = tuple(_clip(line) for line in lines[max(0, index - CONTEXT_BEFORE):index + 1]
                         if line.strip())
        phase = numbers = None
        if signature.category is Category.OOM:
            phase = "generate" if signature.name == "vllm_kv_cache" else oom_phase(lines, index)
            numbers = oom_numbers(lines[index])
        where = f" in {phase}" if phase else ""
        line = _clip(lines[index]).strip()
        line = line if len(line) <= REASON_CHARS else line[:REASON_CHARS] + " ..."
        reason = f"{signature.category.value}{where}: {line}"
        return Classification(signature.category, reason, evidence, signature.name, phase,
                              cause=cause_of(signature.category, line), oom_numbers=numbers)
    tail = tuple(_clip(line) for line in lines if line.strip())[-TAIL_LINES:]
    progress = f"after {steps_recorded} of {steps_expected} steps"
    error = error_line if error_line is not None else last_error_line(lines)
    said = ""
    if error:
        said = _clip(error).strip()
        said = ": " + (said if len(said) <= REASON_CHARS else said[:REASON_CHARS] + " ...")
    if stopped == "hang":
        limit = f"{timeouts[1]:g} s" if timeouts else "the hang timeout"
        return Classification(Category.HANG, f"no progress for {limit} {progress}", tail)
    if stopped == "timeout":
        limit = f"{timeouts[0]:g} s" if timeouts else "the wall-clock limit"
        return Classification(Category.TIMEOUT, f"stopped at the wall-clock limit ({limit}) "
                                                f"{progress}", tail)
    if stopped == "log_limit":
        limit = (f"{log_limit_bytes / 2 ** 20:g} MiB" if log_limit_bytes
                 else "the log limit")
        reason = f"its log outgrew --max-log-bytes ({limit}) {progress}"
        return Classification(Category.CRASH, reason, tail,
                              cause=f"crash: log outgrew {limit}")
    reason = f"{describe_exit(exit_code)} {progress}{said}"
    cause = cause_of(Category.CRASH, error) if error else f"crash: {describe_exit(exit_code)}"
    return Classification(Category.CRASH, reason, tail, cause=cause)
