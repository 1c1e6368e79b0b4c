"""The per-phase noise model of the tuning simulator (benchmarks/tuning_regret.py --truth
phases) and the guided sampler's per-phase error model (trials.guided.PhaseErrorModel, tune
--phase-model on): the simulator's phase sds come from the measured per-phase MAPEs and its
step still meets the measured ranking uncertainty; the sampler combines a rollout layout and a
training layout measured apart."""

import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytestmark = pytest.mark.needs("tune")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

MEMORY_SD = 0.09


@pytest.fixture(scope="module")
def sim():
    from benchmarks import tuning_regret

    return tuning_regret


@pytest.fixture(scope="module")
def prepared(sim):
    jobs = {job.name: job for job in sim.JOBS}
    return {name: sim.prepare(jobs[name]) for name in ("qwen2.5-7b-8", "qwen3-30b-8")}


def test_mape_log_sd_inverts_the_lognormal_mape():
    from trials.guided import mape_log_sd

    rng = np.random.default_rng(0)
    for mape in (0.185, 0.363, 0.434):
        s = mape_log_sd(mape)
        e = rng.normal(0.0, s, 400_000)
        assert np.mean(np.abs(np.exp(-e) - 1)) == pytest.approx(mape, rel=0.01)
    assert mape_log_sd(0.185) == pytest.approx(0.228, abs=0.002)  # about MAPE x sqrt(pi/2)


def test_phase_truth_sds_follow_the_measured_phase_errors_and_the_step_the_pair_figure(
        sim, prepared):
    """Over 30 draws: each phase group's realised log error has the calibrated sd, the sds'
    ratios are the per-phase MAPEs' (as log sds), and the step's error still meets the
    measured ranking uncertainty (median |e_a - e_b| over pairs differing in TP/EP/PP), as the
    scalar model does; the launcher writes verl's per-phase timers, summing to the step."""
    from planner.cost.efficiency import ranking_uncertainty
    from planner.phases import PHASES
    from trials.guided import PHASE_GROUPS, PHASE_MAPE, family_codes, mape_log_sd

    target = math.log1p(ranking_uncertainty()["relative"])
    for job in prepared.values():
        candidates = job.candidates.candidates
        predicted = np.array([c.predicted["tokens_per_s_per_gpu"] for c in candidates])
        phase_predicted = np.array([[c.predicted["time_s"][p] for p in PHASES]
                                    for c in candidates])
        codes = family_codes([c.params for c in candidates], sim.FAMILIES)
        rng = np.random.default_rng(3)
        a, b = rng.integers(0, len(candidates), (2, 20_000))
        differ = np.zeros(len(a), dtype=bool)
        for name in ("tp", "ep", "pp"):
            differ |= codes[name][a] != codes[name][b]
        pairs, errors = [], {g: [] for g in PHASE_GROUPS}
        for seed in range(30):
            truth = sim.hidden_truth(job, 500 + seed, MEMORY_SD, truth="phases")
            step = np.log(truth.tokens_per_s_per_gpu / predicted)
            pairs.append(np.median(np.abs(step[a[differ]] - step[b[differ]])))
            log_ratio = np.log(truth.phase_time_s / phase_predicted)
            for group, members in PHASE_GROUPS.items():
                errors[group].append(log_ratio[:, PHASES.index(members[0])])
        calibration = job.sigmas[("phases", target)]
        sds = calibration["sds"]
        for group in PHASE_GROUPS:
            # the same factor on every group: the MAPEs' ratios are kept
            assert sds[group] / mape_log_sd(PHASE_MAPE[group]) == pytest.approx(
                calibration["scale"], rel=1e-9)
            # over draws a group's log error has its sd (terms shared by few values: 15%)
            assert np.std(np.concatenate(errors[group])) == pytest.approx(sds[group], rel=0.15)
        assert 0.7 < calibration["scale"] < 1.6, job.job.name  # MAPEs near the step's figure
        assert np.mean(pairs) == pytest.approx(target, rel=0.12), job.job.name
        # ref and old log-prob share their group's error
        assert np.allclose(log_ratio[:, PHASES.index("ref")],
                           log_ratio[:, PHASES.index("old_log_prob")])
        launcher = sim.SimulatedLauncher(job, truth)
        timers = launcher.phase_timers(7, 1.0)
        assert set(timers) == {"timing_s/gen", "timing_s/old_log_prob", "timing_s/ref",
                               "timing_s/update_actor", "timing_s/update_weights"}
        assert sum(timers.values()) == pytest.approx(truth.step_time_s[7], rel=1e-9)


def test_the_scalar_truth_is_unchanged_and_writes_no_phase_timers(sim, prepared):
    job = prepared["qwen3-30b-8"]
    scalar = sim.hidden_truth(job, 4, MEMORY_SD)
    phases = sim.hidden_truth(job, 4, MEMORY_SD, truth="phases")
    assert scalar.phase_time_s is None and sim.SimulatedLauncher(job, scalar).phase_timers(
        0, 1.0) == {}
    assert np.array_equal(scalar.oom_need, phases.oom_need)  # the same memory draw


class Frame(SimpleNamespace):
    """What the models read of a CandidateSet: ``candidates``, ``index`` and item access."""

    def __getitem__(self, i):
        return self.candidates[i]


def _four_layouts():
    """Two training layouts (TP1, TP2) x two rollout layouts (rollout TP 1, 2), predicted
    alike: generation 60 s, log-prob 2 x 15 s, update 60 s, sync 5 s per step."""
    time_s = {"generate": 60.0, "old_log_prob": 15.0, "ref": 15.0, "update_actor": 60.0,
              "weight_sync": 5.0}
    step = sum(time_s.values())
    candidates = [SimpleNamespace(
        params={"tp": tp, "pp": 1, "ep": 1, "micro_batch": 1, "rollout_tp": rtp},
        predicted={"tokens_per_s_per_gpu": 1000.0, "step_time_s": step, "time_s": time_s})
        for tp in (1, 2) for rtp in (1, 2)]
    return Frame(candidates=candidates,
                 index={f"c{i}": i for i in range(len(candidates))}), time_s


def test_phase_model_combines_a_rollout_and_a_training_layout_never_run_together():
    """Measured: (TP1, rollout TP2) generates 30% faster than predicted, (TP2, rollout TP1)
    updates and scores 30% faster; both steps about 15% faster.  The layout that pairs the
    two, never run, is the one the per-phase model ranks first, at about the sum of its
    measured phases; the step's model (the same measurements as throughputs) ranks it no
    higher than the measured ones."""
    from trials.guided import ErrorModel, PhaseErrorModel

    frame, time_s = _four_layouts()
    fast = 0.7
    measured = {1: {"generate": time_s["generate"] * fast},  # TP1, rollout TP2
                2: {"old_log_prob": time_s["old_log_prob"] * fast,  # TP2, rollout TP1
                    "ref": time_s["ref"] * fast, "update_actor": time_s["update_actor"] * fast}}
    phases = {i: {p: m.get(p, t) for p, t in time_s.items()} for i, m in measured.items()}
    model = PhaseErrorModel(frame, 0.16)
    groups = {"generate": ("generate",), "log_prob": ("old_log_prob", "ref"),
              "update": ("update_actor",), "sync": ("weight_sync",)}
    observed = {g: (np.array([1, 2]), np.array([sum(phases[i][p] for p in members)
                                                for i in (1, 2)]), np.full(2, 1e-4))
                for g, members in groups.items()}
    mean, sd = model.posterior(observed)
    step = sum(time_s.values())
    combined = sum(time_s[p] * (fast if p != "weight_sync" else 1.0) for p in time_s)
    assert int(np.argmax(mean)) == 3  # TP2 with rollout TP2: never run
    assert np.exp(mean[3]) == pytest.approx(1000.0 * step / combined, rel=0.05)
    for i in (1, 2):  # the measured ones come back as measured
        assert np.exp(mean[i]) == pytest.approx(1000.0 * step / sum(phases[i].values()),
                                                rel=0.01)
    assert sd[3] > sd[1] and sd[3] > sd[2]
    scalar = ErrorModel(frame, 0.16)
    values = np.array([1000.0 * step / sum(phases[i].values()) for i in (1, 2)])
    scalar_mean, _ = scalar.posterior(np.array([1, 2]), values, np.full(2, 1e-4))
    assert scalar_mean[3] <= scalar_mean[1:3].max() + 1e-9


def test_phase_observations_read_verl_timers_of_ok_and_pruned_trials():
    from trials import study_state as attrs
    from trials.guided import STEP_SD, phase_observations

    frame, _ = _four_layouts()
    timers = {"gen": 40.0, "old_log_prob": 10.0, "ref": 11.0, "update_actor": 50.0,
              "update_weights": 4.0, "step": 115.0}

    def trial(key, category, steps, phases=timers):
        return SimpleNamespace(user_attrs={
            attrs.KEY: key, attrs.CATEGORY: category,
            attrs.MEASURED: {"tokens_per_s_per_gpu": 1.0, "steady_steps": steps,
                             "phase_times_s": phases}})

    study = SimpleNamespace(get_trials=lambda deepcopy=False: [
        trial("c0", "ok", 4), trial("c1", "pruned", 1), trial("c2", "oom", 1),
        trial("c3", "ok", 4, {"step": 115.0})])  # no phase timers: counts in no phase
    observed = phase_observations(study, frame)
    index, values, noise = observed["log_prob"]
    assert list(index) == [0, 1] and list(values) == [21.0, 21.0]
    assert list(noise) == pytest.approx([STEP_SD ** 2 / 4, STEP_SD ** 2])
    assert list(observed["sync"][1]) == [4.0, 4.0]
    assert list(observed["generate"][1]) == [40.0, 40.0]


def test_the_phase_model_flag_reaches_the_study_sampler(sim, prepared, tmp_path):
    """``TuneSettings.phase_model``: the same first trial, then other choices; the per-phase
    study sees verl's timers the simulated launcher wrote."""
    import dataclasses

    job = prepared["qwen3-30b-8"]
    truth = sim.hidden_truth(job, 2, MEMORY_SD, truth="phases")
    base = next(s for s in sim.STRATEGIES if s.name == "guided-w2+probe+ucb1")
    keys = {model: [t["key"] for t in sim.run_study(
        job, truth, dataclasses.replace(base, phase_model=model), 8, 0,
        tmp_path / model).trials] for model in ("off", "on")}
    assert keys["off"][0] == keys["on"][0] and keys["off"] != keys["on"]


def test_the_per_phase_study_sees_nothing_of_the_hidden_truth_it_did_not_measure(
        sim, prepared, tmp_path):
    """No leak under the per-phase truth either: scrambling every untried layout's hidden phase
    times (so its throughput) and memory leaves the default study's trials as they were."""
    import dataclasses

    job = prepared["qwen3-30b-8"]
    truth = sim.hidden_truth(job, 9, MEMORY_SD, truth="phases")
    first = sim.run_study(job, truth, sim.default_strategy(), 10, 0, tmp_path / "a")
    assert sim.default_strategy().phase_model == "on"
    ran = np.array([job.candidates.index[t["key"]] for t in first.trials])
    rng = np.random.default_rng(1)
    untried = np.ones(len(truth.tokens_per_s_per_gpu), dtype=bool)
    untried[ran] = False
    factor = np.where(untried[:, None], np.exp(rng.normal(0.0, 0.3, truth.phase_time_s.shape)),
                      1.0)
    phase_time = truth.phase_time_s * factor
    step = phase_time.sum(axis=1)
    scrambled = dataclasses.replace(
        truth, phase_time_s=phase_time, step_time_s=step,
        tokens_per_s_per_gpu=truth.tokens_per_s_per_gpu * truth.step_time_s / step,
        oom_need=np.where(untried, rng.uniform(0.5, 1.2, len(untried)), truth.oom_need))
    second = sim.run_study(job, scrambled, sim.default_strategy(), 10, 0, tmp_path / "b")
    assert [(t["key"], t["category"], t["value"]) for t in second.trials] == \
        [(t["key"], t["category"], t["value"]) for t in first.trials]


def test_the_phase_model_applies_to_colocated_studies_when_asked():
    """An asynchronous trainer's ``timing_s/gen`` is its wait for a batch, not generation: its
    study keeps the step's model; so does one with --phase-model off."""
    from planner.results import COLOCATED_MODE
    from trials.guided import phase_model_applies

    frame, _ = _four_layouts()
    for c in frame.candidates:
        c.mode = COLOCATED_MODE
    assert phase_model_applies(frame, True) and not phase_model_applies(frame, False)
    frame.candidates[0].mode = "fully_async"
    assert not phase_model_applies(frame, True)


def test_the_last_trials_run_the_posterior_best_layout_when_asked(monkeypatch):
    """``TuneSettings.exploit_last`` N: the study's last N of its trials take the allowed
    layout of the highest posterior mean (no bound), the others the bound; 0 in ``tune``."""
    from optuna.trial import TrialState

    from trials.guided import GuidedSampler

    frame, _ = _four_layouts()
    frame = Frame(**vars(frame), distributions=dict)  # LayoutSampler reads it too
    mean, sd = np.array([0.0, 1.0, 0.5, 0.0]), np.array([1.0, 0.0, 0.0, 2.0])
    mask = np.ones(4, dtype=bool)

    def study_of(done):
        trials = [SimpleNamespace(number=i, state=TrialState.COMPLETE) for i in range(done)]
        trials.append(SimpleNamespace(number=done, state=TrialState.RUNNING))  # this one
        return SimpleNamespace(get_trials=lambda deepcopy=False: trials), trials[-1]

    def choice(exploit_last, done, budget=12):
        sampler = GuidedSampler(frame, lambda study: mask, 0.16, kappa=2.0,
                                exploit_last=exploit_last, budget=budget)
        monkeypatch.setattr(sampler, "posterior", lambda study: (mean, sd))
        study, trial = study_of(done)
        return sampler.choose(study, trial, {}, mask)

    assert choice(0, 11) == 3  # the bound: 0 + 2 x 2
    assert choice(2, 9) == 3 and choice(2, 10) == 1 and choice(2, 11) == 1
    assert choice(1, 10) == 3 and choice(1, 11) == 1
    assert choice(2, 11, budget=None) == 3  # no budget known: never
    mask[1] = False  # the posterior-best is not allowed: the next-best mean
    assert choice(2, 11) == 2
