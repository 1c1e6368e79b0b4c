"""The cost model's result schema: every column a scored layout carries, in one place.

Layout columns are the fields of :class:`planner.search.layout.Layout`.  The cost model adds the
columns below (bytes, seconds, FLOP-based ratios; per GPU).  Names built from a phase, a
breakdown part or a flag come from the functions here, never from f-strings elsewhere.
"""

from __future__ import annotations

from planner.phases import PHASES

# Parts of the peak-memory breakdown (bytes per GPU on the rank that sets the peak).
BREAKDOWN_PARTS = ("weights", "grads", "optimizer", "train_activations", "train_logits",
                   "ref_weights", "rollout_weights", "kv_cache")


def memory_column(phase: str) -> str:
    """Peak bytes per GPU of ``phase`` on its worst pipeline rank."""
    return f"mem_{phase}_bytes"


def working_set_column(phase: str) -> str:
    """Allocated working set per GPU of ``phase`` (the tensors alone) on its worst rank."""
    return f"alloc_{phase}_bytes"


def time_column(phase: str) -> str:
    """Seconds per step spent in ``phase``."""
    return f"time_{phase}_s"


# Parts of a phase's time (seconds per step): GEMMs and memory-bound kernels, communication
# not hidden behind them, the pipeline bubble, host<->device copies (offload, CPU optimizer's
# copies are in compute), and fixed latencies (kernel launches, per-tensor calls, wake/sleep).
TIME_PARTS = ("compute_s", "comm_s", "bubble_s", "host_transfer_s", "latency_s")


def breakdown_column(phase: str, part: str) -> str:
    """Seconds per step of one part (:data:`TIME_PARTS`) of ``phase``."""
    return f"breakdown_{phase}_{part}"


def part_column(part: str) -> str:
    """Bytes of one breakdown part (:data:`BREAKDOWN_PARTS`)."""
    return f"{part}_bytes"


def flag_column(flag: str) -> str:
    """True where a layout is legal but unwise for the named reason."""
    return f"flag_{flag}"


# Scalar columns: name -> what it holds.
SCHEMA = {
    "fits": "bool: every phase fits in GPU memory and the KV cache holds a sequence",
    "peak_bytes": "nvidia-smi peak bytes per GPU over the phases the workload runs (what the "
                  "memory band judges)",
    "peak_phase": "index into planner.phases.PHASES of the phase that sets the peak",
    "peak_stage": "index into cost.memory.STAGES of the pipeline rank that sets the peak",
    "memory_utilization": "peak_bytes / GPU memory",
    "kv_cache_bytes": "rollout KV cache per GPU",
    "kv_cache_tokens_per_gpu": "tokens the KV cache of one GPU holds, in tokens of the K/V "
                               "that grows per token (full attention, MLA); bytes where the "
                               "model keeps none (kv_pool_in_bytes)",
    "kv_pool_in_bytes": "bool: the model keeps no K/V that grows per token (every "
                        "sliding/chunked window shorter than the sequence, or attention-free): "
                        "kv_cache_tokens_per_gpu and kv_state_tokens_per_seq count bytes, and "
                        "reports print the pool in GiB",
    "kv_state_tokens_per_seq": "what a sequence keeps beside its growing K/V (window pages, "
                               "Gated DeltaNet/Mamba state pages, hybrid page rounding), in "
                               "tokens of that K/V; 0 for full attention",
    "rollout_concurrent_seqs": "sequences a rollout rank runs at once",
    "rollout_seqs_per_rank": "sequences each rollout attention rank generates per step",
    "rollout_waves": "rounds of generation when a rank's sequences exceed its concurrency",
    "rollout_fits": "bool: the rollout engine fits beside the resident actor state",
    "step_time_s": "seconds per step (GRPO: the sum of the phases), expected over the run "
                   "(planner.cost.trajectory: the mean response length moves)",
    "step_time_start_s": "seconds per step at the run's first step (its mean response length)",
    "step_time_end_s": "seconds per step at the run's last step",
    "tokens_per_s_per_gpu": "prompt + response tokens per second per GPU (verl perf/throughput)",
    "mfu": "actor-update model FLOPs utilisation (verl perf/mfu/actor)",
    "dominant_phase": "index into PHASES of the longest phase",
    "unwise_count": "number of unwise flags set",
    "gpu_memory_utilization_fill": "the rollout pool's gpu_memory_utilization were the GPU "
                                   "filled (memory band 0.70-0.95), same layout",
    "kv_cache_tokens_per_gpu_fill": "KV-cache tokens per GPU at that pool (bytes where "
                                    "kv_pool_in_bytes)",
    "time_generate_s_fill": "seconds of generation at that pool",
    "peak_bytes_fill": "nvidia-smi peak at that pool",
    **{memory_column(phase): f"nvidia-smi peak bytes per GPU in {phase} (reserved pool, "
                             f"context, NCCL, vLLM's whole pool)" for phase in PHASES},
    **{working_set_column(phase): f"allocated working set per GPU in {phase}"
       for phase in PHASES},
    **{time_column(phase): f"seconds per step in {phase}" for phase in PHASES},
    **{part_column(part): f"bytes of {part} on the peak rank" for part in BREAKDOWN_PARTS},
    **{breakdown_column(phase, part): f"{part[:-2]} seconds of {phase}"
       for phase in PHASES for part in TIME_PARTS},
    "kv_holds_sequence": "bool: a rollout rank's KV cache holds one longest sequence",
    "tflops_per_gpu": "model TFLOP/s per GPU of a plain training step (pretraining)",
    # a plan's ranking adds (planner.plan, planner.ranking)
    "rank": "position in the plan, 1 = best",
    "within_error_of_best": "bool: within the model's ranking uncertainty of the best",
}
