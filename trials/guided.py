"""A sampler that lets the cost model propose and the measurements correct it (``--sampler
guided``).

The model's error is not noise: layouts that share a TP, an EP or a PP degree (and, less so, a
micro-batch, a recompute setting, a rollout layout) share the terms that err -- the same
communication, bubble and expert-dispatch terms.  So each measured trial says something about
every untried layout that shares its values.  :class:`GuidedSampler` models the log error of
the prediction, ``y = ln(measured / predicted)``, as a Gaussian process whose covariance is
that sharing (an additive kernel over categorical fields, as in Kandasamy et al. 2015,
"High dimensional Bayesian optimisation and bandits via additive models"):

    cov(y_a, y_b) = tau^2 + sigma^2 * (sum_f w_f [a_f == b_f] + w_layout [a == b])

with a job-wide term ``tau`` (the model's absolute error, learned from the first success),
``sigma`` solved from the model's measured ranking uncertainty ``u`` (the median over pairs of
layouts that differ in TP, EP or PP of ``|y_a - y_b|`` is ``ln(1 + u)``, as
``benchmarks/accuracy.py`` measures it on published layouts) and the shares ``PRIOR_SHARES``
(most of the variance on TP, EP and PP, the rest spread over the other knobs).  After each
trial the next layout is the allowed candidate with the highest upper confidence bound
``ln(predicted) + mean + KAPPA * sd`` of its log throughput (``tune --ucb-width``).  A pruned
trial's partial median is an observation too, with the larger noise of its fewer steps.

Without a measurement yet the bound is the prediction plus the prior's spread: the best
predicted layout (the study enqueues its first trials before it asks anyway).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial

from trials import study_state as attrs
from trials.candidates import CandidateSet
from trials.defaults import TUNE_DEFAULTS
from trials.sampler import LayoutSampler

# The fields whose values share an error term.
FAMILIES = {"tp": ("tp",), "ep": ("ep", "etp"), "pp": ("pp",), "vpp": ("vpp",), "cp": ("cp",),
            "micro_batch": ("micro_batch",), "recompute": ("recompute",),
            "offload": ("param_offload", "optimizer_offload", "ref_param_offload"),
            "rollout": ("rollout_tp", "rollout_dp", "rollout_ep", "gpu_memory_utilization"),
            "placement": ("mode", "trainer_gpus", "staleness_threshold")}
OWN = "layout"  # the share key of each layout's own error term (w_layout above)
# The prior's split of the error variance: 60% on TP, EP and PP together, the rest evenly
# over the other knobs and a small term of each layout's own.
PRIOR_SHARES = {"tp": 0.2, "ep": 0.2, "pp": 0.2, "vpp": 0.05, "cp": 0.05,
                "micro_batch": 0.05, "recompute": 0.05, "offload": 0.05, "rollout": 0.05,
                "placement": 0.05, OWN: 0.05}
PARALLEL_FAMILIES = ("tp", "ep", "pp")  # the pairs the uncertainty was measured on differ here
JOB_SD = 0.5  # prior sd of the job-wide log error (the model's absolute error, learned first)
STEP_SD = 0.03  # assumed log sd of one step's throughput around the layout's
KAPPA = TUNE_DEFAULTS["ucb_width"]  # the bound's width in posterior sds (tune --ucb-width)
PAIRS = 20_000  # candidate pairs sigma is solved over


def family_codes(params: Sequence[Mapping[str, Any]],
                 families: Mapping[str, Sequence[str]] = FAMILIES) -> dict[str, np.ndarray]:
    """Per family, each candidate's value as an integer code (a field the study does not
    search counts as one value)."""
    codes = {}
    for name, fields in families.items():
        values = [tuple(str(p.get(f)) for f in fields) for p in params]
        index = {value: i for i, value in enumerate(sorted(set(values)))}
        codes[name] = np.array([index[value] for value in values], dtype=np.int64)
    return codes


def pair_weights(codes: Mapping[str, np.ndarray], shares: Mapping[str, float],
                 rng: np.random.Generator, pairs: int = PAIRS) -> np.ndarray:
    """For random pairs of candidates that differ in TP, EP or PP, the share of the error
    variance the two do not share (their differing families' and their own)."""
    n = len(next(iter(codes.values())))
    if n < 2:
        return np.array([shares[OWN]])
    a = rng.integers(0, n, pairs)
    b = (a + rng.integers(1, n, pairs)) % n
    parallel = np.zeros(pairs, dtype=bool)
    for name in PARALLEL_FAMILIES:
        parallel |= codes[name][a] != codes[name][b]
    if parallel.any():
        a, b = a[parallel], b[parallel]
    weights = np.full(len(a), shares[OWN])
    for name in codes:
        weights += shares.get(name, 0.0) * (codes[name][a] != codes[name][b])
    return weights


def solve_sigma(weights: np.ndarray, median_log_error: float) -> float:
    """sigma such that the median of |y_a - y_b| over the pairs is ``median_log_error``:
    y_a - y_b is normal with variance 2 sigma^2 W for a pair whose unshared share is W, so the
    fraction of pairs within it is mean(2 Phi(e / (sigma sqrt(2 W))) - 1) = 1/2."""
    from scipy.special import erf  # the tune extra's

    low, high = 1e-4, 5.0
    for _ in range(60):
        sigma = math.sqrt(low * high)
        within = float(np.mean(erf(median_log_error / (2 * sigma * np.sqrt(weights)))))
        low, high = (sigma, high) if within > 0.5 else (low, sigma)
    return math.sqrt(low * high)


class ErrorModel:
    """The Gaussian process of the log prediction error over a candidate set (module
    docstring)."""

    def __init__(self, candidates: CandidateSet, model_error: float,
                 shares: Mapping[str, float] = PRIOR_SHARES):
        params = [c.params for c in candidates.candidates]
        self.codes = family_codes(params)
        self.shares = dict(shares)
        self.sigma = solve_sigma(pair_weights(self.codes, self.shares,
                                              np.random.default_rng(0)),
                                 math.log1p(model_error))
        self.log_predicted = np.log([max(float(c.predicted["tokens_per_s_per_gpu"]), 1e-9)
                                     for c in candidates.candidates])

    def covariance(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """cov(y_rows, y_cols) (candidate indices)."""
        out = np.full((len(rows), len(cols)), JOB_SD ** 2)
        for name, codes in self.codes.items():
            out += self.sigma ** 2 * self.shares.get(name, 0.0) * (
                codes[rows][:, None] == codes[cols][None, :])
        out += self.sigma ** 2 * self.shares[OWN] * (rows[:, None] == cols[None, :])
        return out

    def posterior(self, observed: np.ndarray, values: np.ndarray, noise_var: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and sd of every candidate's log throughput given the measured
        ``values`` (tokens/s/GPU) of the ``observed`` candidates."""
        n = len(self.log_predicted)
        prior_var = JOB_SD ** 2 + self.sigma ** 2 * (sum(self.shares.get(name, 0.0)
                                                         for name in self.codes)
                                                     + self.shares[OWN])
        if not len(observed):
            return self.log_predicted.copy(), np.full(n, math.sqrt(prior_var))
        y = np.log(values) - self.log_predicted[observed]
        gram = self.covariance(observed, observed) + np.diag(noise_var)
        cross = self.covariance(np.arange(n), observed)
        factor = np.linalg.cholesky(gram)
        alpha = np.linalg.solve(factor.T, np.linalg.solve(factor, y))
        mean = self.log_predicted + cross @ alpha
        half = np.linalg.solve(factor, cross.T)
        var = np.maximum(prior_var - (half ** 2).sum(axis=0), 1e-12)
        return mean, np.sqrt(var)


def observations(study: Study, candidates: CandidateSet
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(candidate indices, measured tokens/s/GPU, noise variance) of the study's trials that
    measured a throughput: successes, and pruned trials with their partial median."""
    index, values, noise = [], [], []
    for trial in study.get_trials(deepcopy=False):
        user = trial.user_attrs
        if user.get(attrs.CATEGORY) not in ("ok", "pruned"):
            continue
        measured = user.get(attrs.MEASURED) or {}
        value = measured.get("tokens_per_s_per_gpu")
        position = candidates.index.get(user.get(attrs.KEY, ""))
        if value is None or value <= 0 or position is None:
            continue
        steps = max(int(measured.get("steady_steps") or 1), 1)
        index.append(position)
        values.append(float(value))
        noise.append(STEP_SD ** 2 / steps)
    return (np.array(index, dtype=np.int64), np.array(values, dtype=float),
            np.array(noise, dtype=float))


class GuidedSampler(LayoutSampler):
    """A :class:`~trials.sampler.LayoutSampler` whose proposal is the allowed candidate with
    the highest upper confidence bound of its throughput (module docstring); the same contract
    otherwise."""

    def __init__(self, candidates: CandidateSet, allowed: Callable[[Study], np.ndarray],
                 model_error: float, seed: int | None = None, kappa: float | None = None,
                 inner: BaseSampler | None = None):
        super().__init__(candidates, allowed, inner=inner, seed=seed)
        self.model = ErrorModel(candidates, model_error)
        self.kappa = KAPPA if kappa is None else kappa

    def choose(self, study: Study, trial: FrozenTrial, search_space: dict,
               mask: np.ndarray) -> int:
        mean, sd = self.model.posterior(*observations(study, self.candidates))
        return int(np.argmax(np.where(mask, mean + self.kappa * sd, -np.inf)))
