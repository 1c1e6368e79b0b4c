"""Order candidate layouts, best first.

With the time model (``step_time_s`` present, the normal case), layouts are ranked by:

1. layouts that fit before those that do not;
2. no phase other than generation within 8% of capacity (``memory_tight``) before those that
   are: the fixed overheads are estimates and responses vary in length from step to step;
3. predicted step time (equivalently tokens/s/GPU) — the other unwise choices (TP across
   nodes, starved pipelines, CP on short sequences) are priced into it;
4. lower peak memory (more headroom) breaks ties.

Without a step-time column (memory-only scoring) a memory-headroom rule stands in for 3:
fewer unwise flags, less recompute and offload, less model parallelism, larger micro-batches.
"""

from __future__ import annotations

import numpy as np

from planner.layout import Columns


def rank_order(cols: Columns) -> np.ndarray:
    """Indices that sort layouts best first (a stable lexicographic sort)."""
    not_fit = ~cols["fits"].astype(bool)
    if "step_time_s" in cols:
        keys = [not_fit, cols["flag_memory_tight"].astype(bool), cols["step_time_s"],
                cols["peak_bytes"]]
    else:
        offloads = (cols["param_offload"].astype(int) + cols["optimizer_offload"].astype(int)
                    + cols["ref_param_offload"].astype(int))
        keys = [not_fit, cols["unwise_count"], cols["recompute"], offloads,
                cols["tp"] * cols["pp"] * cols["cp"], cols["ep"] * cols["etp"],
                -cols["micro_batch"], cols["peak_bytes"]]
    return np.lexsort(keys[::-1])
