"""Which layouts a study runs first (``tune --first-trials``).

The cost model cannot tell its best layouts apart: every candidate predicted within its ranking
uncertainty of the best is a tie (:func:`planner.plan.tie_order`; the plan puts them first,
simplest first).  Its errors are not independent either: layouts with the same TP, EP and PP
share most of them (the same communication and pipeline terms, the same kernels), so the ``k``
simplest ties -- often one TP/EP/PP family with other micro-batches or rollouts -- share one
error and say little more than one trial would.

* ``simplest`` -- the ``k`` best-ranked candidates (the simplest ties), as before;
* ``spread`` -- the simplest tie of each distinct TP/EP/PP family first (a training-mode study
  also tells its modes and pool splits apart), in the order the families first appear; then
  the second of each family, and so on; after the ties, the rest in rank order.

``benchmarks/tuning_regret.py`` measures both (docs/tuning/regret.md).
"""

from __future__ import annotations

from typing import Sequence

from trials.candidates import Candidate
from trials.defaults import FIRST_TRIALS

FAMILY_FIELDS = ("mode", "trainer_gpus", "tp", "ep", "pp")


def family(candidate: Candidate) -> tuple:
    """The TP/EP/PP family of a candidate (with its mode and trainer pool in a mode study)."""
    return tuple(candidate.params.get(name) for name in FAMILY_FIELDS)


def tied(candidates: Sequence[Candidate], model_error: float) -> list[int]:
    """Indices of the candidates whose predicted tokens/s/GPU is within ``model_error`` (0.16:
    16%) of the best predicted one -- the ties -- in the set's order."""
    values = [float(c.predicted["tokens_per_s_per_gpu"]) for c in candidates]
    if not values:
        return []
    floor = max(values) / (1.0 + model_error)
    return [i for i, value in enumerate(values) if value >= floor]


def first_trials(candidates: Sequence[Candidate], count: int, how: str,
                 model_error: float) -> list[int]:
    """The indices of the ``count`` candidates a study runs first, in order (module
    docstring); fewer when the set is smaller."""
    if how not in FIRST_TRIALS:
        raise ValueError(f"first trials {how!r} is not one of {', '.join(FIRST_TRIALS)}")
    if how == "simplest":
        return list(range(min(count, len(candidates))))
    if how == "ucb":
        values = [float(c.predicted["tokens_per_s_per_gpu"]) for c in candidates]
        ranked = sorted(range(len(candidates)), key=lambda i: -values[i])  # stable: ties in order
        return round_robin(candidates, ranked)[:count]
    ties = tied(candidates, model_error)
    order = round_robin(candidates, ties)
    chosen = set(order)
    order += [i for i in range(len(candidates)) if i not in chosen]
    return order[:count]


def round_robin(candidates: Sequence[Candidate], indices: Sequence[int]) -> list[int]:
    """``indices`` reordered: the first of each TP/EP/PP family (families in the order they
    first appear), then the second of each, and so on."""
    families: dict[tuple, list[int]] = {}
    for index in indices:
        families.setdefault(family(candidates[index]), []).append(index)
    order: list[int] = []
    depth = 0
    while len(order) < len(indices):
        order += [members[depth] for members in families.values() if depth < len(members)]
        depth += 1
    return order
