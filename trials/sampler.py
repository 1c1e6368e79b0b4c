"""An Optuna sampler that proposes whole candidate layouts.

Optuna samplers pick parameter values; a layout is only runnable as a whole (TP, PP, the
micro-batch and the rollout must agree), and the memory margins and other tuners' running
trials change which layouts may run.  :class:`LayoutSampler` therefore samples all search
fields at once (``sample_relative``): an inner sampler (TPE by default, multivariate, with the
constant liar for parallel tuners) proposes field values from the study's history, and the
proposal is projected onto the nearest *allowed* candidate — not measured yet, not running in
another tuner, within the memory margins (:mod:`trials.candidates`).  Before the inner sampler
has enough history it returns nothing and a random allowed candidate is taken.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial

from trials.candidates import CandidateSet


class LayoutSampler(BaseSampler):
    """Sample complete layouts from a :class:`~trials.candidates.CandidateSet`.

    Contract:

    * :meth:`sample_relative` returns a value for every field of the candidates' study
      (``candidates.fields``: the layout's, and in a training-mode study the split and the
      staleness threshold), and the values are those of one candidate that
      ``allowed(study)`` permits — or ``{}`` when no candidate is allowed (the search space
      is exhausted);
    * a trial with fixed parameters (enqueued, or a retry of a trial whose tuner died) is
      returned as it is; the objective decides whether it may still run;
    * :meth:`sample_independent` is only reached for parameters outside the search space (or
      when nothing is allowed); it delegates to a random sampler.

    ``allowed(study) -> mask`` is supplied by the tuner (it knows the running claims and the
    memory margins).
    """

    def __init__(self, candidates: CandidateSet, allowed: Callable[[Study], np.ndarray],
                 inner: BaseSampler | None = None, seed: int | None = None,
                 n_startup_trials: int = 5):
        self.candidates = candidates
        self.allowed = allowed
        self.inner = inner if inner is not None else optuna.samplers.TPESampler(
            multivariate=True, constant_liar=True, seed=seed, n_startup_trials=n_startup_trials)
        self._random = optuna.samplers.RandomSampler(seed=seed)
        self._rng = np.random.default_rng(seed)
        self._space = candidates.distributions()

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()
        self._random.reseed_rng()
        self._rng = np.random.default_rng()

    def infer_relative_search_space(self, study: Study,
                                    trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self._space)

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        fixed = {**trial.system_attrs.get("fixed_params", {}), **trial.params}
        fields = self.candidates.fields
        if all(name in fixed for name in fields):
            return {name: fixed[name] for name in fields}
        mask = self.allowed(study)
        if not mask.any():
            return {}
        return dict(self.candidates[self.choose(study, trial, search_space, mask)].params)

    def choose(self, study: Study, trial: FrozenTrial,
               search_space: dict[str, BaseDistribution], mask: np.ndarray) -> int:
        """The index of the allowed candidate (``mask``, not empty) to propose: the inner
        sampler's proposal projected onto the nearest allowed candidate."""
        proposal = self.inner.sample_relative(study, trial, search_space)
        if proposal and all(name in proposal for name in self.candidates.fields):
            return self.candidates.nearest(proposal, mask)
        # not enough history yet: explore at random among the allowed layouts
        return int(self._rng.choice(np.flatnonzero(mask)))

    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self._random.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self.inner.before_trial(study, trial)

    def after_trial(self, study: Study, trial: FrozenTrial, state, values) -> None:
        self.inner.after_trial(study, trial, state, values)
