"""How sure a study is that no layout it has not tried beats its best measured one.

The cost model's predictions carry a measured ranking uncertainty ``u`` (``benchmarks/
accuracy.py``: the median error of the predicted throughput ratio of two layouts of one job,
16% in the shipped calibration).  Measured trials fix the job's scale: ``scale`` is the median
of measured / predicted tokens/s/GPU over the study's successful trials.  An untried candidate's
optimistic bound is its prediction on that scale plus the model's error,
``predicted * scale * (1 + u)``; a candidate *could beat* the best measured layout when its
bound is higher than the best's measured value.

When none could, the study says "no untried layout is predicted to beat the best measured one
by more than the model's error" -- and, with ``tune --stop-when-confident``, stops.  Otherwise it
says how many could.  "Untried" means the candidates the study may still run: not measured,
not running, within the memory margins its OOMs raised.  ``u`` is a median: one pair of
layouts in two errs by more, so this is a statement about the model's typical error, not a
guarantee (docs/tuning/regret.md measures how often it stops on a worse layout).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class Confidence:
    best_key: str
    best_value: float  # measured tokens/s/GPU of the best trial
    scale: float  # median measured / predicted tokens/s/GPU of the successful trials
    model_error: float  # the ranking uncertainty u (fraction)
    untried: int  # candidates the study may still run
    could_beat: int  # of those, how many have an optimistic bound above the best
    top_bound: float | None  # the highest optimistic bound of an untried candidate

    @property
    def confident(self) -> bool:
        return self.could_beat == 0

    def statement(self) -> str:
        error = f"{self.model_error:.0%}"
        if self.confident:
            return (f"no untried layout is predicted to beat the best measured one by more "
                    f"than the model's error ({error}; {self.untried:,} untried)")
        return (f"{self.could_beat:,} of {self.untried:,} untried layouts could beat the best "
                f"measured one within the model's error ({error}; the highest bound is "
                f"{self.top_bound:,.1f} tok/s/GPU against {self.best_value:,.1f} measured)")

    def to_dict(self) -> dict:
        return {**asdict(self), "confident": self.confident, "statement": self.statement()}


def assess(predicted: np.ndarray, untried: np.ndarray, successes: Sequence[tuple[int, float]],
           best: tuple[str, float], model_error: float) -> Confidence | None:
    """The study's :class:`Confidence`: ``predicted`` tokens/s/GPU of every candidate,
    ``untried`` its mask of candidates the study may still run, ``successes`` the (candidate
    index, measured tokens/s/GPU) of its successful trials, ``best`` the best one's (key,
    value).  None before any trial succeeded."""
    if not successes:
        return None
    ratios = [value / float(predicted[index]) for index, value in successes
              if predicted[index] > 0]
    scale = float(np.median(ratios)) if ratios else 1.0
    bounds = np.asarray(predicted, dtype=float)[untried] * scale * (1.0 + model_error)
    key, value = best
    return Confidence(best_key=key, best_value=float(value), scale=scale,
                      model_error=float(model_error), untried=int(untried.sum()),
                      could_beat=int(np.count_nonzero(bounds > value)),
                      top_bound=float(bounds.max()) if len(bounds) else None)
