"""Columns computed when first read (a scoring chunk's memory columns no ranking reads).

A plan scores millions of rows a chunk at a time and keeps of each chunk the few columns the
ranking reads (:data:`planner.plan.RANKING_COLUMNS`) and the expected step time; the other
memory columns (the working sets, the peak stage's parts, most of the rollout engine's) are
computed again for the rows a caller takes.  A chunk's :class:`DeferredColumns` holds those as
functions, called on the first read (and kept): the same operations on the same values as
computing them at once, so the same bits, and the names in the same order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from functools import partial


class DeferredColumns(Mapping):
    """Named columns in the order they were set (a name set again keeps its place, as a
    dict's), each a value or a function of no argument computing it when first read."""

    def __init__(self) -> None:
        self._names: dict[str, None] = {}
        self._values: dict = {}
        self._later: dict[str, Callable] = {}

    def __setitem__(self, name: str, value) -> None:
        self._names[name] = None
        self._values[name] = value
        self._later.pop(name, None)

    def defer(self, name: str, compute: Callable) -> None:
        """``name``'s value is ``compute()``, called when first read."""
        self._names[name] = None
        self._values.pop(name, None)
        self._later[name] = compute

    def update_from(self, columns: Mapping) -> None:
        """Every column of ``columns``, in its order (a deferred one stays deferred)."""
        for name in columns:
            if isinstance(columns, DeferredColumns) and name in columns._later:
                self.defer(name, partial(columns.__getitem__, name))
            else:
                self[name] = columns[name]

    def __getitem__(self, name: str):
        if name in self._values:
            return self._values[name]
        value = self._values[name] = self._later[name]()  # KeyError: no such column
        del self._later[name]
        return value

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)
