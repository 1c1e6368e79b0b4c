"""Which layouts a plan must time fully so that its first rows are known when the model's ties
lead it, from every layout's expected step time.

A plan ranked with ties (:func:`planner.ranking.tie_order`) starts with the layouts of its best
tier whose expected step time ``E`` is within the tolerance of the best's, ``E <= (1 + tol)
E_b`` (:func:`planner.ranking.tied_with_best`), ordered simplest first
(:func:`planner.ranking.simplicity_keys`: memory and layout columns), then by ``E``, the peak
and the row's position (a stable sort).  A caller that reads the first few rows alone
(``--mode best`` reads the colocated plan's best) needs neither every tie nor their count:
given every row's ``E``, the first rows are those of the simplicity groups, in their order, up
to the group where the ties reach the rows read.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from planner.ranking import tie_limit_s


def rows_for_first_ties(rows: np.ndarray, expected: np.ndarray, count: int, tolerance: float,
                        simplicity: Callable[[np.ndarray], list[np.ndarray]],
                        ) -> np.ndarray | None:
    """Of ``rows`` (one tier of fitting rows, positions into ``expected``: their expected step
    times), those among which the first ``count`` rows of the tie order lie: the rows with
    the best ``E`` (the strict ranking's first: it decides the ties) and every tie of the
    simplicity groups, in their order, up to the group where the ties reach ``count``
    (``simplicity(rows)``: their :func:`planner.ranking.simplicity_keys`).  None: the ties are
    fewer than ``count`` (the rows after them are ranked strictly), or no ``E`` is finite."""
    values = expected[rows]
    if not np.isfinite(values).any():
        return None
    best = np.nanmin(values)
    ties = rows[values <= tie_limit_s(best, tolerance)]
    if len(ties) < count:
        return None
    keys = simplicity(ties)
    order = np.lexsort(keys[::-1])
    keys = np.stack([np.asarray(key)[order] for key in keys])
    # the end of each group of equal keys; the first group whose end reaches ``count``
    ends = np.r_[np.flatnonzero((keys[:, 1:] != keys[:, :-1]).any(axis=0)) + 1, len(ties)]
    last = ends[np.searchsorted(ends, count)]
    return np.union1d(rows[values == best], ties[order[:last]])
