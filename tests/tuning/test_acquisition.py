"""The guided sampler's acquisitions besides its bound (``TuneSettings.acquisition``,
trials.acquisition; the sixth round of docs/tuning/regret.md): ``design`` takes the tie of the
largest posterior sd, ``info`` the contender whose measurement tells most about which
contender beats the posterior best."""

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytestmark = pytest.mark.needs("tune")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _model():
    """Eleven layouts over TP (share 0.5) and micro-batch (0.4), own 0.1, predicted alike:
    TP 1-5 with micro-batch 1 and 2, and TP 6 with micro-batch 1 alone."""
    from trials.guided import OWN, ErrorModel

    layouts = [(tp, 1) for tp in range(1, 6)] + [(tp, 2) for tp in range(1, 6)] + [(6, 1)]
    codes = {"tp": np.array([tp for tp, _ in layouts]),
             "micro_batch": np.array([mb for _, mb in layouts])}
    model = ErrorModel(None, 0.16, {"tp": 0.5, "micro_batch": 0.4, OWN: 0.1}, codes=codes,
                       sigma=0.2, log_predicted=np.zeros(len(layouts)))
    return model, layouts


def test_posterior_covariance_is_the_gaussian_process_update():
    """cov(y_a, y_b | y_obs) = K_ab - K_ao (K_oo + N)^-1 K_ob, and its diagonal is the
    posterior's variance."""
    model, layouts = _model()
    observed, noise = np.array([0, 6]), np.array([1e-3, 1e-3])
    rows = np.arange(len(layouts))
    cov = model.posterior_covariance(observed, noise, rows, rows)
    k = model.covariance(rows, rows)
    gram = model.covariance(observed, observed) + np.diag(noise)
    expected = k - k[:, observed] @ np.linalg.solve(gram, k[observed, :])
    assert np.allclose(cov, expected)
    _, sd = model.posterior(observed, np.ones(2), noise)
    assert np.allclose(np.sqrt(np.diag(cov)), sd)
    assert np.allclose(model.posterior_covariance(np.array([], dtype=np.int64), np.array([]),
                                                  rows, rows), k)


def test_information_counts_a_term_once_per_contender_that_shares_it():
    """(TP1, mb1) measured.  The bound prefers (TP6, mb1) (an unmeasured TP: the larger sd);
    a measurement of (TP1, mb2) tells more about which contender beats the measured one -- its
    unmeasured micro-batch is shared by five contenders, TP6 by one."""
    from trials.acquisition import information
    from trials.guided import STEP_SD

    model, layouts = _model()
    observed = (np.array([0]), np.array([1.0]), np.array([STEP_SD ** 2]))
    mean, sd = model.posterior(*observed)
    mb2, tp6 = layouts.index((1, 2)), layouts.index((6, 1))
    assert sd[tp6] > sd[mb2]
    parts = [(np.ones(len(layouts)), model, observed)]
    targets = np.arange(1, len(layouts))
    score = information(parts, mean, targets, 0, np.array([mb2, tp6]))
    assert score[0] > 1.15 * score[1] > 0
    # a contender no better than the best counts less: the micro-batch's contenders pushed
    # below the best
    lower = mean.copy()
    lower[[i for i, (_, mb) in enumerate(layouts) if mb == 2]] -= 0.5
    assert information(parts, lower, targets, 0, np.array([mb2]))[0] < 0.5 * score[0]


def test_the_additive_width_counts_each_term_that_differs_from_the_incumbent():
    """(TP1, mb1) and (TP2, mb2) measured, (TP1, mb1) the anchor: the step's sd is the same
    for (TP3, mb1) and (TP3, mb2) -- their variances add in quadrature with the measured sum
    -- while the additive width adds the sd of each term that differs from the anchor's, so
    (TP3, mb2) -- a new TP and the other micro-batch -- gets the wider; the anchor none, and
    without an anchor every term's own sd."""
    from trials.guided import STEP_SD

    model, layouts = _model()
    observed, noise = np.array([0, 6]), np.full(2, STEP_SD ** 2)
    width = model.term_sd(observed, noise, 0)
    _, sd = model.posterior(observed, np.ones(2), noise)
    one, two = layouts.index((3, 1)), layouts.index((3, 2))
    assert sd[one] == pytest.approx(sd[two])
    assert width[two] > 1.5 * width[one] > 0 and width[0] == 0
    prior = model.term_sd(np.array([], dtype=np.int64), np.array([]))
    assert prior == pytest.approx(np.full(len(layouts), 0.2 * (0.5 ** 0.5 + 0.4 ** 0.5)))


def test_the_sampler_takes_the_acquisition_for_its_first_trials_then_the_bound(monkeypatch):
    """``acquisition="design"`` with ``acquisition_trials`` 3: the tie of the largest sd for
    the trials before the third, the bound after; ``info`` the most informative of the
    highest bounds (:func:`trials.acquisition.information`)."""
    from optuna.trial import TrialState

    from trials.acquisition import acquisition
    from trials.guided import GuidedSampler

    class Frame(SimpleNamespace):  # what the sampler reads of a CandidateSet
        def __getitem__(self, i):
            return self.candidates[i]

    candidates = [SimpleNamespace(params={"tp": tp, "pp": 1, "ep": 1, "micro_batch": mb},
                                  predicted={"tokens_per_s_per_gpu": value})
                  for tp, mb, value in ((1, 1, 1000.0), (2, 1, 950.0), (1, 2, 900.0),
                                        (2, 2, 500.0))]  # the last not a tie
    frame = Frame(candidates=candidates, index={f"c{i}": i for i in range(4)},
                  distributions=dict)
    mean, sd = np.array([0.3, 0.0, 0.1, 0.0]), np.array([0.05, 0.2, 0.1, 0.4])
    mask = np.ones(4, dtype=bool)

    def study_of(done):
        trials = [SimpleNamespace(number=i, state=TrialState.COMPLETE) for i in range(done)]
        trials.append(SimpleNamespace(number=done, state=TrialState.RUNNING))
        return SimpleNamespace(get_trials=lambda deepcopy=False: trials), trials[-1]

    def choice(name, done, count=3):
        sampler = GuidedSampler(frame, lambda study: mask, 0.16, kappa=2.0,
                                acquire=acquisition(name), acquisition_trials=count)
        assert sampler.ties.tolist() == [True, True, True, False]
        monkeypatch.setattr(sampler, "posterior_parts",
                            lambda study: (mean, sd, [(np.ones(4), sampler.model, (
                                np.array([], dtype=np.int64), np.array([]), np.array([])))]))
        monkeypatch.setattr(sampler, "posterior", lambda study: (mean, sd))
        study, trial = study_of(done)
        return sampler.choose(study, trial, {}, mask)

    assert choice("ucb", 1) == 3  # the bound: 0 + 2 x 0.4
    assert choice("design", 1) == 1 and choice("design", 2) == 1  # the largest sd of a tie
    assert choice("design", 3) == 3  # from the third trial on: the bound
    assert choice("design", 5, count=0) == 1  # 0: every trial
    assert choice("info", 1) in (0, 1, 2, 3)
    assert choice("additive", 1) == 0  # nothing measured: the same width, the best mean
    with pytest.raises(ValueError, match="acquisition 'x' is not one of ucb, design, info, "
                                         "additive, knobs"):
        acquisition("x")


def test_the_acquisition_reaches_the_study_sampler(tmp_path):
    """``TuneSettings.acquisition``: the same first trial (the best predicted), then other
    choices; every trial a layout of the study's candidates, none twice."""
    import dataclasses

    from benchmarks import tuning_regret as sim

    job = sim.prepare(next(j for j in sim.JOBS if j.name == "qwen3-30b-8"))
    truth = sim.hidden_truth(job, 2, 0.09, truth="phases")
    base = sim.default_strategy()
    keys = {how: [t["key"] for t in sim.run_study(
        job, truth, dataclasses.replace(base, acquisition=how), 8, 0,
        tmp_path / how).trials] for how in ("ucb", "info", "design")}
    assert keys["ucb"][0] == keys["info"][0] == keys["design"][0]
    assert keys["info"] != keys["ucb"] and keys["design"] != keys["ucb"]
    for run in keys.values():
        assert len(run) == 8 and len(set(run)) == 8


def test_the_knobs_acquisition_varies_the_knob_terms_among_the_near_best_bounds(monkeypatch):
    """``acquisition="knobs"``: of the allowed layouts whose bound is within
    ``KNOB_TOLERANCE`` of the highest, the one whose terms other than TP/EP/PP differ most from
    the incumbent's -- with (TP1, mb1) and (TP2, mb2) measured alike, a new TP with the
    micro-batch not yet measured alone, (TP3, mb2); a layout outside the tolerance is never
    taken."""
    from trials.acquisition import KNOB_TOLERANCE, acquisition
    from trials.guided import STEP_SD, GuidedSampler

    model, layouts = _model()

    class Frame(SimpleNamespace):
        def __getitem__(self, i):
            return self.candidates[i]

    frame = Frame(candidates=[SimpleNamespace(params={"tp": tp, "micro_batch": mb},
                                              predicted={"tokens_per_s_per_gpu": 1000.0})
                              for tp, mb in layouts],
                  index={f"c{i}": i for i in range(len(layouts))}, distributions=dict)
    observed = (np.array([0, 6]), np.ones(2), np.full(2, STEP_SD ** 2))
    mean, sd = model.posterior(*observed)
    mask = np.ones(len(layouts), dtype=bool)
    mask[[0, 6]] = False
    sampler = GuidedSampler(frame, lambda study: mask, 0.16, kappa=2.0,
                            acquire=acquisition("knobs"))
    monkeypatch.setattr(sampler, "posterior_parts", lambda study: (
        mean, sd, [(np.ones(len(layouts)), model, observed)]))
    monkeypatch.setattr(sampler, "counted", lambda study, trial: 2)
    bound = np.where(mask, mean + 2.0 * sd, -np.inf)
    chosen = sampler.choose(None, None, {}, mask)
    assert bound[chosen] >= bound.max() - KNOB_TOLERANCE
    assert layouts[chosen] == (3, 2)
    ucb = GuidedSampler(frame, lambda study: mask, 0.16, kappa=2.0)
    monkeypatch.setattr(ucb, "posterior", lambda study: (mean, sd))
    assert layouts[ucb.choose(None, None, {}, mask)][1] == 1  # the bound: mb1 (first of ties)


def test_every_acquisition_but_the_bound_is_one_of_the_registry():
    """``TuneSettings.acquisition``'s names (trials.defaults) are the bound's ``ucb`` -- the
    sampler's own, no ``acquire`` -- and trials.acquisition's registry, no more and no fewer."""
    from trials.acquisition import ACQUIRE, acquisition
    from trials.defaults import ACQUISITIONS

    assert set(ACQUISITIONS) == {"ucb", *ACQUIRE} and "ucb" not in ACQUIRE
    assert acquisition("ucb") is None
    assert all(acquisition(name) is ACQUIRE[name] for name in ACQUIRE)
