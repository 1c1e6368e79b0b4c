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

**Per phase** (``tune --phase-model on``, :class:`PhaseErrorModel`).  Every trial also records
verl's per-phase timers (``timing_s/gen``, ``timing_s/old_log_prob``, ``timing_s/ref``,
``timing_s/update_actor``, ``timing_s/update_weights``; medians in ``phase_times_s``).  A phase
reads only some fields: generation the rollout layout and its KV pool, log-prob and the update
the training layout, the sync both (:data:`PHASE_FAMILIES`).  One process of the same form is
fitted per phase group to ``ln(measured phase time / predicted phase time)``, over that phase's
fields only, so a layout's rollout term is learned from every trial that ran its rollout layout
whatever its training layout, and the other way round: the study can rank a pairing of the
best measured rollout layout with the best measured training layout that never ran together.
A candidate's step time is the sum over phase groups of its predicted phase time x
exp(posterior mean); the sd of its log step time is the delta method's, sqrt(sum_g (T_g / T)^2
sd_g^2) with T_g the group's posterior time and T their sum (the groups' posteriors are
independent), and the bound is ``ln(predicted tokens/s/GPU x predicted step / T) + KAPPA x
sd``.  The groups' prior sds: their relative sizes are the measured per-phase MAPEs
(:data:`PHASE_MAPE`) turned into log sds (:func:`mape_log_sd`), their common scale solved so
that the linearised step error meets the same measured ranking uncertainty as the scalar
model (:func:`solve_phase_scale`).  A trial without phase timers counts in no phase; a study
with none left uses the scalar model, and so does an asynchronous study
(:func:`phase_model_applies`).

**Other acquisitions** (``TuneSettings.acquisition``: ``design``, ``info``, ``additive``,
``knobs``; no ``tune`` flag, the sixth round of docs/tuning/regret.md measured none better than
the bound) are :mod:`trials.acquisition`'s: functions of the same posterior (a
:class:`Posterior`) that the sampler is given (``acquire``) and asks instead of its bound for a
study's first ``acquisition_trials`` trials.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from planner.results import COLOCATED_MODE
from trials import study_state as attrs
from trials.candidates import CandidateSet
from trials.defaults import TUNE_DEFAULTS
from trials.proposals import tied
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

# --- per phase ----------------------------------------------------------------------------------
# The phase groups whose errors are modelled apart, the planner's phases each sums, and the fields
# each reads: generation runs the rollout engine (its TP/DP/EP and the KV pool
# gpu_memory_utilization leaves); the log-prob passes and the update run Megatron's layout (the
# update also its optimizer offload); the sync reshards the training layout into the rollout's.
PHASE_GROUPS = {"generate": ("generate",), "log_prob": ("old_log_prob", "ref"),
                "update": ("update_actor",), "sync": ("weight_sync",)}
TRAINING_FIELDS = ("tp", "ep", "pp", "vpp", "cp", "micro_batch", "recompute")
PHASE_FAMILIES = {"generate": ("rollout", "placement"),
                  "log_prob": TRAINING_FIELDS + ("placement",),
                  "update": TRAINING_FIELDS + ("offload", "placement"),
                  "sync": ("tp", "ep", "pp", "rollout", "placement")}
# Measured per-phase MAPE of the time model, |predicted / measured - 1| averaged over published
# runs (benchmarks/accuracy.py --rl, stored in docs/accuracy.md on 2026-12-04).
PHASE_MAPE = {"generate": 0.185, "log_prob": 0.363, "update": 0.194, "sync": 0.434}
# verl's timers (RayPPOTrainer.fit; planner/diagnose/advice.py) -> the planner's phases
VERL_TIMERS = {"gen": "generate", "old_log_prob": "old_log_prob", "ref": "ref",
               "update_actor": "update_actor", "update_weights": "weight_sync"}


def mape_log_sd(mape: float) -> float:
    """The log sd ``s`` whose lognormal error has mean absolute percentage error ``mape``: with
    ln(measured / predicted) ~ N(0, s^2), E|predicted / measured - 1| = exp(s^2 / 2)
    (2 Phi(s) - 1) (the error taken unbiased: a job-wide bias in the MAPE makes this an upper
    bound; only the phases' ratios are used)."""
    low, high = 1e-6, 5.0
    for _ in range(80):
        s = 0.5 * (low + high)
        value = math.exp(s * s / 2) * math.erf(s / math.sqrt(2))
        low, high = (s, high) if value < mape else (low, s)
    return 0.5 * (low + high)


def phase_shares(group: str, shares: Mapping[str, float] = PRIOR_SHARES) -> dict[str, float]:
    """``shares`` restricted to the fields ``group`` reads, in their proportions, and the
    layout's own term with the share it has of the step's (5%): a phase's error is mostly its
    fields', as the step's is."""
    fields = {name: shares[name] for name in PHASE_FAMILIES[group]}
    total = sum(fields.values())
    return {**{name: (1 - shares[OWN]) * value / total for name, value in fields.items()},
            OWN: shares[OWN]}


def phase_fractions(predicted: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """Each candidate's predicted time per phase group (seconds; 0 for a phase it lacks)."""
    return {group: np.array([sum(float((p.get("time_s") or {}).get(phase, 0.0))
                                   for phase in phases) for p in predicted])
            for group, phases in PHASE_GROUPS.items()}


def solve_phase_scale(codes: Mapping[str, np.ndarray], times: Mapping[str, np.ndarray],
                      sds: Mapping[str, float], shares: Mapping[str, Mapping[str, float]],
                      median_log_error: float, rng: np.random.Generator,
                      pairs: int = PAIRS) -> float:
    """The common factor ``c`` on the groups' log sds ``sds`` such that the median over pairs
    of candidates differing in TP, EP or PP of the linearised |e_a - e_b| is
    ``median_log_error``, where e = sum_g f_g e_g (f_g: the group's share of the predicted
    step) and the groups' errors are independent: Var(e_a - e_b) = c^2 sum_g sd_g^2
    (f_ga^2 + f_gb^2 - 2 f_ga f_gb S_g(a, b)), S_g the variance share the pair has in common in
    group g."""
    total = sum(times.values())
    a, b = parallel_pairs(codes, rng, pairs)
    variance = np.zeros(len(a))
    for group, sd in sds.items():
        f = times[group] / np.maximum(total, 1e-12)
        common = sum(share * (codes[name][a] == codes[name][b])
                     for name, share in shares[group].items() if name != OWN)
        common = common + shares[group][OWN] * (a == b)
        variance += sd ** 2 * (f[a] ** 2 + f[b] ** 2 - 2 * f[a] * f[b] * common)
    return solve_sigma(np.maximum(variance, 1e-12) / 2, median_log_error)


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


def parallel_pairs(codes: Mapping[str, np.ndarray], rng: np.random.Generator,
                   pairs: int = PAIRS) -> tuple[np.ndarray, np.ndarray]:
    """Random pairs (a, b) of distinct candidates that differ in TP, EP or PP (all the random
    pairs when none do)."""
    n = len(next(iter(codes.values())))
    a = rng.integers(0, n, pairs)
    b = (a + rng.integers(1, n, pairs)) % n
    parallel = np.zeros(pairs, dtype=bool)
    for name in PARALLEL_FAMILIES:
        parallel |= codes[name][a] != codes[name][b]
    return (a[parallel], b[parallel]) if parallel.any() else (a, b)


def pair_weights(codes: Mapping[str, np.ndarray], shares: Mapping[str, float],
                 rng: np.random.Generator, pairs: int = PAIRS) -> np.ndarray:
    """For random pairs of candidates that differ in TP, EP or PP, the share of the error
    variance the two do not share (their differing families' and their own)."""
    if len(next(iter(codes.values()))) < 2:
        return np.array([shares[OWN]])
    a, b = parallel_pairs(codes, rng, pairs)
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
                 shares: Mapping[str, float] = PRIOR_SHARES, *,
                 codes: Mapping[str, np.ndarray] | None = None, sigma: float | None = None,
                 log_predicted: np.ndarray | None = None):
        """The throughput's model; a phase group's with its ``codes`` (its fields), ``sigma``
        and ``log_predicted`` (ln predicted phase time) given."""
        self.codes = dict(codes) if codes is not None else family_codes(
            [c.params for c in candidates.candidates])
        self.shares = dict(shares)
        self.sigma = sigma if sigma is not None else solve_sigma(
            pair_weights(self.codes, self.shares, np.random.default_rng(0)),
            math.log1p(model_error))
        self.log_predicted = log_predicted if log_predicted is not None else np.log(
            [max(float(c.predicted["tokens_per_s_per_gpu"]), 1e-9)
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

    def term_sd(self, observed: np.ndarray, noise_var: np.ndarray,
                anchor: int | None = None, skip: Sequence[str] = ()) -> np.ndarray:
        """Every candidate's sum over the families of the posterior sd of the difference
        between its value's term and the ``anchor`` candidate's (the incumbent; without one,
        of its value's term): the additive bound's width, sum_f sd(z_f[x_f] - z_f[a_f]) (after
        Kandasamy et al. 2015's Add-GP-UCB, which sums the components' sds; the step's bound
        adds their variances).  Relative to the anchor because one trial measures a sum of
        terms, not each term: the job-wide term and the anchor's own leave out (the same for
        every untried candidate).  ``skip``: families left out.  Read by the ``additive`` and
        ``knobs`` acquisitions (:func:`trials.acquisition.additive_width`)."""
        total = np.zeros(len(self.log_predicted))
        factor = (np.linalg.cholesky(self.covariance(observed, observed) + np.diag(noise_var))
                  if len(observed) else None)
        for name, codes in self.codes.items():
            prior = self.sigma ** 2 * self.shares.get(name, 0.0)
            if prior <= 0 or name in skip:
                continue
            values = np.arange(codes.max() + 1)
            solved = (np.linalg.solve(factor, prior * (codes[observed][:, None] == values))
                      if factor is not None else np.zeros((1, len(values))))
            if anchor is None:
                var = prior - (solved ** 2).sum(axis=0)
            else:
                base = codes[anchor]
                var = (2 * prior * (values != base)
                       - ((solved - solved[:, [base]]) ** 2).sum(axis=0))
            total += np.sqrt(np.maximum(var, 0.0))[codes]
        return total

    def posterior_covariance(self, observed: np.ndarray, noise_var: np.ndarray,
                             rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """Posterior cov(y_rows, y_cols) given measurements of the ``observed`` candidates
        with ``noise_var`` (a Gaussian process's posterior covariance does not depend on the
        measured values; :func:`trials.acquisition.information` weighs it)."""
        prior = self.covariance(rows, cols)
        if not len(observed):
            return prior
        factor = np.linalg.cholesky(self.covariance(observed, observed) + np.diag(noise_var))
        left = np.linalg.solve(factor, self.covariance(observed, rows))
        right = np.linalg.solve(factor, self.covariance(observed, cols))
        return prior - left.T @ right


def measured_trials(study: Study, candidates: CandidateSet
                    ) -> Iterator[tuple[int, Mapping[str, Any], float]]:
    """(candidate index, what it measured, the noise variance of its medians) of each of the
    study's trials of a candidate of the set that measured: successes, and pruned trials with
    their partial medians -- the median of ``steady_steps`` steps, one step's ``STEP_SD`` each."""
    for trial in study.get_trials(deepcopy=False):
        user = trial.user_attrs
        if user.get(attrs.CATEGORY) not in ("ok", "pruned"):
            continue
        position = candidates.index.get(user.get(attrs.KEY, ""))
        if position is None:
            continue
        measured = user.get(attrs.MEASURED) or {}
        yield position, measured, STEP_SD ** 2 / max(int(measured.get("steady_steps") or 1), 1)


def observations(study: Study, candidates: CandidateSet
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(candidate indices, measured tokens/s/GPU, noise variance) of the study's trials that
    measured a throughput (:func:`measured_trials`)."""
    index, values, noise = [], [], []
    for position, measured, noise_var in measured_trials(study, candidates):
        value = measured.get("tokens_per_s_per_gpu")
        if value is None or value <= 0:
            continue
        index.append(position)
        values.append(float(value))
        noise.append(noise_var)
    return (np.array(index, dtype=np.int64), np.array(values, dtype=float),
            np.array(noise, dtype=float))


class PhaseErrorModel:
    """One :class:`ErrorModel` per phase group over the fields it reads, combined into the
    step's throughput (module docstring, "Per phase")."""

    def __init__(self, candidates: CandidateSet, model_error: float,
                 shares: Mapping[str, float] = PRIOR_SHARES):
        predicted = [c.predicted for c in candidates.candidates]
        codes = family_codes([c.params for c in candidates.candidates])
        self.times = phase_fractions(predicted)
        self.groups = tuple(g for g, t in self.times.items() if (t > 0).any())
        self.shares = {g: phase_shares(g, shares) for g in self.groups}
        mape_sd = {g: mape_log_sd(PHASE_MAPE[g]) for g in self.groups}
        self.scale = solve_phase_scale(codes, {g: self.times[g] for g in self.groups}, mape_sd,
                                       self.shares, math.log1p(model_error),
                                       np.random.default_rng(0))
        self.sigmas = {g: self.scale * mape_sd[g] for g in self.groups}
        self.models = {g: ErrorModel(candidates, model_error, self.shares[g],
                                     codes={f: codes[f] for f in PHASE_FAMILIES[g]},
                                     sigma=self.sigmas[g],
                                     log_predicted=np.log(np.maximum(self.times[g], 1e-9)))
                       for g in self.groups}
        self.log_tokens = np.log([max(float(p["tokens_per_s_per_gpu"]), 1e-9)
                                  * max(float(p["step_time_s"]), 1e-9) for p in predicted])
        # what the step holds besides the phases (none in a colocated step; kept as predicted)
        self.rest_s = np.maximum(np.array([float(p["step_time_s"]) for p in predicted])
                                 - sum(self.times.values()), 0.0)

    def posterior(self, observed: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
                  ) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and sd of every candidate's log throughput given, per phase group,
        (candidate indices, measured group time in seconds, noise variance)."""
        mean, sd, _ = self.step_posterior(observed)
        return mean, sd

    def step_posterior(self, observed: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
                       ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """:meth:`posterior` and each group's share of every candidate's posterior step time,
        T_g / T: the weights of the linearised log step time, sum_g (T_g / T) e_g."""
        total = self.rest_s.copy()
        parts = {}
        for group, model in self.models.items():
            index, values, noise = observed.get(group, (np.array([], dtype=np.int64),
                                                        np.array([]), np.array([])))
            mean, sd = model.posterior(index, values, noise)
            time_s = np.where(self.times[group] > 0, np.exp(mean), 0.0)
            parts[group] = (time_s, sd)
            total += time_s
        total = np.maximum(total, 1e-9)
        variance = sum((time_s / total) ** 2 * sd ** 2 for time_s, sd in parts.values())
        return (self.log_tokens - np.log(total), np.sqrt(variance),
                {group: time_s / total for group, (time_s, _) in parts.items()})


def phase_observations(study: Study, candidates: CandidateSet
                       ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per phase group: (candidate indices, measured group time, noise variance) of the
    study's trials whose measurement has every verl timer of the group
    (:func:`measured_trials`)."""
    out: dict[str, tuple[list, list, list]] = {g: ([], [], []) for g in PHASE_GROUPS}
    for position, measured, noise_var in measured_trials(study, candidates):
        timers = measured.get("phase_times_s") or {}
        if not timers:
            continue
        phases = {VERL_TIMERS[k]: float(v) for k, v in timers.items() if k in VERL_TIMERS}
        predicted = candidates[position].predicted.get("time_s") or {}
        for group, members in PHASE_GROUPS.items():
            if not all(p in phases for p in members if predicted.get(p, 0.0) > 0):
                continue
            value = sum(phases.get(p, 0.0) for p in members)
            if value <= 0:
                continue
            out[group][0].append(position)
            out[group][1].append(value)
            out[group][2].append(noise_var)
    return {g: (np.array(i, dtype=np.int64), np.array(v, dtype=float), np.array(n, dtype=float))
            for g, (i, v, n) in out.items()}


def phase_model_applies(candidates: CandidateSet, phase_model: bool | None) -> bool:
    """Whether the sampler models phases: asked (``tune --phase-model``), a colocated study
    (an asynchronous trainer's ``timing_s/gen`` is the wait for a batch generated meanwhile,
    not its generation) and predicted generation and update times to correct."""
    use = TUNE_DEFAULTS["phase_model"] == "on" if phase_model is None else phase_model
    if not use or any(getattr(c, "mode", COLOCATED_MODE) != COLOCATED_MODE
                      for c in candidates.candidates):
        return False
    times = phase_fractions([c.predicted for c in candidates.candidates])
    return bool((times["generate"] > 0).any() and (times["update"] > 0).any())


_COUNTED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING)

# One part of the linearised log throughput (trials.acquisition reads them): each candidate's
# weight in it, the part's model (a phase group's, or the step's) and its observations.
Part = tuple[np.ndarray, ErrorModel, tuple[np.ndarray, np.ndarray, np.ndarray]]


@dataclass(frozen=True, eq=False)
class Posterior:
    """What an acquisition (:mod:`trials.acquisition`) chooses from: every candidate's posterior
    mean and sd of its log throughput, the parts they sum (:meth:`GuidedSampler.posterior_parts`),
    the allowed candidates, the ties (predicted within the model's error) and the bound's width
    in posterior sds."""

    mean: np.ndarray
    sd: np.ndarray
    parts: list[Part]
    mask: np.ndarray
    ties: np.ndarray
    kappa: float

    @property
    def bound(self) -> np.ndarray:
        """The allowed candidates' upper confidence bound, ``mean + kappa * sd`` (-inf for
        the others)."""
        return np.where(self.mask, self.mean + self.kappa * self.sd, -np.inf)


class GuidedSampler(LayoutSampler):
    """A :class:`~trials.sampler.LayoutSampler` whose proposal is the allowed candidate with
    the highest upper confidence bound of its throughput (module docstring); the same contract
    otherwise.  ``acquire`` (:func:`trials.acquisition.acquisition`), when given, chooses
    instead of the bound for the study's first ``acquisition_trials`` trials (0: all)."""

    def __init__(self, candidates: CandidateSet, allowed: Callable[[Study], np.ndarray],
                 model_error: float, seed: int | None = None, kappa: float | None = None,
                 inner: BaseSampler | None = None, phase_model: bool | None = None,
                 exploit_last: int = 0, budget: int | None = None,
                 acquire: Callable[[Posterior], int] | None = None,
                 acquisition_trials: int = 0):
        super().__init__(candidates, allowed, inner=inner, seed=seed)
        self.exploit_last = exploit_last if budget is not None else 0
        self.budget = budget
        self.model = ErrorModel(candidates, model_error)
        self.kappa = KAPPA if kappa is None else kappa
        self.phase_model = (PhaseErrorModel(candidates, model_error)
                            if phase_model_applies(candidates, phase_model) else None)
        self.acquire = acquire
        self.acquisition_trials = acquisition_trials
        self.ties = np.zeros(len(candidates.candidates), dtype=bool)
        self.ties[tied(candidates.candidates, model_error)] = True

    def posterior(self, study: Study) -> tuple[np.ndarray, np.ndarray]:
        """Every candidate's posterior mean and sd of its log throughput: per phase when the
        sampler models phases and a trial measured them, else the step's."""
        mean, sd, _ = self.posterior_parts(study)
        return mean, sd

    def posterior_parts(self, study: Study) -> tuple[np.ndarray, np.ndarray, list[Part]]:
        """:meth:`posterior` and the parts of the linearised log throughput it sums (the
        acquisitions' input, :mod:`trials.acquisition`): each phase group's, or the step's
        alone."""
        if self.phase_model is not None:
            observed = phase_observations(study, self.candidates)
            if any(len(index) for index, _, _ in observed.values()):
                mean, sd, weights = self.phase_model.step_posterior(observed)
                return mean, sd, [(weights[g], model, observed[g])
                                  for g, model in self.phase_model.models.items()]
        observed = observations(study, self.candidates)
        mean, sd = self.model.posterior(*observed)
        return mean, sd, [(np.ones(len(mean)), self.model, observed)]

    def choose(self, study: Study, trial: FrozenTrial, search_space: dict,
               mask: np.ndarray) -> int:
        if self.exploiting(study, trial):
            mean, _ = self.posterior(study)
            return int(np.argmax(np.where(mask, mean, -np.inf)))
        if self.acquire is None or (self.acquisition_trials and self.counted(study, trial)
                                    >= self.acquisition_trials):
            mean, sd = self.posterior(study)
            return int(np.argmax(np.where(mask, mean + self.kappa * sd, -np.inf)))
        mean, sd, parts = self.posterior_parts(study)
        return self.acquire(Posterior(mean, sd, parts, mask, self.ties, self.kappa))

    def counted(self, study: Study, trial: FrozenTrial) -> int:
        """The study's trials before ``trial`` that count against its budget (finished,
        pruned, failed, running)."""
        return sum(t.number != trial.number and t.state in _COUNTED
                   for t in study.get_trials(deepcopy=False))

    def exploiting(self, study: Study, trial: FrozenTrial) -> bool:
        """Whether ``trial`` is one of the study's last ``exploit_last`` of ``budget`` trials,
        which run the allowed layout of the highest posterior mean (``TuneSettings.exploit_last``,
        0 in ``tune``): under the per-phase model that is often a composition never run as one
        trial -- the best measured rollout layout with the best measured training fields.  The
        fifth round of docs/tuning/regret.md measured no gain from it, so ``tune`` has no flag."""
        if not self.exploit_last:
            return False
        return self.budget - self.counted(study, trial) <= self.exploit_last
