"""Order candidate layouts, best first.

Memory-headroom rule (used until a step-time column is present):

1. layouts that fit before those that do not;
2. fewer *unwise* flags (TP across nodes, a starved pipeline, ...);
3. less work traded for memory: no recompute before selective before full, then fewer
   offloads (each costs host<->device traffic every step);
4. less model parallelism (smaller TP*PP*CP, then EP*ETP): more data parallelism means less
   communication on the critical path;
5. larger micro-batches (better kernel efficiency, fewer pipeline flushes);
6. lower peak memory (more headroom against fragmentation and long responses).

When the frame has ``step_time_s`` (the time model), layouts that fit are ranked by predicted
step time (equivalently tokens/s/GPU) instead: the other unwise choices are priced into the
time (slow links, pipeline bubbles), a training phase within 8% of capacity comes after every
layout with headroom, and lower peak memory breaks ties.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


def rank_candidates(frame: "pd.DataFrame") -> "pd.DataFrame":
    frame = frame.copy()
    frame["offload_count"] = (frame["param_offload"].astype(int)
                              + frame["optimizer_offload"].astype(int)
                              + frame["ref_param_offload"].astype(int))
    frame["model_parallel"] = frame["tp"] * frame["pp"] * frame["cp"]
    frame["expert_parallel"] = frame["ep"] * frame["etp"]
    frame["recompute_level"] = frame["recompute"].cat.codes
    if "step_time_s" in frame:
        keys = ["fits", "flag_memory_tight", "step_time_s", "peak_bytes"]
        ascending = [False, True, True, True]
    else:
        keys = ["fits", "unwise_count", "recompute_level", "offload_count", "model_parallel",
                "expert_parallel", "micro_batch", "peak_bytes"]
        ascending = [False, True, True, True, True, True, False, True]
    frame = frame.sort_values(keys, ascending=ascending, kind="stable").reset_index(drop=True)
    frame.insert(0, "rank", range(1, len(frame) + 1))
    return frame
