"""From parsed arguments to the planner's inputs: model, cluster, workload, pins, policy.

Messages name the flag a value came from.  The one note printed here (no GPU visible through
NVML) goes to stderr.
"""

from __future__ import annotations

import sys
from pathlib import Path

from planner.catalog.hardware import (
    DEFAULT_GPU,
    DEFAULT_GPUS_PER_NODE,
    ClusterSpec,
    detect_local_gpus,
    get_gpu,
    gpu_from_detected,
)
from planner.catalog.workload import GrpoWorkload, PretrainWorkload
from planner.cli.args import UsageError
from planner.cost.efficiency import read_calibration
from planner.policy import DEFAULT_POLICY, MemoryPolicy
from planner.search.layout import RECOMPUTE
from planner.search.space import SearchOptions


def resolve_cluster(args) -> ClusterSpec:
    """``--gpu-type``/``--gpus``/``--gpus-per-node``, else what NVML reports."""
    detected = None
    if args.gpu_type is not None:
        gpu = get_gpu(args.gpu_type)
    else:
        detected = detect_local_gpus()
        if detected is None:
            print(f"note: no GPU visible through NVML; planning for {DEFAULT_GPU} "
                  f"(pass --gpu-type to choose)", file=sys.stderr)
            gpu = get_gpu(DEFAULT_GPU)
        else:
            gpu = gpu_from_detected(detected)
    gpus = args.gpus if args.gpus is not None else (detected.count if detected else None)
    if gpus is None:
        raise UsageError("--gpus is required when no local GPU is detected")
    per_node = args.gpus_per_node or (detected.count if detected else DEFAULT_GPUS_PER_NODE)
    if args.gpus is not None and args.gpus < per_node and not args.gpus_per_node:
        per_node = max(args.gpus, 1)
    return ClusterSpec(gpu=gpu, num_gpus=gpus, gpus_per_node=per_node)


def workload(args):
    if args.workload == "pretrain":
        return PretrainWorkload(seq_len=args.seq_len, global_batch=args.global_batch,
                                precision=args.precision)
    return GrpoWorkload(mean_response_length=args.mean_response_length,
                        train_batch_size=args.train_batch_size, rollout_n=args.rollout_n,
                        prompt_length=args.prompt_length, response_length=args.response_length,
                        mini_batch_size=args.mini_batch_size, ppo_epochs=args.ppo_epochs,
                        precision=args.precision, max_num_seqs=args.max_num_seqs)


def calibration(args) -> dict | None:
    if not getattr(args, "calibration", None):
        return None
    return read_calibration(Path(args.calibration))


def policy(args) -> MemoryPolicy:
    text = getattr(args, "memory_band", None)
    return DEFAULT_POLICY if text is None else MemoryPolicy.parse(text)


# flag attribute -> layout field a plan may pin
PIN_FIELDS = ("tp", "pp", "vpp", "cp", "ep", "etp", "micro_batch", "rollout_tp", "rollout_dp",
              "rollout_ep", "param_offload", "optimizer_offload", "ref_param_offload")
GRPO_ONLY = ("rollout_tp", "rollout_dp", "rollout_ep", "param_offload", "optimizer_offload",
             "ref_param_offload")


def pins(args) -> dict:
    """Layout values the search keeps fixed (``--tp 4`` and the like)."""
    pinned = {name: getattr(args, name) for name in PIN_FIELDS if getattr(args, name) is not None}
    for name in ("first_stage_layers", "last_stage_layers"):
        if getattr(args, name) is not None:
            raise UsageError(f"--{name.replace('_', '-')} is for `estimate`; the search "
                             f"chooses the stage split")
    return pinned


def search_options(args, work) -> SearchOptions:
    """The search space a plan (or a tuning study) explores, from the pins and knobs."""
    pinned = pins(args)
    if args.no_offload and any(pinned.get(name) for name in ("param_offload",
                                                             "optimizer_offload")):
        raise UsageError("--no-offload contradicts --param-offload/--optimizer-offload")
    grpo_only = [name for name in GRPO_ONLY if name in pinned]
    if work.kind == "pretrain" and (grpo_only or args.gpu_memory_utilization is not None):
        flags = ", ".join("--" + name.replace("_", "-") for name in grpo_only)
        raise UsageError(f"--workload pretrain has no rollout, reference or verl offload; drop "
                         f"{flags or '--gpu-memory-utilization'}")
    offload = (False,) if args.no_offload else (False, True)
    return SearchOptions(
        offload=offload,
        ref_param_offload=offload,
        recompute=(args.recompute,) if args.recompute else RECOMPUTE,
        gpu_memory_utilization=args.gpu_memory_utilization,
        fixed=tuple(sorted(pinned.items())))
