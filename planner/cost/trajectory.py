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
from functools import lru_cache
from typing import Callable, Union

import numpy as np

from planner.catalog.lengths import ResponseLengths
from planner.cost.columns import time_column
from planner.cost.pool_time import pool_state
from planner.phases import PHASES

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
    # a quantity that does not move over the run is its own mean, exactly (the weighted sum
    # can differ from it in the last bit)
    total = np.where((first == middle) & (middle == last), middle, total)
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
    return _with_mean(workload, mean)


@lru_cache(maxsize=64)
def _with_mean(workload, mean: int):
    """:func:`workload_at`'s copy, made once per workload and length (a sizing sweep's plans
    ask for the same three points of one workload 96 times; the copy re-runs the workload's
    checks)."""
    return replace(workload, mean_response_length=mean)


# --- the time model's columns over the run ----------------------------------------------------
# Each floating column is a time, or a count that follows the lengths (decode steps): its
# expectation over the run is Simpson's rule over the nodes.  Throughput and MFU are ratios
# (tokens or FLOPs over seconds): the run's figure is the mean work over the expected time
# (below); booleans and indices are the middle node's.
RATIO_COLUMNS = ("tokens_per_s_per_gpu", "mfu")
START_COLUMN, END_COLUMN = "step_time_start_s", "step_time_end_s"


def request_at(request, mean_tokens: float):
    """``request`` with its workload at one point of the trajectory (:func:`workload_at`)."""
    workload = workload_at(request.workload, mean_tokens)
    if workload.mean_response_length == request.workload.mean_response_length:
        return request
    return replace(request, workload=workload)


def columns_over_run(request, evaluate: Callable) -> tuple[dict, tuple[dict, dict, dict]]:
    """``evaluate(request)`` -- the time model on a batch of layouts, a dict of columns -- over
    the run's trajectory: returns the run's expected columns (every floating column but
    :data:`RATIO_COLUMNS` by :func:`expected_over_run`; the others the middle node's), and the
    columns at the first, the middle and the last step.  One call per distinct node (one when
    the lengths do not move, or the workload has none), each vectorised over the layouts."""
    lengths = getattr(request.workload, "lengths", None)
    if lengths is None or lengths.constant:
        middle = evaluate(request)
        return middle, (middle, middle, middle)
    at_nodes = tuple(evaluate(request_at(request, point)) for point in node_lengths(lengths))
    expected = {}
    for name, value in at_nodes[1].items():
        array = np.asarray(value)
        if np.issubdtype(array.dtype, np.floating) and name not in RATIO_COLUMNS:
            expected[name] = expected_over_run([node[name] for node in at_nodes])
        else:
            expected[name] = value
    return expected, at_nodes


def step_columns_over_run(request, evaluate: Callable) -> dict:
    """The step's time columns (``evaluate``: :func:`planner.cost.timing.step_columns` on the
    layouts) as the run's expectation, with :data:`START_COLUMN` and :data:`END_COLUMN`, the
    step time at the first and the last step.  ``step_time_s`` is the expected step time (what
    a run of S steps takes, over S): what plans rank by and sizing multiplies by the steps.
    Throughput is the mean tokens of a step (linear in the mean length: the middle node's) over
    the expected time; MFU the middle node's FLOPs over the expected actor-update time; the
    dominant phase, the longest expected phase."""
    expected, (start, middle, end) = columns_over_run(request, evaluate)
    out = dict(expected)
    out[START_COLUMN] = start["step_time_s"]
    out[END_COLUMN] = end["step_time_s"]
    if middle is start:
        return out
    update = time_column("update_actor")
    runs = np.isfinite(expected["step_time_s"])  # inf: a layout that cannot run (rate 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        out["tokens_per_s_per_gpu"] = np.where(
            runs, middle["tokens_per_s_per_gpu"] * middle["step_time_s"]
            / expected["step_time_s"], 0.0)
        out["mfu"] = np.where(runs, middle["mfu"] * middle[update] / expected[update], 0.0)
    out["dominant_phase"] = np.stack([expected[time_column(phase)] for phase in PHASES]
                                     ).argmax(axis=0)
    return out


# --- separate pools over the run (planner.placement's splits) ---------------------------------
# A split's step is a steady state of its two pools (planner.cost.pool_time): max(G, T) + ...,
# not linear in either pool's time, so it is evaluated at each node from both pools' seconds at
# that node, and its expectation is Simpson's rule over the steps, not the steady state of the
# pools' expected times (which would hide a bottleneck that moves from trainer to rollout as the
# responses grow).


def seconds_over_run(request, evaluate: Callable) -> tuple[np.ndarray, np.ndarray]:
    """``evaluate(request)`` -- one pool's seconds per step, an array over layouts -- over the
    run: its expectation and its value at each of :data:`NODES` (shape ``(3, layouts)``).  One
    call per distinct node (one when the lengths do not move)."""
    lengths = getattr(request.workload, "lengths", None)
    if lengths is None or lengths.constant:
        value = np.asarray(evaluate(request), dtype=float)
        return value, np.stack([value] * len(NODES))
    at_nodes = np.stack([np.asarray(evaluate(request_at(request, point)), dtype=float)
                         for point in node_lengths(lengths)])
    return np.asarray(expected_over_run(at_nodes)), at_nodes


def steady_state_over_run(steady_state: Callable, generate_at_nodes, train_at_nodes,
                          sync_s: float) -> dict:
    """A split's steady state over the run: ``steady_state(generate, train, sync)`` (a mode's
    schedule, :mod:`planner.cost.pool_time`) at each of :data:`NODES` from the rollout pool's
    and the trainer pool's seconds per step there.  Returns the run's columns: the expected
    step time (``step_time_s``, Simpson's rule over the nodes' steps: what ranks), the first
    and last step's (:data:`START_COLUMN`, :data:`END_COLUMN`), the expected boundary wait and
    syncs, each pool's expected busy seconds (``generate_s``, ``train_s``), and each pool's idle
    fraction and the bottleneck over the whole run (busy seconds over the run's seconds)."""
    generate = np.asarray(generate_at_nodes, dtype=float)
    train = np.asarray(train_at_nodes, dtype=float)
    at = steady_state(generate, train, sync_s)
    steps = np.asarray(at["step_time_s"], dtype=float)
    expected_generate, expected_train = (expected_over_run(generate),
                                         expected_over_run(train))
    out = pool_state(expected_generate, expected_train, expected_over_run(steps),
                     expected_over_run(np.asarray(at["boundary_s"], dtype=float)),
                     expected_over_run(np.asarray(at["sync_per_step_s"], dtype=float)))
    out.update({START_COLUMN: steps[0], END_COLUMN: steps[-1],
                "generate_s": expected_generate, "train_s": expected_train})
    return out
