"""The actor rows' memory beside the rollout engine, as distinct pairs
(:func:`planner.plan.rollout_choice`): per row, the bytes the actor keeps resident during
generation (its generate phase's largest stage) and the largest stage of the phases the
engine's other memory joins (``joined``), coded as ``(resident, beside, inverse)``: the
distinct pairs in order of first appearance and each row's pair.

An actor evaluation held per cell (:class:`planner.cost.memory.ActorCells`) computes a row's
bytes from its core row's parts and its knob combination alone, and the generate phase and the
weight sync read of a core row only its stages' weights, gradients and optimizer state (the
resident state and what the sync loads, :func:`planner.cost.memory._held`).  Core rows whose
such parts are the same bits (micro-batch and recompute change none of them: DeepSeek-V3 on
1,024 GPUs has 1,148 of 136,872) give the same pair at each combination, so the pairs are
computed on the first core row of each kind, every combination of it, and spread over the
rows: the same values, and, the first row of each pair being one of those cells, in the same
order of first appearance as over every row (``tests/cost/test_engine_pairs.py``).
"""

from __future__ import annotations

import numpy as np

from planner.cost.memory import ActorCells, actor_resident_bytes, max_rows, over_rows
from planner.search.layout import distinct_bit_patterns, distinct_pair

# What the engine's phases read of a core row's stages (the rest: the knob combination):
# the resident state (generate) and what the sync loads (weight_sync), _held's terms.
ENGINE_PHASE_PARTS = {"generate": ("weights", "grads", "optimizer_state"),
                      "weight_sync": ("weights", "grads", "optimizer_state")}


def engine_pairs(memory: dict, joined: tuple[str, ...],
                 chunk: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(resident, beside, inverse)`` of the rows of ``memory`` (an actor memory,
    :func:`planner.cost.memory.actor_memory`), ``chunk`` rows computed at a time (module
    docstring): per kind of core row where it is held per cell in order and the phases read
    the parts :data:`ENGINE_PHASE_PARTS` names, else over every row."""
    cells = memory.get("cells")
    if isinstance(cells, ActorCells):
        pairs = _per_core_kind(cells, joined, chunk)
        if pairs is not None:
            return pairs
    return pairs_of_rows(memory, joined, chunk)


def pairs_of_rows(memory: dict, joined: tuple[str, ...],
                  chunk: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`engine_pairs` computed on every row (``chunk`` at a time, held cells)."""
    resident, beside = over_rows(memory, lambda rows: _pair_bytes(rows, joined), chunk,
                                 only=("generate", *joined))
    # a row and the row one knob combination table's width before are often the same pair
    # (the knobs' tables of neighbouring core rows): hashed once
    period = len(memory["cells"].knobs) if "cells" in memory else 0
    first, inverse = distinct_pair(resident, beside, period)
    return resident[first], beside[first], inverse


def _pair_bytes(rows: dict, joined: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Per row of an actor memory: the resident bytes and the largest stage of ``joined``."""
    return (actor_resident_bytes(rows),
            max_rows([max_rows(rows["phases"][phase]) for phase in joined]))


def _per_core_kind(cells: ActorCells, joined: tuple[str, ...],
                   chunk: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """:func:`engine_pairs` on the first core row of each kind (module docstring); None where
    the rows are not every combination of each core row in order or the kinds are more than
    half the core rows (every row costs as little then), or a phase reads parts
    :data:`ENGINE_PHASE_PARTS` does not name."""
    width, n = len(cells.knobs), len(cells)
    if (not cells.in_order or width == 0 or n == 0 or n % width
            or any(phase not in ENGINE_PHASE_PARTS for phase in ("generate", *joined))):
        return None
    cores = n // width
    names = sorted({name for phase in ("generate", *joined) for name in ENGINE_PHASE_PARTS[phase]})
    parts = [np.asarray(stage[name]) for stage in cells.core_parts for name in names]
    if any(np.ndim(values) > 1 or np.ndim(values) and len(values) != cores for values in parts):
        return None
    # a part the same for every core row (a scalar) tells no kinds apart
    first_core, kind = distinct_bit_patterns([values for values in parts if np.ndim(values)],
                                             cores)
    if 2 * len(first_core) > cores:
        return None
    rows = (first_core[:, None] * width + np.arange(width)).reshape(-1)
    pieces = [_pair_bytes(cells.rows(rows[start:start + chunk], ("generate", *joined)), joined)
              for start in range(0, len(rows), max(chunk, 1))]
    resident, beside = (np.concatenate(part) for part in zip(*pieces))
    first, inverse = distinct_pair(resident, beside, width)
    return resident[first], beside[first], inverse.reshape(-1, width)[kind].reshape(-1)
