"""What a plan with no fitting layout tells the user: its closest miss and the remedy.

A layout fails to fit when its nvidia-smi peak exceeds the GPU, or when its peak fits but the
state it offloads does not fit the node's host memory (``--host-memory-gib``).  The remedy
differs: more or larger GPUs for the first; more host memory, or less offload, for the
second.  Every "no layout fits" message reads the remedy here, so none says "add GPUs" to a
job that is short of host memory.
"""

from __future__ import annotations

import numpy as np

from planner.units import GIB

GPU_REMEDY = "add GPUs or use a larger GPU"  # a miss whose GPU peak is over the GPU


def closest_miss(plan) -> dict | None:
    """The record of the layout with the smallest peak when none fits (the first of equals);
    None when no layout was estimated."""
    peaks = np.asarray(plan.columns["peak_bytes"], dtype=np.float64)
    known = np.flatnonzero(~np.isnan(peaks))
    return plan.records(known[[np.argmin(peaks[known])]])[0] if len(known) else None


def short_of_host_memory(plan, miss: dict | None) -> bool:
    """Whether the closest miss fits the GPU and fails on the node's host memory alone."""
    return (miss is not None and miss["peak_bytes"] <= plan.cluster.gpu.memory_bytes
            and not miss["host_fits"])


def remedy(plan) -> str:
    """What would make a layout fit: the host memory the closest miss needs per node, or more
    or larger GPUs."""
    miss = closest_miss(plan)
    if short_of_host_memory(plan, miss):
        return (f"its offloaded state needs {miss['host_bytes_per_node'] / GIB:.1f} GiB of host "
                f"memory per node, over the {plan.cluster.host_memory_per_node_bytes / GIB:.1f} "
                f"GiB per node (--host-memory-gib): raise it, or add GPUs")
    return GPU_REMEDY


def modes_remedy(plans) -> str:
    """The remedy when no training mode's plan fits (``--mode best``): the colocated (``sync``)
    plan's, whose every GPU holds both the trainer and the rollout -- a job short of host
    memory there is short of it on the split pools' trainers too, which hold the same actor
    state on fewer GPUs; without a colocated plan, more or larger GPUs."""
    colocated = next((plan.sync_plan for plan in plans if plan.sync_plan is not None), None)
    return GPU_REMEDY if colocated is None else remedy(colocated)
