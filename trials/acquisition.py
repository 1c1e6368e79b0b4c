"""How the guided sampler may pick a layout other than by its bound (``TuneSettings.acquisition``;
no ``tune`` flag: the sixth round of docs/tuning/regret.md measured none better than the bound).

:class:`~trials.guided.GuidedSampler` takes the allowed candidate of the highest upper
confidence bound of its log throughput, ``mean + KAPPA * sd`` (``"ucb"``, ``tune``'s default;
the posterior and the bound are :mod:`trials.guided`'s).  For a study's first
``acquisition_trials`` trials (0: all) it may instead ask one of :data:`ACQUIRE`, each a function
of the same posterior (a :class:`~trials.guided.Posterior`: every candidate's mean and sd,
the parts they sum -- each phase group's model and observations, or the step's alone -- the
allowed candidates and the ties), which :func:`acquisition` looks up by name for the
sampler's ``acquire``:

* ``design`` (:func:`design`): the tie (predicted within the model's error) of the largest
  posterior sd -- the posterior variance does not depend on the measured values, so the
  sequence is a greedy D-optimal design of the first trials over the error model's terms;
* ``info`` (:func:`most_informative`): of the ``INFO_CHOICES`` highest bounds, the layout whose
  measurement tells most about which of the ``INFO_TARGETS`` contenders beats the posterior
  best (:func:`information`);
* ``additive``: the bound with the sum of the terms' sds (:func:`additive_width`,
  :meth:`~trials.guided.ErrorModel.term_sd`; after Kandasamy et al. 2015's Add-GP-UCB)
  instead of their quadrature;
* ``knobs`` (:func:`knobs`): of the bounds within ``KNOB_TOLERANCE`` of the highest, the one
  whose knob terms (all but TP/EP/PP) differ most from the incumbent's.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from trials.defaults import ACQUISITIONS
from trials.guided import PARALLEL_FAMILIES, STEP_SD, Part, Posterior

INFO_TARGETS = 200  # the candidates of the highest bound whose difference to the best it weighs
INFO_CHOICES = 30  # the allowed candidates of the highest bound it chooses among
# "knobs": of the allowed candidates whose bound is within this much (log throughput) of the
# highest, the one whose knob terms (all but TP/EP/PP) differ most from the incumbent's
KNOB_TOLERANCE = 0.015


def information(parts: Sequence[Part], mean: np.ndarray, targets: np.ndarray, best: int,
                choices: np.ndarray, noise_var: float = STEP_SD ** 2) -> np.ndarray:
    """For each of ``choices``: how much measuring it (a probe: one step, ``noise_var``) is
    expected to tell about which of ``targets`` beats ``best`` -- the reduction of the posterior
    variance of each difference D_c = y_c - y_best, weighted by the posterior probability
    P(D_c > 0) that c is faster.

    A trial measures every part (phase group) g of its layout x, each an independent Gaussian
    process, and D_c = sum_g (f_gc e_g(c) - f_gb e_g(best)) (``f``: the part's weight, the
    sign of the phase times' error dropped: it is squared), so the reduction is
    sum_g (f_gc C_g(c, x) - f_gb C_g(best, x))^2 / (C_g(x, x) + noise_var), C_g the posterior
    covariance (:meth:`~trials.guided.ErrorModel.posterior_covariance`).  Unlike the bound's
    sd, which adds a layout's unmeasured terms in quadrature, this counts a term once per tied
    candidate that shares it: a micro-batch or rollout value shared by many contenders weighs
    as much as a TP degree shared by few."""
    from scipy.special import ndtr  # the tune extra's

    rows = np.concatenate([[best], targets, choices]).astype(np.int64)
    t = slice(1, 1 + len(targets))
    x = slice(1 + len(targets), len(rows))
    reduction = np.zeros((len(targets), len(choices)))
    var_d = np.zeros(len(targets))
    for weight, model, (index, _, noise) in parts:
        cov = model.posterior_covariance(index, noise, rows, rows)
        w = weight[rows]
        diff = w[t, None] * cov[t, x] - w[0] * cov[0, x][None, :]
        reduction += diff ** 2 / (np.diag(cov)[x] + noise_var)[None, :]
        var_d += (w[t] ** 2 * np.diag(cov)[t] + w[0] ** 2 * cov[0, 0]
                  - 2 * w[t] * w[0] * cov[t, 0])
    beats = ndtr((mean[targets] - mean[best]) / np.sqrt(np.maximum(var_d, 1e-12)))
    return beats @ reduction


def additive_width(mean: np.ndarray, parts: Sequence[Part],
                   skip: Sequence[str] = ()) -> np.ndarray:
    """Every candidate's additive width (:meth:`~trials.guided.ErrorModel.term_sd`) against
    the measured candidate of the highest posterior mean, summed over the parts by their
    weights; ``skip``: families left out."""
    measured = np.unique(np.concatenate([index for _, _, (index, _, _) in parts]))
    anchor = int(measured[np.argmax(mean[measured])]) if len(measured) else None
    return sum(weight * model.term_sd(index, noise, anchor, skip)
               for weight, model, (index, _, noise) in parts)


def design(posterior: Posterior) -> int:
    """``design``: the allowed tie of the largest posterior sd (the bound's choice when no tie
    is allowed)."""
    mask, ties = posterior.mask, posterior.ties
    if (mask & ties).any():
        return int(np.argmax(np.where(mask & ties, posterior.sd, -np.inf)))
    return int(np.argmax(posterior.bound))


def most_informative(posterior: Posterior) -> int:
    """``info``: of the ``INFO_CHOICES`` allowed candidates of the highest bound, the one
    whose measurement tells most about which of the ``INFO_TARGETS`` candidates of the highest
    bound (measured ones included) beats the posterior best of them (:func:`information`); the
    bound's choice when one candidate or none is allowed."""
    mean, parts, mask, bound = posterior.mean, posterior.parts, posterior.mask, posterior.bound
    if mask.sum() <= 1:
        return int(np.argmax(bound))
    measured = np.zeros(len(mask), dtype=bool)
    for _, _, (index, _, _) in parts:
        measured[index] = True
    pool = np.where(mask | measured, mean + posterior.kappa * posterior.sd, -np.inf)
    targets = np.argsort(-pool, kind="stable")[:INFO_TARGETS]
    targets = targets[np.isfinite(pool[targets])]
    best = int(targets[np.argmax(mean[targets])])
    targets = targets[targets != best]
    choices = np.argsort(-bound, kind="stable")[:INFO_CHOICES]
    choices = choices[np.isfinite(bound[choices])]
    if not len(targets):
        return int(choices[0])
    return int(choices[np.argmax(information(parts, mean, targets, best, choices))])


def additive(posterior: Posterior) -> int:
    """``additive``: the allowed candidate of the highest ``mean + kappa * additive width``
    (:func:`additive_width`)."""
    width = additive_width(posterior.mean, posterior.parts)
    return int(np.argmax(np.where(posterior.mask, posterior.mean + posterior.kappa * width,
                                  -np.inf)))


def knobs(posterior: Posterior) -> int:
    """``knobs``: of the candidates whose bound is within ``KNOB_TOLERANCE`` of the highest,
    the one of the largest additive width over the knob terms, TP/EP/PP left out."""
    bound = posterior.bound
    near = bound >= bound.max() - KNOB_TOLERANCE
    width = additive_width(posterior.mean, posterior.parts, skip=PARALLEL_FAMILIES)
    return int(np.argmax(np.where(near, width, -np.inf)))


# Every acquisition besides the bound, by its TuneSettings.acquisition name
ACQUIRE: dict[str, Callable[[Posterior], int]] = {
    "design": design, "info": most_informative, "additive": additive, "knobs": knobs}


def acquisition(name: str) -> Callable[[Posterior], int] | None:
    """The acquisition ``TuneSettings.acquisition`` names, for the sampler's ``acquire``: None
    for the bound (``ucb``, the sampler's own); ValueError naming the valid ones for a name
    that is none (:data:`trials.defaults.ACQUISITIONS`)."""
    if name not in ACQUISITIONS:
        raise ValueError(f"acquisition {name!r} is not one of {', '.join(ACQUISITIONS)}")
    return ACQUIRE.get(name)
