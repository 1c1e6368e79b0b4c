"""The actor's knob sums per distinct knob pattern (:meth:`planner.cost.memory.ActorCells.rows`).

A (core row, knob combination) cell of the actor's memory is a sum of per-core-row terms in a
fixed order (:func:`planner.cost.memory._held`), each term kept or zeroed by a knob.  Adding an
exact 0 changes no bit (``x + 0.0 == x``; the bytes are never -0.0) and neither does a product
by 1.0, so a sum is that of the terms a combination keeps, in order.  Combinations that keep
the same terms have the same sum: a phase's state reads the parameter offload, the
optimizer's GPU share (``0.0`` of a finite, non-negative state is an exact 0, so the CPU
optimizer's whole share keeps no term) and the reference; the update's state (everything
loaded back) the optimizer's share and the reference alone.  The default grid's 12
combinations are 8 distinct states and 4 updates, so each is computed once per core row,
stacked (pattern, core row) -- each sum a contiguous row, the core-row terms broadcast along
it -- and spread over the combinations once per table the caller keeps
(:class:`CombinationTables`): the same operations on the same values, so the same bits
(``tests/cost/test_actor_cells.py`` compares with the (core row, combination) tables).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SumConstants:
    """The constant bytes of the sums (planner.cost.memory's names)."""

    fixed: float  # CUDA context + NCCL buffers, on every phase
    fragmentation: float  # 1 + the allocator's fragmentation on the transients
    sync_bucket: float  # the weight sync's bucket
    host_worker: float  # a worker's host memory
    host_state: float  # the CPU optimizer's bytes per parameter on the host


class KnobPatterns:
    """Each knob combination's pattern of kept terms, per family of sums: ``state`` (the
    resident state, what the log-prob pass and the weight sync load: the parameter offload,
    the optimizer term, the reference), ``update`` (the optimizer term, the reference) and
    ``host``.  ``patterns[family]``: the distinct keys in order of first appearance;
    ``index[family]``: each combination's position among them."""

    def __init__(self, knobs: list, needs_reference: bool, optimizer_zeroes: bool) -> None:
        families = {"state": [], "update": [], "host": []}
        for knob in knobs:
            on_gpu = float(1 - np.float64(knob.on_host))  # the optimizer's share on the GPU
            # its term: none where it is an exact 0 (or offloaded, in the state's sums)
            optimizer = None if on_gpu == 0 and optimizer_zeroes else on_gpu
            no_ref = knob.ref_param_offload or not needs_reference
            families["state"].append((not knob.param_offload,
                                      None if knob.optimizer_offload else optimizer, not no_ref))
            families["update"].append((optimizer, not no_ref))
            families["host"].append((knob.param_offload,
                                     optimizer if knob.optimizer_offload else None,
                                     knob.ref_param_offload and needs_reference,
                                     float(knob.on_host)))
        self.patterns, self.index = {}, {}
        for family, keys in families.items():
            distinct = list(dict.fromkeys(keys))
            self.patterns[family] = distinct
            self.index[family] = np.array([distinct.index(key) for key in keys], dtype=np.intp)


def _term(name, vectors: dict) -> np.ndarray:
    """A term's per-core-row values: ``W``/``G`` (weights, grads), ``("O", share)`` (the
    optimizer state times its GPU share), ``("H", share)`` (the CPU optimizer's host bytes)."""
    if isinstance(name, str):
        return vectors[name]
    kind, share = name
    if kind == "O":
        state = vectors["optimizer_state"]
        return state if share == 1.0 else state * share
    return share * vectors["optimizer_params"] * vectors["host_state"]


def _sums(term_lists: list[tuple], vectors: dict) -> np.ndarray:
    """(pattern, core row): each pattern's terms summed in order (none: 0.0); prefixes shared
    (a prefix's sum is its shorter prefix's plus its last term; held in a plain dict, freed
    as this returns: no recursive closure, whose reference cycle would keep them)."""
    width = len(vectors["W"])
    out = np.empty((len(term_lists), width))
    memo: dict[tuple, np.ndarray] = {}
    for row, terms in enumerate(term_lists):
        for end in range(1, len(terms) + 1):
            if terms[:end] not in memo:
                memo[terms[:end]] = (_term(terms[0], vectors) if end == 1
                                     else memo[terms[:end - 1]] + _term(terms[end - 1], vectors))
        out[row] = memo[terms] if terms else np.zeros(width)
    return out


def stage_states(patterns: KnobPatterns, vectors: dict, consts: SumConstants,
                 names: frozenset[str]) -> dict:
    """Per family of sums, a stage's (pattern, core row) tables ``names`` of
    ``resident_state``, ``loaded``, ``ref`` (the reference pass's state), ``update`` and
    ``host``; ``vectors``: the stage's per-core-row ``W``, ``G``, ``optimizer_state``,
    ``optimizer_params``."""
    state = patterns.patterns["state"]
    out = {}
    if names & {"resident_state", "ref"}:
        resident = _sums([tuple(t for t in (("W" if kept else None), ("G" if kept else None),
                                            (None if opt is None else ("O", opt)),
                                            ("W" if ref else None)) if t is not None)
                          for kept, opt, ref in state], vectors)
        resident += consts.fixed
        out["resident_state"] = resident_state = resident - consts.fixed
    if "ref" in names:
        # the reference pass holds the resident state less the reference's weights, plus the
        # weights
        ref_state = resident_state.copy()
        for row, (_, _, ref) in enumerate(state):
            if ref:
                np.subtract(ref_state[row], vectors["W"], out=ref_state[row])
        ref_state += vectors["W"]
        out["ref"] = ref_state
    if "loaded" in names:
        out["loaded"] = _sums([tuple(t for t in ("W", ("G" if kept else None),
                                                 (None if opt is None else ("O", opt)),
                                                 ("W" if ref else None)) if t is not None)
                               for kept, opt, ref in state], vectors)
    if "update" in names:
        out["update"] = _sums([tuple(t for t in ("W", "G", (None if opt is None else ("O", opt)),
                                                 ("W" if ref else None)) if t is not None)
                               for opt, ref in patterns.patterns["update"]], vectors)
    if "host" in names:
        host = _sums([tuple(t for t in (("W" if off else None),
                                        (None if opt is None else ("O", opt)),
                                        ("W" if ref_off else None),
                                        (("H", share) if share != 0 else None)) if t is not None)
                      for off, opt, ref_off, share in patterns.patterns["host"]],
                     {**vectors, "host_state": consts.host_state})
        host += consts.host_worker
        out["host"] = host
    return out


# per phase: (its family of patterns, its state's table, its transient's core-row part or None)
PHASE_SUMS = {"update_actor": ("update", "update", "update"),
              "old_log_prob": ("state", "loaded", "log_prob"),
              "ref": ("state", "ref", "reference"),
              "weight_sync": ("state", "loaded", "sync"),
              "generate": ("state", "resident_state", None)}


class CombinationTables:
    """(core row, combination) tables of (pattern, core row) ones (:func:`stage_states`'):
    combination ``j`` of a family reads its pattern ``index[j]``.  C-ordered, so a row's cells
    follow each other: one flat take per table, its positions found once per family (a
    transposing copy strides across the patterns' rows, slower)."""

    def __init__(self, patterns: KnobPatterns, width: int, flat: dict) -> None:
        """``flat``: the positions found so far, per family (kept by the caller for its next
        tables of these patterns and width)."""
        self._patterns, self._width, self._flat = patterns, width, flat

    def _positions(self, family: str) -> np.ndarray:
        flat = self._flat.get(family)
        if flat is None:
            flat = self._flat[family] = ((self._patterns.index[family] * self._width)[None, :]
                                         + np.arange(self._width)[:, None])
        return flat

    def of(self, family: str, table: np.ndarray) -> np.ndarray:
        return np.take(table.reshape(-1), self._positions(family))

    def positions_at(self, family: str, cells: np.ndarray) -> np.ndarray:
        """The flat positions in a (pattern, core row) table of the flat (core row,
        combination) cells ``cells``: ``np.take(table.reshape(-1), positions)`` is :meth:`of`'s
        values at those cells alone."""
        return np.take(self._positions(family).reshape(-1), cells)
