"""Step time over a run whose mean response length moves: the band and the expected time.

The mean response length moves linearly in steps from ``lengths.start_tokens`` to
``lengths.end_tokens`` (:mod:`planner.catalog.lengths`).  The time model is evaluated at the
mean length of the first, the middle and the last step (:data:`NODES`); the run's expected step
time -- what a run of S steps takes, divided by S -- is the integral over the trajectory,

    E[T] = integral_0^1 T(L(s)) ds  ~  (T(L_0) + 4 T(L_1/2) + T(L_1)) / 6,

Simpson's rule, exact when the step time is a polynomial of degree <= 3 in the mean length
(decode steps and token counts grow linearly with it, attention FLOPs quadratically; the
ceilings of micro-batch counts make it piecewise, within a micro-batch's worth).  The three
evaluations also give the band a plan shows: the step time at the start and at the end.

Pure functions: the caller passes the time model as ``step_time_at(mean_tokens)`` (a scalar or
an array over layouts), e.g. :func:`workload_at` plus the cost model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Union

import numpy as np

from planner.catalog.lengths import ResponseLengths

NODES = (0.0, 0.5, 1.0)  # fractions of the run: first, middle, last step
WEIGHTS = (1 / 6, 4 / 6, 1 / 6)  # Simpson's rule on [0, 1]

Seconds = Union[float, np.ndarray]


def node_lengths(lengths: ResponseLengths) -> tuple[float, ...]:
    """The mean response length (tokens) at each of :data:`NODES`."""
    return tuple(lengths.at(fraction) for fraction in NODES)


def expected_over_run(at_nodes) -> Seconds:
    """Simpson's rule over values at :data:`NODES` (the run's mean of a quantity that follows
    the mean response length)."""
    first, middle, last = (np.asarray(value, dtype=float) for value in at_nodes)
    total = WEIGHTS[0] * first + WEIGHTS[1] * middle + WEIGHTS[2] * last
    return float(total) if total.ndim == 0 else total


@dataclass(frozen=True)
class StepTimeBand:
    """Step time at the first and last step of the run and its expectation over the run
    (seconds; arrays over layouts when the time model returns arrays)."""

    start_s: Seconds
    end_s: Seconds
    expected_s: Seconds
    lengths: ResponseLengths

    @property
    def low_s(self) -> Seconds:
        return np.minimum(self.start_s, self.end_s)

    @property
    def high_s(self) -> Seconds:
        return np.maximum(self.start_s, self.end_s)


def step_time_band(lengths: ResponseLengths,
                   step_time_at: Callable[[float], Seconds]) -> StepTimeBand:
    """The band and the expected step time of ``lengths``' trajectory, the time model called
    once per distinct node length (once when the lengths do not move)."""
    means = node_lengths(lengths)
    if lengths.constant:
        value = step_time_at(means[0])
        return StepTimeBand(value, value, value, lengths)
    at_nodes = [step_time_at(mean) for mean in means]
    return StepTimeBand(at_nodes[0], at_nodes[-1], expected_over_run(at_nodes), lengths)


def workload_at(workload, mean_tokens: float):
    """``workload`` with its mean response length set to ``mean_tokens`` (rounded, at least 1,
    at most the maximum): the time model's input at one point of the trajectory."""
    mean = int(min(max(round(mean_tokens), 1), workload.response_length))
    return replace(workload, mean_response_length=mean)
